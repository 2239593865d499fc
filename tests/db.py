"""Helpers for tests that check what the database refuses, or reach it from other processes."""

import re
import threading
import time
from contextlib import contextmanager
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import IntegrityError, connection, transaction


@contextmanager
def refused(error=IntegrityError, match: str | None = None):
    """The statements inside must fail with ``error``; a savepoint keeps the test usable."""
    with pytest.raises(error, match=match), transaction.atomic():
        yield


def check_deferred_constraints() -> None:
    """Run the checks PostgreSQL would run at commit, inside the test's transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")


def database_url() -> str:
    """The test database as ``DATABASE_URL`` for a process a test starts (a worker, an MCP
    server); with ``MEMSVC_LOCAL_MODE=1`` it reads the test data dir's secrets, as the tests do."""
    db = settings.DATABASES["default"]
    host = quote(db["HOST"], safe="")
    return f"postgres://{db['USER']}@{host}:{db['PORT']}/{db['NAME']}"


@contextmanager
def recorded_statements():
    """The SQL of every statement sent inside, in order (a list filled as they go)."""
    sent = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield sent


# How long the held transaction waits for the request to wait for it, at most: a request that
# never does (it needs none of the rows held) runs on meanwhile.
HELD_AT_MOST_SECONDS = 1.5


def while_held(hold, request, *, waits: bool = False):
    """``request()`` (an API call, made here) while ``hold()`` has run in a transaction of
    another connection that commits only once the request is waiting for its locks (or has
    ended, or ``HELD_AT_MOST_SECONDS`` have passed); what ``request()`` returned.
    ``waits``: the request must not end before that transaction commits (it waited for
    it). (Tests that need real commits: ``transaction=True``.)"""
    held, done, committing = threading.Event(), threading.Event(), threading.Event()
    connection.ensure_connection()
    requester = connection.connection.info.backend_pid  # (the request runs on this thread)

    def other_transaction():
        try:
            with transaction.atomic():
                hold()
                held.set()
                holder = connection.connection.info.backend_pid
                deadline = time.monotonic() + HELD_AT_MOST_SECONDS
                # Until the request waits for a lock of this transaction: a fixed 1.5 s was
                # most of the time of 80 tests.
                while not done.is_set() and time.monotonic() < deadline:
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT %s = ANY(pg_blocking_pids(%s))", [holder, requester])
                        if cursor.fetchone()[0]:
                            break
                    done.wait(0.01)
                # Before the commit, not after it: the commit frees the request, which could
                # end before this thread ran again (a request that had waited, seen as not).
                committing.set()
        finally:
            connection.close()

    thread = threading.Thread(target=other_transaction)
    thread.start()
    assert held.wait(10)
    try:
        result = request()
        ended_first = not committing.is_set()
    finally:
        done.set()
        thread.join()
    assert not (waits and ended_first), "the request ended before the held transaction committed"
    return result


@contextmanager
def plans_of(start: str):
    """The plans of the statements sent meanwhile that begin with ``start``, each explained
    just before it runs, as it is sent (past the planner settings
    ``search.statements.execute_planned`` sends before it)."""
    plans = []
    begins = re.compile(r"(^|;)\s*" + re.escape(start))

    def explain(execute, sql, params, many, context):
        found = begins.search(sql)
        if found and "EXPLAIN" not in sql:
            cursor = context["cursor"]
            at = found.end() - len(start)
            cursor.execute(f"{sql[:at]}EXPLAIN {sql[at:]}", params)
            while cursor.description is None and cursor.nextset():
                pass  # past the settings
            plans.append("\n".join(line for (line,) in cursor.fetchall()))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(explain):
        yield plans
