"""System checks of the configuration that still lets the service start but leaves part of
it unusable (``manage.py check``, and every ``migrate``, print them)."""

from django.conf import settings
from django.core.checks import Tags, Warning, register
from django.utils.functional import SimpleLazyObject

MIN_JWT_SECRET_BYTES = 32  # HS256's key should be at least as long as its hash (RFC 7518)


@register(Tags.security)
def check_user_tokens(app_configs=None, **kwargs) -> list[Warning]:
    """Without a way to verify user tokens, ``/v1/user`` answers 401 to everyone."""
    secret = settings.MEMSVC_JWT_SECRET
    if type(secret) is SimpleLazyObject:
        # Local mode's own (``embedded_db.local_secret``), long enough, made when first used:
        # not by a check.
        return []
    if not secret and not settings.MEMSVC_JWT_JWKS_URL:
        return [
            Warning(
                "No user token can be verified: /v1/user answers 401 to every request.",
                hint="Set MEMSVC_JWT_SECRET (HS256) or MEMSVC_JWT_JWKS_URL with "
                "MEMSVC_JWT_ISSUER and MEMSVC_JWT_AUDIENCE (an OIDC issuer).",
                id="memsvc.W001",
            )
        ]
    if (
        settings.MEMSVC_JWT_SECRET
        and len(settings.MEMSVC_JWT_SECRET.encode()) < MIN_JWT_SECRET_BYTES
    ):
        return [
            Warning(
                f"MEMSVC_JWT_SECRET is shorter than {MIN_JWT_SECRET_BYTES} bytes: user tokens "
                "signed with it can be forged by guessing it.",
                hint="Use a random secret of 32 bytes or more (python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))').",
                id="memsvc.W002",
            )
        ]
    return []
