"""Letta's sleeptime agent, as a task: every ``sleeptime_agent_frequency`` captured turns of
an agent (``POST /v1/agents/{id}/messages/capture``), the LLM reads the new turns and
rewrites the agent's memory blocks (the ``human`` block first) within each block's limit.
Each change is a block revision by ``agent:<id>`` like any other write.

Without an LLM (``memsvc.llm``) captures are stored and nothing else happens. The turns are
claimed before the LLM is asked (the agent's row lock decides between two workers) and
leased to the worker (``reading.Place``, as the extraction's: a killed worker's turns are
read again once its lease lapses); a transient failure gives them back and the task is sent
again for later (``tasks.READ_RETRIES`` times), any other error gives them back for the next
capture (turns a later observation read past are read first), a malformed
answer changes nothing, and a block changed while the LLM read it keeps that change (the
turns are given back).
"""

import logging

from django.db import transaction

from agents_api import services
from agents_api.models import Agent, MemoryBlock
from agents_api.reading import Claim, GiveBack, Place, given_back, recovered
from agents_api.selectors import memory_blocks
from agents_api.services.letta import letta_settings, sleeptime_frequency
from conversations.models import Role
from conversations.selectors import conversation_messages
from memsvc.api.errors import ApiError
from memsvc.db import locked_row
from memsvc.llm import LLMError, chat, json_answer, llm_configured, transcript_line

logger = logging.getLogger(__name__)

THROUGH_KEY = "observed_through_seq"  # the last message the observer has read
UNREAD_KEY = "observed_unread"  # turns given back after it read past them: [after, through]
TAKEN_KEY = "observing"  # the turns workers are reading: [after, through, until, token]
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
    """Every how many captured turns the observer runs; 0: never (sleeptime off, or a
    frequency an import or the admin left that is no whole number >= 1)."""
    frequency = sleeptime_frequency(agent)
    if not letta_settings(agent).get("enable_sleeptime") or type(frequency) is not int:
        return 0
    return max(frequency, 0)


def _place(agent: Agent) -> Place:
    """The observer's place in the agent's captured turns (``reading.Place``)."""
    stored = _stored_place(agent)
    return Place.of(stored.through, stored.unread, stored.taken)


def _stored_place(agent: Agent) -> Place:
    """The observer's place as it is stored, whatever its shape (``_place`` reads it)."""
    letta = letta_settings(agent)
    return Place(letta.get(THROUGH_KEY), letta.get(UNREAD_KEY), letta.get(TAKEN_KEY))


def _enough_turns(agent: Agent, through: int) -> bool:
    """Whether at least the sleeptime frequency of captured user turns came after ``through``."""
    frequency = _frequency(agent)
    turns = conversation_messages(agent.local_conversation, for_agent=True).filter(
        seq__gt=through, role=Role.USER
    )
    return bool(frequency) and turns.count() >= frequency


def observation_due(agent: Agent) -> bool:
    """An LLM, a sleeptime frequency, and turns given back to read again (a lapsed lease's
    too) or at least that many captured turns unread."""
    if not _frequency(agent) or agent.local_conversation_id is None or not llm_configured():
        return False
    place = _place(agent)
    return bool(place.unread) or place.lapsed() or _enough_turns(agent, place.through)


def recover_lapsed_observers() -> list[str]:
    """Give back the turns of every observer's lease that lapsed (``reading.recovered``: its
    worker was killed, or is past its time) and answer the ids of the agents whose
    observation is then due: the sweep hands them to a worker. (The agent's row locked as an
    update of no key: a write that names the agent, a block's, is not held back.)"""
    agents = recovered(
        Agent.objects.filter(metadata__letta__has_key=TAKEN_KEY)
        .exclude(**{f"metadata__letta__{TAKEN_KEY}": []})
        .values_list("id", f"metadata__letta__{TAKEN_KEY}"),
        lock=lambda key: (
            Agent.objects.select_for_update(skip_locked=True, no_key=True).filter(id=key).first()
        ),
        stored=_stored_place,
        save=_save_place,
    )
    return [str(agent.id) for agent in agents if observation_due(agent)]


@transaction.atomic
def _claim(agent: Agent) -> Claim | None:
    """Take the unread turns when enough have come (``Place.claim``: those given back
    first). The agent's row lock makes a second worker wait and then find them taken."""
    agent = Agent.objects.select_for_update().filter(pk=agent.pk).first()
    if agent is None or not observation_due(agent):  # (deleted since the task read it)
        return None
    captured = conversation_messages(agent.local_conversation, for_agent=True)

    def window(after: int, until: int | None) -> list:
        # The oldest first, the rest for the next observation: the blocks learn the turns
        # in the order they came (the newest 100 were read, and the older never: review).
        turns = captured.filter(seq__gt=after)
        if until is not None:
            turns = turns.filter(seq__lte=until)
        return list(turns.order_by("seq")[:MAX_TRANSCRIPT_MESSAGES])

    place = _place(agent)
    # (The turns given back all deleted since: as many as the frequency asks, or none yet;
    # ``turns[-1]`` failed on none: code review.)
    claim = place.claim(window, lambda after: _enough_turns(agent, after))
    if place != _stored_place(agent):
        _save_place(agent, place)
    return claim


def with_place_kept(metadata: dict, agent: Agent) -> dict:
    """``metadata`` given to ``agent`` (the admin's) with the observer's place in it as it is
    in ``agent`` (read under its row lock by the caller): Letta's settings as its API takes
    them hold no place, and a save of the agent's description sent the model every captured
    turn again, and lost those given back (review)."""
    letta = metadata.get("letta")
    place = {
        key: value
        for key, value in letta_settings(agent).items()
        if key in (THROUGH_KEY, UNREAD_KEY, TAKEN_KEY)
    }
    if not isinstance(letta, dict) or not place:
        return metadata
    return {**metadata, "letta": {**letta, **place}}


def _save_place(agent: Agent, place: Place) -> None:
    letta = {
        **letta_settings(agent),
        THROUGH_KEY: place.through,
        UNREAD_KEY: place.unread,
        TAKEN_KEY: place.taken,
    }
    agent.metadata = {**agent.metadata, "letta": letta}
    agent.save(update_fields=["metadata"])


@transaction.atomic
def _done(agent: Agent, claim: Claim, *, again: bool) -> None:
    """End the lease of ``claim`` (``Place.end``): its turns read, or ``again``: given back
    for the next capture."""
    agent = Agent.objects.select_for_update().filter(pk=agent.pk).first()
    if agent is not None and (place := _place(agent)).end(claim.token, again=again):
        _save_place(agent, place)


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
    return claim.settle(
        lambda: _observe(agent, claim.turns), lambda again: _done(agent, claim, again=again)
    )


def _observe(agent: Agent, turns: list) -> list[str]:
    """``blocks_observe``'s work on the turns it claimed; ``GiveBack`` (with the labels it
    changed) when they are to be read again."""
    blocks = {block.label: block for block in memory_blocks(agent, user_id="")}
    try:
        values = parse_block_values(json_answer(chat(observer_prompt(blocks.values(), turns))))
    except LLMError as exc:
        back = given_back(exc)
        logger.warning(
            "sleeptime: agent %s's blocks not updated%s: %s",
            agent.id,
            f" (the turns are {back.later})" if back else "",
            exc,
        )
        if back:
            raise back from exc
        return []
    # Turned off while the model read (it rewrote the blocks all the same: review): the
    # turns wait for it to be back on.
    current = Agent.objects.filter(pk=agent.pk).first()
    if current is None or not _frequency(current):
        logger.info("sleeptime: agent %s's observer was turned off while the model read", agent.id)
        raise GiveBack([])
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
        raise GiveBack(changed)
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
