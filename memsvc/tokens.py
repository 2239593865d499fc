"""Local JWTs: HS256 tokens signed with ``MEMSVC_JWT_SECRET`` (local mode and tests)."""

import time

import jwt
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

LOCAL_ALGORITHM = "HS256"


def mint_user_token(user_id: str, *, ttl_seconds: int = 3600) -> str:
    if not settings.MEMSVC_JWT_SECRET:
        # (A setting missing: said in one line by ``memsvc token``, a traceback before: review.)
        raise ImproperlyConfigured("MEMSVC_JWT_SECRET is not set: local tokens cannot be signed")
    now = int(time.time())
    claims = {"sub": user_id, "iat": now, "exp": now + ttl_seconds}
    if settings.MEMSVC_JWT_ISSUER:
        claims["iss"] = settings.MEMSVC_JWT_ISSUER
    if settings.MEMSVC_JWT_AUDIENCE:
        claims["aud"] = settings.MEMSVC_JWT_AUDIENCE
    return jwt.encode(claims, settings.MEMSVC_JWT_SECRET, algorithm=LOCAL_ALGORITHM)
