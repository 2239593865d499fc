"""Celery workers' signs of life, for ``/v1/health``: the broker answering said nothing of
whether anything took the tasks sent to it (review: health said ok with no worker running,
while every message waited for its embedding).

Each worker writes its name, the queues it takes tasks from and the time into
``worker_heartbeat`` every ``HEARTBEAT_SECONDS`` (``memsvc.celery.Heartbeat``, from a thread of
its own) and takes its row out when it stops; health counts the workers of each queue heard
from within ``HEARD_WITHIN``. A worker killed (``kill -9``, its machine gone) leaves its row,
which then ages out. Every time is the database's: workers and web processes may run on
machines whose clocks differ (code review)."""

import logging
from collections.abc import Sequence
from datetime import timedelta

from django.db import connection

from memsvc.models import WorkerHeartbeat
from memsvc.outage import Reminder

logger = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 30
# Three beats missed: a worker busy with a long task still beats (its thread is one of the
# worker's main process, not of the processes running tasks).
HEARD_WITHIN = timedelta(seconds=3 * HEARTBEAT_SECONDS)
# Rows of workers not heard from for this long (names of restarted or moved workers) go.
FORGOTTEN_AFTER = timedelta(days=1)

_NOT_WRITTEN = Reminder()

_TABLE = WorkerHeartbeat._meta.db_table


def beat(worker: str, queues: Sequence[str]) -> None:
    """The worker's sign of life, written now; any failure (the database down, or anything
    else) is said once a minute, never raised into the worker's thread, which beats again."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {_TABLE} (worker, queues, seen_at)"  # noqa: S608 (the model's table)
                " VALUES (%s, %s, statement_timestamp()) ON CONFLICT (worker) DO UPDATE"
                " SET queues = excluded.queues, seen_at = excluded.seen_at;"
                f" DELETE FROM {_TABLE} WHERE seen_at < statement_timestamp() - %s",
                [worker, list(queues), FORGOTTEN_AFTER],
            )
    except Exception as exc:  # (a thread that ended would say the worker gone for good)
        _NOT_WRITTEN.say(logger.warning, "worker %s: its heartbeat not written (%s)", worker, exc)
    finally:
        # (Twice a minute: a connection kept between would be one more the server holds,
        # and one a fork of the worker's pool could inherit.)
        connection.close()


def stopped(worker: str) -> None:
    """The worker's row taken out: health stops counting it at once. (A beat still waiting
    on a database slow to answer may write it again after: it then ages out.)"""
    try:
        WorkerHeartbeat.objects.filter(worker=worker).delete()
    except Exception as exc:
        logger.info("worker %s: its heartbeat not taken out (%s); it ages out", worker, exc)
    finally:
        connection.close()


def workers_heard_from(*queues: str) -> list[int]:
    """How many workers taking tasks from each of ``queues`` said they were alive within
    ``HEARD_WITHIN``, in one statement."""
    counted = ", ".join("count(*) FILTER (WHERE %s = ANY(queues))" for _ in queues)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {counted} FROM {_TABLE}"  # noqa: S608 (the model's table, constant texts)
            " WHERE seen_at >= statement_timestamp() - %s",
            [*queues, HEARD_WITHIN],
        )
        return list(cursor.fetchone())
