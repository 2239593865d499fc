"""The one error shape of the /v1 API: ``{"error": ..., "code": ..., "details": {...}}``.

Services raise the ``ApiError`` subclasses below (or Django's ``ValidationError``); DRF's own
exceptions (parse errors, authentication failures, throttling) are translated here too, so a
client sees the same shape whatever refused its request.
"""

import uuid

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions as drf
from rest_framework.response import Response

from memsvc.text import named


class ApiError(Exception):
    status_code = 400
    code = "error"
    default_message = "request refused"

    def __init__(
        self,
        message: str | None = None,
        *,
        details: dict | None = None,
        headers: dict[str, str] | None = None,
    ):
        self.message = message or self.default_message
        self.details = details or {}
        self.headers = headers or {}
        super().__init__(self.message)

    def named(self, names: dict[str, str]) -> "ApiError":
        """The same refusal with its fields named as the caller named them (``names``: the
        service's name -> the caller's): a page's ``q`` for the API's ``query``, an MCP
        tool's argument for the API field it fills (a model was told to fix an ``append`` it
        never sent; review)."""
        message = self.message
        for name, given in names.items():
            if message.startswith(f"{name}:"):
                message = f"{given}{message[len(name) :]}"
                break
        # (Not ``copy.copy``, which calls the class with ``args``: ``RateLimited`` takes others.)
        error = type(self).__new__(type(self), message)
        error.__dict__.update(self.__dict__)
        error.message = message
        error.details = {
            names.get(field, field): problems for field, problems in self.details.items()
        }
        return error


class InvalidInput(ApiError):
    status_code = 400
    code = "validation_error"
    default_message = "invalid input"

    # Where the named fields are ("body", "path", "query"): the local API's 422 says it.
    location = "body"

    @classmethod
    def for_field(cls, field: str, problem: str, *, location: str = "body") -> "InvalidInput":
        error = cls(f"{field}: {problem}", details={field: [problem]})
        error.location = location
        return error

    def within(self, place: str) -> "InvalidInput":
        """The same refusal of a part of the input at ``place`` ("memory_blocks.0"): its
        fields named from there, dotted."""
        details = {f"{place}.{field}": problems for field, problems in self.details.items()}
        error = type(self)(f"{place}.{self.message}", details=details)
        error.location = self.location
        return error


class Unauthorized(ApiError):
    status_code = 401
    code = "unauthorized"
    default_message = "missing or invalid credentials"


class Forbidden(ApiError):
    status_code = 403
    code = "forbidden"
    default_message = "not allowed"


class NotFound(ApiError):
    status_code = 404
    code = "not_found"
    default_message = "not found"


def one_or_404(queryset, row_id, what: str):
    """The row of ``queryset`` with this id; 404 "<what> not found" for an id that is not a
    UUID, not there, or not in the queryset (a stranger's row reads as no row)."""
    try:
        row_id = uuid.UUID(str(row_id))
    except ValueError:
        raise NotFound(f"{what} not found") from None
    row = queryset.filter(id=row_id).first()
    if row is None:
        raise NotFound(f"{what} not found")
    return row


class Conflict(ApiError):
    status_code = 409
    code = "conflict"
    default_message = "conflicts with the current state"


class PayloadTooLarge(ApiError):
    status_code = 413
    code = "payload_too_large"
    default_message = "request body too large"


class RateLimited(ApiError):
    status_code = 429
    code = "rate_limited"
    default_message = "too many requests"

    def __init__(self, retry_after: int, message: str | None = None):
        super().__init__(message, headers={"Retry-After": str(max(1, retry_after))})


class Unavailable(ApiError):
    status_code = 503
    code = "unavailable"
    default_message = "the service is unavailable, try again shortly"


def error_body(message: str, code: str, details: dict | None = None) -> dict:
    return {"error": message, "code": code, "details": details or {}}


def flattened_details(detail) -> dict:
    """DRF's nested error detail -> ``{"field": ["problem", ...]}`` with dotted paths."""
    flat: dict[str, list[str]] = {}

    def walk(value, path):
        if isinstance(value, dict):
            for key, sub in value.items():
                if isinstance(key, int):  # DRF reports a list's bad items by index
                    walk(sub, f"{path}[{key}]")
                elif key == "non_field_errors" and path:
                    walk(sub, path)  # a nested list's own problem (too long, empty)
                else:
                    walk(sub, f"{path}.{key}" if path else str(key))
        elif isinstance(value, list) and value and not all(isinstance(v, str) for v in value):
            for index, sub in enumerate(value):
                walk(sub, f"{path}[{index}]" if path else f"[{index}]")
        else:
            items = value if isinstance(value, list) else [value]
            flat.setdefault(path or "non_field_errors", []).extend(str(v) for v in items)

    walk(detail, "")
    return flat


def _invalid(details: dict) -> InvalidInput:
    first_field = next(iter(details), "non_field_errors")
    message = f"{first_field}: {details[first_field][0]}" if details else "invalid input"
    return InvalidInput(message, details=details)


def _validation_response(details: dict) -> Response:
    invalid = _invalid(details)
    return Response(error_body(invalid.message, invalid.code, invalid.details), status=400)


def as_api_error(exc: Exception) -> ApiError | None:
    """A refusal as the API reports it: an ``ApiError`` as it is, a validation error of DRF or
    Django as ``InvalidInput`` naming the field; None for anything else (a bug). For callers
    outside DRF's views (the MCP server's tools)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, DjangoValidationError):
        if hasattr(exc, "error_dict"):
            return _invalid(flattened_details(exc.message_dict))
        return _invalid({"non_field_errors": exc.messages})
    if isinstance(exc, drf.ValidationError):
        return _invalid(flattened_details(exc.detail))
    return None


def exception_handler(exc, context):
    error = as_api_error(exc)
    if error is not None:
        response = Response(error_body(error.message, error.code, error.details), error.status_code)
        for name, value in error.headers.items():
            response[name] = value
        if isinstance(error, Unauthorized):
            response["WWW-Authenticate"] = "Bearer"
        return response
    if isinstance(exc, drf.ParseError):
        return _validation_response({"body": [str(exc.detail)]})
    if isinstance(exc, drf.NotAuthenticated | drf.AuthenticationFailed):
        response = Response(error_body(str(exc.detail), Unauthorized.code), status=401)
        response["WWW-Authenticate"] = "Bearer"
        return response
    if isinstance(exc, drf.PermissionDenied | DjangoPermissionDenied):
        return Response(error_body("not allowed", Forbidden.code), status=403)
    if isinstance(exc, drf.NotFound | Http404):
        return Response(error_body("not found", NotFound.code), status=404)
    if isinstance(exc, drf.Throttled):
        response = Response(error_body(str(exc.detail), RateLimited.code), status=429)
        if exc.wait:
            response["Retry-After"] = str(int(exc.wait))
        return response
    if isinstance(exc, drf.MethodNotAllowed):
        return Response(error_body(str(exc.detail), "method_not_allowed"), status=405)
    if isinstance(exc, drf.UnsupportedMediaType):
        return Response(error_body(str(exc.detail), "unsupported_media_type"), status=415)
    if isinstance(exc, drf.NotAcceptable):
        return Response(error_body(str(exc.detail), "not_acceptable"), status=406)
    return None  # anything else is a bug: let it be a 500 and reach the logs


def render_v1_error(error: ApiError, shaped=None) -> JsonResponse:
    """``error`` in the /v1 shape (``error_body``), or as ``shaped(body)`` makes it."""
    body = error_body(error.message, error.code, error.details)
    response = JsonResponse(body if shaped is None else shaped(body), status=error.status_code)
    for name, value in error.headers.items():
        response[name] = value
    return response


def render_api_error(request, error: ApiError) -> HttpResponse | None:
    """``error`` as the API that serves ``request.path_info`` answers errors, or None for a
    path that is no API's (the admin, web pages: Django's own pages).

    The shape belongs to the view: a view class with a ``render_error(error)`` static method
    (the local compatibility API's ``LocalView``) answers in its own shape; anything under
    ``/v1`` in the ``/v1`` shape. Used where a refusal happens outside a view's own error
    handling: the middleware (body too large, NUL in the path, database down, rate limits).
    """
    try:
        view_class = getattr(resolve(request.path_info).func, "view_class", None)
    except Resolver404:
        view_class = None
    render = getattr(view_class, "render_error", None)
    if render is None and (request.path_info == "/v1" or request.path_info.startswith("/v1/")):
        render = render_v1_error
    if render is None:
        return None
    response = render(error)
    # Answered before CommonMiddleware (which would add it): without a length the server
    # would send the few bytes chunked.
    response["Content-Length"] = str(len(response.content))
    return response


@csrf_exempt  # an API route: no cookies, so no CSRF; and a 404 must not become a 403
def not_found_view(request, *args, instead: str = "", **kwargs):
    """404 in the API's shape; ``instead``: the route meant, most likely. A route whose id
    is no UUID is named as such: "no such route" sent its client looking for a wrong URL
    (``/v1/agent/memories/notauuid``; review)."""
    if instead:
        said = f"no such route (the endpoint is {instead})"
    elif (malformed := _malformed_id(request.path_info)) is not None:
        said = f"not found: {named(malformed)!r} is no id (an id is a UUID)"
    else:
        said = "no such route"
    return JsonResponse(error_body(said, NotFound.code), status=404)


_SOME_ID = str(uuid.UUID(int=0))


def _malformed_id(path: str) -> str | None:
    """The segment of ``path`` (``/v1/...``) after ``/v1`` that, were it a UUID, would make
    it a route of ``/v1``; None if none."""
    parts = path.split("/")
    for index, part in enumerate(parts[2:], start=2):
        if not part or part == _SOME_ID:
            continue
        candidate = "/".join([*parts[:index], _SOME_ID, *parts[index + 1 :]])
        try:
            match = resolve(candidate)
        except Resolver404:
            continue
        if match.func is not not_found_view:
            return part
    return None
