"""Celery tasks of the agents app: they take ids and call a service."""

import logging
from collections.abc import Sequence

from django.db import transaction

from agents_api import extraction, services
from agents_api.models import Agent
from conversations.models import Conversation
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


# --- memories distilled from conversations ---------------------------------------------------


@app.task(name="agents_api.extract_memories", acks_late=True)
def extract_memories_task(agent_id: str, conversation_id: str) -> int:
    agent = Agent.objects.filter(id=agent_id).first()
    conversation = Conversation.objects.filter(id=conversation_id).first()
    if agent is None or conversation is None:
        return 0  # deleted meanwhile
    return len(extraction.memories_extract(agent, conversation))


def enqueue_memory_extraction(agent: Agent, conversation: Conversation) -> None:
    """Once the caller's transaction has committed, hand the agent's next extraction from
    the conversation to a worker if it is due (``extraction.extraction_due``: two small
    queries, only with an LLM configured).

    Whatever fails here, the write that called it has succeeded: the error is logged, and
    the due extraction is found again at the agent's next write.
    """

    def enqueue():
        if not extraction.extraction_due(agent, conversation):
            return
        try:
            extract_memories_task.apply_async(
                args=[str(agent.id), str(conversation.id)], retry=False
            )
        except Exception as exc:  # any broker failure: kombu, redis, amqp, OS errors
            logger.warning("could not enqueue a memory extraction (%s); next turn will", exc)

    transaction.on_commit(enqueue, robust=True)
