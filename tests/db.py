"""Helpers for tests that check what the database refuses, or reach it from other processes."""

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
