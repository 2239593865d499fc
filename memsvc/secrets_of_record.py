"""The secrets every process of one service must share, checked against the database's
record of them (``memsvc.models.SecretsOfRecord``).

An API key is stored as an HMAC keyed by ``DJANGO_SECRET_KEY`` (``agents_api.keys``), a
user token is signed with ``MEMSVC_JWT_SECRET``: a web process started with another of
either refused every key (or token) as invalid while its health said ok, and behind a load
balancer its refusals counted towards the address's failed authentications until the
good processes locked the clients out too (review). Each ``migrate`` records the
fingerprints of its secrets; a process whose own differ says so in its health
(``secrets: "differ"``, and its log), and answers a credential it cannot verify 503, not a
failed authentication (``differs``). Its health stays ok: a migrate run with another secret
than the service's (a job's placeholder) would otherwise have taken every process out.
Rotating a secret is a deploy with the new one whose ``migrate`` records it (a new
``DJANGO_SECRET_KEY`` revokes every API key)."""

import hashlib
import hmac
import time

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


def differing() -> dict[str, str]:
    """The settings of this process that differ from those the last ``migrate`` recorded,
    by the record's field (nothing recorded, or a user token secret on one side only, the
    tokens of an identity provider: none). One statement."""
    from memsvc.models import SecretsOfRecord

    recorded = SecretsOfRecord.objects.filter(id=1).values(*SETTINGS).first()
    if recorded is None:
        return {}
    mine = ours()
    return {
        field: setting
        for field, setting in SETTINGS.items()
        if recorded[field] and mine[field] and recorded[field] != mine[field]
    }


# How long a process keeps what it read of the record for its refusals (``differs``).
KEPT_SECONDS = 60.0
_read: tuple[float, dict[str, str]] | None = None


def differs(field: str) -> bool:
    """Whether this process's secret of ``field`` differs from the record, as read at most
    ``KEPT_SECONDS`` ago: asked when a credential fails (a key of a known id with a wrong
    secret, a token whose signature does not verify), which is then this server's fault,
    not the caller's (503, not a failed authentication counted against the address)."""
    global _read
    now = time.monotonic()
    if _read is None or now - _read[0] > KEPT_SECONDS:
        _read = (now, differing())
    return field in _read[1]


def forget() -> None:
    """Read the record again at the next ``differs`` (a test's secrets changed)."""
    global _read
    _read = None


def refusal(field: str) -> str:
    """What a request refused by this server's secret is told (``differs``)."""
    return (
        f"this server's {SETTINGS[field]} is not the one its credentials were made with "
        "(another server of the service may answer): try again"
    )
