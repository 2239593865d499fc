"""Rate limits: requests per principal, failed authentications per client address.

Two limits, per minute (fixed one-minute windows), ``0`` turning one off:

- ``MEMSVC_RATE_LIMIT`` (1200): requests of one principal: a user (JWT ``sub``), an API key,
  or, for a caller without credentials (a keyless loopback caller of the local API, the
  schema), its address.
- ``MEMSVC_AUTH_FAILURE_LIMIT`` (60): answers 401 to one client address. Past the limit,
  every request from that address that carries credentials is refused until the window
  ends, the right ones too: guessing secrets or tokens gets nowhere. (But for a view that
  reads none: health checks, the schema and its docs, the local API's unknown paths.)

An IPv6 client counts as its /64 (``counted_as``). Over a limit: 429 ``rate_limited`` with ``Retry-After`` (seconds to the next window), in the
shape of the API asked. The counts are shared by every process of the service: in Redis when
one is configured (``MEMSVC_REDIS_URL``, by default the Celery broker when that is Redis),
otherwise in the database (``memsvc.models.RateLimitCounter``).

Using it on a new surface:

- a DRF view gets the per-principal limit by default (``PrincipalRateThrottle`` is in
  ``REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"]``), counted before its permissions are
  checked when ``CountedBeforePermissions`` is its first base (every API's base view);
  ``throttle_classes = []`` exempts one (health checks);
- anything else calls ``limit_principal(identity)`` once it knows who is asking (it raises
  ``RateLimited``), or wraps a Django view in ``@rate_limited(identity_of)``;
- a 401 from any API path is counted against its address by ``RateLimitMiddleware``; code
  that refuses credentials without answering 401 (a stdio protocol, say) calls
  ``note_auth_failure(address)`` itself;
- a password login (the web pages', the admin's) goes through ``LockoutModelBackend``: its
  wrong passwords count as 401s do (near the limit, its checks running counted too, as the
  middleware's), and an address past the limit has every password refused, the right one
  too.
"""

import functools
import ipaddress
import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, connection
from django.http import Http404, HttpResponse
from django.urls import resolve
from rest_framework.throttling import BaseThrottle

from memsvc.api.errors import RateLimited, render_api_error
from memsvc.api.middleware import exception_response
from memsvc.db import database_gone
from memsvc.outage import Outage, Reminder

logger = logging.getLogger(__name__)

WINDOW_SECONDS = 60
CREDENTIAL_HEADERS = ("HTTP_AUTHORIZATION", "HTTP_X_API_KEY")


# --- counting ----------------------------------------------------------------------------------


_pruned_before = [0]  # the window whose earlier rows this process last deleted


class DatabaseCounter:
    """One row per bucket, reset when a new window starts; every process updates the same
    row, so the count is the service's, not a process's."""

    def hit(self, bucket: str, window_start: int) -> int:
        # A hit of a window already past (a process that read the clock just before the
        # minute's end, or one whose clock is behind) counts in the row's newer window: it
        # reset that window's count, and a burst across the minute's end had its hits
        # counted from 1 again each time two processes' windows alternated.
        # A row per address or key ever seen would grow the table without end (an IPv6
        # client has 2^64 addresses, and as many /64s): once a window, each process deletes
        # the rows of windows past, in the same statement (no query more for the request);
        # not the bucket's own row, which the insert itself starts again.
        prune = ""
        if _pruned_before[0] < window_start:
            _pruned_before[0] = window_start
            prune = """
                WITH pruned AS (
                    DELETE FROM rate_limit_counter WHERE window_start < %(start)s
                    AND bucket <> %(bucket)s
                )"""
        with connection.cursor() as cursor:
            cursor.execute(
                prune  # noqa: S608 (two constant texts; every value is a parameter)
                + """
                INSERT INTO rate_limit_counter AS c (bucket, window_start, hits)
                VALUES (%(bucket)s, %(start)s, 1)
                ON CONFLICT (bucket) DO UPDATE SET
                    hits = CASE WHEN c.window_start >= EXCLUDED.window_start
                                THEN c.hits + 1 ELSE 1 END,
                    window_start = GREATEST(c.window_start, EXCLUDED.window_start)
                RETURNING hits
                """,
                {"bucket": bucket, "start": window_start},
            )
            return cursor.fetchone()[0]

    def count(self, bucket: str, window_start: int) -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT hits FROM rate_limit_counter WHERE bucket = %s AND window_start = %s",
                [bucket, window_start],
            )
            row = cursor.fetchone()
        return row[0] if row else 0

    def take_back(self, bucket: str, window_start: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE rate_limit_counter SET hits = hits - 1"
                " WHERE bucket = %s AND window_start = %s AND hits > 0",
                [bucket, window_start],
            )


class RedisCounter:
    """A key per bucket and window, expiring with the window."""

    def __init__(self, url: str):
        import redis

        self.redis = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)

    @staticmethod
    def _key(bucket: str, window_start: int) -> str:
        return f"memsvc:rate:{bucket}:{window_start}"

    def hit(self, bucket: str, window_start: int) -> int:
        key = self._key(bucket, window_start)
        pipeline = self.redis.pipeline()
        pipeline.incr(key)
        pipeline.expire(key, WINDOW_SECONDS + 5)
        return pipeline.execute()[0]

    def count(self, bucket: str, window_start: int) -> int:
        return int(self.redis.get(self._key(bucket, window_start)) or 0)

    def take_back(self, bucket: str, window_start: int) -> None:
        # With its expiry again: a key gone already (a request longer than the window)
        # would come back as -1, and stay.
        key = self._key(bucket, window_start)
        self.redis.pipeline().decr(key).expire(key, WINDOW_SECONDS + 5).execute()


@functools.cache
def _redis_counter(url: str) -> RedisCounter:
    return RedisCounter(url)


def _counter():
    if settings.MEMSVC_REDIS_URL:
        return _redis_counter(settings.MEMSVC_REDIS_URL)
    return DatabaseCounter()


def _window() -> tuple[int, int]:
    """The current window's start and the seconds left in it (at least 1)."""
    now = time.time()
    start = int(now // WINDOW_SECONDS * WINDOW_SECONDS)
    return start, max(1, int(start + WINDOW_SECONDS - now + 0.999))


# Redis that failed a count is not asked again for this long (``_counted``): each request
# of an outage waited for its timeout (1 s), before the broker's.
REDIS_OUTAGE = Outage(seconds=5.0)
_UNCOUNTED_SAID = Reminder()


def _counted(
    operation: str, bucket: str, window: tuple[int, int] | None = None
) -> tuple[int, int] | None:
    """``(count, seconds left)`` after ``operation`` ("hit", "count" or "take_back") on
    ``bucket`` in ``window`` (by default the current one); None when Redis cannot be
    reached: the limits then let requests through (logged), rather than take the service
    down with them. A database error propagates (the request would fail anyway: 503)."""
    window_start, left = window or _window()
    counter = _counter()
    if isinstance(counter, RedisCounter):
        import redis

        if REDIS_OUTAGE.ongoing:
            return None
        try:
            return getattr(counter, operation)(bucket, window_start), left
        except redis.RedisError as exc:
            REDIS_OUTAGE.began()
            logger.warning("rate limits not enforced: Redis unreachable (%s)", exc)
            return None
    return getattr(counter, operation)(bucket, window_start), left


# --- the limits --------------------------------------------------------------------------------


def enforce(bucket: str, limit: int) -> None:
    """Count one event in ``bucket``; ``RateLimited`` when that is more than ``limit`` in
    the current window (0: no limit, nothing counted)."""
    if not limit:
        return
    counted = _counted("hit", bucket)
    if counted is not None and counted[0] > limit:
        raise RateLimited(counted[1], f"rate limit of {limit} requests a minute exceeded")


def limit_principal(identity: str) -> None:
    """The per-principal limit (``MEMSVC_RATE_LIMIT``) for one request of ``identity``
    (``"user:<id>"``, ``"key:<public id>"``, ``"address:<ip>"``...). Raises ``RateLimited``."""
    enforce(f"principal:{identity}", settings.MEMSVC_RATE_LIMIT)


def note_auth_failure(address: str) -> None:
    """Count a refused credential from ``address``."""
    if settings.MEMSVC_AUTH_FAILURE_LIMIT:
        _counted("hit", f"auth-failures:{counted_as(address)}")


def _locked_out(limit: int, retry_after: int) -> RateLimited:
    return RateLimited(
        retry_after, f"too many failed authentications from this address ({limit} a minute)"
    )


# How many requests a server may check at once (its web processes' threads, with room):
# an address that many failures from its limit has its checks counted while they run
# (``auth_attempt``).
CHECKS_AT_ONCE = 32
# Near the limit, a request whose check would pass it waits for those running to end, at
# most this long (then it is refused), looking again this often.
CHECK_WAIT_SECONDS = 5.0
CHECK_POLL_SECONDS = 0.02


def auth_attempt(address: str) -> tuple[RateLimited | None, Callable[[], None] | None]:
    """The refusal for a request with credentials from ``address`` that has failed
    authentication too often in this window; else None and, near the limit, the call that
    ends its check (``checked``, once its failure, if any, is counted).

    A failure is counted once answered; so a burst of guesses at once, all checked before
    the first answer, got as many checks as the server runs at once past the limit (24 at
    once, a limit of 3: 24 checked). Near the limit (``CHECKS_AT_ONCE``) the checks running
    are counted too (``auth-checking``): failures and running checks together never pass
    the limit, and a request that would pass it waits for the running ones to end (a right
    one ends in milliseconds, a wrong one is a failure), then goes on or is refused. (They
    were counted as failures until taken back: right requests at once near the limit were
    refused for each other, 6 of 24 at a limit of 5: review.) Far from the limit a request
    pays one read, as every right one does."""
    limit = settings.MEMSVC_AUTH_FAILURE_LIMIT
    if not limit:
        return None, None
    where = counted_as(address)
    failures, checking = f"auth-failures:{where}", f"auth-checking:{where}"
    window = _window()
    counted = _counted("count", failures, window)
    if counted is None or counted[0] < limit - CHECKS_AT_ONCE:
        return None, None
    give_up_at = time.monotonic() + CHECK_WAIT_SECONDS
    while counted[0] < limit:
        running = _counted("hit", checking, window)
        # The failures read again, once this check is counted: a check that fails counts
        # its failure before it stops counting as running, so the two read in this order
        # never miss it (read before, a failure of the meantime was missed: one check past
        # the limit).
        counted = running and _counted("count", failures, window)
        if counted is None:  # (Redis unreachable: let through, ``_counted``)
            return None, None
        if counted[0] + running[0] <= limit:
            return None, functools.partial(_counted, "take_back", checking, window)
        _counted("take_back", checking, window)
        if counted[0] >= limit:
            break
        if time.monotonic() >= give_up_at:
            message = "too many authentications at once from this address"
            return RateLimited(running[1], message), None
        time.sleep(CHECK_POLL_SECONDS)
        window = _window()
        counted = _counted("count", failures, window)
        if counted is None:
            return None, None
    return _locked_out(limit, counted[1]), None


def _ip(address: str):
    """``address`` as an IP address, an IPv4 one written as IPv6 (``::ffff:10.0.0.5``) as
    itself; None for what is not one."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    return getattr(ip, "ipv4_mapped", None) or ip


def counted_as(address: str) -> str:
    """Whom a client ``address`` counts as: an IPv6 address as its /64 (one subscriber's
    network, where a client can take a new address for every request and so escape any
    limit per address), an IPv4 address (also one written as IPv6) as itself."""
    ip = _ip(address)
    if ip is None:
        return address
    if ip.version == 6:
        return str(ipaddress.ip_network((ip, 64), strict=False))
    return str(ip)


def client_address(request) -> str:
    """The client's address: ``REMOTE_ADDR``, or, when that is a proxy in
    ``MEMSVC_TRUSTED_PROXIES``, the nearest address in ``X-Forwarded-For`` that is not one
    of them (read from the right: the proxies add theirs last, a client may write anything
    first)."""
    address = request.META.get("REMOTE_ADDR", "")
    if not _trusted_proxy(address):
        if "HTTP_X_FORWARDED_FOR" in request.META:
            _warn_of_unnamed_proxy(address)
        return address
    for hop in reversed(request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")):
        try:
            hop = str(ipaddress.ip_address(_without_port(hop.strip())))
        except ValueError:
            break  # not an address: nothing further left can be trusted
        if not _trusted_proxy(hop):
            return hop
        address = hop
    return address


def _without_port(hop: str) -> str:
    """An address as some proxies write it with the client's port (``203.0.113.7:5123``,
    ``[2001:db8::1]:5123``): the address alone. (Else every client counted as the proxy,
    and one client's failed authentications locked them all out.)"""
    if hop.startswith("[") and "]" in hop:
        return hop[1 : hop.index("]")]
    if hop.count(":") == 1:
        return hop.split(":")[0]
    return hop


@functools.lru_cache(maxsize=8)
def _trusted_networks(networks: tuple[str, ...]) -> tuple:
    return tuple(ipaddress.ip_network(network, strict=False) for network in networks)


def _trusted_proxy(address: str) -> bool:
    """Whether ``address`` is in one of ``MEMSVC_TRUSTED_PROXIES`` (addresses or networks);
    an IPv4 address written as IPv6 (``::ffff:10.0.0.5``) counts as itself."""
    ip = _ip(address)
    return ip is not None and any(
        ip in network for network in _trusted_networks(tuple(settings.MEMSVC_TRUSTED_PROXIES))
    )


# At most once a minute: a client can send X-Forwarded-For from anywhere.
_UNNAMED_PROXY_SAID = Reminder()


def _warn_of_unnamed_proxy(address: str) -> None:
    """Behind a proxy nobody named, every client is the proxy's address, and one client's
    failed authentications lock everyone out."""
    _UNNAMED_PROXY_SAID.say(
        logger.warning,
        "a request came through a proxy at %s (X-Forwarded-For) that MEMSVC_TRUSTED_PROXIES "
        "does not name: if it is yours, name it, or every client counts as %s for the rate "
        "limits and the lockout of failed authentications",
        address,
        address,
    )


def principal_identity(request) -> str:
    """Who a request counts against: the credential's or principal's ``rate_limit_key``
    (an API key, a user), else the client's address."""
    for holder in (getattr(request, "auth", None), getattr(request, "user", None)):
        key = getattr(holder, "rate_limit_key", None)
        if key:
            return key
    return f"address:{counted_as(client_address(request))}"


class PrincipalRateThrottle(BaseThrottle):
    """DRF's hook for ``limit_principal``: runs after authentication, so the principal is
    known. Over the limit it raises ``RateLimited`` itself (the API's shape, Retry-After)."""

    def allow_request(self, request, view):
        limit_principal(principal_identity(request))
        return True


# A DRF view's mixin (first among its bases): its requests count against their principal
# before its permissions are checked. DRF checks them first: a request they refused (a key
# without the scope, no credentials) counted nowhere, and was answered 403 or 401, never
# 429, however many came (review). (No docstring: the OpenAPI schema would give it to every
# operation without a description of its own.)
class CountedBeforePermissions:
    def check_permissions(self, request):
        super().check_throttles(request)
        super().check_permissions(request)

    def check_throttles(self, request):
        """(Done before the permissions, by ``check_permissions``.)"""


def rate_limited(identity_of: Callable = principal_identity):
    """For a plain Django view: ``@rate_limited()`` (or ``@rate_limited(lambda request:
    ...)``) applies the per-principal limit before the view runs, answering 429 in the
    shape of the API (``render_api_error``)."""

    def decorate(view):
        @functools.wraps(view)
        def wrapper(request, *args, **kwargs):
            try:
                limit_principal(identity_of(request))
            except RateLimited as refusal:
                response = render_api_error(request, refusal) or HttpResponse(
                    refusal.message, status=429, content_type="text/plain"
                )
                for name, value in refusal.headers.items():
                    response[name] = value
                return response
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


def _guarded(check, *args):
    # An exception here would be Django's HTML 500: with the database down the request
    # goes on without this check, and its view answers 503.
    try:
        return check(*args)
    except DatabaseError:
        _say_uncounted()
        return None


def _say_uncounted() -> None:
    # (Said once a minute: by every request with credentials, it named failed
    # authentications where none had failed; review.)
    _UNCOUNTED_SAID.say(
        logger.warning,
        "the database is unreachable: failed authentications are not counted meanwhile",
    )


class RateLimitMiddleware:
    """Failed authentications per address: refuses requests with credentials from an
    address past ``MEMSVC_AUTH_FAILURE_LIMIT``, and counts every 401 an API answers to
    credentials. A request without any is no guess: any web page its visitor opens could
    send them by the hundred, unasked (a browser adds no credential header across origins
    without a preflight), and lock the visitor's address out (review)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        presented = any(request.META.get(header) for header in CREDENTIAL_HEADERS)
        if presented and _reads_credentials(request):
            try:
                refusal, checked = request_auth_attempt(request)
            except DatabaseError as gone:
                return exception_response(request, gone)
            if refusal is not None:
                response = render_api_error(request, refusal)
                if response is not None:
                    return response
            if checked is not None:
                setattr(request, _CHECK_RUNNING, checked)
        try:
            response = self.get_response(request)
            if response.status_code == 401 and presented:
                _guarded(note_auth_failure, client_address(request))
        finally:
            auth_check_ended(request)
        return response


def _reads_credentials(request) -> bool:
    """Whether ``request``'s view reads credentials: a probe (``/v1/health``, ``/health``)
    and the public documents (``authentication_classes = []``) do not, and are answered to a
    locked-out address whatever headers it sends (``learning()`` sends its key with its
    health check, was refused, and told to start a memsvc that ran: review)."""
    try:
        view = resolve(request.path_info).func
    except Http404:  # (a path no URL takes: its 404 reads nothing either)
        return False
    return getattr(getattr(view, "view_class", None), "authentication_classes", None) != []


# The request attribute holding the end of its credential check (``auth_attempt``'s
# ``checked``): near the failure limit only.
_CHECK_RUNNING = "memsvc_auth_check_running"


def auth_check_ended(request) -> None:
    """The end of ``request``'s credential check (Django's request or DRF's), if it is
    counted as running (``auth_attempt``): by the authentication that accepts its
    credentials, else once it is answered (a failure counted first, by the middleware).
    Counted until the answer, a right request held back the others of its address for its
    view's whole time (one waiting on a lock: the others waited 5 s each, then were
    refused; review)."""
    request = getattr(request, "_request", request)
    ended = request.__dict__.pop(_CHECK_RUNNING, None)
    if ended is not None:
        _guarded(ended)


def request_auth_attempt(request) -> tuple[RateLimited | None, Callable[[], None] | None]:
    """``auth_attempt`` for ``request``'s address; nothing refused or counted without a
    request (a password checked from a shell) or when a statement fails. A database that
    is not there (``database_gone``) raises: the request, which reads it to check its
    credentials, would wait for a connection once more (review: a 503 after 20 s, two
    connection timeouts)."""
    if request is None:
        return None, None
    try:
        return auth_attempt(client_address(request))
    except DatabaseError as exc:
        if database_gone(exc):
            raise
        _say_uncounted()
        return None, None


# Password checks run at once in a process at most (Django's PBKDF2 is about 0.25 s of CPU
# each): a flood of wrong passwords, from as many addresses as the lockout counts apart,
# took both cores from every other request (review). One more is refused at once (429).
PASSWORD_CHECKS_AT_ONCE = 2
_password_checks = threading.BoundedSemaphore(PASSWORD_CHECKS_AT_ONCE)
LOGINS_BUSY = "Too many logins are being checked right now. Please try again in a moment."


class LockoutModelBackend(ModelBackend):
    """Django's password check for the web pages and the admin, refused outright for an
    address locked out by failed authentications, as the APIs refuse its credentials:
    guessing a password gets no session. Its answer is final (a refusal raises
    ``PermissionDenied``, which ends ``authenticate()``): ``ModelBackend``, listed after it
    only so that sessions made before keep their backend, never checks a password again.

    It counts the wrong passwords itself and, near the limit, the (slow) hash checks running
    (``auth_attempt``), as ``RateLimitMiddleware`` does, so that a burst of guesses at once
    gets no more checks than the limit. Counted only once checked (on Django's
    ``user_login_failed``), every guess of a burst was checked (12 at once, a limit of 3: 12
    checked)."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is not None:
            # The password is this request's credential: a header the middleware counted
            # (a proxy's ``Authorization: Basic``) is checked by nothing here, and counted
            # twice the login waited for itself, then was refused (review).
            auth_check_ended(request)
        refusal, checked = request_auth_attempt(request)
        # (A password checked from a shell, without a request, is not held to the cap.)
        capped = request is not None
        if refusal is None and capped and not _password_checks.acquire(blocking=False):
            refusal = RateLimited(1, LOGINS_BUSY)
            if checked is not None:
                _guarded(checked)
        if refusal is not None:
            setattr(request, LOGIN_REFUSAL, refusal)  # (for the login form to say so)
            raise PermissionDenied
        try:
            user = super().authenticate(request, username, password, **kwargs)
            if user is None and request is not None:
                _guarded(note_auth_failure, client_address(request))
        finally:
            if capped:
                _password_checks.release()
            if checked is not None:
                _guarded(checked)
        if user is None:
            raise PermissionDenied
        return user


# The request attribute holding ``LockoutModelBackend``'s refusal of a locked-out address.
LOGIN_REFUSAL = "memsvc_login_refusal"


def login_refusal(request) -> RateLimited | None:
    """Why a password login of ``request`` was refused without its password being checked
    (its address locked out, ``LockoutModelBackend``), or None."""
    return getattr(request, LOGIN_REFUSAL, None)
