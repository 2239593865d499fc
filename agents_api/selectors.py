"""Reads of agents."""

import uuid

from agents_api.models import Agent, MemoryBlock, MemoryBlockRevision
from memsvc.api.errors import InvalidInput, NotFound
from memsvc.api.principals import AGENT_PRINCIPAL_PREFIX


def agent_by_id(agent_id, *, field: str) -> Agent:
    """The agent a request names (users know agents by the id of ``GET /v1/agent/me``)."""
    try:
        agent = Agent.objects.filter(id=uuid.UUID(str(agent_id))).first()
    except ValueError:
        agent = None
    if agent is None:
        raise InvalidInput.for_field(field, "no such agent")
    return agent


def principal_for_sharing(principal_id: str, *, field: str) -> str:
    """A principal to share with: any user id, or ``agent:<id>`` of an existing agent."""
    if principal_id.startswith(AGENT_PRINCIPAL_PREFIX):
        return agent_by_id(
            principal_id.removeprefix(AGENT_PRINCIPAL_PREFIX), field=field
        ).principal_id
    return principal_id


def memory_blocks(agent: Agent, *, user_id: str) -> list[MemoryBlock]:
    return list(MemoryBlock.objects.filter(agent=agent, user_id=user_id).order_by("label"))


def memory_block(agent: Agent, *, user_id: str, label: str) -> MemoryBlock:
    block = MemoryBlock.objects.filter(agent=agent, user_id=user_id, label=label).first()
    if block is None:
        raise NotFound(f"no memory block labelled {label!r}")
    return block


def memory_block_revisions(block: MemoryBlock) -> list[MemoryBlockRevision]:
    return list(block.revisions.order_by("-created_at", "-id"))


LOCAL_OWNER = "local"  # owner_principal of the local compatibility API's agents


def local_agent(caller_agent: Agent | None, name: str) -> Agent:
    """The named agent of the local API, as a caller may reach it: a loopback caller in
    local mode (``caller_agent`` None) reaches every local agent, a key only its own agent.
    404 otherwise."""
    if caller_agent is not None:
        agent = caller_agent if caller_agent.name == name else None
    else:
        agent = Agent.objects.filter(owner_principal=LOCAL_OWNER, name=name).first()
    if agent is None:
        raise NotFound("Agent not found")
    return agent
