import logging

from django.conf import settings
from django.db import DatabaseError, connection
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from memsvc.celery import broker_reachable
from search.embeddings import configured_backend
from search.selectors import pending_embedding_count

logger = logging.getLogger(__name__)

HealthResponse = inline_serializer(
    "Health",
    fields={
        "status": serializers.ChoiceField(choices=["ok", "unavailable"]),
        "database": serializers.CharField(),
        "embeddingBackend": serializers.CharField(),
        "embeddingModel": serializers.CharField(),
        "embeddingDimension": serializers.IntegerField(),
        "pendingEmbeddings": serializers.IntegerField(allow_null=True),
        "broker": serializers.ChoiceField(choices=["reachable", "unreachable"]),
        "reason": serializers.CharField(required=False),
    },
)


class HealthView(APIView):
    """Readiness and liveness: 200 when the database answers, 503 with a reason when not.

    ``broker`` says whether the task broker answers. Without it the service goes on (what
    it would have queued is embedded by the periodic sweep once the broker is back), so it
    does not change the status."""

    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = []  # probes are never refused

    @extend_schema(
        tags=["system"],
        operation_id="health",
        responses={200: HealthResponse, 503: HealthResponse},
    )
    def get(self, request):
        body = {
            "status": "ok",
            "database": "embedded" if settings.DATABASE_URL is None else "external",
            "embeddingBackend": settings.MEMORY_EMBEDDING_BACKEND,
            "embeddingModel": configured_backend().model,
            "embeddingDimension": settings.MEMORY_EMBEDDING_DIMENSION,
            "pendingEmbeddings": None,
            "broker": "reachable" if broker_reachable() else "unreachable",
        }
        try:
            body["pendingEmbeddings"] = pending_embedding_count()
        except DatabaseError:
            # A broken connection must not stick to this worker thread: drop it so the next
            # request reconnects once the database is back.
            connection.close_if_unusable_or_obsolete()
            # The driver's message names hosts, sockets and paths: for the logs, not for
            # whoever probes the service.
            logger.warning("health: database unreachable", exc_info=True)
            body.update(status="unavailable", reason="database unreachable")
            return Response(body, status=503)
        return Response(body)
