"""Small database helpers shared by the apps (``memsvc.db``)."""

import contextlib
import select
import socket
import threading
import time
import uuid
from unittest import mock

import pytest
from django.apps import apps
from django.conf import settings
from django.db import DataError, OperationalError, connection, connections, transaction

from agents_api.models import Agent, MemoryBlock
from agents_api.selectors import LOCAL_OWNER, local_agent, memory_blocks
from conversations import selectors
from conversations import services as conversation_services
from conversations.models import AccessLevel, Conversation
from conversations.selectors import access_conversation, conversation_owner_id
from memsvc import db
from memsvc.api.errors import Forbidden, NotFound
from memsvc.api.principals import Principal
from tests.factories import AgentFactory
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db


def test_a_queryset_compiled_once_finds_what_the_queryset_finds():
    first, second = AgentFactory(name="first"), AgentFactory(name="second")
    for agent in (first, second):
        named = Agent.objects.filter(name=agent.name)
        [found] = db.compiled_once("test_agent_named", lambda named=named: named, [agent.name])
        assert (found.pk, found.metadata, found.created_at) == (
            agent.pk,
            agent.metadata,
            Agent.objects.get(pk=agent.pk).created_at,
        )
    assert "test_agent_named" in db._COMPILED_SQL


def test_parameters_other_than_the_sql_takes_keep_nothing_and_answer_right():
    agent = AgentFactory(name="plain")
    named = Agent.objects.filter(name="plain", owner_principal=agent.owner_principal)
    # (Given in the wrong order: the SQL takes the name first.)
    [found] = db.compiled_once("test_wrong_order", lambda: named, [agent.owner_principal, "plain"])
    assert found.pk == agent.pk
    assert "test_wrong_order" not in db._COMPILED_SQL


def test_a_kept_sql_is_run_without_making_its_queryset_again():
    agent = AgentFactory(name="kept")
    made = []

    def named():
        made.append(1)
        return Agent.objects.filter(name="kept")

    for _ in range(3):
        [found] = db.compiled_once("test_made_once", named, ["kept"])
        assert found.pk == agent.pk
    assert made == [1]


@pytest.mark.parametrize(
    "sql",
    [
        'SELECT a.*, 42 AS "answer" FROM agent a WHERE a.name = %s',
        'SELECT a.id, a.metadata, 42 AS "answer" FROM agent a WHERE a.name = %s',  # (deferred)
        # Not in the model's order of fields (review: values went into the wrong fields)
        'SELECT a.metadata, 42 AS "answer", a.name, a.id FROM agent a WHERE a.name = %s',
    ],
)
def test_kept_rows_are_the_instances_raw_gives(sql):
    """(``RawQuerySet`` worked out its columns' fields and converters at every query:
    ``kept_rows`` does once per statement what it did.) JSON read as the ORM reads it,
    other columns as attributes, fields not selected deferred."""
    AgentFactory(name="first", metadata={"tea": ["green", 1]})
    AgentFactory(name="second", metadata={})
    name = f"test_kept_rows_{sql}"  # (one reader a statement)
    for agent_name in ("first", "second", "nobody"):
        kept = db.kept_rows(name, Agent, sql, [agent_name])
        raw = list(Agent.objects.raw(sql, [agent_name]))
        assert [
            (a.pk, a.name, a.metadata, a.answer, a.get_deferred_fields(), a._state.adding)
            for a in kept
        ] == [(a.pk, a.name, a.metadata, a.answer, a.get_deferred_fields(), False) for a in raw]
        assert len(kept) == (agent_name != "nobody")
    assert name in db._READERS
    # A statement whose columns changed under it (a migration changed those of ``a.*``) is
    # read anew, not by the positions of before: as many others, or one more.
    if "a.metadata" in sql:
        swapped = sql.replace("a.metadata", "a.description")
        [other] = db.kept_rows(name, Agent, swapped, ["first"])
        assert other.description == Agent.objects.get(name="first").description
        assert "metadata" in other.get_deferred_fields()
    [wider] = db.kept_rows(name, Agent, sql.replace("42 AS", "7 AS extra, 42 AS"), ["first"])
    assert (wider.metadata, wider.extra, wider.answer) == ({"tea": ["green", 1]}, 7, 42)


def test_the_local_agent_and_its_blocks_are_read_by_sql_compiled_once():
    agent = AgentFactory(name="local-one", owner_principal=LOCAL_OWNER, loopback_trusted=True)
    MemoryBlock.objects.create(agent=agent, label="persona", value="calm")
    MemoryBlock.objects.create(agent=agent, label="human", value="Ana", awaiting_attach=True)
    assert local_agent(None, "local-one").pk == agent.pk
    assert local_agent(None, "local-one", memories=True).keeps_memory is False
    assert [block.label for block in memory_blocks(agent, user_id="")] == ["persona"]
    # Kept: their parameters are given as their SQL takes them (a change of the querysets
    # that moved them would make every request compile them again, silently).
    assert {"local_agent", "local_agent_and_memories", "memory_blocks"} <= db._COMPILED_SQL.keys()
    # Only the context's read of the agent asks about its memories.
    assert "FROM memory" not in db._COMPILED_SQL["local_agent"][1]
    assert "FROM memory" in db._COMPILED_SQL["local_agent_and_memories"][1]


def test_a_writes_look_at_its_conversation_is_read_by_sql_compiled_once():
    """(An append's look, made and compiled at each request, was 0.9 of its 8 ms of the
    web process's time: profiling.) Each way in is kept, and says what the queryset says."""
    alice = Principal.user("alice")
    conversation = conversation_services.conversation_create(alice, title="Kept")
    agent = AgentFactory(name="helper")
    conversation_services.membership_create(
        alice, conversation=conversation, principal_id=agent.principal_id, access_level="writer"
    )
    acting = agent.as_principal(on_behalf_of="alice")
    for principal, level in [(alice, "owner"), (acting, "writer")]:
        found = access_conversation(principal, conversation.id, summary=False)
        assert (found.pk, found.title, found.access_level) == (conversation.pk, "Kept", level)
    assert "access_conversation" in db._COMPILED_SQL
    with pytest.raises(NotFound):
        access_conversation(Principal.user("bob"), conversation.id, summary=False)
    with pytest.raises(Forbidden):
        access_conversation(acting, conversation.id, need=AccessLevel.OWNER, summary=False)
    # Once kept, not even the queryset is made (making it was half of the look's cost).
    with mock.patch.object(
        selectors, "conversations_visible_to", side_effect=AssertionError("made")
    ):
        assert access_conversation(alice, conversation.id, summary=False).pk == conversation.pk


def test_the_owner_an_agents_user_turn_is_signed_with_is_read_by_sql_compiled_once():
    """(An agent's append of a user's turn looked its conversation's owner up by a queryset
    made and compiled each time: a tenth of the append's Python, profiling.)"""
    agent = AgentFactory(name="scribe")
    mine = conversation_services.conversation_create(agent.as_principal(), title="Mine")
    theirs = conversation_services.conversation_create(Principal.user("carol"), title="Theirs")
    conversation_services.membership_create(
        Principal.user("carol"),
        conversation=theirs,
        principal_id=agent.principal_id,
        access_level="writer",
    )
    assert conversation_owner_id(mine) == agent.principal_id
    assert "conversation_owner_id" in db._COMPILED_SQL
    assert conversation_owner_id(theirs) == "carol"


@pytest.mark.django_db(transaction=True)
def test_a_lock_kept_as_compiled_sql_locks_its_row_and_refuses_a_missing_one():
    """(An append's lock of its conversation, made and compiled at each append: its SQL is
    kept, ``locked_row(kept_as=...)``.) Another transaction's write of the row waits."""
    alice = Principal.user("alice")
    conversation = conversation_services.conversation_create(alice, title="Locked")
    conversation_services.message_append(alice, conversation=conversation, content="hi")
    assert "append_lock" in db._COMPILED_SQL
    with transaction.atomic():
        row = db.locked_row(
            Conversation.objects.only("pk"), conversation.pk, missing="gone", kept_as="append_lock"
        )
        assert row.pk == conversation.pk
        other = connections.create_connection("default")  # (another session)
        try:
            with other.cursor() as other_cursor:
                other_cursor.execute("SET lock_timeout = '200ms'")
                with pytest.raises(OperationalError, match="lock timeout"):
                    other_cursor.execute(
                        "UPDATE conversation SET title = 'x' WHERE id = %s", [conversation.pk]
                    )
        finally:
            other.close()
        with pytest.raises(NotFound, match="gone"):
            db.locked_row(
                Conversation.objects.only("pk"), uuid.uuid4(), missing="gone", kept_as="append_lock"
            )


TIMESTAMPS = [
    "2026-11-24 22:50:51.123456+00",
    "2026-11-24 22:50:51+00",
    "2026-11-24 22:50:51.5+00",
    "2026-11-24 23:50:51.25+01",  # another offset: Django's loader
    "0044-03-15 12:00:00+00 BC",  # refused by both alike
    "12026-11-24 22:50:51+00",  # past year 9999: refused alike
    "infinity",
]


@pytest.mark.parametrize("text", TIMESTAMPS)
def test_a_timestamp_reads_as_djangos_loader_reads_it(text):
    """``memsvc.db_backend``'s loader of ``timestamptz`` (ISO 8601 read in C) answers what
    Django's answers, value or error."""
    from django.db import connection
    from django.db.backends.postgresql.psycopg_any import BaseTzLoader
    from psycopg.postgres import types

    connection.ensure_connection()
    ours = connection.connection.adapters.get_loader(types["timestamptz"].oid, 0)
    djangos = type("Djangos", (BaseTzLoader,), {"timezone": ours.timezone})
    results = []
    for loader in (ours, djangos):
        try:
            results.append(
                loader(types["timestamptz"].oid, connection.connection).load(text.encode())
            )
        except Exception as exc:  # (the same error from both)
            results.append(type(exc))
    assert results[0] == results[1]
    if not isinstance(results[0], type):
        assert results[0].tzinfo == results[1].tzinfo is not None


def test_a_timestamp_in_utc_is_not_parsed_in_python(monkeypatch):
    """Django's loader derives from psycopg's Python one (2.8 us a value, a hundred in a
    search); an ordinary timestamp is read without it."""
    from django.db import connection
    from django.utils import timezone
    from psycopg.types.datetime import TimestamptzLoader

    def refuse(self, data):
        raise AssertionError("parsed in Python")

    monkeypatch.setattr(TimestamptzLoader, "load", refuse)
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::timestamptz", [now])
        assert cursor.fetchone()[0] == now


def test_a_timestamp_in_an_hour_held_twice_is_read_as_the_instant_it_is():
    """A database ``TIME_ZONE`` of offset 0 with summer time: PostgreSQL writes the second
    01:30 of the autumn's last Sunday in London as ``01:30:00+00``, an hour after the
    first (``+01``)."""
    from datetime import UTC, datetime

    from django.db import connections

    default = connections["default"]
    london = type(default)({**default.settings_dict, "TIME_ZONE": "Europe/London"}, "default")
    try:
        with london.cursor() as cursor:
            cursor.execute(
                "SELECT '2026-10-25 00:30:00+00'::timestamptz, '2026-10-25 01:30:00+00'::timestamptz"
            )
            first, second = cursor.fetchone()
    finally:
        london.close()
    # (In UTC: an hour held twice is equal to no time of another zone, PEP 495.)
    assert first.astimezone(UTC) == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    assert second.astimezone(UTC) == datetime(2026, 10, 25, 1, 30, tzinfo=UTC)


@pytest.mark.django_db
def test_no_index_of_ours_repeats_the_first_column_of_another():
    """An index on one column that another index (not partial) starts with only costs each
    write (``db.foreign_key_unindexed``): Django makes one for every foreign key."""
    tables = [
        model._meta.db_table
        for label in ("agents_api", "conversations", "memsvc", "search")
        for model in apps.get_app_config(label).get_models()
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT lone.indexrelid::regclass::text, other.indexrelid::regclass::text
            FROM pg_index lone
            JOIN pg_index other ON other.indrelid = lone.indrelid
                AND other.indexrelid <> lone.indexrelid AND other.indkey[0] = lone.indkey[0]
                AND other.indpred IS NULL AND other.indclass[0] = lone.indclass[0]
            JOIN pg_class lone_index ON lone_index.oid = lone.indexrelid
            JOIN pg_class other_index ON other_index.oid = other.indexrelid
            WHERE lone.indrelid::regclass::text = ANY(%s) AND lone.indnatts = 1
                AND NOT lone.indisunique AND lone.indpred IS NULL
                AND lone_index.relam = other_index.relam
            """,
            [tables],
        )
        assert cursor.fetchall() == []


def _in_another_connection(sql: str, params=()) -> list:
    """The rows of one statement run on another connection (another thread's)."""
    rows = []

    def run():
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                rows.extend(cursor.fetchall())
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return rows


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_health_check_sends_the_server_nothing():
    pid = _backend_pid()
    assert connection.is_usable()
    # (Django's own check sent "SELECT 1": the server would show it as the last statement.)
    [(last,)] = _in_another_connection("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid])
    assert last == "SELECT pg_backend_pid()"


@pytest.mark.django_db(transaction=True)
def test_a_connection_the_server_ended_fails_its_health_check_and_is_made_anew():
    pid = _backend_pid()
    assert _in_another_connection("SELECT pg_terminate_backend(%s)", [pid]) == [(True,)]
    # (the server's goodbye reaches the socket shortly)
    wait_until(lambda: not connection.is_usable(), "the ended connection looks unusable")

    connection.health_check_done = False  # (as at the start of a request)
    connection.close_if_health_check_failed()
    assert _backend_pid() != pid


@pytest.mark.django_db(transaction=True)
def test_a_connection_with_a_message_waiting_from_a_live_server_stays():
    """Something on the socket is not always a goodbye (a notification, a notice): Django's
    own check then decides, and the connection is kept."""
    pid = _backend_pid()
    with connection.cursor() as cursor:
        cursor.execute("LISTEN memsvc_health_check")
    try:
        _in_another_connection("SELECT pg_notify('memsvc_health_check', 'hello'), 1")
        poller = select.poll()
        poller.register(connection.connection.fileno(), select.POLLIN)
        # (the notification reaches the socket shortly)
        wait_until(lambda: poller.poll(0), "the notification arrived")

        assert connection.is_usable()
        connection.health_check_done = False  # (as at the start of a request)
        connection.close_if_health_check_failed()
        assert _backend_pid() == pid
    finally:
        # (a connection kept listening would take notifications into later tests)
        with connection.cursor() as cursor:
            cursor.execute("UNLISTEN *")


@pytest.mark.django_db(transaction=True)
def test_work_beside_runs_at_once_on_its_own_connection():
    """Started on a thread of its own while the caller goes on: the work waits for the
    caller, who signals it only inside the block (run in the caller's thread, it would
    wait in vain)."""
    caller_went_on = threading.Event()

    def work():
        return caller_went_on.wait(timeout=10), threading.current_thread().name, _backend_pid()

    with db.beside(work) as result:
        caller_went_on.set()
        went_on, thread, pid = result()
    assert went_on
    assert thread.startswith("beside")
    assert pid != _backend_pid()
    # Each thread keeps its connection for its next piece of work: more pieces than threads
    # find fewer backends than pieces.
    threads = settings.WEB_REQUEST_THREADS
    backends = set()
    for _ in range(threads + 1):
        with db.beside(_backend_pid) as result:
            backends.add(result())
    assert len(backends) <= threads


@pytest.mark.django_db(transaction=True)
def test_an_error_beside_is_raised_to_whoever_asks_for_the_result():
    def fails():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")

    with pytest.raises(DataError, match="division by zero"), db.beside(fails) as result:
        result()
    with db.beside(_backend_pid) as result:
        assert result() != _backend_pid()  # (and the thread serves on)


@pytest.mark.django_db(transaction=True)
def test_work_beside_never_outlives_its_block_and_its_unasked_error_is_logged(caplog):
    """A caller that fails before it asks for the result (a request answered 503) leaves
    the block only once the work under way has ended: no thread or connection of the
    request's is still busy after its answer, and the work's own error is logged."""
    started, ended = threading.Event(), []

    def work():
        started.set()
        time.sleep(0.3)
        ended.append(True)
        raise ValueError("the work's own error")

    with pytest.raises(RuntimeError, match="the caller's"), db.beside(work):
        assert started.wait(timeout=10)
        raise RuntimeError("the caller's")
    assert ended == [True]
    [record] = [r for r in caplog.records if r.name == "memsvc.db"]
    assert isinstance(record.exc_info[1], ValueError)


@pytest.mark.django_db(transaction=True)
def test_work_beside_not_started_when_its_block_ends_never_runs():
    """Every thread busy: the last piece waits in the queue, and is dropped with its block."""
    release, ran = threading.Event(), []
    with contextlib.ExitStack() as busy:
        for _ in range(settings.WEB_REQUEST_THREADS):
            busy.enter_context(db.beside(release.wait, 10))
        with db.beside(ran.append, "late"):
            pass
        release.set()
    assert ran == []
    with db.beside(ran.append, "next") as result:  # (the pool serves on)
        result()
    assert ran == ["next"]


def test_work_beside_a_transaction_runs_in_it_when_its_result_is_asked_for():
    """Another connection would not see what the transaction wrote (a test's, here)."""
    AgentFactory(name="written-here")
    ran = []

    def work():
        ran.append(threading.current_thread())
        return Agent.objects.filter(name="written-here").count()

    with db.beside(work) as result:
        assert ran == []
        assert result() == 1
    assert ran == [threading.current_thread()]


def test_a_connection_to_a_server_that_never_answers_is_given_up():
    """A database that takes connections and never answers (stopped by a signal, a frozen
    machine) held each request that connected without end (review): given up after
    ``DATABASE_CONNECT_SECONDS``, an ``OperationalError`` (answered 503)."""
    listener = socket.create_server(("127.0.0.1", 0))  # accepts, says nothing
    port = listener.getsockname()[1]
    settings_dict = {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": str(port)}
    frozen = type(connections["default"])(settings_dict)  # (a connection of its own)
    started = time.monotonic()
    try:
        with pytest.raises(OperationalError):
            frozen.ensure_connection()
    finally:
        listener.close()
    assert time.monotonic() - started < settings.DATABASE_CONNECT_SECONDS + 5


def test_a_server_handle_whose_start_failed_is_made_again_not_handed_back(tmp_path):
    """The package lists a handle before it starts the server: one whose start failed (a
    server still running on a data directory deleted under it) stayed, half made, and every
    later connection of the process got it and failed on its missing server, for good,
    though the server was back (review). It is made again."""
    from types import SimpleNamespace

    from memsvc import embedded_db

    attempts = []

    class Package:
        _instances: dict = {}

        def __init__(self, pgdata, *, cleanup_mode):
            self._postmaster_info = None
            self._instances[pgdata] = self
            attempts.append(pgdata)
            if len(attempts) == 1:
                raise AssertionError  # (the package's check of a server left running)
            self._postmaster_info = "running"
            if len(attempts) == 2:  # (started, then its list of holders not written)
                raise OSError(28, "No space left on device")

        def _cleanup(self):
            pass

    package = SimpleNamespace(PostgresServer=Package)
    with pytest.raises(AssertionError):
        embedded_db._get_server(package, tmp_path / "pg")
    assert Package._instances == {}
    with pytest.raises(OSError):
        embedded_db._get_server(package, tmp_path / "pg")
    assert Package._instances == {}
    handle = embedded_db._get_server(package, tmp_path / "pg")
    assert handle._postmaster_info == "running" and len(attempts) == 3
    assert embedded_db._get_server(package, tmp_path / "pg") is handle  # (kept once made)


def test_a_server_the_package_cannot_start_is_an_outage_not_a_bug(monkeypatch):
    """Its assertion reached the request as a 500 page (review): the database is down."""
    from memsvc import embedded_db

    def cannot_start(data_dir):
        raise AssertionError

    monkeypatch.setattr(embedded_db, "ensure_server", cannot_start)
    monkeypatch.setattr(settings, "DATABASE_URL", None)
    fresh = connection.copy()
    try:
        with pytest.raises(OperationalError, match="could not be started here"):
            fresh.ensure_connection()
    finally:
        fresh.close()


def test_why_the_server_did_not_start_is_said_from_its_last_start_alone(tmp_path):
    """The log holds every start's lines: a failure was said with older ones' reasons above
    its own ("Permission denied" of a start long fixed, over "insufficient file
    descriptors"; review). A start that wrote nothing (a full disk) is said from the end
    before it, said so (code review)."""
    from memsvc import embedded_db

    log = tmp_path / "log"
    log.write_text('FATAL:  could not open file "base/1": Permission denied\n')
    since = embedded_db._log_size(log)
    nothing = embedded_db._start_said(log, since)
    assert embedded_db._why_it_stopped(nothing) == (
        'before this start: FATAL:  could not open file "base/1": Permission denied'
    )
    with log.open("a") as handle:
        handle.write("FATAL:  insufficient file descriptors available to start server\n")
        handle.write("LOG:  database system is shut down\n")
    said = embedded_db._start_said(log, since)
    assert "Permission denied" not in said
    assert embedded_db._why_it_stopped(said) == (
        "FATAL:  insufficient file descriptors available to start server"
    )
    log.write_text("LOG:  a log cut since\n")  # (shorter than where the start began: all of it)
    assert "cut since" in embedded_db._start_said(log, since)
