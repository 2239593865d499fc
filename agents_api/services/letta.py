"""Writes behind the Letta-compatible routes (``agents_api.letta_api``): Letta's agents,
blocks, sleeptime groups and captured turns, kept as memsvc's own agents, memory blocks and
messages.

A key reaches its own agent and the agents it created through these routes (owned by the
key's principal, ``selectors.letta_agents``). What Letta keeps and memsvc has no column for
(tags, model, the sleeptime frequency) lives in the agent's metadata under ``"letta"``.
"""

from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from agents_api.models import KEPT_BLOCKS, Agent, MemoryBlock
from agents_api.services.agents import agent_delete, agent_get_or_create
from agents_api.services.blocks import memory_block_create
from agents_api.services.messages import local_conversation_renamed, local_messages_append
from conversations.models import Message, Role
from conversations.services import NewMessage, within_message_limit
from memsvc.api.errors import Conflict, Forbidden, InvalidInput, NotFound
from memsvc.db import locked_row
from memsvc.text import shows_nothing

LETTA_METADATA_KEY = "letta"
# What ``POST /v1/agents/`` may set and the agent then answers with.
LETTA_SETTINGS = ("agent_type", "model", "embedding", "system", "description", "enable_sleeptime")
# How many tags an agent has at most (a request's list, and an agent's once merged).
MAX_TAGS = 100
CAPTURED_ROLES = {"user": Role.USER, "assistant": Role.ASSISTANT, "system": Role.SYSTEM}
# How long a block made by ``POST /v1/blocks/`` waits for its attach before the daily prune
# deletes it (``unattached_blocks_prune``): the SDK attaches it at once (``memory.create``
# is the two calls), so one untouched for a day is of a client that stopped between them,
# and would otherwise stay for good (no agent keeps it, no list but Letta's shows it).
UNATTACHED_BLOCK_TTL = timedelta(days=1)


def letta_settings(agent: Agent) -> dict:
    """The agent's Letta settings; a null is as if left out (an import once kept
    ``{"tags": null}``, and every reader of the tags had to know it)."""
    kept = agent.metadata.get(LETTA_METADATA_KEY) or {}
    return {key: value for key, value in kept.items() if value is not None}


# Every how many captured turns the sleeptime observer runs when no group's manager config
# said: as Letta's server makes a sleeptime group (the SDK asks for 2). Unset, an agent made
# with sleeptime by another client, or turned to it later, was never observed (review).
DEFAULT_SLEEPTIME_FREQUENCY = 5


def sleeptime_frequency(agent: Agent):
    """The agent's ``sleeptime_agent_frequency`` as stored (whatever an import or the admin
    left), else ``DEFAULT_SLEEPTIME_FREQUENCY``."""
    return letta_settings(agent).get("sleeptime_agent_frequency", DEFAULT_SLEEPTIME_FREQUENCY)


def letta_metadata(agent: Agent) -> dict:
    """What Letta calls the agent's metadata: the agent's own, but for its Letta settings."""
    return without_letta_settings(agent.metadata)


def without_letta_settings(metadata: dict) -> dict:
    """An agent's ``metadata`` but for its Letta settings: the client's own part."""
    return {key: value for key, value in metadata.items() if key != LETTA_METADATA_KEY}


def _save_settings(agent: Agent, *, metadata: dict | None = None, **changes) -> None:
    """Merge ``changes`` into the agent's Letta settings, and put ``metadata`` (when given)
    in place of its ``letta_metadata`` (caller holds the agent's row lock)."""
    kept = letta_metadata(agent) if metadata is None else metadata
    agent.metadata = {**kept, LETTA_METADATA_KEY: {**letta_settings(agent), **changes}}
    agent.save(update_fields=["metadata"])


def _locked(agent: Agent) -> Agent:
    """The agent as it is now, locked; 404 when a concurrent request deleted it since."""
    return locked_row(Agent.objects, agent.pk, missing="Agent not found")


def _given(settings: dict) -> dict:
    """The Letta settings of a request. (A null in the request was left out of it, as on
    Letta's server: ``letta_api.serializers.LettaInput``.)"""
    return {key: value for key, value in settings.items() if key in LETTA_SETTINGS}


@transaction.atomic
def letta_agent_create(
    caller: Agent,
    *,
    name: str,
    tags: list[str],
    memory_blocks: list[dict],
    settings: dict,
    metadata: dict | None = None,
) -> Agent:
    """A Letta agent named ``name``: the key's own agent when the names match, else an
    agent the key's agent owns, made or found by name (asked twice, one agent). Its blocks
    are created where the agent has none of that label; its tags are added to its own; its
    metadata, when given, replaced."""
    if name == caller.name:
        agent = _locked(caller)
    else:
        agent, _ = agent_get_or_create(owner_principal=caller.principal_id, name=name)
        agent = _locked(agent)
    merged = sorted({*letta_settings(agent).get("tags", []), *tags})
    if len(merged) > MAX_TAGS:
        raise InvalidInput.for_field("tags", f"an agent has at most {MAX_TAGS} tags")
    _save_settings(agent, metadata=metadata, **_given(settings), tags=merged)
    labels = set(
        agent.memory_blocks.filter(KEPT_BLOCKS, user_id="").values_list("label", flat=True)
    )
    for index, block in enumerate(memory_blocks):
        if block["label"] in labels:
            continue
        try:
            memory_block_create(caller.as_principal(), agent=agent, **block)
        except InvalidInput as error:  # (named "value": which block's was not said)
            raise error.within(f"memory_blocks.{index}") from None
        labels.add(block["label"])
    return agent


@transaction.atomic
def letta_agent_update(
    caller: Agent,
    *,
    agent: Agent,
    name: str | None = None,
    settings: dict,
    metadata: dict | None = None,
) -> Agent:
    """Letta's settings given (``enable_sleeptime`` false: the observer stops), and the
    tags, the metadata and the name, replaced, when given. A name is one per agent the key reaches by name
    (``letta_agent_create``): another's, or the key's own agent's, is a conflict. The key's
    own agent keeps the name it was given with the key, as it is not the key's to delete."""
    agent = _locked(agent)
    if name is not None and name != agent.name:
        _rename(caller, agent, name)
    tags = settings.get("tags")
    _save_settings(
        agent,
        metadata=metadata,
        **_given(settings),
        **({"tags": sorted(set(tags))} if tags is not None else {}),
    )
    return agent


def _rename(caller: Agent, agent: Agent, name: str) -> None:
    if agent.pk == caller.pk:
        raise Forbidden("an API key cannot rename its own agent")
    if name == caller.name:
        raise Conflict(f"the name {name!r} is the API key's own agent's")
    old_name, agent.name = agent.name, name
    try:
        with transaction.atomic():
            agent.save(update_fields=["name"])
    except IntegrityError:
        raise Conflict(f"an agent named {name!r} exists already") from None
    local_conversation_renamed(agent, old_name=old_name)


@transaction.atomic
def letta_agent_delete(caller: Agent, *, agent: Agent) -> None:
    """Delete an agent the key's agent created here with its captured turns (its own
    conversation: ``agent_delete``), as Letta deletes an agent's messages with it; the
    key's own agent is not its to delete. One deleted meanwhile: Letta's 404."""
    if agent.pk == caller.pk:
        raise Forbidden("an API key cannot delete its own agent")
    agent_delete(caller.as_principal(), agent=_locked(agent))


@transaction.atomic
def letta_sleeptime_update(agent: Agent, *, frequency: int | None) -> Agent:
    """Store the group's ``sleeptime_agent_frequency``: every how many captures the
    observer (``agents_api.sleeptime``) updates the agent's blocks."""
    agent = _locked(agent)
    if frequency is not None:
        _save_settings(agent, sleeptime_agent_frequency=frequency)
    return agent


@transaction.atomic
def letta_block_create(caller: Agent, **fields) -> MemoryBlock:
    """Letta creates a block first and attaches it to an agent next: until then the block
    waits on the key's own agent, which does not keep it (``models.KEPT_BLOCKS``): a block
    whose attach never came (the client stopped between the two calls) is in no agent's
    prompt nor lists, and its label refuses no block made after it."""
    return memory_block_create(caller.as_principal(), agent=caller, awaiting_attach=True, **fields)


@transaction.atomic
def unattached_blocks_prune(*, now: datetime | None = None) -> int:
    """Delete the blocks that still wait for their attach (``letta_block_create``) and have
    not changed for ``UNATTACHED_BLOCK_TTL``; how many. Locked before they are deleted (the
    lock re-checks the condition on a row an attach held): one attached meanwhile is kept,
    and a second run at once deletes none twice."""
    now = now or timezone.now()
    stale = MemoryBlock.objects.filter(
        awaiting_attach=True, updated_at__lt=now - UNATTACHED_BLOCK_TTL
    )
    ids = list(stale.select_for_update().values_list("pk", flat=True))
    _, deleted = MemoryBlock.objects.filter(pk__in=ids).delete()
    return deleted.get(MemoryBlock._meta.label, 0)


def letta_block_attach(caller: Agent, *, agent: Agent | None, block: MemoryBlock) -> MemoryBlock:
    """Give a block made to be attached (``letta_block_create``) to ``agent`` (a no-op when
    it has it already; None: the key reaches no such agent, a 404). All or nothing: a
    refused attach deletes that block, which would otherwise be left waiting on the key's
    own agent (the SDK's ``memory.create`` is the two calls)."""
    try:
        if agent is None:
            raise NotFound("Agent not found")
        return _block_attach(caller, agent=agent, block=block)
    except (Conflict, NotFound):
        _drop_awaiting(caller, block)
        raise


@transaction.atomic
def _drop_awaiting(caller: Agent, block: MemoryBlock) -> None:
    """Delete ``block`` if it still waits for its attach on the key's agent: locked first,
    so that one attached meanwhile (by a concurrent attach) is not deleted."""
    awaiting = MemoryBlock.objects.filter(pk=block.pk, agent=caller, awaiting_attach=True)
    if awaiting.select_for_update().exists():
        awaiting.delete()


@transaction.atomic
def _block_attach(caller: Agent, *, agent: Agent, block: MemoryBlock) -> MemoryBlock:
    """An agent has one block per label, so a second one of that label is a conflict.
    Letta shares a block between the agents it is attached to; memsvc keeps a block in one
    agent, so another agent's block (the key's own agent's too) is a conflict, not taken
    from it. The agent's row is locked first, as its deletion and ``letta_agent_create``
    lock it: the block is not moved into an agent deleted meanwhile, nor next to a block of
    its label created meanwhile (``memory_block_create`` holds the agent's key first).
    A label the agent has is refused by ``memory_block_unique_label``: one given to another
    of its blocks by a change not committed yet (a rename) is found only there."""
    agent = _locked(agent)
    block = locked_row(MemoryBlock.objects, block.pk, missing="Block not found")
    awaiting = block.agent_id == caller.pk and block.awaiting_attach
    if block.agent_id != agent.pk and not awaiting:
        raise Conflict("the block is attached to another agent; memsvc does not share blocks")
    block.agent, block.awaiting_attach = agent, False
    try:
        with transaction.atomic():
            block.save(update_fields=["agent", "awaiting_attach"])
    except IntegrityError:  # (the key's own agent too may keep a block of its label)
        raise Conflict(f"the agent already has a memory block labelled {block.label!r}") from None
    return block


def _text(content) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts
    (OpenAI's and Anthropic's shapes)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            part if isinstance(part, str) else part.get("text", "")
            for part in content
            if isinstance(part, str | dict)
        ]
        return "\n".join(part for part in parts if isinstance(part, str) and part)
    return ""


def captured_messages(request_messages: list, response: dict, metadata: dict) -> list[NewMessage]:
    """The turns of a capture worth keeping: each request message and the response with a
    role memsvc knows and some text."""
    turns = [*request_messages, response]
    messages = []
    for turn in turns:
        if not isinstance(turn, dict):
            continue
        role = turn.get("role", "assistant" if turn is response else "")
        role = CAPTURED_ROLES.get(role) if isinstance(role, str) else None
        content = _text(turn.get("content")).replace("\x00", "").strip()
        if role and not shows_nothing(content):
            messages.append(
                NewMessage(
                    content=within_message_limit(content), role=role, metadata=dict(metadata)
                )
            )
    return messages


def letta_capture(
    agent: Agent, *, request_messages: list, response: dict, model: str, provider: str
) -> list[Message]:
    """Store a captured LLM call (the SDK's request messages and the provider's answer) as
    messages of the agent's own conversation, embedded and searched like any other."""
    metadata = {"source": "letta-capture", "model": model, "provider": provider}
    messages = captured_messages(request_messages, response, metadata)
    if not messages:
        return []
    return local_messages_append(agent, messages)
