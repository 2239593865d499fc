"""Reads of agents: their memory blocks, and whose memory a request reaches."""

from agents_api.models import Agent, MemoryBlock, MemoryBlockRevision
from memsvc.api.errors import Forbidden, InvalidInput, NotFound
from memsvc.api.principals import Principal, user_id_problem


def memory_subject(principal: Principal, *, user_id: str | None, field: str = "userId") -> str:
    """Whose memory (blocks, memories) an agent's request reaches: the user it acts for
    (``X-On-Behalf-Of``, which cannot reach another user), else the user it names, else its
    own (""). Any user id will do: agents learn about users they have not served yet."""
    acting_for = principal.on_behalf_of
    if acting_for:
        if user_id and user_id != acting_for:
            raise Forbidden(f"acting for {acting_for}, this request cannot reach another user")
        return acting_for
    if not user_id:
        return ""
    problem = user_id_problem(user_id)
    if problem:
        raise InvalidInput.for_field(field, problem)
    return user_id


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
