"""The base of every ``/v1/user`` view, whichever app serves it: a user's JWT, nothing else;
and of every ``/v1/agent`` view (``ApiView``)."""

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.views import APIView

from memsvc.api.errors import InvalidInput
from memsvc.api.jwt_auth import JWTAuthentication


def user_operation(operation_id: str, **kwargs):
    return extend_schema(operation_id=operation_id, tags=["user"], **kwargs)


# The base of every view of ``/v1/user`` and ``/v1/agent``. (No docstring: the OpenAPI
# schema would give it to every operation without a description of its own.)
class ApiView(APIView):
    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        # No parameter of theirs is a list: one given twice ("?limit=abc&limit=2") was read
        # as its last, the other never checked (review).
        for name, values in request.query_params.lists():
            if len(values) > 1:
                raise InvalidInput.for_field(name, "must be given once", location="query")


class UserApiView(ApiView):
    authentication_classes = [JWTAuthentication]
    permission_classes = [IsAuthenticated]
