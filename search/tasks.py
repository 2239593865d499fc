"""Celery tasks of the search app: they take ids, and call a service that reloads the rows."""

import functools
from collections.abc import Sequence

from celery.utils.log import get_task_logger

from memsvc.broker import TRANSIENT
from memsvc.celery import Gathered, app, sent
from memsvc.db import DATABASE_DID_NOT_ANSWER
from search import services
from search.embeddings import EmbeddingError

logger = get_task_logger(__name__)

# Messages younger than this are left to the task queued when they were committed.
SWEEP_GRACE_SECONDS = 30


class TransientEmbeddingError(Exception):
    """Raised to make Celery retry: the backend may answer next time."""


@app.task(
    name="search.embed_messages",
    autoretry_for=(TransientEmbeddingError,),
    retry_backoff=2,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=8,
    acks_late=True,
)
def embed_messages_task(message_ids: list[str]) -> int:
    try:
        return services.embed_messages(message_ids, batch=services.TASK_BATCH)
    except DATABASE_DID_NOT_ANSWER as exc:
        # The database did not answer (restarting, a connection it dropped) or chose this
        # task to end a deadlock (with a deletion counting its messages out, say): nothing
        # was written, and it is tried again. (Only a deadlock was: a restart's tasks were
        # dropped, their messages left to the sweep for a minute or more; review.)
        raise TransientEmbeddingError(str(exc)) from exc
    except EmbeddingError as exc:
        if exc.transient:
            raise TransientEmbeddingError(str(exc)) from exc
        # Not worth retrying (a bad model name, say): the sweep tries again later, and the
        # messages stay findable by keywords meanwhile.
        logger.error("embedding failed for %d messages: %s", len(message_ids), exc)
        return 0


# Batches per sweep: a large backlog is worked off over several runs, not by one run that
# outlasts many minutes.
SWEEP_MAX_BATCHES = 40

# The sweeps (of messages the queue lost, of memories and tool records saved while the
# backend was down): a backend that is restarting is tried again within the minute; a longer
# outage is left to the next runs, so retries of one run never pile up behind the next. (The
# messages' sweep gave up at once: code review.)
SWEEP_TASK_OPTIONS = {
    "autoretry_for": (TransientEmbeddingError,),
    "retry_backoff": 2,
    "retry_backoff_max": 16,
    "retry_jitter": True,
    "max_retries": 3,
    "acks_late": True,
}


def sweep(task, embed_pending, what: str) -> int:
    """Run one sweep (``embed_pending(max_batches=...)``) of ``task`` (bound): a transient
    failure is retried by the task, and after its last try said in one line, as another (a
    bad model name, say) is; the next minute's run tries again. (An outage of minutes
    logged a traceback from every sweep every minute: review.)"""
    try:
        embedded = embed_pending(max_batches=SWEEP_MAX_BATCHES)
    except EmbeddingError as exc:
        if exc.transient and task.request.retries < SWEEP_TASK_OPTIONS["max_retries"]:
            raise TransientEmbeddingError(str(exc)) from exc
        log = logger.warning if exc.transient else logger.error
        log("the sweep of %s stopped: %s", what, exc)
        return 0
    if embedded:
        logger.info("sweep embedded %d %s", embedded, what)
    return embedded


@app.task(name="search.sweep_unembedded", bind=True, **SWEEP_TASK_OPTIONS)
def sweep_unembedded_task(self) -> int:
    """Embed whatever the queue lost (broker down, worker killed). Runs every minute."""
    return sweep(
        self,
        functools.partial(services.embed_pending, older_than_seconds=SWEEP_GRACE_SECONDS),
        "messages",
    )


def enqueue_embedding(message_ids: Sequence) -> None:
    """Hand committed messages to a worker: a process's messages of the next
    ``EMBEDDING_GATHER_SECONDS`` go together (``Gathered``), in tasks of ``TASK_BATCH``. A
    broker that is down loses nothing: the sweep embeds whatever is still waiting, so the
    error is logged and the process goes on. For the same reason the message is transient:
    local mode's broker does not wait for the disk (an append waited about 0.5-0.7 ms for
    the ``fsync``; docs/benchmarks.md, "An Intel host again"), and a message lost with the
    machine, or with a process killed outright, is the sweep's."""
    _EMBEDDINGS.add([str(message_id) for message_id in message_ids])


def flush_embedding_requests() -> None:
    """Send the messages to embed this process holds now (at exit, and for tests)."""
    _EMBEDDINGS.flush()


def _send_embedding(ids: list[str]) -> None:
    for start in range(0, len(ids), services.TASK_BATCH):
        sent(
            embed_messages_task,
            [ids[start : start + services.TASK_BATCH]],
            instead="the sweep will embed them",
            delivery_mode=TRANSIENT,
        )


# How long after a process's first message to embed its next ones are gathered before the
# task goes: under load several appends a task (bench.load: about a fifth of an append's
# Python was its own task's message), one alone waits this long for its worker.
EMBEDDING_GATHER_SECONDS = 0.025
_EMBEDDINGS = Gathered(_send_embedding, seconds=EMBEDDING_GATHER_SECONDS, name="embedding-requests")
