"""Messages an agent writes: bulk appends with an idempotency key, and the local
compatibility API's."""

from django.db import transaction

from agents_api.models import Agent
from conversations.models import Conversation, Message, Role
from conversations.services import (
    NewMessage,
    conversation_create,
    conversation_update,
    messages_append,
)
from memsvc.api.idempotency import write_once
from memsvc.api.principals import Principal
from memsvc.db import locked_row


@transaction.atomic
def agent_messages_append(
    actor: Principal,
    *,
    conversation,
    messages: list[NewMessage],
    idempotency_key: str | None = None,
    request_hash: str = "",
) -> tuple[list[Message], bool]:
    """Append like ``messages_append``; with a key, a retry returns the first result
    (``write_once``).

    Returns (messages, created).
    """
    return write_once(
        actor,
        idempotency_key,
        request_hash,
        lambda: messages_append(actor, conversation=conversation, messages=messages),
        Message.objects.without_search_data(),
        kind="message",
    )


# --- the local compatibility API -------------------------------------------------------------


@transaction.atomic
def local_conversation_for(agent: Agent):
    """The conversation holding a local agent's messages, made on first use.

    The agent owns it, so its messages are embedded, searched and shown (the admin, the
    agent API) like any other conversation's.
    """
    agent = locked_row(Agent.objects, agent.pk, missing="Agent not found")  # 404 if deleted since
    if agent.local_conversation_id is None:
        agent.local_conversation = conversation_create(
            agent.as_principal(),
            title=local_conversation_title(agent.name),
            metadata={"local_agent": agent.name},
        )
        agent.save(update_fields=["local_conversation"])
    return agent.local_conversation


def local_conversation_title(name: str) -> str:
    return f"{name} (local)"


def local_conversation_renamed(agent: Agent, *, old_name: str) -> None:
    """Give the agent's own conversation its new name (``agent.name``), where it still has
    the old one: its title and ``local_agent`` metadata as ``local_conversation_for`` made
    them (a title changed since is kept). The caller holds the agent's row lock."""
    if agent.local_conversation_id is None:
        return
    conversation = locked_row(
        Conversation.objects, agent.local_conversation_id, missing="not found"
    )
    if conversation.title != local_conversation_title(old_name):
        return
    metadata = None
    if conversation.metadata.get("local_agent") == old_name:
        metadata = {**conversation.metadata, "local_agent": agent.name}
    conversation_update(
        agent.as_principal(),
        conversation=conversation,
        title=local_conversation_title(agent.name),
        metadata=metadata,
    )


@transaction.atomic
def local_messages_append(agent: Agent, messages: list[NewMessage]) -> list[Message]:
    """Messages of the agent's own conversation (the local compatibility API's, the Letta
    routes' captured turns). One transaction: a refused message leaves no conversation made
    for it, and no message of the batch."""
    return _local_append(agent, messages)


def _local_append(agent: Agent, messages: list[NewMessage]) -> list[Message]:
    """``local_messages_append`` in the caller's transaction."""
    # These APIs have no user ids: their speakers are "user", the agent and "system".
    for message in messages:
        if message.author_name is None:
            message.author_name = {Role.USER: "user", Role.SYSTEM: "system"}.get(message.role)
    return messages_append(
        agent.as_principal(), conversation=local_conversation_for(agent), messages=messages
    )


@transaction.atomic
def local_message_append(
    agent: Agent,
    *,
    role: str,
    content: str,
    metadata: dict | None = None,
    idempotency_key: str | None = None,
    request_hash: str = "",
) -> tuple[Message, bool]:
    """One message of the local compatibility API, in the agent's own conversation; with a
    key, a retry returns the first request's message. Returns (message, created)."""
    messages, created = write_once(
        agent.as_principal(),
        idempotency_key,
        request_hash,
        lambda: _local_append(
            agent, [NewMessage(content=content, role=role, metadata=metadata or {})]
        ),
        Message.objects.without_search_data(),
        kind="message",
    )
    return messages[0], created
