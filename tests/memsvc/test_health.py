from datetime import timedelta

import pytest
from django.db import OperationalError, connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from agents_api.models import Memory, ToolRecord, content_hash
from conversations.models import Message
from search.checks import VECTOR_TABLES
from tests.factories import AgentFactory, MessageFactory

pytestmark = pytest.mark.django_db


@pytest.mark.django_db(transaction=True)  # (the backlog is counted on the probe's thread)
def test_health_reports_database_embeddings_and_backlog(client, settings):
    with transaction.atomic():  # (a group's owner comes with it: a deferred check)
        MessageFactory.create_batch(3)
        embedded = MessageFactory()
    Message.objects.filter(pk=embedded.pk).update(
        embedding=[0.0] * settings.MEMORY_EMBEDDING_DIMENSION,
        embedding_model="test-model",
        embedded_at=embedded.created_at,
    )

    response = client.get("/v1/health")

    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "database": "embedded",
        "embeddingBackend": "local",
        "embeddingModel": "all-MiniLM-L6-v2@int8",
        "embeddingDimension": 384,
        "embedding": "ok",
        "pendingEmbeddings": 3,
        "pendingMemoryEmbeddings": 0,
        "pendingToolRecordEmbeddings": 0,
        "broker": "reachable",
        "worker": "silent",
        "workerSeenAt": None,
    }


@pytest.mark.django_db(transaction=True)
def test_the_backlog_is_counted_up_to_a_bound(client, monkeypatch):
    """A probe of a service with a backlog of millions counted them all, every few seconds."""
    from search import selectors

    with transaction.atomic():
        MessageFactory.create_batch(3)
    monkeypatch.setattr(selectors, "PENDING_COUNTED_UP_TO", 2)
    assert client.get("/v1/health").json()["pendingEmbeddings"] == 2


@pytest.mark.django_db(transaction=True)
def test_the_memories_and_tool_records_waiting_are_counted_too(client):
    """Only messages were: after a ``memsvc reindex --resize`` every memory waited, and
    health said nothing waited (review)."""
    agent = AgentFactory()
    for content in ("alice likes tea", "alice owns a kayak"):
        Memory.objects.create(agent=agent, content=content, content_hash=content_hash(content))
    ToolRecord.objects.create(agent=agent, tool_name="grep", summary="found 3 files")
    body = client.get("/v1/health").json()
    assert (body["pendingMemoryEmbeddings"], body["pendingToolRecordEmbeddings"]) == (2, 1)


@pytest.mark.django_db(transaction=True)  # (read on the probe's thread)
def test_health_says_whether_a_worker_took_the_embedding_tasks_lately(client, monkeypatch):
    """It said ok, with no word of a worker, while none ran: appended messages waited for
    their embedding and nothing said why (review). A worker's task notes it on its way out
    (``memsvc.celery.Task.after_return``); the status stays ok either way."""
    from memsvc import celery
    from search.tasks import sweep_unembedded_task

    def said():
        body = client.get("/v1/health").json()
        return body["status"], body["worker"], body["workerSeenAt"]

    assert said() == ("ok", "silent", None)
    sweep_unembedded_task.apply()  # (run here, as a test or a script does: no worker's)
    assert said() == ("ok", "silent", None)

    monkeypatch.setattr(celery, "_WORKER_NOTED", {})
    # (As a worker's process runs it, taken from its queue.)
    sweep_unembedded_task.push_request(is_eager=False, delivery_info={"routing_key": "celery"})
    try:
        # (A task that failed says nothing: every one fails in a worker whose database
        # refuses it.)
        sweep_unembedded_task.after_return("FAILURE", None, "id", (), {}, None)
        assert said() == ("ok", "silent", None)
        sweep_unembedded_task.after_return("SUCCESS", 0, "id", (), {}, None)
    finally:
        sweep_unembedded_task.pop_request()
    status, worker, seen_at = said()
    assert (status, worker) == ("ok", "active")
    assert parse_datetime(seen_at) > timezone.now() - timedelta(seconds=10)
    # Told by the database's clock, which wrote it: a web host's clock 10 minutes ahead of an
    # external database's said silent (code review).
    later = timezone.now() + timedelta(minutes=10)
    with monkeypatch.context() as ahead:
        ahead.setattr("django.utils.timezone.now", lambda: later)
        assert said()[:2] == ("ok", "active")

    with connection.cursor() as cursor:
        cursor.execute("UPDATE worker_seen SET seen_at = seen_at - interval '181 seconds'")
    assert said()[:2] == ("ok", "silent")
    celery.worker_seen("celery")  # (within 10 s of its last note, the process writes none)
    assert said()[:2] == ("ok", "silent")
    monkeypatch.setattr(celery, "_WORKER_NOTED", {})  # (10 s later)
    celery.worker_seen("celery")
    assert said()[:2] == ("ok", "active")


@pytest.mark.django_db(transaction=True)  # (read on the probe's thread)
def test_a_database_not_migrated_to_the_workers_table_keeps_health_ok(client):
    """New code before its ``migrate`` (an external ``DATABASE_URL`` is migrated once a
    release): health said "database not migrated" (503, out of the load balancer) for a
    table that only says whether a worker works (code review). It says nothing of it."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE worker_seen RENAME TO worker_seen_aside")
    try:
        body = client.get("/v1/health").json()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE worker_seen_aside RENAME TO worker_seen")
    assert (body["status"], body["worker"], body["workerSeenAt"]) == ("ok", None, None)
    assert body["pendingEmbeddings"] == 0


def test_health_says_when_the_broker_is_unreachable_and_stays_ok(client, dead_broker):
    response = client.get("/v1/health")

    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    assert response.json()["broker"] == "unreachable"


def test_unknown_v1_routes_answer_in_the_error_shape(client):
    for path in ("/v1/nope", "/v1/user/conversations/x/y/z", "/v1"):
        response = client.get(path)
        assert response.status_code == 404
        assert response.json() == {"error": "no such route", "code": "not_found", "details": {}}


def test_a_route_whose_id_is_no_uuid_says_so(client):
    """It said "no such route": its client went looking for a wrong URL (review)."""
    for path, segment in [
        ("/v1/agent/memories/notauuid", "notauuid"),
        ("/v1/user/conversations/12/messages", "12"),
        ("/v1/agent/memories/" + "x" * 100, "x" * 63 + "…"),
    ]:
        response = client.get(path)
        assert response.status_code == 404
        assert response.json() == {
            "error": f"not found: {segment!r} is no id (an id is a UUID)",
            "code": "not_found",
            "details": {},
        }


def test_health_needs_no_credentials_but_refuses_writes(client):
    response = client.post("/v1/health")
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"


@pytest.mark.parametrize("path, said", [("/v1/health", "reason"), ("/health", "detail")])
def test_a_database_that_does_not_answer_is_unavailable_within_seconds(
    client, monkeypatch, path, said
):
    """A server stopped but alive (a stalled disk, a frozen VM) never reaches its own
    statement timeout: the probe waited as long as it was stopped (review: 125 s), and
    each probe held one of the web process's few request threads."""
    import threading
    import time

    from memsvc.api import health

    stuck, calls = threading.Event(), []

    def count_backlog():
        calls.append(1)
        stuck.wait(30)

    monkeypatch.setattr(health, "_read_state", count_backlog)
    monkeypatch.setattr(health, "_probe", health._DatabaseProbe())
    monkeypatch.setattr(health, "DATABASE_ANSWER_SECONDS", 1.0)
    took = []
    for _ in range(3):
        started = time.monotonic()
        response = client.get(path)
        took.append(time.monotonic() - started)
        assert response.status_code == 503
        assert response.json()["status"] == "unavailable"
        assert response.json()[said] == "database not answering"
    assert calls == [1]  # one probe waits on it; the next asks for no other
    # and is told no at once: that probe's time is up (each waited a whole second again).
    assert 1.0 <= took[0] < 3 and took[1] < 0.5 and took[2] < 0.5, took
    stuck.set()
    time.sleep(0.1)
    monkeypatch.setattr(
        health,
        "_read_state",
        lambda: health.DatabaseState(dict.fromkeys(VECTOR_TABLES, 0), (None, None)),
    )
    assert client.get(path).status_code == 200


def test_a_database_restarted_since_the_last_probe_is_answered_ok(client, monkeypatch):
    """The probe's thread keeps its connection: one the server dropped since (a restart, a
    failover) is replaced, as a request's is, not failed on (503 while the database
    answered; review)."""
    from django.db import connection

    from memsvc.api import health

    probe = health._DatabaseProbe()
    monkeypatch.setattr(health, "_probe", probe)
    assert client.get("/v1/health").status_code == 200  # (the probe's connection, opened)

    def backend_pid():
        with connection.cursor() as cursor:  # (on the probe's thread: its connection)
            cursor.execute("SELECT pg_backend_pid()")
            return cursor.fetchone()[0]

    pid = probe._executor.submit(backend_pid).result()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])  # (waits for its end)
        assert cursor.fetchone()[0]
    assert client.get("/v1/health").status_code == 200


def test_health_is_503_when_the_embedded_databases_disk_is_full(client, monkeypatch):
    """It said ok on a full disk, where every write failed (review). The disk's free space
    is read as it is: "full" here is below a bound set above it."""
    from memsvc.api import health

    assert client.get("/v1/health").status_code == 200
    monkeypatch.setattr(health, "DISK_FULL_BELOW_BYTES", 2**62)
    response = client.get("/v1/health")
    assert response.status_code == 503
    assert (response.json()["status"], response.json()["reason"]) == ("unavailable", "disk full")


def test_a_full_disk_is_said_though_the_database_stopped_on_it(client, monkeypatch):
    """PostgreSQL stops when its disk is full: the reason said was "database unreachable"
    (review), which sent an operator to look at the database, not the disk."""
    from memsvc.api import health

    monkeypatch.setattr(health, "DISK_FULL_BELOW_BYTES", 2**62)

    def stopped():
        raise OperationalError("connection refused")

    monkeypatch.setattr(health, "_read_state", stopped)
    response = client.get("/v1/health")
    assert (response.status_code, response.json()["reason"]) == (503, "disk full")


@pytest.mark.django_db(transaction=True)
def test_a_database_without_memsvcs_tables_is_said_not_migrated(client, monkeypatch):
    """A DATABASE_URL that answers, before its migrate: it was "database unreachable"."""
    from memsvc.api import health

    def not_migrated():
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM no_such_table_of_memsvc")

    monkeypatch.setattr(health, "pending_embedding_counts", not_migrated)
    response = client.get("/v1/health")
    assert (response.status_code, response.json()["reason"]) == (503, "database not migrated")
    local = client.get("/health")  # (the same probe: it said "database unreachable")
    assert (local.status_code, local.json()["detail"]) == (503, "database not migrated")


def test_a_database_that_refuses_new_connections_is_unavailable(client, monkeypatch):
    """Out of processes (``ulimit -u``), PostgreSQL refused new connections and most writes
    got 503, while health said ok: its probe asked on a connection it kept (review)."""
    import psycopg

    from memsvc.api import health
    from memsvc.db_backend.base import DatabaseWrapper

    monkeypatch.setattr(health, "_probe", health._DatabaseProbe())
    assert client.get("/v1/health").status_code == 200

    def refused(self, conn_params):
        raise psycopg.OperationalError("could not fork new process for connection")

    monkeypatch.setattr(DatabaseWrapper, "get_new_connection", refused)
    response = client.get("/v1/health")
    assert (response.status_code, response.json()["reason"]) == (503, "database unreachable")
