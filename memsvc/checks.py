"""System checks of the configuration that still lets the service start but leaves part of
it unusable (``manage.py check``, and every ``migrate``, print them)."""

import ipaddress
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Tags, Warning, register
from django.utils.functional import SimpleLazyObject

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
