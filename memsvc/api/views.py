"""The base of every ``/v1/user`` view, whichever app serves it: a user's JWT, nothing else;
and of every ``/v1/agent`` view (``ApiView``)."""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.views import APIView

from memsvc.api.errors import InvalidInput
from memsvc.api.fields import only_query_parameters
from memsvc.api.jwt_auth import JWTAuthentication
from memsvc.api.ratelimit import CountedBeforePermissions


def operation(operation_id: str, *, parameters=(), **kwargs):
    """An operation of the OpenAPI description (drf-spectacular's ``extend_schema``) whose
    query is what its ``parameters`` name: any other query parameter is a 400 naming it
    (``ApiView.initial``; the description of every /v1 operation says it may answer 400:
    ``schema.state_enforced_constraints``). A misspelt filter read as none answered another list than the
    one asked for (``?userid=alice``: the agent's own memories; review)."""
    parameters = list(parameters)
    if not all(isinstance(parameter, OpenApiParameter) for parameter in parameters):
        # (A serializer's fields would be parameters the check below does not know.)
        raise TypeError(f"{operation_id}: parameters are OpenApiParameter objects")
    described = extend_schema(operation_id=operation_id, parameters=parameters, **kwargs)
    names = frozenset(
        parameter.name for parameter in parameters if parameter.location == OpenApiParameter.QUERY
    )

    def decorate(method):
        method = described(method)
        method.query_parameters = names
        return method

    return decorate


def user_operation(operation_id: str, **kwargs):
    return operation(operation_id, tags=["user"], **kwargs)


# The base of every view of ``/v1/user`` and ``/v1/agent``. (No docstring: the OpenAPI
# schema would give it to every operation without a description of its own.)
class ApiView(CountedBeforePermissions, APIView):
    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        # No parameter of theirs is a list: one given twice ("?limit=abc&limit=2") was read
        # as its last, the other never checked (review).
        for name, values in request.query_params.lists():
            if len(values) > 1:
                raise InvalidInput.for_field(name, "must be given once", location="query")
        handler = getattr(self, request.method.lower(), None)
        described = getattr(handler, "query_parameters", None)
        if described is not None:
            only_query_parameters(request, *described)


class UserApiView(ApiView):
    authentication_classes = [JWTAuthentication]
    permission_classes = [IsAuthenticated]
