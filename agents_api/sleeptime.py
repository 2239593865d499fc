"""Letta's sleeptime agent, as a task: every ``sleeptime_agent_frequency`` captured turns of
an agent (``POST /v1/agents/{id}/messages/capture``), the LLM reads the new turns and
rewrites the agent's memory blocks (the ``human`` block first) within each block's limit.
Each change is a block revision by ``agent:<id>`` like any other write.

Without an LLM (``memsvc.llm``) captures are stored and nothing else happens. The turns are
claimed before the LLM is asked (the agent's row lock decides between two workers); a
transient failure (or any other error) gives them back for the next capture, as the
extraction's are (``extraction.given_back``: turns a later observation read past are read
first), a malformed answer changes nothing, and a block changed while the LLM read it keeps
that change (the turns are given back).
"""

import logging

from django.db import transaction

from agents_api import services
from agents_api.extraction import given_back, unread_taken
from agents_api.models import Agent, MemoryBlock
from agents_api.selectors import memory_blocks
from agents_api.services.letta import letta_settings
from conversations.models import Role
from conversations.selectors import conversation_messages
from memsvc.api.errors import ApiError
from memsvc.db import locked_row
from memsvc.llm import LLMError, chat, json_answer, llm_configured, transcript_line

logger = logging.getLogger(__name__)

FREQUENCY_KEY = "sleeptime_agent_frequency"
THROUGH_KEY = "observed_through_seq"  # the last message the observer has read
UNREAD_KEY = "observed_unread"  # turns given back after it read past them: [after, through]
MAX_TRANSCRIPT_MESSAGES = 100
MAX_MESSAGE_CHARS = 4_000

OBSERVER_INSTRUCTIONS = """\
You maintain the memory blocks of an AI assistant: short texts it reads before every \
conversation. Read the new conversation turns and update the blocks with what the \
assistant should remember: in the "human" block, facts about the user (name, preferences, \
plans, relationships); in other blocks, what their description asks for. Keep what is \
still true, correct what changed, drop placeholders once you know something real. Each \
block must stay within its character limit.

Answer with JSON only: {"blocks": [{"label": "human", "value": "<the whole new text>"}]}, \
listing only the blocks that change ({"blocks": []} when none does)."""


def _frequency(agent: Agent) -> int:
    letta = letta_settings(agent)
    frequency = letta.get(FREQUENCY_KEY)
    if not letta.get("enable_sleeptime") or not isinstance(frequency, int) or frequency < 1:
        return 0
    return frequency


def _unread(agent: Agent):
    """The agent's captured user turns the observer has not read, and the turns around them."""
    if agent.local_conversation is None:
        return None
    through = letta_settings(agent).get(THROUGH_KEY) or 0
    return conversation_messages(agent.local_conversation, for_agent=True).filter(seq__gt=through)


def _given_back(agent: Agent) -> list:
    """The spans of turns given back to read first (``extraction.given_back``)."""
    spans = letta_settings(agent).get(UNREAD_KEY)
    return [
        span
        for span in (spans if isinstance(spans, list) else [])
        if isinstance(span, list) and len(span) == 2 and all(type(seq) is int for seq in span)
    ]


def observation_due(agent: Agent) -> bool:
    """An LLM, a sleeptime frequency, and turns given back to read again or at least that
    many captured turns unread."""
    frequency = _frequency(agent)
    unread = _unread(agent) if frequency and llm_configured() else None
    return unread is not None and (
        bool(_given_back(agent)) or unread.filter(role=Role.USER).count() >= frequency
    )


@transaction.atomic
def _claim(agent: Agent) -> tuple[int, list] | None:
    """Take the unread turns when enough have come: (what was read through before, the
    turns). The agent's row lock makes a second worker wait and then find them taken."""
    agent = Agent.objects.select_for_update().filter(pk=agent.pk).first()
    if agent is None or not observation_due(agent):  # (deleted since the task read it)
        return None
    through = letta_settings(agent).get(THROUGH_KEY) or 0
    captured = conversation_messages(agent.local_conversation, for_agent=True)

    def window(after: int, until: int | None = None) -> list:
        # The oldest first, the rest for the next observation: the blocks learn the turns
        # in the order they came (the newest 100 were read, and the older never: review).
        turns = captured.filter(seq__gt=after)
        if until is not None:
            turns = turns.filter(seq__lte=until)
        return list(turns.order_by("seq")[:MAX_TRANSCRIPT_MESSAGES])

    after, turns, spans = unread_taken(_given_back(agent), window)
    if turns:
        _save_place(agent, through, spans)
        return after, turns
    # (The turns given back all deleted since: as many as the frequency asks, or none yet;
    # ``turns[-1]`` failed on none: code review.)
    if _unread(agent).filter(role=Role.USER).count() < _frequency(agent):
        _save_place(agent, through, spans)
        return None
    turns = window(through)
    _save_place(agent, turns[-1].seq, spans)
    return through, turns


def with_place_kept(metadata: dict, agent: Agent) -> dict:
    """``metadata`` given to ``agent`` (the admin's) with the observer's place in it as it is
    in ``agent`` (read under its row lock by the caller): Letta's settings as its API takes
    them hold no place, and a save of the agent's description sent the model every captured
    turn again, and lost those given back (review)."""
    letta = metadata.get("letta")
    place = {
        key: value
        for key, value in letta_settings(agent).items()
        if key in (THROUGH_KEY, UNREAD_KEY)
    }
    if not isinstance(letta, dict) or not place:
        return metadata
    return {**metadata, "letta": {**letta, **place}}


def _save_place(agent: Agent, through: int, unread: list) -> None:
    letta = {**letta_settings(agent), THROUGH_KEY: through, UNREAD_KEY: unread}
    agent.metadata = {**agent.metadata, "letta": letta}
    agent.save(update_fields=["metadata"])


@transaction.atomic
def _release(agent: Agent, previous: int, claimed: int) -> None:
    agent = Agent.objects.select_for_update().filter(pk=agent.pk).first()
    if agent is not None:
        through = letta_settings(agent).get(THROUGH_KEY) or 0
        _save_place(
            agent, *given_back(through, _given_back(agent), previous=previous, claimed=claimed)
        )


def observer_prompt(blocks, turns) -> list[dict]:
    ordered = sorted(blocks, key=lambda block: (block.label != "human", block.label))
    described = "\n\n".join(
        f'<block label="{b.label}" limit="{b.limit}" description="{b.description}">\n'
        f"{b.value}\n</block>"
        for b in ordered
    )
    transcript = "\n".join(
        transcript_line(turn.role, turn.content[:MAX_MESSAGE_CHARS]) for turn in turns
    )
    return [
        {"role": "system", "content": OBSERVER_INSTRUCTIONS},
        {
            "role": "user",
            "content": f"The blocks now:\n{described}\n\nThe new turns:\n{transcript}",
        },
    ]


def parse_block_values(answer) -> dict[str, str]:
    """label -> new value from ``{"blocks": [{"label", "value"}]}``; other items are skipped,
    an answer of another shape is an ``LLMError``."""
    items = answer.get("blocks") if isinstance(answer, dict) else None
    if not isinstance(items, list):
        raise LLMError(f"expected {{'blocks': [...]}}, got {str(answer)[:200]!r}")
    return {
        item["label"]: item["value"].replace("\x00", "")
        for item in items
        if isinstance(item, dict)
        and isinstance(item.get("label"), str)
        and isinstance(item.get("value"), str)
    }


def blocks_observe(agent: Agent) -> list[str]:
    """Let the LLM update the agent's blocks from the turns captured since it last did,
    when enough have come. Returns the labels of the blocks that changed."""
    claim = _claim(agent)
    if claim is None:
        return []
    previous, turns = claim
    try:
        return _observe(agent, previous, turns)
    except Exception:
        # Whatever else failed (the database, a bug): the turns are given back, not lost.
        _release(agent, previous, turns[-1].seq)
        raise


def _observe(agent: Agent, previous: int, turns: list) -> list[str]:
    """``blocks_observe``'s work on the turns it claimed."""
    blocks = {block.label: block for block in memory_blocks(agent, user_id="")}
    try:
        values = parse_block_values(json_answer(chat(observer_prompt(blocks.values(), turns))))
    except LLMError as exc:
        if exc.answers_later:
            _release(agent, previous, turns[-1].seq)
        logger.warning("sleeptime: agent %s's blocks not updated: %s", agent.id, exc)
        return []
    changed, outdated = [], False
    for label, value in values.items():
        block = blocks.get(label)
        if block is None or block.value == value:
            continue
        try:
            rewritten = _rewrite(agent, block, value)
        except ApiError as exc:  # over the limit, read-only, deleted: the block keeps its value
            logger.warning("sleeptime: block %r of agent %s kept: %s", label, agent.id, exc)
            continue
        if not rewritten:
            outdated = True
            logger.info("sleeptime: block %r of agent %s changed meanwhile", label, agent.id)
            continue
        changed.append(label)
    if outdated:
        # Read again, with the block as it is now, at the next capture.
        _release(agent, previous, turns[-1].seq)
    return changed


@transaction.atomic
def _rewrite(agent: Agent, block: MemoryBlock, value: str) -> bool:
    """Set the block to the model's ``value`` unless it changed since the model read it (its
    rewrite of the older text would undo that change); whether it was set."""
    current = locked_row(MemoryBlock.objects, block.pk, missing="memory block not found")
    if current.value != block.value:
        return False
    services.memory_block_update(agent.as_principal(), block=current, value=value)
    return True
