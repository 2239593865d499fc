"""The life of a long-term memory after it is saved: uses counted, pruned when stale,
embedded later when the backend was down."""

import threading
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents_api import tasks
from agents_api.models import MEMORY_TTL, Memory, MemoryListing
from agents_api.services import (
    POPULAR_ACCESS_COUNT,
    PruneResult,
    memories_prune,
    memories_touch,
    memory_delete,
    memory_save,
)
from agents_api.tasks import (
    enqueue_memory_touch,
    flush_memory_touches,
    prune_memories_task,
    sweep_unembedded_memories_task,
    touch_memories_task,
)
from memsvc import cli
from memsvc.broker import TRANSIENT
from memsvc.celery import app
from search.embeddings import EmbeddingError, configured_backend
from tests.factories import AgentFactory
from tests.waiting import wait_until

NOW = timezone.now()


def save(agent, content, *, expires_in: timedelta = MEMORY_TTL, used: int = 0) -> Memory:
    memory, _ = memory_save(agent.as_principal(), agent=agent, user_id="alice", content=content)
    for _ in range(used):  # (while it lives: an expired memory's uses are not counted)
        memories_touch([memory.id])
    Memory.objects.filter(pk=memory.pk).update(expires_at=NOW + expires_in)
    memory.refresh_from_db()
    return memory


def lives(agent) -> dict[str, tuple]:
    """Every memory of the agent: content -> (expires_at, access_count)."""
    return {
        m.content: (m.expires_at, m.access_count)
        for m in Memory.objects.filter(agent=agent).order_by("content")
    }


def a_mixed_crowd(agent) -> None:
    hour = timedelta(hours=1)
    save(agent, "stale", expires_in=-hour, used=3)
    save(agent, "almost popular", expires_in=-hour, used=POPULAR_ACCESS_COUNT - 1)
    save(agent, "expires this instant", expires_in=timedelta(0))
    save(agent, "popular", expires_in=-hour, used=POPULAR_ACCESS_COUNT)
    save(agent, "popular, found a month late", expires_in=-timedelta(days=30), used=12)
    save(agent, "fresh", expires_in=hour)
    save(agent, "fresh and popular", expires_in=hour, used=50)


@pytest.mark.django_db
def test_prune_deletes_stale_memories_extends_popular_ones_and_leaves_the_rest():
    agent = AgentFactory()
    a_mixed_crowd(agent)
    before = lives(agent)

    with CaptureQueriesContext(connection) as queries:
        assert memories_prune(now=NOW) == PruneResult(deleted=3, extended=2)
    # One DELETE and one UPDATE, each with the whole condition: PostgreSQL re-checks it on a
    # row that changed while the statement waited for it (the two-prunes test below).
    memory_writes = ('DELETE FROM "memory" ', 'UPDATE "memory" ')
    statements = [q["sql"] for q in queries if q["sql"].startswith(memory_writes)]
    assert len(statements) == 2
    assert all('"expires_at" <=' in sql and '"access_count"' in sql for sql in statements)

    after = lives(agent)
    assert set(after) == {"popular", "popular, found a month late", "fresh", "fresh and popular"}
    # Another 15 days from its expiry (DESIGN: ``expiresAt`` + 15 days, not from the run;
    # review), and the uses are counted afresh; one found expired longer than that, from
    # the run.
    assert after["popular"] == (before["popular"][0] + MEMORY_TTL, 0)
    assert after["popular, found a month late"] == (NOW + MEMORY_TTL, 0)
    assert after["fresh"] == before["fresh"]
    assert after["fresh and popular"] == before["fresh and popular"]

    # A second run finds nothing to do.
    assert memories_prune(now=NOW) == PruneResult(deleted=0, extended=0)
    assert lives(agent) == after


@pytest.mark.django_db
def test_prune_forgets_the_orders_of_walks_by_popularity_begun_a_day_ago():
    old = MemoryListing.objects.create(memory_ids=[], created_at=NOW - timedelta(days=1, seconds=1))
    young = MemoryListing.objects.create(memory_ids=[], created_at=NOW - timedelta(hours=23))
    memories_prune(now=NOW)
    assert list(MemoryListing.objects.values_list("id", flat=True)) == [young.id]
    assert old.id != young.id


@pytest.mark.django_db
def test_the_daily_task_prunes_with_the_clock(caplog):
    agent = AgentFactory()
    save(agent, "stale", expires_in=-timedelta(minutes=1))
    popular = save(agent, "popular", expires_in=-timedelta(minutes=1), used=POPULAR_ACCESS_COUNT)
    assert prune_memories_task.apply().get() == {
        "deleted": 1,
        "extended": 1,
        "idempotencyKeys": 0,
        "unattachedBlocks": 0,
    }
    assert "1 deleted, 1 extended" in caplog.text
    assert list(lives(agent).values()) == [(popular.expires_at + MEMORY_TTL, 0)]


@pytest.mark.django_db(transaction=True)
def test_two_prunes_at_once_delete_or_extend_each_memory_exactly_once():
    """The second run starts while the first holds its rows; it waits, re-checks the rows
    the first changed, and finds nothing left to do."""
    agent = AgentFactory()
    a_mixed_crowd(agent)
    before = lives(agent)
    outcome = {}

    def prune_again():
        try:
            outcome["second"] = memories_prune(now=NOW)
        except Exception as exc:  # the test's point: it must not fail
            outcome["second"] = exc
        finally:
            connection.close()

    with transaction.atomic():
        first = memories_prune(now=NOW)
        second_run = threading.Thread(target=prune_again)
        second_run.start()
        second_run.join(timeout=1.0)
        assert second_run.is_alive()  # waiting for the first run's row locks
    second_run.join(timeout=10)

    assert first == PruneResult(deleted=3, extended=2)
    assert outcome["second"] == PruneResult(deleted=0, extended=0)
    after = lives(agent)
    assert len(after) == 4
    assert after["popular"] == (before["popular"][0] + MEMORY_TTL, 0)


@pytest.mark.django_db
def test_memsvc_prune_prints_the_counts(capsys):
    agent = AgentFactory()
    save(agent, "stale", expires_in=-timedelta(minutes=1))
    save(agent, "popular", expires_in=-timedelta(minutes=1), used=POPULAR_ACCESS_COUNT)
    save(agent, "fresh")
    assert cli.main(["prune"]) == 0
    assert (
        capsys.readouterr().out
        == "memories: 1 deleted, 1 extended\nidempotency keys: 0 forgotten\n"
        "unattached blocks: 0 deleted\n"
    )
    assert cli.main(["prune"]) == 0
    assert (
        capsys.readouterr().out
        == "memories: 0 deleted, 0 extended\nidempotency keys: 0 forgotten\n"
        "unattached blocks: 0 deleted\n"
    )


# --- the sweep -------------------------------------------------------------------------------


class BrokenBackend:
    """An embedding backend that is down (the outside dependency, so it may be faked)."""

    name = "broken"
    model = "all-MiniLM-L6-v2@int8"
    dimension = 384

    def __init__(self, *, transient: bool = True):
        self.transient = transient
        self.calls = 0

    def embed(self, texts):
        self.calls += 1
        raise EmbeddingError("connection refused", transient=self.transient)


@pytest.fixture
def backend_down(monkeypatch):
    """The embedding backend fails from now on, until the test puts the real one back."""
    broken = BrokenBackend()
    # Where memories are embedded when saved, and by the sweep.
    monkeypatch.setattr("search.services.configured_backend", lambda: broken)
    return broken


@pytest.mark.django_db
def test_a_memory_saved_while_the_backend_is_down_is_embedded_by_the_sweep(
    backend_down, monkeypatch
):
    agent = AgentFactory()
    memory = save(agent, "Alice's favourite colour is blue.")
    assert (memory.embedding, memory.embedding_model, memory.embedded_at) == (None, "", None)

    monkeypatch.undo()  # the backend is back
    assert sweep_unembedded_memories_task.apply().get() == 1

    memory.refresh_from_db()
    assert memory.embedding_model == "all-MiniLM-L6-v2@int8"
    assert memory.embedded_at is not None
    [expected] = configured_backend().embed([memory.content])
    assert np.dot(memory.embedding, expected) > 0.999
    assert sweep_unembedded_memories_task.apply().get() == 0  # nothing left


@pytest.fixture
def retries_run_inline():
    """Tasks run here retry here, one try after another as a worker would, and end in a
    result instead of raising the first failure. (Celery's eager retries read this setting,
    not the argument given to ``apply``.)"""
    previous = app.conf.task_eager_propagates
    app.conf.task_eager_propagates = False
    yield
    app.conf.task_eager_propagates = previous


@pytest.mark.django_db
def test_the_sweep_retries_a_transient_failure_a_few_times_then_leaves_it_for_later(
    backend_down, retries_run_inline, caplog
):
    memory = save(AgentFactory(), "Alice lives in Lisbon")
    calls_at_save = backend_down.calls
    result = sweep_unembedded_memories_task.apply()
    # Retries spent: said in a line, not a failure's traceback each minute of an outage
    # (review); the next run tries again.
    assert result.get() == 0
    assert "the sweep of memories stopped" in caplog.text
    assert backend_down.calls - calls_at_save == 1 + sweep_unembedded_memories_task.max_retries
    backend_down.transient = False
    calls = backend_down.calls
    assert sweep_unembedded_memories_task.apply().get() == 0  # not worth retrying
    assert backend_down.calls == calls + 1
    memory.refresh_from_db()
    assert memory.embedded_at is None


@pytest.mark.django_db
def test_reindex_embeds_waiting_memories_and_all_re_embeds_every_one(
    backend_down, monkeypatch, capsys
):
    agent = AgentFactory()
    waiting = save(agent, "saved while the backend was down")
    monkeypatch.undo()
    embedded = save(agent, "saved with a vector")
    embedded_at = embedded.embedded_at

    assert cli.main(["reindex"]) == 0
    assert ", 1 memories and" in capsys.readouterr().err
    waiting.refresh_from_db()
    assert waiting.embedded_at is not None

    assert cli.main(["reindex", "--all"]) == 0
    assert ", 2 memories and" in capsys.readouterr().err
    embedded.refresh_from_db()
    assert embedded.embedded_at > embedded_at


# --- counting uses ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_touch_counts_one_use_of_each_memory_and_ignores_deleted_ones():
    agent = AgentFactory()
    tea, coffee = save(agent, "Likes tea"), save(agent, "Likes coffee")
    gone = save(agent, "Forgotten")
    gone_id = gone.id
    memory_delete(agent.as_principal(), memory=gone)

    before = timezone.now()
    assert touch_memories_task.apply(args=[[str(tea.id), str(gone_id)]]).get() == 1
    enqueue_memory_touch([tea.id, coffee.id])

    tea.refresh_from_db()
    coffee.refresh_from_db()
    assert tea.access_count == 2
    assert coffee.access_count == 1
    assert tea.last_accessed_at >= before
    assert coffee.last_accessed_at >= tea.created_at


def updates_of_memory_table() -> tuple[int, int]:
    """(updates, HOT updates) of the memory table, committed ones, this backend's included."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # at the end of this statement
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'memory'::regclass"
        )
        return cursor.fetchone()


@pytest.mark.django_db(transaction=True)
def test_a_touch_writes_no_index_entry():
    """Every search counts uses: a count must be a HOT update, or each one would add an
    entry to all of the table's indexes, the vector graph included. PostgreSQL makes an
    update HOT when it changes no column an index reads (key, expression or condition) and
    the new version fits in the row's page: no index reads what a touch writes, and a touch
    of a memory alone on its page (a page holds two) is HOT.

    (It counted ten touches of six memories, 52 of 60 HOT as the pages were pruned between
    them; with the suite in two processes 14-20: a page is pruned only of versions older
    than every transaction of the server, the other test database's too, most likely
    through the snapshot horizon PostgreSQL keeps between recomputations.)"""
    written = {"access_count", "last_accessed_at"}  # memories_touch's update
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT i.indexrelid::regclass::text, a.attname,
                   pg_get_expr(i.indexprs, i.indrelid), pg_get_expr(i.indpred, i.indrelid)
            FROM pg_index i
            LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
            WHERE i.indrelid = 'memory'::regclass
            """
        )
        indexes = cursor.fetchall()
    assert indexes
    for name, column, expressions, condition in indexes:
        read = f"{column} {expressions} {condition}"
        assert not any(field in read for field in written), name

    # Saved until one is alone on its page (the seventh, as a rule; where pruning left room
    # for a third on a page, a later one). First, the rows of earlier tests' rolled-back
    # saves go: unseen, they stay on their pages until a vacuum, and one of them left no
    # room on an "alone" row's page (a failure now and then: 1 update, 0 HOT).
    with connection.cursor() as cursor:
        cursor.execute("VACUUM memory")
    agent, alone = AgentFactory(), []
    for n in range(20):
        save(agent, f"Fact number {n}")
        with connection.cursor() as cursor:
            cursor.execute("SELECT id, (ctid::text::point)[0] FROM memory")
            pages = dict(cursor.fetchall())
        alone = [i for i, page in pages.items() if list(pages.values()).count(page) == 1]
        if alone:
            break
    assert alone  # (what the test needs)
    updates, hot = updates_of_memory_table()
    memories_touch([alone[0]])
    after_updates, after_hot = updates_of_memory_table()
    assert (after_updates - updates, after_hot - hot) == (1, 1)
    assert Memory.objects.get(id=alone[0]).access_count == 1


def test_use_counts_are_sent_as_transient_messages(local_broker):
    enqueue_memory_touch(["00000000-0000-0000-0000-000000000001"])
    flush_memory_touches()
    [message] = local_broker()
    assert message["headers"]["task"] == touch_memories_task.name
    assert message["body"][0] == [["00000000-0000-0000-0000-000000000001"]]
    assert message["properties"]["delivery_mode"] == TRANSIENT


def test_a_processs_uses_go_in_one_message_sent_off_the_request_path(monkeypatch):
    """A message per search cost each search about 1 ms and the worker a task each: the uses
    a process counts are sent together, each use named (the same memory twice: two uses)."""
    sent = []
    app.conf.task_always_eager = False  # (as a server runs them; the suite's fixture resets it)
    monkeypatch.setattr(touch_memories_task, "apply_async", lambda **kw: sent.append(kw))
    monkeypatch.setattr(tasks._TOUCHES, "seconds", 0.05)
    tea, coffee = "00000000-0000-0000-0000-00000000000a", "00000000-0000-0000-0000-00000000000c"
    enqueue_memory_touch([tea, coffee])
    enqueue_memory_touch([tea])
    assert sent == []  # (nothing on the searches' path)
    wait_until(lambda: sent, "the touch was sent")
    assert [kw["args"] for kw in sent] == [[[tea, coffee, tea]]]
    assert sent[0]["delivery_mode"] == TRANSIENT


def test_the_exit_waits_for_the_counts_the_sender_thread_is_sending(monkeypatch):
    """The exit sends what the process holds (``flush_memory_touches``, atexit), and waits
    for a message the sending thread has begun: the interpreter stops a daemon thread where
    it is once the exit's handlers are done, and the counts it held were lost."""
    begun, release, sent = threading.Event(), threading.Event(), []

    def slow_send(ids):
        begun.set()
        release.wait(5)
        sent.append(ids)

    app.conf.task_always_eager = False  # (as a server runs them; the suite's fixture resets it)
    monkeypatch.setattr(tasks._TOUCHES, "send", slow_send)
    monkeypatch.setattr(tasks._TOUCHES, "seconds", 0.01)
    tea = "00000000-0000-0000-0000-00000000000a"
    enqueue_memory_touch([tea])
    assert begun.wait(5)  # the thread took the count and is sending it
    exiting = threading.Thread(target=flush_memory_touches)
    exiting.start()
    exiting.join(0.3)
    assert exiting.is_alive()
    release.set()
    exiting.join(5)
    assert not exiting.is_alive()
    assert sent == [[tea]]


@pytest.mark.django_db
def test_a_use_named_twice_counts_twice():
    agent = AgentFactory()
    tea, coffee = save(agent, "Likes tea"), save(agent, "Likes coffee")
    assert memories_touch([tea.id, coffee.id, tea.id]) == 2
    tea.refresh_from_db()
    coffee.refresh_from_db()
    assert (tea.access_count, coffee.access_count) == (2, 1)


@pytest.mark.django_db
def test_a_use_counted_after_the_memory_expired_does_not_keep_it_alive():
    """A search found it just before it expired; the count arrives after (it is sent off the
    request path): the prune must still delete it, not extend it for 15 days."""
    agent = AgentFactory()
    fading = save(agent, "Likes tea", expires_in=-timedelta(seconds=1), used=9)
    assert memories_touch([fading.id, fading.id]) == 0
    fading.refresh_from_db()
    assert fading.access_count == 9
    assert memories_prune() == PruneResult(deleted=1, extended=0)


@pytest.mark.django_db
def test_with_the_broker_down_a_touch_is_counted_inline(dead_broker, caplog):
    memory = save(AgentFactory(), "Likes tea")
    enqueue_memory_touch([memory.id])
    flush_memory_touches()  # (what the process's sender does within a second)
    assert "counted now" in caplog.text
    assert "Connection refused" in caplog.text
    memory.refresh_from_db()
    assert memory.access_count == 1
    assert memory.last_accessed_at is not None


def test_the_daily_prune_comes_at_a_time_of_day_whenever_beat_started(settings, monkeypatch):
    """(Counted from beat's start, it came a day after each start: a beat restarted more
    often than daily, without its schedule file, never pruned.)"""
    schedule = settings.CELERY_BEAT_SCHEDULE["prune-memories"]["schedule"]
    for started, due in (
        (datetime(2026, 3, 1, 2, 0, tzinfo=UTC), datetime(2026, 3, 1, 3, 17, tzinfo=UTC)),
        (datetime(2026, 3, 1, 23, 0, tzinfo=UTC), datetime(2026, 3, 2, 3, 17, tzinfo=UTC)),
    ):
        # A fresh beat counts from its start: the next run is the next 03:17, not a day on.
        monkeypatch.setattr(schedule, "nowfun", lambda started=started: started)
        assert started + schedule.remaining_estimate(started) == due
