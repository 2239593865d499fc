"""Celery tasks of the agents app: they take ids and call a service."""

import logging
from collections.abc import Sequence

from agents_api import services
from memsvc.celery import app

logger = logging.getLogger(__name__)


@app.task(name="agents_api.touch_memories", acks_late=True)
def touch_memories_task(memory_ids: list[str]) -> int:
    return services.memories_touch(memory_ids)


def enqueue_memory_touch(memory_ids: Sequence) -> None:
    """Count a use of each memory a search returned, off the request path; with the broker
    down, at once (one cheap UPDATE): a search never fails for its bookkeeping."""
    ids = [str(memory_id) for memory_id in memory_ids]
    if not ids:
        return
    try:
        touch_memories_task.apply_async(args=[ids], retry=False)
    except Exception as exc:  # any broker failure: kombu, redis, amqp, OS errors
        logger.warning("could not enqueue a memory touch (%s); counted now", exc)
        services.memories_touch(ids)
