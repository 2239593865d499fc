"""The secrets every process of one service must share, checked against the database's
record of them (``memsvc.models.SecretsOfRecord``).

An API key is stored as an HMAC keyed by ``DJANGO_SECRET_KEY`` (``agents_api.keys``), a
user token is signed with ``MEMSVC_JWT_SECRET``: a web process started with another of
either refused every key (or token) as invalid while its health said ok, and behind a load
balancer its refusals counted towards the address's failed authentications until the
good processes locked the clients out too (review). Each ``migrate`` records the
fingerprints of its secrets; a process whose own differ answers its health 503, naming the
setting, so that a balancer takes it out. Rotating a secret is a deploy with the new one
whose ``migrate`` records it (every API key is revoked by a new ``DJANGO_SECRET_KEY``)."""

import hashlib
import hmac

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

# What is signed with a secret for its fingerprint (a fixed text: the fingerprint tells
# nothing of the secret, and differs from every key's hash).
FINGERPRINTED = b"memsvc: a secret of record"


def fingerprint(secret: str | None) -> str:
    if not secret:
        return ""
    return hmac.new(secret.encode(), FINGERPRINTED, hashlib.sha256).hexdigest()


def ours() -> dict[str, str]:
    """This process's fingerprints, by the record's fields."""
    return {
        "api_keys": fingerprint(settings.SECRET_KEY),
        "user_tokens": fingerprint(settings.MEMSVC_JWT_SECRET),
    }


def record(using: str = DEFAULT_DB_ALIAS, **kwargs) -> None:
    """Record this process's secrets (``post_migrate``, once for memsvc's app); nothing
    where the table is not (a migrate back to before it)."""
    from memsvc.models import SecretsOfRecord

    if SecretsOfRecord._meta.db_table not in connections[using].introspection.table_names():
        return
    SecretsOfRecord.objects.using(using).update_or_create(
        id=1, defaults={**ours(), "recorded_at": timezone.now()}
    )


SETTINGS = {"api_keys": "DJANGO_SECRET_KEY", "user_tokens": "MEMSVC_JWT_SECRET"}


def differing() -> str | None:
    """Why this process's credentials are not the database's (the setting that differs
    from the one the last ``migrate`` recorded), or None (the same; or nothing recorded;
    a user token secret on one side only: tokens of an identity provider). One statement."""
    from memsvc.models import SecretsOfRecord

    recorded = SecretsOfRecord.objects.filter(id=1).values(*SETTINGS).first()
    if recorded is None:
        return None
    mine = ours()
    for field, setting in SETTINGS.items():
        if recorded[field] and mine[field] and recorded[field] != mine[field]:
            what = "API key" if field == "api_keys" else "user token"
            return (
                f"{setting} differs from the one the database's last migrate recorded: every "
                f"{what} is refused here; set the one every other process has"
            )
    return None
