"""Celery workers' signs of life, for ``/v1/health``: the broker answering said nothing of
whether anything took the tasks sent to it (review: health said ok with no worker running,
while every message waited for its embedding).

Each worker writes its name and the time into ``worker_heartbeat`` every
``HEARTBEAT_SECONDS`` (``memsvc.celery.Heartbeat``, from the worker's timer thread) and takes
its row out when it stops; health counts the workers heard from within ``HEARD_WITHIN``. A
worker killed (``kill -9``, its machine gone) leaves its row, which then ages out."""

import logging
from datetime import timedelta

from django.db import DatabaseError, connection
from django.utils import timezone

from memsvc.models import WorkerHeartbeat
from memsvc.outage import Reminder

logger = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 30
# Three beats missed: a worker busy with a long task still beats (the timer is a thread of
# its main process, not of the processes running tasks).
HEARD_WITHIN = timedelta(seconds=3 * HEARTBEAT_SECONDS)
# Rows of workers not heard from for this long (names of restarted or moved workers) go.
FORGOTTEN_AFTER = timedelta(days=1)

_NOT_WRITTEN = Reminder()


def beat(worker: str) -> None:
    """The worker's sign of life, written now (one statement); a database that refuses it
    is said once a minute, never raised into the worker."""
    now = timezone.now()
    try:
        WorkerHeartbeat.objects.bulk_create(
            [WorkerHeartbeat(worker=worker, seen_at=now)],
            update_conflicts=True,
            unique_fields=["worker"],
            update_fields=["seen_at"],
        )
        WorkerHeartbeat.objects.filter(seen_at__lt=now - FORGOTTEN_AFTER).delete()
    except DatabaseError as exc:
        _NOT_WRITTEN.say(logger.warning, "worker %s: its heartbeat not written (%s)", worker, exc)
    finally:
        # (The timer's thread beats twice a minute: a connection kept between would be one
        # more the server holds, and one a fork of the worker's pool could inherit.)
        connection.close()


def stopped(worker: str) -> None:
    """The worker's row taken out: health stops counting it at once."""
    try:
        WorkerHeartbeat.objects.filter(worker=worker).delete()
    except DatabaseError:
        pass  # (it ages out)
    finally:
        connection.close()


def workers_heard_from() -> int:
    """How many workers said they were alive within ``HEARD_WITHIN``."""
    return WorkerHeartbeat.objects.filter(seen_at__gte=timezone.now() - HEARD_WITHIN).count()
