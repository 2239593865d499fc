"""Shared fixtures: the alice (owner) / bob (shared with) / charlie (stranger) personas.

The database is the embedded PostgreSQL + pgvector of local mode; pytest-django creates the
test database on it once per session.
"""

import base64
import json
import os
import sys
from dataclasses import dataclass

import pytest

from memsvc.tokens import mint_user_token


def pytest_configure(config):
    """The tests run the web app, whose WhiteNoise scans STATIC_ROOT when it starts and warns
    when it is missing: the session makes it, as `memsvc serve` does (settings make nothing).
    Before collection, which already builds the app (tests/memsvc/test_schemathesis.py).
    Passwords are hashed with few iterations (``tests.hashers``)."""
    from django.conf import settings

    settings.STATIC_ROOT.mkdir(parents=True, exist_ok=True)
    settings.PASSWORD_HASHERS = ["tests.hashers.QuickPBKDF2PasswordHasher"]
    # The processes tests start on data directories of their own (servers, workers, the
    # command line) use the session's model graphs: each would make its own in 5-10 s.
    os.environ.setdefault("MEMSVC_MODEL_CACHE_DIR", str(settings.MEMSVC_MODEL_CACHE_DIR))


def pytest_collection_modifyitems(items):
    """schemathesis makes a test of each API operation, named ``test_...[GET /path]``, but
    under pytest 9 they all get the function's node id (pytest builds an item's id from its
    parametrize call, which schemathesis does not use): pytest-xdist, which hands tests to
    its workers by id, ran one operation's test of each module. Each gets its operation in
    its id again."""
    for item in items:
        label = getattr(item, "operation_label", None)
        if label and not item.nodeid.endswith("]"):
            item._id = item._id.with_params(label)
    items.sort(key=_longest_first)


# The modules that take longest, longest first (seconds of test time on the slowest host
# kind, a 2-core Zen 3, 2026-12-04). ``scripts/test`` hands whole modules to its processes in
# the order of the collection (``--dist loadfile --no-loadscope-reorder``): these go first,
# the many short ones fill in after them, so that no process is left with a long module at
# the end while the others idle (by number of tests, xdist's own order, test_serve.py came
# near the end).
LONGEST_MODULES = [
    "tests/agents_api/test_data_rights.py",  # 155 (before its world was built by services)
    "tests/memsvc/test_settings.py",  # 115
    "tests/agents_api/test_mcp.py",  # 101
    "tests/memsvc/test_client_delivery.py",  # 86
    "tests/memsvc/test_serve.py",  # 80
    "tests/browser/test_pages.py",  # 74
    "tests/agents_api/test_memory_extraction.py",  # 51
    "tests/search/test_embeddings.py",  # 42 (2026-12-03)
    "tests/agents_api/test_schemathesis.py",  # 41
    "tests/memsvc/test_schemathesis.py",  # 40
    "tests/memsvc/test_rate_limits.py",  # 38
    "tests/conversations/test_services.py",  # 35
    "tests/memsvc/test_cli.py",  # 30
]


def _longest_first(item) -> int:
    module = item.nodeid.split("::")[0]
    return LONGEST_MODULES.index(module) if module in LONGEST_MODULES else len(LONGEST_MODULES)


@pytest.fixture(scope="session", autouse=True)
def test_database_left_alone(django_db_setup, django_db_blocker):
    """At the end of the session the test database is dropped, which PostgreSQL refuses while
    anyone is connected. The servers the tests run in this process (live servers, the MCP
    transport's loop and tool pool) keep a persistent connection on each thread that served
    a request, as in production, and those threads outlive the tests: their connections are
    ended here, from the database's side (a thread's connection can only be closed by the
    thread)."""
    yield
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT pg_terminate_backend(pid) FROM pg_stat_activity
            WHERE datname = current_database() AND pid <> pg_backend_pid()
            """
        )


@dataclass(frozen=True)
class Persona:
    id: str

    def auth_headers(self, ttl_seconds: int = 600) -> dict[str, str]:
        """Real ``Authorization`` headers, as a chat frontend would send them."""
        return {"HTTP_AUTHORIZATION": f"Bearer {mint_user_token(self.id, ttl_seconds=ttl_seconds)}"}


@pytest.fixture
def alice() -> Persona:
    return Persona("alice")


@pytest.fixture
def bob() -> Persona:
    return Persona("bob")


@pytest.fixture
def charlie() -> Persona:
    return Persona("charlie")


@pytest.fixture
def api(client):
    from tests.api import Api

    return Api(client)


@pytest.fixture(autouse=True)
def searches_learn_of_their_own_scopes():
    """A search learns whether a scope holds rows and how to find its nearest vectors from
    the rows of its own test (a process keeps what it learned a minute:
    ``search.statements.SCOPE_KEPT_SECONDS``)."""
    from search import statements

    statements.forget_scopes()


@pytest.fixture(autouse=True)
def celery_runs_tasks_inline():
    """Tasks run in the calling process (a real worker is tested in tests/search).

    Celery marks a task run inline by a process-wide flag (``denied_join_result``) that two
    threads running tasks at once can leave set (each puts back what it found): every later
    ``result.get()`` of the process was then "Never call result.get() within a task!" (15
    tests of one CI worker, after a test whose threads appended at once). Cleared for each
    test."""
    from celery._state import _set_task_join_will_block

    from memsvc.celery import app

    _set_task_join_will_block(False)
    app.conf.task_always_eager = True
    yield
    # What a test that sent tasks for real left gathered for its process's sender thread
    # (``memsvc.celery.Gathered``) is that test's: not sent later, inline, during another.
    from agents_api.tasks import _TOUCHES
    from search.tasks import _EMBEDDINGS

    for gathered in (_EMBEDDINGS, _TOUCHES):
        with gathered._lock:
            gathered._pending.clear()
    app.conf.task_always_eager = False


@pytest.fixture(autouse=True)
def no_outage_is_remembered():
    """A test's broker or Redis is up, and its LLM takes memsvc's setup, until it fails in
    that test (a process remembers a failure a few seconds or a minute: ``memsvc.outage``)."""
    from memsvc.api.ratelimit import REDIS_OUTAGE
    from memsvc.celery import BROKER_OUTAGE, NOT_SENT_SAID
    from memsvc.llm import LLM_REFUSAL

    BROKER_OUTAGE.end()
    NOT_SENT_SAID.clear()
    REDIS_OUTAGE.end()
    LLM_REFUSAL.end()


@pytest.fixture(autouse=True)
def no_learning_warning_is_remembered():
    """Each test's ``learning()`` warns of a failure as a fresh process's would (a process
    warns of each kind once until a call has memory again: ``memsvc.client.hooks.warn``).
    (Not imported here when no test did: its import patches the model clients.)"""
    hooks = sys.modules.get("memsvc.client.hooks")
    if hooks is not None:
        hooks.forget_warnings()
        hooks._said_once.clear()  # (what a process says once in its life: once a test)


@pytest.fixture
def dead_broker():
    """A broker nobody listens on, and tasks really sent to it (not run inline)."""
    from tests.search.conftest import sent_to_broker

    with sent_to_broker(broker_url="redis://127.0.0.1:1/0"):
        yield


@pytest.fixture
def local_broker(tmp_path):
    """Local mode's broker (``memsvc.broker``) in folders of the test's own, and tasks really
    sent to it (not run inline): the fixture is a function giving what its queue holds, each
    message as the worker would read it (``properties``, ``headers``, and the ``body``
    decoded: Celery's ``[args, kwargs, options]``)."""
    from tests.search.conftest import sent_to_broker

    folders = {name: tmp_path / name for name in ("queue", "processed", "control")}
    for folder in folders.values():
        folder.mkdir()
    folder_options = {
        "data_folder_in": str(folders["queue"]),
        "data_folder_out": str(folders["queue"]),
        "processed_folder": str(folders["processed"]),
        "control_folder": str(folders["control"]),
        "store_processed": False,
    }

    def queued() -> list[dict]:
        messages = []
        for path in sorted(folders["queue"].glob("*.msg")):
            message = json.loads(path.read_bytes())
            assert message["properties"]["body_encoding"] == "base64"
            message["body"] = json.loads(base64.b64decode(message["body"]))
            messages.append(message)
        return messages

    with sent_to_broker(broker_url="filesystem://", broker_transport_options=folder_options):
        yield queued
