"""OpenAPI helpers: the error shape, and the error responses each operation documents."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


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
    409: "Conflicts with the current state.",
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


def forbid_unknown_request_fields(result, generator, request, public):
    """Request bodies refuse unknown fields (``InputSerializer``); say so in the schema."""
    from memsvc.api.fields import InputSerializer

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    names = {
        getattr(getattr(c, "Meta", None), "ref_name", None) for c in subclasses(InputSerializer)
    }
    names = {n for n in names if n} | {f"Patched{n}" for n in names if n}
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name in names and component.get("type") == "object":
            component["additionalProperties"] = False
    return result
