"""Writes behind the Letta-compatible routes (``agents_api.letta_api``): Letta's agents,
blocks, sleeptime groups and captured turns, kept as memsvc's own agents, memory blocks and
messages.

A key reaches its own agent and the agents it created through these routes (owned by the
key's principal, ``selectors.letta_agents``). What Letta keeps and memsvc has no column for
(tags, model, the sleeptime frequency) lives in the agent's metadata under ``"letta"``.
"""

from django.db import transaction

from agents_api.models import DEFAULT_BLOCK_LIMIT, Agent, MemoryBlock
from agents_api.services.agents import agent_delete, agent_get_or_create
from agents_api.services.blocks import memory_block_create
from agents_api.services.messages import local_messages_append
from conversations.models import Message, Role
from conversations.services import NewMessage, within_message_limit
from memsvc.api.errors import Conflict, Forbidden
from memsvc.db import locked_row

LETTA_METADATA_KEY = "letta"
# What ``POST /v1/agents/`` may set and the agent then answers with.
LETTA_SETTINGS = ("agent_type", "model", "embedding", "system", "description", "enable_sleeptime")
CAPTURED_ROLES = {"user": Role.USER, "assistant": Role.ASSISTANT, "system": Role.SYSTEM}


def letta_settings(agent: Agent) -> dict:
    return dict(agent.metadata.get(LETTA_METADATA_KEY) or {})


def _save_settings(agent: Agent, **changes) -> None:
    """Merge ``changes`` into the agent's Letta settings (caller holds the agent's row lock)."""
    agent.metadata = {**agent.metadata, LETTA_METADATA_KEY: {**letta_settings(agent), **changes}}
    agent.save(update_fields=["metadata"])


def _locked(agent: Agent) -> Agent:
    """The agent as it is now, locked; 404 when a concurrent request deleted it since."""
    return locked_row(Agent.objects, agent.pk, missing="Agent not found")


def _given(settings: dict) -> dict:
    """The Letta settings of a request that it sets: as on Letta's server, a null leaves a
    setting as it is (the SDK's ``agents.update(agent, model=None)`` keeps the model)."""
    return {
        key: value for key, value in settings.items() if key in LETTA_SETTINGS and value is not None
    }


@transaction.atomic
def letta_agent_create(
    caller: Agent,
    *,
    name: str,
    tags: list[str],
    memory_blocks: list[dict],
    settings: dict,
) -> Agent:
    """A Letta agent named ``name``: the key's own agent when the names match, else an
    agent the key's agent owns, made or found by name (asked twice, one agent). Its blocks
    are created where the agent has none of that label; its tags are added to its own."""
    if name == caller.name:
        agent = _locked(caller)
    else:
        agent, _ = agent_get_or_create(owner_principal=caller.principal_id, name=name)
        agent = _locked(agent)
    known = letta_settings(agent)
    _save_settings(agent, **_given(settings), tags=sorted({*known.get("tags", []), *tags}))
    labels = set(agent.memory_blocks.filter(user_id="").values_list("label", flat=True))
    for block in memory_blocks:
        if block["label"] in labels:
            continue
        memory_block_create(
            caller.as_principal(),
            agent=agent,
            label=block["label"],
            value=block.get("value") or "",
            description=block.get("description") or "",
            limit=block.get("limit") or DEFAULT_BLOCK_LIMIT,
        )
        labels.add(block["label"])
    return agent


@transaction.atomic
def letta_agent_update(agent: Agent, *, settings: dict) -> Agent:
    """Letta's settings given (``enable_sleeptime`` false: the observer stops), and the
    tags, replaced, when given."""
    agent = _locked(agent)
    tags = settings.get("tags")
    _save_settings(
        agent, **_given(settings), **({"tags": sorted(set(tags))} if tags is not None else {})
    )
    return agent


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


def letta_block_create(caller: Agent, **fields) -> MemoryBlock:
    """Letta creates a block first and attaches it to an agent next: until then the block
    is the key's own agent's (a label it already has is a conflict)."""
    return memory_block_create(caller.as_principal(), agent=caller, **fields)


@transaction.atomic
def letta_block_attach(caller: Agent, *, agent: Agent, block: MemoryBlock) -> MemoryBlock:
    """Give a block of the key's own agent (``letta_block_create``) to ``agent`` (a no-op
    when it has it already); an agent has one block per label, so a second one of that
    label is a conflict. Letta shares a block between the agents it is attached to; memsvc
    keeps a block in one agent, so another agent's block is a conflict, not taken from it.
    The agent's row is locked first, as its deletion and ``letta_agent_create`` lock it: the
    block is not moved into an agent deleted meanwhile, nor next to a block of its label
    created meanwhile."""
    agent = _locked(agent)
    block = locked_row(MemoryBlock.objects, block.pk, missing="Block not found")
    if block.agent_id == agent.pk:
        return block
    if block.agent_id != caller.pk:
        raise Conflict("the block is attached to another agent; memsvc does not share blocks")
    if MemoryBlock.objects.filter(agent=agent, user_id=block.user_id, label=block.label).exists():
        raise Conflict(f"the agent already has a memory block labelled {block.label!r}")
    block.agent = agent
    block.save(update_fields=["agent"])
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
        if role and content:
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
