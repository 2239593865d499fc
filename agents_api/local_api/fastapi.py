"""Answers as the seed's FastAPI server gives them (``{"detail": ...}``, bad input as 422
naming where it is), for the local API and the Letta API alike: a body read as FastAPI reads
one, and errors rendered as it renders them."""

from django.http import JsonResponse
from rest_framework import exceptions as drf
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.response import Response

from agents_api.local_api import serializers as s
from memsvc.api.errors import ApiError, InvalidInput


def render_local_error(error: ApiError) -> JsonResponse:
    """An ``ApiError`` as the seed's FastAPI server answers: ``{"detail": ...}``, bad input
    as 422 naming where it is."""
    if isinstance(error, InvalidInput):
        issues = [
            {"type": "value_error", "loc": [error.location, *_place(field)], "msg": problem}
            for field, problems in error.details.items()
            for problem in problems
        ]
        response = JsonResponse({"detail": issues or error.message}, status=422)
    else:
        response = JsonResponse({"detail": error.message}, status=error.status_code)
    for name, value in error.headers.items():
        response[name] = value
    return response


def _place(field: str) -> list:
    """A dotted field name (``InvalidInput.within``) as FastAPI's ``loc`` names it: its
    parts, list indexes as numbers."""
    return [int(part) if part.isdigit() else part for part in field.split(".")]


class FastApiBodies(DefaultContentNegotiation):
    """A body read as the seed's FastAPI server reads one: as JSON when it names no type
    (a client that sent JSON without saying so got a 415; review), or a JSON type
    (``application/json``, ``application/...+json``); a body of another type is no object
    of the fields asked for (422, ``fastapi_errors``)."""

    def select_parser(self, request, parsers):
        media_type = request._request.content_type  # (Django's: without parameters, lower case)
        if not media_type or (
            media_type.startswith("application/") and media_type.endswith("+json")
        ):
            return next(parser for parser in parsers if parser.media_type == "application/json")
        return super().select_parser(request, parsers)


def fastapi_errors(exc, context):
    """Errors as the seed's FastAPI server answers them."""
    if isinstance(exc, drf.UnsupportedMediaType):  # (FastAPI reads the body as bytes)
        exc = drf.ParseError("Input should be a valid dictionary or object to extract fields from")
    if isinstance(exc, drf.ValidationError | drf.ParseError):
        detail = exc.detail if isinstance(exc, drf.ValidationError) else {"body": [str(exc.detail)]}
        return Response({"detail": s.validation_detail(detail)}, status=422)
    if isinstance(exc, ApiError):
        return render_local_error(exc)
    if isinstance(exc, drf.APIException):
        return Response({"detail": str(exc.detail)}, status=exc.status_code)
    return None
