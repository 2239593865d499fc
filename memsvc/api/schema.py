"""OpenAPI helpers: the error shape, the error responses each operation documents, and the
view that serves the document."""

from django.conf import settings
from django.http import HttpResponse
from django.utils import translation
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer


class ErrorSerializer(serializers.Serializer):
    error = serializers.CharField(help_text="What went wrong, readable by a person.")
    code = serializers.ChoiceField(
        choices=[
            "validation_error",
            "unauthorized",
            "forbidden",
            "not_found",
            "conflict",
            "rate_limited",
            "method_not_allowed",
            "unsupported_media_type",
            "not_acceptable",
            "payload_too_large",
            "unavailable",
            # (A fault of the server's own, never the client's input: logged with the
            # request's X-Request-Id. It was in no list: review.)
            "internal_error",
        ]
    )
    details = serializers.DictField(
        help_text="For validation errors: the fields at fault and their problems."
    )

    class Meta:
        ref_name = "Error"


_DESCRIPTIONS = {
    400: "Invalid input (`validation_error`), naming the field.",
    401: "No or bad credentials, or a credential of the wrong kind for this API.",
    403: "A member below the needed level, a missing scope, or a refused policy.",
    404: "Missing, or not visible to the caller.",
    406: "An `Accept` header that takes no JSON (`not_acceptable`).",
    409: "Conflicts with the current state.",
    413: "The body is larger than the server takes (`payload_too_large`).",
    415: "A body that is not JSON (`unsupported_media_type`).",
    429: "Over a rate limit (`rate_limited`); `Retry-After` says when to try again.",
    503: (
        "A service it needs is unreachable (`unavailable`): the database, for a semantic"
        " search the embedding service, for a token of an OIDC issuer the issuer's key set;"
        " try again shortly."
    ),
}


def paged(serializer_class, name: str):
    """The schema of a paged list: ``{"data": [...], "nextCursor": ...}``."""
    return type(
        name,
        (serializers.Serializer,),
        {
            "data": serializer_class(many=True),
            "nextCursor": serializers.CharField(allow_null=True),
            "Meta": type("Meta", (), {"ref_name": name}),
        },
    )


def listed(serializer_class, name: str):
    """The schema of an unpaged list: ``{"data": [...]}``."""
    return type(
        name,
        (serializers.Serializer,),
        {"data": serializer_class(many=True), "Meta": type("Meta", (), {"ref_name": name})},
    )


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    return {
        code: OpenApiResponse(ErrorSerializer, description=_DESCRIPTIONS[code]) for code in codes
    }


class JWTAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "memsvc.api.jwt_auth.JWTAuthentication"
    name = "UserJWT"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "JWT",
            "description": "A user's JWT (`sub` is the user id).",
        }


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "agents_api.authentication.ApiKeyAuthentication"
    name = "AgentApiKey"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "msk_<id>_<secret>",
            "description": "An agent's API key (also accepted as `X-API-Key`).",
        }


def _input_serializers():
    """Every request body class (``InputSerializer`` subclasses) with its component name."""
    from memsvc.api.fields import InputSerializer

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    for cls in subclasses(InputSerializer):
        name = getattr(getattr(cls, "Meta", None), "ref_name", None)
        if name:
            yield name, cls


def forbid_unknown_request_fields(result, generator, request, public):
    """Request bodies refuse unknown fields (``InputSerializer``); say so in the schema."""
    names = {name for name, _ in _input_serializers()}
    names |= {f"Patched{n}" for n in names}
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name in names and component.get("type") == "object":
            component["additionalProperties"] = False
    return result


def state_enforced_constraints(result, generator, request, public):
    """What the server refuses and drf-spectacular does not write down, written down:

    - list sizes of request bodies (``allow_empty=False`` -> ``minItems: 1``, ``max_length``
      -> ``maxItems``);
    - a body's own rules across fields (``InputSerializer.schema_rules``, JSON Schema: the
      block PATCH's "at most one of value, append, replace");
    - the refusals any ``/v1`` operation may answer whatever its input: 400 (a NUL in a
      query parameter; on ``/v1/user``, a token whose ``sub`` cannot be a user id), 429 (rate
      limits), 503 (database down), 406 (an ``Accept`` that takes no JSON), 413 (a body over
      the cap, which a GET may send too), and 415 (not JSON) for those with a body; of
      these, health answers 400, 406 and 413 only. (A 405 is a method its path has no
      operation for: OpenAPI has no place to say it; the README does.)
    """
    from rest_framework import serializers

    schemas = result.get("components", {}).get("schemas", {})
    for name, cls in _input_serializers():
        component = schemas.get(name)
        if component is None:
            continue
        properties = component.get("properties", {})
        for field_name, field in cls().fields.items():
            prop = properties.get(field_name)
            if prop is None or not isinstance(
                field, serializers.ListSerializer | serializers.ListField
            ):
                continue
            if not field.allow_empty:
                prop["minItems"] = max(prop.get("minItems", 1), 1)
            if field.min_length is not None:
                prop["minItems"] = field.min_length
            if field.max_length is not None:
                prop["maxItems"] = field.max_length
        component.update(getattr(cls, "schema_rules", {}))

    for path, operations in result.get("paths", {}).items():
        if not path.startswith("/v1/"):
            continue
        for operation in operations.values():
            if path == "/v1/health":  # (never limited; its 503 is its own body)
                codes = (400, 413)
            elif "requestBody" in operation:
                codes = (400, 413, 415, 429, 503)
            else:
                codes = (400, 413, 429, 503)
            codes += (406,)
            for code, response in errors(*codes).items():
                operation["responses"].setdefault(
                    str(code),
                    {
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                        },
                        "description": response.description,
                    },
                )
    return result


class RefusalsInJson:
    """For a view whose answer is a document of its own format (YAML, an HTML page): a
    refusal (an unknown ``?format=``, an ``Accept`` of no format it writes, a method it
    does not take) is the API's JSON error, not written in that format (review)."""

    def finalize_response(self, request, response, *args, **kwargs):
        if response.status_code >= 400:
            request.accepted_renderer, request.accepted_media_type = (
                JSONRenderer(),
                "application/json",
            )
        return super().finalize_response(request, response, *args, **kwargs)


class SchemaView(RefusalsInJson, SpectacularAPIView):
    """``/v1/schema``: the OpenAPI document, made and written out (YAML, JSON) once per
    process, language and format, then served as it was written. A public document (no
    credentials, no rate limit: the rate limits need the database), it was made afresh for
    each request: about 0.2 s of CPU each, which anyone could ask for in a loop; made once
    but written out each time, YAML (the default) still cost 0.09 s (reviews). It depends
    on the code alone, not on who asks."""

    authentication_classes = []
    permission_classes = []
    throttle_classes = []
    made: dict[str, dict] = {}  # language -> the schema
    written: dict[tuple[str, str], bytes] = {}  # (language, format) -> the document

    def _get_schema_response(self, request):
        language = translation.get_language()
        if language not in dict(settings.LANGUAGES):  # (``?lang=`` is anyone's to write)
            language = settings.LANGUAGE_CODE
        schema = self.made.get(language)
        if schema is None:
            schema = self.made.setdefault(language, super()._get_schema_response(request).data)
        # Written as the format's own media type says (an ``Accept``'s parameters, such as
        # JSON's ``indent``, are anyone's to vary: a document for each was no cache).
        renderer = request.accepted_renderer
        body = self.written.get((language, renderer.format))
        if body is None:
            written = renderer.render(schema, renderer.media_type, self.get_renderer_context())
            body = self.written.setdefault((language, renderer.format), written)
        content_type = renderer.media_type
        if renderer.charset:
            content_type = f"{content_type}; charset={renderer.charset}"
        version = None  # (the API has one version: ``_get_schema_response``'s)
        filename = self._get_filename(request, version)
        response = HttpResponse(body, content_type=content_type)
        response["Content-Disposition"] = f'inline; filename="{filename}"'
        return response


class DocsView(RefusalsInJson, SpectacularSwaggerView):
    """``/v1/docs``: the schema's Swagger UI, a public page (no credentials, no rate limit)
    to open, and nothing else: DRF's answer to its OPTIONS, written by the page's template
    renderer, which has no template for it, was a 500 (review)."""

    http_method_names = ["get", "head"]
    authentication_classes = []
    permission_classes = []
    throttle_classes = []
