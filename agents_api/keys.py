"""API key format and hashing: ``msk_<public_id>_<secret>``, stored as an HMAC of the secret."""

import hashlib
import hmac
import secrets

from django.conf import settings

KEY_PREFIX = "msk_"


def hash_secret(secret: str) -> str:
    return hmac.new(settings.SECRET_KEY.encode(), secret.encode(), hashlib.sha256).hexdigest()


def new_key() -> tuple[str, str, str]:
    """A fresh key: (public id, secret, the full key to hand to the user once)."""
    public_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return public_id, secret, f"{KEY_PREFIX}{public_id}_{secret}"


def split_key(key: str) -> tuple[str, str] | None:
    """(public id, secret) of a well-formed key, else None."""
    if not key.startswith(KEY_PREFIX):
        return None
    public_id, sep, secret = key.removeprefix(KEY_PREFIX).partition("_")
    if not sep or not public_id or not secret:
        return None
    return public_id, secret


def secret_matches(secret: str, stored_hmac: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), stored_hmac)
