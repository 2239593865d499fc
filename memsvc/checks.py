"""System checks of the configuration that still lets the service start but leaves part of
it unusable (``manage.py check``, and every ``migrate``, print them)."""

import ipaddress
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Error, Info, Tags, Warning, register
from django.core.checks.security import base as django_security
from django.db import connections
from django.utils.functional import SimpleLazyObject

from memsvc.env import env_str

MIN_JWT_SECRET_BYTES = 32  # HS256's key should be at least as long as its hash (RFC 7518)


@register(Tags.security)
def check_user_tokens(app_configs=None, **kwargs) -> list[Warning]:
    """Without a way to verify user tokens, ``/v1/user`` answers 401 to everyone; with a
    guessable secret, or an issuer's keys fetched in the clear, tokens can be forged."""
    secret = settings.MEMSVC_JWT_SECRET
    key_set_url = settings.MEMSVC_JWT_JWKS_URL
    # Local mode's own secret (``embedded_db.local_secret``) is long enough and made when
    # first used: not by a check.
    made_when_used = type(secret) is SimpleLazyObject
    if not made_when_used and not secret and not key_set_url:
        return [
            Warning(
                "No user token can be verified: /v1/user answers 401 to every request.",
                hint="Set MEMSVC_JWT_SECRET (HS256) or MEMSVC_JWT_JWKS_URL with "
                "MEMSVC_JWT_ISSUER and MEMSVC_JWT_AUDIENCE (an OIDC issuer).",
                id="memsvc.W001",
            )
        ]
    found = []
    if not made_when_used and secret and len(secret.encode()) < MIN_JWT_SECRET_BYTES:
        found.append(
            Warning(
                f"MEMSVC_JWT_SECRET is shorter than {MIN_JWT_SECRET_BYTES} bytes: user tokens "
                "signed with it can be forged by guessing it.",
                hint="Use a random secret of 32 bytes or more (python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))').",
                id="memsvc.W002",
            )
        )
    if key_set_url and _fetched_in_the_clear(key_set_url):
        found.append(
            Warning(
                "MEMSVC_JWT_JWKS_URL is plain http to another host: whoever sits on the way can "
                "serve their own keys and sign any user's tokens.",
                hint="Use the issuer's https:// URL.",
                id="memsvc.W003",
            )
        )
    return found


@register(Tags.security)
def check_secret_key(app_configs=None, **kwargs) -> list[Warning]:
    """Django's own test of a ``DJANGO_SECRET_KEY`` (at least 50 characters, 5 of them
    different), which only ``check --deploy`` ran: a short key was taken without a word
    (review), and the web pages' sessions and API keys' hashes are made with it. Read from
    the environment: local mode's own key is made when first used, not by a check (and
    ``settings.SECRET_KEY`` would make it)."""
    key = env_str("DJANGO_SECRET_KEY")
    # (Django's test itself, which its deployment check runs on the setting.)
    if not key or django_security._check_secret_key(key):
        return []
    return [
        Warning(
            f"DJANGO_SECRET_KEY is shorter than {django_security.SECRET_KEY_MIN_LENGTH} "
            "characters, has too few different ones or is one of Django's made-up "
            f"{django_security.SECRET_KEY_INSECURE_PREFIX!r} keys: the web pages' sessions "
            "signed with it can be forged by guessing it.",
            hint="Use a random key (python -c 'import secrets; print(secrets.token_urlsafe(50))').",
            id="memsvc.W005",
        )
    ]


@register()
def check_broker_outside_local_mode(app_configs=None, **kwargs) -> list[Info]:
    """Outside local mode (a service of several processes, perhaps machines), the task
    queue in this machine's data directory (no ``CELERY_BROKER_URL``): a web process
    started without it queued its embeddings to a folder no other machine's worker read,
    and said nothing (review). Said, not warned of: a service on one machine is served
    right so (code review)."""
    if settings.LOCAL_MODE or settings.CELERY_BROKER_URL != "filesystem://":
        return []
    return [
        Info(
            "CELERY_BROKER_URL is not set outside local mode: tasks go to a folder of this "
            "machine's data directory, which a worker on another machine never reads (the "
            "sweep embeds what they were for, a minute late).",
            hint="On several machines, set CELERY_BROKER_URL (redis:// or amqp://) on every "
            "process of the service.",
            id="memsvc.I006",
        )
    ]


def _fetched_in_the_clear(url: str) -> bool:
    """``url`` is http:// to a host other than this machine's loopback."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        return False
    host = parts.hostname or ""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name
        return True


@register(Tags.database)
def check_pgvector(app_configs=None, databases=None, **kwargs) -> list[Error]:
    """The database's ``vector`` extension (pgvector), which the first migration creates and
    every table of messages, memories and tool records needs: on a PostgreSQL without it,
    or where the role may not create it (pgvector is no trusted extension: a superuser's
    to create), ``migrate`` ended in a traceback, half done (review). Checked by every
    ``migrate`` (``memsvc serve`` runs one) before anything is made."""
    found = []
    for alias in databases or ():
        with connections[alias].cursor() as cursor:
            cursor.execute(
                """
                SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector'),
                       EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector'),
                       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user),
                       current_database()
                """
            )
            available, installed, superuser, database = cursor.fetchone()
        if installed:
            continue
        if not available:
            found.append(
                Error(
                    f"The PostgreSQL server of database {database!r} has no pgvector "
                    "(the 'vector' extension): memsvc cannot store vectors there.",
                    hint="Install pgvector on that server (a package such as "
                    "postgresql-<version>-pgvector), or leave DATABASE_URL unset for the "
                    "embedded PostgreSQL, which has it.",
                    id="memsvc.E001",
                )
            )
        elif not superuser:
            found.append(
                Error(
                    f"The 'vector' extension is not created in database {database!r}, and "
                    "only a superuser may create it (pgvector is not a trusted extension).",
                    hint=f'As a superuser: psql -d "{database}" -c "CREATE EXTENSION vector"; '
                    "then run the migrations again.",
                    id="memsvc.E002",
                )
            )
    return found


@register(Tags.database)
def check_schema_not_newer(app_configs=None, databases=None, **kwargs) -> list[Warning]:
    """A database migrated by a newer memsvc, which this older code starts on (a rollback
    after an upgrade): it may refuse what the newer code stores, or fail on columns it does
    not know. It started without a word (review); now every ``migrate`` (``memsvc serve``
    runs one) says which migrations it does not know."""
    from django.db.migrations.loader import MigrationLoader

    found = []
    for alias in databases or ():
        loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
        # (A squashed migration's originals are known by it, their files gone or not.)
        squashed = {key for m in loader.replacements.values() for key in m.replaces}
        unknown = sorted(
            f"{app}.{name}"
            for app, name in loader.applied_migrations
            if app in loader.migrated_apps
            and (app, name) not in loader.disk_migrations
            and (app, name) not in squashed
        )
        if unknown:
            found.append(
                Warning(
                    f"Database {alias!r} was migrated by a newer memsvc: this code does not know "
                    f"its migrations {', '.join(unknown)}, and may fail on what they changed.",
                    hint="Run the release that migrated it, or restore the database's "
                    "backup taken before the upgrade.",
                    id="memsvc.W004",
                )
            )
    return found
