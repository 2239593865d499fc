"""Helpers for tests that check what the database refuses."""

from contextlib import contextmanager

import pytest
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
