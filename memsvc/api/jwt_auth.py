"""JWT bearer authentication for the user API.

Two kinds of token are accepted, each with its own algorithms, so a key can never be used
as another kind of key (no HS/RS confusion, never ``none``):

- HS256 signed with ``MEMSVC_JWT_SECRET`` (local mode, tests, simple deployments);
- RS256/RS384/RS512/ES256/ES384 from an OIDC issuer's key set at ``MEMSVC_JWT_JWKS_URL``
  (cached for an hour, then fetched again: a key the issuer has removed stops being
  accepted; while the issuer fails, its last key set stays in use, and a process that has
  none answers 503), with
  ``MEMSVC_JWT_ISSUER`` and ``MEMSVC_JWT_AUDIENCE`` checked.

Every token needs ``exp`` and ``sub``; the user id is ``sub``.
"""

import functools
import logging
import time

import jwt
from django.conf import settings
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from memsvc.api.errors import InvalidInput, Unauthorized, Unavailable
from memsvc.api.principals import Principal, user_id_problem
from memsvc.api.ratelimit import auth_check_ended

SHARED_SECRET_ALGORITHMS = ("HS256",)
ISSUER_ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384")
API_KEY_PREFIX = "msk_"
API_KEY_REFUSED = "an API key is not accepted here: the user API needs a user token"


logger = logging.getLogger(__name__)

KEY_SET_RETRY_SECONDS = 30


class IssuerKeySet(jwt.PyJWKClient):
    """PyJWT's key set client, for an issuer that fails (unreachable, slow, answering
    nonsense): a failed fetch is tried again ``KEY_SET_RETRY_SECONDS`` later, not by every
    request (each would wait for it, up to the timeout, one at a time under the client's
    lock; a made-up ``kid`` asks for a fetch), and meanwhile the last key set fetched, expired
    or not, stays in use."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._last_key_set = None
        self._failed_at = None

    def get_jwk_set(self, refresh: bool = False):
        failed_at = self._failed_at
        if failed_at is None or time.monotonic() - failed_at >= KEY_SET_RETRY_SECONDS:
            try:
                self._last_key_set = super().get_jwk_set(refresh)
                self._failed_at = None
            except (jwt.PyJWTError, ValueError) as exc:
                self._failed_at = time.monotonic()
                logger.warning("the issuer's key set at %s could not be read: %s", self.uri, exc)
        if self._last_key_set is None:
            raise KeySetUnavailable
        return self._last_key_set


class KeySetUnavailable(Exception):
    """No key set of the issuer's to check a token with: it has not answered one this
    process could read. The service's outage, not the caller's bad token: a 401 was counted
    as the address's failed authentication, every user behind one address was locked out,
    and the answer showed the fetch's network error (review)."""


@functools.cache
def _jwks_client(url: str) -> IssuerKeySet:
    # No ``cache_keys``: PyJWT's cache of keys by ``kid`` never expires, and sits in front of
    # the key set, so a key the issuer removed would be accepted for the life of the process.
    return IssuerKeySet(url, lifespan=3600, timeout=5)


def _bound_to(jwk: jwt.PyJWK, algorithm: str) -> jwt.PyJWK:
    """``jwk`` for verifying ``algorithm``. PyJWT binds an RSA key published without ``alg``
    to RS256, which would refuse every token of an issuer that signs with RS384 or RS512;
    such a key verifies any RS algorithm. A key with ``alg`` stays bound to it, and an EC
    key's curve fixes its algorithm."""
    published = jwk._jwk_data  # the key's JWK members: PyJWT keeps them nowhere public
    if jwk.key_type == "RSA" and "alg" not in published and algorithm.startswith("RS"):
        return jwt.PyJWK(published, algorithm)
    return jwk


def decode_user_token(token: str) -> dict:
    """The verified claims of ``token``; raises ``Unauthorized`` for anything else."""
    try:
        algorithm = jwt.get_unverified_header(token).get("alg")
        if algorithm in SHARED_SECRET_ALGORITHMS and settings.MEMSVC_JWT_SECRET:
            key = settings.MEMSVC_JWT_SECRET
        elif algorithm in ISSUER_ALGORITHMS and settings.MEMSVC_JWT_JWKS_URL:
            # The PyJWK itself, not its bare key: PyJWT then refuses an ``alg`` that does not
            # fit the key the ``kid`` names (an RSA key with ES256, say).
            key = _bound_to(
                _jwks_client(settings.MEMSVC_JWT_JWKS_URL).get_signing_key_from_jwt(token),
                algorithm,
            )
        else:
            raise Unauthorized(f"tokens signed with {algorithm!r} are not accepted")
        claims = jwt.decode(
            token,
            key,
            algorithms=[algorithm],
            issuer=settings.MEMSVC_JWT_ISSUER,
            audience=settings.MEMSVC_JWT_AUDIENCE,
            options={"require": ["exp", "sub"], "verify_aud": bool(settings.MEMSVC_JWT_AUDIENCE)},
            leeway=30,
        )
    except jwt.ExpiredSignatureError:
        # (Its signature verified. PyJWT reads ``"exp": true`` as 1: "expired": review.)
        unverified = jwt.decode(token, options={"verify_signature": False})
        raise Unauthorized(_times_problem(unverified) or "token expired") from None
    except KeySetUnavailable:
        raise Unavailable("the token issuer's key set cannot be read; try again shortly") from None
    except (jwt.PyJWTError, ValueError) as exc:
        # Every way a token can be wrong is the caller's 401, never a 500. A part that does
        # not decode is said without the decoder's own words ("Invalid header string:
        # 'utf-8' codec can't decode byte 0xb7 ...": review).
        said = str(exc)
        if isinstance(exc, jwt.DecodeError) and not isinstance(exc, jwt.InvalidSignatureError):
            said = said.partition(":")[0]
        raise Unauthorized(f"invalid token: {said}") from None
    sub = claims["sub"]
    if not isinstance(sub, str) or not sub:
        raise Unauthorized("invalid token: sub must be a non-empty string")
    if problem := _times_problem(claims):
        raise Unauthorized(problem)
    # A signed token for an id this service cannot take as a user's (too long, a NUL, an
    # agent's ``agent:`` prefix: agent principals come from API keys only) is a request it
    # cannot serve, not a failed authentication: 400 naming ``sub``.
    problem = user_id_problem(sub)
    if problem:
        raise InvalidInput.for_field("sub", problem, location="header")
    return claims


def _times_problem(claims: dict) -> str | None:
    """Why the token's times are not numbers (RFC 7519's NumericDate), or None. PyJWT reads
    "9999999999" as one, and a token whose exp was that text was taken (review)."""
    for name in ("exp", "nbf", "iat"):
        value = claims.get(name)
        if name in claims and (isinstance(value, bool) or not isinstance(value, int | float)):
            return f"invalid token: {name} must be a number"
    return None


class JWTAuthentication(BaseAuthentication):
    """``Authorization: Bearer <jwt>`` -> a user principal."""

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts:
            if request.headers.get("X-API-Key"):  # (said "no credentials": review)
                raise Unauthorized(API_KEY_REFUSED)
            return None  # the permission check answers 401
        if parts[0].lower() != b"bearer" or len(parts) != 2:
            raise Unauthorized("expected 'Authorization: Bearer <token>'")
        try:
            token = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise Unauthorized("invalid token") from None
        if token.startswith(API_KEY_PREFIX):
            raise Unauthorized(API_KEY_REFUSED)
        principal = Principal.user(decode_user_token(token)["sub"])
        request._request.principal = principal
        auth_check_ended(request)
        return principal, token

    def authenticate_header(self, request):
        return "Bearer"
