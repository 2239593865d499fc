"""Refusals outside any view's own error handling, answered in the shape of the API asked
(``errors.render_api_error``): never Django's HTML pages, never a 500 for a client's input
or for a database that is down.

- Before the view: a NUL character in the path or the query (PostgreSQL cannot store or
  compare it) -> 400; a body larger than ``MEMSVC_MAX_BODY_BYTES`` -> 413, decided from
  ``Content-Length`` before anything parses it, the body then read and dropped so that a
  keep-alive connection stays usable (``discard_body``).
- After a view raised what its own handler left alone: the database unreachable (or a
  statement cancelled) -> 503 ``unavailable``; a value the database refused (``DataError``)
  -> 400; Django's own ``RequestDataTooBig`` -> 413, and its ``TooManyFieldsSent`` (more
  query parameters than ``DATA_UPLOAD_MAX_NUMBER_FIELDS``) -> 400; anything else (a bug) is
  logged as Django logs it and answered as a JSON 500.
"""

import logging
from urllib.parse import unquote_plus, unquote_to_bytes

from django.conf import settings
from django.core import signals
from django.core.exceptions import DisallowedHost, RequestDataTooBig, TooManyFieldsSent
from django.db import DataError, IntegrityError, connections
from django.http import HttpResponse, HttpResponseBadRequest
from django.urls import Resolver404, resolve
from psycopg import errors

from memsvc.api.errors import (
    ApiError,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    Unavailable,
    render_api_error,
)
from memsvc.db import DATABASE_DID_NOT_ANSWER, DATABASE_GONE_SAID, database_gone
from memsvc.text import named

logger = logging.getLogger("django.request")
security_logger = logging.getLogger("django.security.DisallowedHost")

# A refused body is read and dropped when it is at most this many times the cap.
DISCARD_MAX_FACTOR = 2
DISCARD_CHUNK_BYTES = 64 * 1024

ADMIN_PREFIX = "/admin/"  # (memsvc.urls)
LETTA_VIEWS = "agents_api.letta_api."  # Letta's routes, under /v1/ too


class InternalError(ApiError):
    status_code = 500
    code = "internal_error"
    default_message = "internal error"


def _nul_path_parameter(path: str) -> str:
    """The name of the path parameter that holds a NUL character (``path`` when none does),
    as the API documents it: ``/v1``'s are camelCase (``userId``, not the route's
    ``user_id``), the local API's and Letta's (``/v1/blocks/...``: ``block_id``) as their
    routes name them."""
    try:
        match = resolve(path)
    except Resolver404:
        return "path"
    name = next((name for name, value in match.kwargs.items() if "\x00" in str(value)), "path")
    if path.startswith("/v1/") and not match.func.__module__.startswith(LETTA_VIEWS):
        first, *rest = name.split("_")
        name = first + "".join(part.capitalize() for part in rest)
    return name


def _not_utf8_parameter(query: str) -> str | None:
    """The name of the first query parameter whose percent-encoded bytes are no UTF-8 (a
    lone surrogate's among them), or None. Django reads them with U+FFFD in their place:
    "?userId=a%FFb" listed the memories of a user no one named (review)."""
    for part in query.split("&"):
        try:
            unquote_to_bytes(part).decode("utf-8")
        except UnicodeDecodeError:
            return named(unquote_plus(part.partition("=")[0], errors="replace"))
    return None


def request_refusal(request) -> ApiError | None:
    """What makes ``request`` unanswerable before any view reads it, or None."""
    if "\x00" in request.path_info:
        return InvalidInput.for_field(
            _nul_path_parameter(request.path_info),
            "must not contain NUL characters",
            location="path",
        )
    query = request.META.get("QUERY_STRING", "")
    if "\x00" in unquote_plus(query):
        for name, values in request.GET.lists():
            if "\x00" in name or any("\x00" in value for value in values):
                return InvalidInput.for_field(
                    name.replace("\x00", "\\x00"),
                    "must not contain NUL characters",
                    location="query",
                )
        return InvalidInput.for_field("query", "must not contain NUL characters", location="query")
    if "%" in query:
        not_text = _not_utf8_parameter(query)
        if not_text is not None:
            return InvalidInput.for_field(not_text, "must be UTF-8 text", location="query")
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return InvalidInput.for_field("Content-Length", "must be a number")
    if length > settings.MEMSVC_MAX_BODY_BYTES:
        return PayloadTooLarge(f"the body must be at most {settings.MEMSVC_MAX_BODY_BYTES} bytes")
    return None


def discard_body(request) -> None:
    """Read and drop a refused body (up to ``DISCARD_MAX_FACTOR`` times the cap), so the
    connection can carry the client's next request, under a WSGI server (gunicorn's sync
    workers drain at most 64 KiB of what an application left unread, and close a keep-alive
    connection that had more; a body past the bound is left to that). Under ``memsvc
    serve`` the ASGI handler has dropped it already (``memsvc.asgi``): nothing is left."""
    length = int(request.META.get("CONTENT_LENGTH") or 0)
    if length > settings.MEMSVC_MAX_BODY_BYTES * DISCARD_MAX_FACTOR:
        return
    try:
        while request.read(DISCARD_CHUNK_BYTES):
            pass
    except OSError:
        pass  # the client went away: nothing to keep


def exception_refusal(exception: Exception) -> ApiError:
    if isinstance(exception, RequestDataTooBig):
        return PayloadTooLarge(f"the body must be at most {settings.MEMSVC_MAX_BODY_BYTES} bytes")
    if isinstance(exception, TooManyFieldsSent):
        return InvalidInput.for_field(
            "query",
            f"at most {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} parameters",
            location="query",
        )
    if isinstance(exception, DATABASE_DID_NOT_ANSWER):
        # A broken connection must not stay with this thread: the next request reconnects.
        for connection in connections.all(initialized_only=True):
            connection.close_if_unusable_or_obsolete()
        return Unavailable()
    if isinstance(exception, DataError):
        return InvalidInput("a value in the request cannot be stored")
    if isinstance(exception, IntegrityError) and isinstance(
        exception.__cause__, errors.ForeignKeyViolation
    ):
        # Checked at commit: a row the write refers to (its agent, its conversation) was
        # deleted by a request that committed first. As a change racing a deletion: 404. (A
        # memory or a key saved while its agent was deleted was a 500: review.)
        logger.warning("a write refers to a row deleted meanwhile", exc_info=exception)
        return NotFound("what this request refers to was deleted meanwhile")
    return InternalError()


# When a page refused in an outage says to come back (a few restarts of the database).
UNAVAILABLE_RETRY_SECONDS = 5


def _admin_refusal(request, refusal: ApiError) -> HttpResponseBadRequest | None:
    """The admin's answer to a request PostgreSQL cannot take (a NUL, a value the database
    refused: its lists filter on what the query names, a 500 before): Django's own page for a
    bad request, as the admin has. None for another path."""
    if not request.path_info.startswith(ADMIN_PREFIX):
        return None
    return HttpResponseBadRequest(refusal.message, content_type="text/plain")


def unavailable_response(request, refusal: Unavailable) -> HttpResponse:
    """``refusal`` as the API that serves ``request`` answers it; on the web pages and the
    admin, a plain 503 too: an outage, not a bug's 500 (their 500 page said the server had
    failed while every API said 503; review)."""
    response = render_api_error(request, refusal)
    if response is None:
        response = HttpResponse(refusal.message, status=503, content_type="text/plain")
        retry = refusal.headers.get("Retry-After", str(UNAVAILABLE_RETRY_SECONDS))
        response["Retry-After"] = retry
    return response


def _kept_by_no_cache(response):
    """An API's JSON answer (a user's conversations, memories, keys) marked
    ``Cache-Control: no-store``, as the pages and the export are: without it a browser or a
    proxy that ignores ``Authorization`` could keep it (review). An answer that says how it
    may be kept (the OpenAPI document) is left as it is."""
    if not response.has_header("Cache-Control") and response.get("Content-Type", "").startswith(
        "application/json"
    ):
        response["Cache-Control"] = "no-store"
    return response


class ApiErrorMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return _kept_by_no_cache(self._answer(request))

    def _answer(self, request):
        response = self._refused_host(request)
        if response is not None:
            return response
        refusal = request_refusal(request)
        if refusal is not None:
            response = render_api_error(request, refusal) or _admin_refusal(request, refusal)
            if response is not None:
                if isinstance(refusal, PayloadTooLarge):
                    discard_body(request)
                return response
        return self.get_response(request)

    @staticmethod
    def _refused_host(request):
        """An API's answer to a ``Host`` not in ``DJANGO_ALLOWED_HOSTS``, logged as Django
        logs it (Django's own answer, from CommonMiddleware, is an HTML page: the pages
        and the admin keep it); None for a host it answers for, or not an API."""
        try:
            request.get_host()
            return None
        except DisallowedHost as refused:
            problem = "names no host this server answers for (DJANGO_ALLOWED_HOSTS)"
            error = InvalidInput.for_field("Host", problem, location="header")
            response = render_api_error(request, error)
            if response is not None:
                security_logger.warning(str(refused))
            return response

    def process_exception(self, request, exception):
        return exception_response(request, exception)


def exception_response(request, exception):
    """The answer to ``exception`` raised by a view (or a step before it): the API's refusal
    in its shape, an outage's 503 for the pages and the admin too; None for Django's own
    handling (an exception of a page that is not the database's)."""
    refusal = exception_refusal(exception)
    if isinstance(refusal, Unavailable):
        response = unavailable_response(request, refusal)
    else:
        response = render_api_error(request, refusal)
        if response is None:
            if isinstance(exception, DataError):
                return _admin_refusal(request, refusal)
            return None  # not an API: Django's own handling
    # The path as Django's own lines log one, escaped: a newline or an escape sequence in it
    # wrote a line of the client's own into the log (review).
    path = request.path.encode("unicode_escape").decode("ascii")
    if isinstance(refusal, Unavailable) and database_gone(exception):
        # Said once a minute, with a traceback of what failed; Django's own line of each
        # 503 left out too (``log_response``'s mark). (A statement's own failure, a
        # timeout or a deadlock, is said by each request, as before: code review.)
        DATABASE_GONE_SAID.say(
            logger.error,
            "%s: %s (said once a minute while it lasts)",
            refusal.message,
            path,
            exc_info=exception,
            extra={"status_code": refusal.status_code, "request": request},
        )
        response._has_been_logged = True
    elif isinstance(refusal, InternalError | Unavailable):
        logger.error(
            "%s: %s",
            refusal.message,
            path,
            exc_info=exception,
            extra={"status_code": refusal.status_code, "request": request},
        )
    if isinstance(refusal, InternalError):
        # What Django sends for an unhandled exception (the test client re-raises it).
        signals.got_request_exception.send(sender=None, request=request)
    return response
