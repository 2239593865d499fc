"""The base of every ``/v1/user`` view, whichever app serves it: a user's JWT, nothing else."""

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.views import APIView

from memsvc.api.jwt_auth import JWTAuthentication


def user_operation(operation_id: str, **kwargs):
    return extend_schema(operation_id=operation_id, tags=["user"], **kwargs)


class UserApiView(APIView):
    authentication_classes = [JWTAuthentication]
    permission_classes = [IsAuthenticated]
