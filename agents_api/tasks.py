"""Celery tasks of the agents app: they take ids and call a service."""

import contextlib
import logging
import random
from collections.abc import Sequence

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import DatabaseError, transaction

from agents_api import extraction, reading, services, sleeptime
from agents_api.models import Agent, SummarySource
from conversations.models import Conversation
from memsvc.api.idempotency import idempotency_keys_prune
from memsvc.broker import TRANSIENT
from memsvc.celery import Gathered, app, sent
from memsvc.db import DATABASE_DID_NOT_ANSWER
from memsvc.llm import LLMError, llm_configured
from search.tasks import SWEEP_TASK_OPTIONS, sweep

logger = logging.getLogger(__name__)


class TransientLLMError(Exception):
    """Raised to make Celery retry: the LLM may answer next time."""


# A task that asks the LLM: on the LLM's queue (its own worker, ``memsvc.cli``), and ended
# (``SoftTimeLimitExceeded``, then killed 30 s later) when the model takes longer than
# MEMSVC_LLM_TASK_SECONDS; the turns it claimed are given back (``extraction``,
# ``sleeptime``), a tool record keeps its deterministic summary.
LLM_TASK_OPTIONS = {
    "uses_llm": True,  # (``memsvc.celery.route``)
    "soft_time_limit": settings.MEMSVC_LLM_TASK_SECONDS,
    "time_limit": settings.MEMSVC_LLM_TASK_SECONDS + 30,
    "acks_late": True,
}


@app.task(name="agents_api.touch_memories", acks_late=True)
def touch_memories_task(memory_ids: list[str]) -> int:
    return services.memories_touch(memory_ids)


def enqueue_memory_touch(memory_ids: Sequence) -> None:
    """Count a use of each memory a search returned, off the request path: a process's
    counts of the next ``TOUCH_BATCH_SECONDS`` go in one transient message (``_send``).
    With tasks run inline (the tests'), at once."""
    ids = [str(memory_id) for memory_id in memory_ids]
    if ids:
        _TOUCHES.add(ids)


def flush_memory_touches() -> None:
    """Send the counts this process holds now (at exit, and for tests)."""
    _TOUCHES.flush()


def _send(ids: list[str]) -> None:
    """The uses of ``ids`` (a memory once per use) as a transient message (local mode's
    broker does not wait for the disk: a use count need not outlive a crash of the machine,
    and every memory search waited about 1-4 ms for the ``fsync``); with the broker down,
    at once (one cheap UPDATE): a search never fails for its bookkeeping."""
    if sent(touch_memories_task, [ids], instead="counted now", delivery_mode=TRANSIENT):
        return
    try:
        # A savepoint: a failed UPDATE must not break a transaction the caller is in.
        with transaction.atomic():
            services.memories_touch(ids)
    except DatabaseError as exc:
        logger.warning("could not count a use of %d memories: %s", len(ids), exc)


# A process's use counts are sent together, once this long after the first of them: a
# message per search cost each search about 1 ms and the worker a task each (its work beside
# the next searches on 2 cores: REST memory search p95 12.8 -> 26-28 ms, docs/benchmarks.md).
# A process killed outright loses at most this much of its counts; one that exits sends them.
TOUCH_BATCH_SECONDS = 1.0
_TOUCHES = Gathered(_send, seconds=TOUCH_BATCH_SECONDS, name="memory-touches")


@app.task(name="agents_api.prune_memories", acks_late=True)
def prune_memories_task() -> dict[str, int]:
    """The daily lifecycle run (``memsvc prune`` does the same by hand): memories, the
    Idempotency-Keys past their time, and Letta's blocks whose attach never came."""
    result = services.memories_prune()
    forgotten = idempotency_keys_prune()
    unattached = services.unattached_blocks_prune()
    logger.info(
        "pruned memories: %d deleted, %d extended; %d idempotency keys forgotten; "
        "%d unattached blocks deleted",
        result.deleted,
        result.extended,
        forgotten,
        unattached,
    )
    return {
        "deleted": result.deleted,
        "extended": result.extended,
        "idempotencyKeys": forgotten,
        "unattachedBlocks": unattached,
    }


@app.task(name="agents_api.sweep_unembedded_memories", bind=True, **SWEEP_TASK_OPTIONS)
def sweep_unembedded_memories_task(self) -> int:
    """Embed memories saved while the embedding backend was down. Runs every minute.

    A memory is embedded when it is saved, so there is no task per memory to race with:
    whatever is waiting is the sweep's. Keywords find those memories meanwhile.
    """
    return sweep(self, services.memories_embed_pending, "memories")


# --- memories distilled from conversations ---------------------------------------------------


@app.task(
    name="agents_api.extract_memories",
    autoretry_for=DATABASE_DID_NOT_ANSWER,
    retry_backoff=5,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=5,
    **LLM_TASK_OPTIONS,
)
def extract_memories_task(agent_id: str, conversation_id: str, tries: int = 0) -> int:
    agent = Agent.objects.filter(id=agent_id).first()
    conversation = Conversation.objects.filter(id=conversation_id).first()
    if agent is None or conversation is None:
        return 0  # deleted meanwhile
    read = f"conversation {conversation_id} for agent {agent_id}"
    with _turns_given_back(extract_memories_task, [agent_id, conversation_id], tries, read):
        return len(extraction.memories_extract(agent, conversation))
    return 0


# How many times a reader's task is sent again when its LLM could not answer
# (``reading.TryAgain``): after about READ_RETRY_SECONDS, then twice as long each time
# (30 s, 1 min, 2 min, each between half and all of it, so that the tasks of one outage do
# not all ask at once); then its turns wait for the conversation's next write.
READ_RETRIES = 3
READ_RETRY_SECONDS = 30


@contextlib.contextmanager
def _turns_given_back(task, args: list, tries: int, read: str):
    """A reader's task (``task`` with ``args``, tried ``tries`` times before) whose turns
    were given back (``Claim.settle``): one past ``MEMSVC_LLM_TASK_SECONDS`` said in one
    line (its traceback of some 95 lines was logged for each task while the model was slow:
    review), one whose LLM could not answer now sent again for later, READ_RETRIES times.
    (Sent anew, not Celery's retry: that one counts the database's retries too, and waits
    on a broker that is down, ``sent`` does neither: code review.)"""
    try:
        yield
    except SoftTimeLimitExceeded:
        logger.warning(
            "the turns of %s were given back: the model took longer than %s s",
            read,
            settings.MEMSVC_LLM_TASK_SECONDS,
        )
    except reading.TryAgain:
        if tries >= READ_RETRIES:
            logger.warning(
                "the turns of %s wait for its next write: the model did not answer %d times",
                read,
                tries + 1,
            )
            return
        later = READ_RETRY_SECONDS * 2**tries * random.uniform(0.5, 1)  # noqa: S311 (a jitter)
        sent(
            task,
            args,
            kwargs={"tries": tries + 1},
            countdown=later,
            instead="its turns wait for its next write",
        )


def enqueue_memory_extraction(agent: Agent, conversation: Conversation) -> None:
    """Once the caller's transaction has committed, hand the agent's next extraction from
    the conversation to a worker if it is due (``extraction.extraction_due``: two small
    queries, only with an LLM configured).

    Whatever fails here, the write that called it has succeeded: the error is logged, and
    the due extraction is found again at the agent's next write.
    """

    def enqueue():
        if extraction.extraction_due(agent, conversation):
            args = [str(agent.id), str(conversation.id)]
            sent(extract_memories_task, args, instead="the next turn will ask again")

    transaction.on_commit(enqueue, robust=True)


# --- the memory bank's observer --------------------------------------------------------------


@app.task(
    name="agents_api.observe_tool_record",
    autoretry_for=(TransientLLMError, *DATABASE_DID_NOT_ANSWER),
    retry_backoff=5,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=5,
    **LLM_TASK_OPTIONS,
)
def observe_tool_record_task(record_id: str) -> bool:
    """The observer LLM's summary of one tool record (``services.tool_record_observe``).
    A model that is unreachable or overloaded is asked again later; one that answers
    nothing (or refuses) leaves the record its deterministic summary."""
    try:
        return services.tool_record_observe(record_id)
    except SoftTimeLimitExceeded:
        logger.warning(
            "tool record %s keeps its fallback summary: the model took longer than %s s",
            record_id,
            settings.MEMSVC_LLM_TASK_SECONDS,
        )
        return False
    except LLMError as exc:
        if exc.transient:
            raise TransientLLMError(str(exc)) from exc
        logger.warning("tool record %s keeps its fallback summary: %s", record_id, exc)
        return False


def enqueue_tool_record_observation(records) -> None:
    """Once the caller's transaction has committed, hand the records that have only the
    deterministic summary to the observer's LLM (when one is configured), one task each
    (the seed: parallel calls, one observer call each). A broker that is down costs only
    the better summary: each record already has its deterministic one."""
    record_ids = [r.id for r in records if r.summary_source == SummarySource.FALLBACK]
    if not record_ids or not llm_configured():
        return

    def enqueue():
        for record_id in record_ids:
            if not sent(
                observe_tool_record_task, [str(record_id)], instead="fallback summaries kept"
            ):
                return

    transaction.on_commit(enqueue, robust=True)


@app.task(name="agents_api.sweep_unembedded_tool_records", bind=True, **SWEEP_TASK_OPTIONS)
def sweep_unembedded_tool_records_task(self) -> int:
    """Embed tool records written while the embedding backend was down (or whose LLM
    summary came then). Runs every minute, as the memory sweep does."""
    return sweep(self, services.tool_records_embed_pending, "tool records")


# --- Letta's sleeptime agent -----------------------------------------------------------------


@app.task(name="agents_api.observe_letta_turns", **LLM_TASK_OPTIONS)
def observe_letta_turns_task(agent_id: str, tries: int = 0) -> list[str]:
    agent = Agent.objects.filter(id=agent_id).first()
    if agent is None:
        return []
    with _turns_given_back(
        observe_letta_turns_task, [agent_id], tries, f"agent {agent_id}'s captures"
    ):
        return sleeptime.blocks_observe(agent)
    return []


def enqueue_letta_observation(agent: Agent) -> None:
    """After the capture commits, hand the agent's blocks to the observer when enough turns
    have come (``sleeptime.observation_due``); a broker failure is logged, and the next
    capture asks again."""

    def enqueue():
        # As committed: the capture may have made the agent's conversation.
        fresh = Agent.objects.filter(pk=agent.pk).first()
        if fresh is not None and sleeptime.observation_due(fresh):
            sent(
                observe_letta_turns_task, [str(agent.id)], instead="the next capture will ask again"
            )

    transaction.on_commit(enqueue, robust=True)


# --- turns a killed worker was reading --------------------------------------------------------


@app.task(name="agents_api.sweep_lapsed_reads")
def sweep_lapsed_reads_task() -> int:
    """Give back the turns of every reader's lease that lapsed (``reading``: its worker was
    killed, or is past its time), and hand the readers then due to a worker. Runs every
    minute; returns how many it handed on. (Without an LLM, or with the observer turned off
    since, nothing is due: the turns wait, given back, as after any failure.)"""
    readers = [(extract_memories_task, list(pair)) for pair in extraction.recover_lapsed_claims()]
    readers += [(observe_letta_turns_task, [i]) for i in sleeptime.recover_lapsed_observers()]
    if readers:
        logger.warning(
            "%d readers' leases lapsed (their workers killed?): read again", len(readers)
        )
    return sum(sent(task, args, instead="the next write will ask again") for task, args in readers)
