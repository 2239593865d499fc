import concurrent.futures
import logging
import os
import shutil
import threading
import time
from datetime import datetime, timedelta
from typing import NamedTuple

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from memsvc.celery import broker_reachable, worker_seen_at
from memsvc.db import not_migrated
from memsvc.embedded_db import socket_dir
from memsvc.outage import Reminder
from search.embeddings import EMBEDDING_FAILING, configured_backend
from search.selectors import PENDING_COUNTED_UP_TO, pending_embedding_counts

logger = logging.getLogger(__name__)

# Each reason said once a minute while it lasts: every probe logged it, a traceback each
# (review); and Django's own line of each 503 is left out (``log_response``'s mark).
_SAID = {
    reason: Reminder()
    for reason in (
        "disk full",
        "database not answering",
        "database not migrated",
        "database unreachable",
    )
}


def unavailable(body: dict) -> Response:
    """A health check's 503 (this one's, the local API's), ``body`` as it is: its reason is
    said in the log once a minute (``_said``), not by Django for each probe."""
    response = Response(body, status=503)
    response._has_been_logged = True
    return response


# A worker that finished no task of the embedding queue for this long is silent: beat's
# sweeps give one a task each minute, and ``worker_seen`` notes one each 10 s at most.
WORKER_SILENT_AFTER = timedelta(seconds=180)


class DatabaseState(NamedTuple):
    backlog: dict[str, int]  # the rows waiting for their embedding, by table
    # (``memsvc.celery.worker_seen_at``: when, and how long ago by the database's clock;
    # None when the database cannot say)
    worker_seen: tuple[datetime | None, timedelta | None] | None


HealthResponse = inline_serializer(
    "Health",
    fields={
        "status": serializers.ChoiceField(choices=["ok", "unavailable"]),
        "database": serializers.CharField(),
        "embeddingBackend": serializers.CharField(),
        "embeddingModel": serializers.CharField(),
        "embeddingDimension": serializers.IntegerField(),
        "embedding": serializers.ChoiceField(
            choices=["ok", "failing"],
            help_text="failing when this web process's last embedding of a search query or "
            f"a saved memory failed less than {EMBEDDING_FAILING.seconds:g} s ago (a remote "
            "backend down or too slow): its searches then rank by keywords alone, and "
            "memories wait for their vector (the worker embeds them later). It does not "
            "change the status.",
        ),
        "pendingEmbeddings": serializers.IntegerField(
            allow_null=True,
            help_text=f"Messages waiting for their embedding, counted up to "
            f"{PENDING_COUNTED_UP_TO:,}; null when the database did not answer, or its disk "
            "is full.",
        ),
        "pendingMemoryEmbeddings": serializers.IntegerField(
            allow_null=True, help_text="Memories waiting for theirs, counted alike."
        ),
        "pendingToolRecordEmbeddings": serializers.IntegerField(
            allow_null=True, help_text="Tool records waiting for theirs, counted alike."
        ),
        "broker": serializers.ChoiceField(choices=["reachable", "unreachable"]),
        "worker": serializers.ChoiceField(
            choices=["active", "silent"],
            allow_null=True,
            help_text="Whether a worker took the embedding queue's tasks lately: active when "
            f"one finished a task in the last {WORKER_SILENT_AFTER.seconds} s (beat's sweeps "
            "give it one each minute, and a worker sends its queue one as it starts), silent "
            "when none did: appended messages then wait for their embedding "
            "(pendingEmbeddings) until one runs. It does not change the status; null when the "
            "database did not answer (or is not migrated to this release).",
        ),
        "workerSeenAt": serializers.DateTimeField(
            allow_null=True,
            help_text="When a worker was last noted finishing one of those tasks (each of its "
            "processes notes it at most every 10 s).",
        ),
        "reason": serializers.CharField(required=False),
    },
)


# How long a probe waits for the database to answer one statement. A server that does not
# answer at all (stopped, a stalled disk, a frozen VM) never reaches its own
# ``statement_timeout``, and the probe waited as long as it was stopped (review: 125 s).
DATABASE_ANSWER_SECONDS = 5


class _DatabaseProbe:
    """The backlogs (``pending_embedding_counts``) read on a thread of its own (with its own
    connection), waited for at most ``DATABASE_ANSWER_SECONDS`` from when it was asked.
    One probe at a time per process: while one waits on a database that does not answer,
    the next asks for no other, and waits only for what is left of that probe's time: told
    no at once once it is up (a thread per probe would pile up behind it; every probe waited
    its whole time again). The thread that answers a probe never reads the database itself:
    it is one of the web process's own for probes (``memsvc.asgi``), which a frozen database
    must not hold (review: health went unanswered for 75 s once every request thread hung
    on one)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pid = None
        self._executor = None
        self._in_flight: concurrent.futures.Future | None = None
        self._sent_at = 0.0

    def state(self, seconds: float) -> DatabaseState | None:
        """What the database said (``_read_state``), or None when it did not answer within
        ``seconds``; ``DatabaseError`` when it refused (down, unreachable, not migrated)."""
        with self._lock:
            if self._pid != os.getpid():  # (a forked child has none of its parent's threads)
                self._pid, self._in_flight = os.getpid(), None
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="health-probe"
                )
            if self._in_flight is None or self._in_flight.done():
                self._in_flight = self._executor.submit(_read_state)
                self._sent_at = time.monotonic()
            probe, left = self._in_flight, self._sent_at + seconds - time.monotonic()
        try:
            return probe.result(timeout=max(left, 0))
        except concurrent.futures.TimeoutError:
            return None


def _read_state() -> DatabaseState:
    # On a connection of its own each time (this thread's, closed after): a connection kept
    # from the last probe said ok while the database refused every new one (PostgreSQL out
    # of processes: 33 of 48 appends refused; review), and one the server dropped since (a
    # restart, a failover) answered 503 while the database answered (review): Django's
    # check of a connection left open, as a request starts, first.
    close_old_connections()
    try:
        return DatabaseState(pending_embedding_counts(), worker_seen_at())
    finally:
        connection.close()


def database_state() -> tuple[DatabaseState | None, str | None]:
    """The probe of both health checks (this one's, the local API's): (what it said, None)
    when the database answered within ``DATABASE_ANSWER_SECONDS``; else (None, why not:
    "database not migrated", "database unreachable" or "database not answering"), said in
    the log once a minute."""
    try:
        state = _probe.state(DATABASE_ANSWER_SECONDS)
    except DatabaseError as exc:
        if not_migrated(exc):
            # It answers, without memsvc's tables: a DATABASE_URL not migrated yet (it
            # said "database unreachable": review).
            return _said(
                "database not migrated", "health: the database has no memsvc tables (run migrate)"
            )
        # The driver's message names hosts, sockets and paths: for the logs, not for
        # whoever probes the service.
        return _said("database unreachable", "health: database unreachable", exc_info=True)
    if state is None:
        return _said(
            "database not answering",
            "health: the database did not answer in %s s",
            DATABASE_ANSWER_SECONDS,
        )
    return state, None


def _said(reason: str, message: str, *args, **kwargs) -> tuple[None, str]:
    _SAID[reason].say(logger.warning, message, *args, **kwargs)
    return None, reason


_probe = _DatabaseProbe()

# The embedded database's disk holds less than this: PostgreSQL cannot make its next WAL
# segment (16 MB), and a write it cannot log stops the server. Health said ok on a full disk
# while every write failed (review).
DISK_FULL_BELOW_BYTES = 64 * 1024 * 1024


def _disk_full() -> bool:
    """Whether the embedded database's disk is (nearly) full; False for a database of its
    own (``DATABASE_URL``: its disk is not this machine's to see)."""
    if settings.DATABASE_URL is not None:
        return False
    free = shutil.disk_usage(socket_dir(settings.MEMSVC_DATA_DIR)).free
    return free < DISK_FULL_BELOW_BYTES


class HealthView(APIView):
    """Readiness and liveness: 200 when the database answers, 503 with a reason when not, or
    when the embedded database's disk is full.

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
            "embedding": "failing" if EMBEDDING_FAILING.ongoing else "ok",
            "pendingEmbeddings": None,
            "pendingMemoryEmbeddings": None,
            "pendingToolRecordEmbeddings": None,
            "broker": "reachable" if broker_reachable() else "unreachable",
            "worker": None,
            "workerSeenAt": None,
        }
        # The disk first: a full one stops PostgreSQL, which then does not answer either
        # (the reason said was "database unreachable": review).
        if _disk_full():
            _said("disk full", "health: the database's disk has less than 64 MB free")
            return unavailable({**body, "status": "unavailable", "reason": "disk full"})
        state, reason = database_state()
        if reason is not None:
            return unavailable({**body, "status": "unavailable", "reason": reason})
        body["pendingEmbeddings"] = state.backlog["message"]
        body["pendingMemoryEmbeddings"] = state.backlog["memory"]
        body["pendingToolRecordEmbeddings"] = state.backlog["tool_record"]
        if state.worker_seen is not None:
            seen, ago = state.worker_seen
            lately = seen is not None and ago <= WORKER_SILENT_AFTER
            body["worker"] = "active" if lately else "silent"
            body["workerSeenAt"] = seen and serializers.DateTimeField().to_representation(seen)
        return Response(body)
