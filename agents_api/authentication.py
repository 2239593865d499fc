"""API key authentication for the agent API (and, outside local mode, the local API)."""

from datetime import timedelta

from django.db import connection
from django.utils import timezone
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import SAFE_METHODS, BasePermission

from agents_api.keys import KEY_PREFIX, secret_matches, split_key
from agents_api.models import Agent, ApiKey, Scope
from memsvc.api.errors import ApiError, Forbidden, InvalidInput, Unauthorized
from memsvc.api.fields import header_text
from memsvc.api.principals import Principal, user_id_problem
from memsvc.api.ratelimit import auth_check_ended, limit_principal
from memsvc.db import kept_rows

LAST_USED_GRANULARITY = timedelta(minutes=1)
ON_BEHALF_HEADER = "X-On-Behalf-Of"


def _presented_key(request) -> str | None:
    header_key = request.headers.get("X-API-Key")
    if header_key:
        header_key = header_key.strip()
        # Another agent key as a bearer token too: which agent asks is not for this side to
        # choose (it took the X-API-Key one, silently). Anything else there (a proxy's own
        # credentials) is left alone, as before.
        parts = get_authorization_header(request).split()
        if len(parts) == 2 and parts[0].lower() == b"bearer":
            bearer = parts[1].decode("latin-1")
            if bearer.startswith(KEY_PREFIX) and bearer != header_key:
                raise Unauthorized("two different API keys (X-API-Key and Authorization)")
        return header_key
    parts = get_authorization_header(request).split()
    if not parts:
        return None
    if parts[0].lower() != b"bearer" or len(parts) != 2:
        raise Unauthorized("expected 'Authorization: Bearer msk_...' or 'X-API-Key: msk_...'")
    token = parts[1].decode("latin-1")
    if not token.startswith(KEY_PREFIX):
        raise Unauthorized("this API needs an agent API key (msk_...), not a user token")
    return token


# A key and its agent in one fixed statement: the agent's columns, then the key's as
# key_<column>. Compiled per request as a queryset (``select_related``), it cost more than it
# ran: 0.66 ms of every request with a key, 0.27 ms so.
_KEY_FIELDS = ApiKey._meta.concrete_fields
_KEY_COLUMNS = ", ".join(f'k."{field.column}" AS "key_{field.column}"' for field in _KEY_FIELDS)
_KEY_SQL = f"SELECT a.*, {_KEY_COLUMNS} FROM api_key k JOIN agent a ON a.id = k.agent_id WHERE k.public_id = %s"  # noqa: S608 (the model's columns)


def key_with_agent(public_id: str) -> ApiKey | None:
    """The key of this public id, its agent loaded with it; None if there is none."""
    for agent in kept_rows("key_with_agent", Agent, _KEY_SQL, [public_id]):
        values = []
        for field in _KEY_FIELDS:
            # (Taken off the agent, which becomes the request's: the key's HMAC stays on the key.)
            value = agent.__dict__.pop(f"key_{field.column}")
            if hasattr(field, "from_db_value"):  # (``scopes``: JSON text, as the ORM reads it)
                value = field.from_db_value(value, None, connection)
            values.append(value)
        api_key = ApiKey.from_db(agent._state.db, [field.attname for field in _KEY_FIELDS], values)
        api_key.agent = agent
        return api_key
    return None


def authenticate_key(key: str) -> ApiKey:
    """The active key; one 401 for every way a key can be wrong (unknown, bad secret, revoked)."""
    public_id, secret = split_key(key) or ("", "")
    api_key = key_with_agent(public_id)
    # The HMAC is computed for unknown ids too: a secret is never checked faster or slower
    # by how much of it is right. (A known id still costs its row's reading, some 80 µs: an
    # id, which ``apikey list`` shows, is no secret; review.)
    if not secret_matches(secret, api_key.secret_hmac if api_key else "0" * 64):
        api_key = None
    if api_key is None or not api_key.is_active:
        raise Unauthorized("invalid API key")
    now = timezone.now()
    if api_key.last_used_at is None or now - api_key.last_used_at >= LAST_USED_GRANULARITY:
        # At most one write a minute per key, however busy the agent is.
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
    return api_key


def principal_for_key(api_key: ApiKey, on_behalf_of: str | None) -> Principal:
    scopes = frozenset(api_key.scopes)
    if on_behalf_of is not None:
        if Scope.IMPERSONATE not in scopes:
            raise Forbidden(f"{ON_BEHALF_HEADER} needs a key with the 'impersonate' scope")
        problem = user_id_problem(on_behalf_of)
        if problem:
            raise InvalidInput.for_field(ON_BEHALF_HEADER, problem, location="header")
    return api_key.agent.as_principal(scopes=scopes, on_behalf_of=on_behalf_of)


def refuse_acting_for_a_user(request) -> None:
    """The APIs that keep an agent's own memory alone (the local API, Letta's routes) refuse
    ``X-On-Behalf-Of`` once the caller is known (422, whatever the key's scopes): taken and
    ignored, a search "as bob" answered what was made for alice (review)."""
    if ON_BEHALF_HEADER in request.headers:
        raise InvalidInput.for_field(
            ON_BEHALF_HEADER,
            "this API keeps an agent's own memory; act for a user through /v1/agent",
            location="header",
        )


class ApiKeyAuthentication(BaseAuthentication):
    """``Authorization: Bearer msk_...`` or ``X-API-Key: msk_...`` -> an agent principal."""

    acts_for_users = True  # ``X-On-Behalf-Of`` taken (else refused: ``OwnMemoryKeyAuthentication``)

    def authenticate(self, request):
        key = _presented_key(request)
        if key is None:
            return None
        api_key = authenticate_key(key)
        on_behalf_of = None
        try:
            if self.acts_for_users:
                on_behalf_of = header_text(request, ON_BEHALF_HEADER)
            else:
                refuse_acting_for_a_user(request)
            principal = principal_for_key(api_key, on_behalf_of)
        except ApiError:
            # Refused what it asked (to act for a user it may not): counted against the key,
            # and 429 past its limit, as its other requests (none was: review).
            limit_principal(api_key.rate_limit_key)
            raise
        request._request.principal = principal
        request._request.agent = api_key.agent
        auth_check_ended(request)
        return principal, api_key

    def authenticate_header(self, request):
        return "Bearer"


class OwnMemoryKeyAuthentication(ApiKeyAuthentication):
    """A key of an API that keeps an agent's own memory alone (the local API, Letta's
    routes): ``X-On-Behalf-Of`` is refused, not checked against the key's scopes."""

    acts_for_users = False


def require_scope(principal: Principal, needed: str, *, answers_stored: bool = False) -> None:
    """403 unless the key the principal came with has the ``needed`` scope (the agent API's
    views through ``HasScope``, the MCP server's tools). ``answers_stored``: a write that
    answers with what only a reader may see (the memory a save was merged into, a block's
    whole value after an append) needs ``read`` too: a key that may not read may not learn
    it by writing (review)."""
    for scope in (needed, Scope.READ) if answers_stored else (needed,):
        if scope not in principal.scopes:
            raise Forbidden(f"this API key lacks the '{scope}' scope")


class HasScope(BasePermission):
    """Reads need the ``read`` scope, writes the ``write`` scope (a view may name its own);
    the methods in the view's ``writes_read`` ``read`` too (``require_scope``'s
    ``answers_stored``). The scopes are those of the authenticated caller
    (``request.user.scopes``): an agent principal on ``/v1``, a ``LocalCaller`` on the
    local API."""

    def has_permission(self, request, view):
        needed = getattr(view, "required_scope", None) or (
            Scope.READ if request.method in SAFE_METHODS else Scope.WRITE
        )
        writes_read = request.method in getattr(view, "writes_read", ())
        require_scope(request.user, needed, answers_stored=writes_read)
        return True
