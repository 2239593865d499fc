"""Messages an agent writes: bulk appends with an idempotency key, and the local
compatibility API's."""

from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from agents_api.models import (
    IDEMPOTENCY_KEY_MAX_LENGTH,
    Agent,
    IdempotentRequest,
)
from conversations.models import Message, Role
from conversations.services import NewMessage, conversation_create, messages_append
from memsvc.api.errors import Conflict, InvalidInput
from memsvc.api.principals import Principal
from memsvc.db import locked_row

# How long an Idempotency-Key is remembered: a retry comes within minutes or hours; kept
# forever, every keyed append would leave a row behind for good. (The daily prune.)
IDEMPOTENCY_KEY_TTL = timedelta(days=7)


def idempotency_keys_prune(*, now: datetime | None = None) -> int:
    """Forget the keys of requests older than ``IDEMPOTENCY_KEY_TTL``; how many."""
    now = now or timezone.now()
    deleted, _ = IdempotentRequest.objects.filter(created_at__lt=now - IDEMPOTENCY_KEY_TTL).delete()
    return deleted


@transaction.atomic
def agent_messages_append(
    actor: Principal,
    *,
    conversation,
    messages: list[NewMessage],
    idempotency_key: str | None = None,
    request_hash: str = "",
) -> tuple[list[Message], bool]:
    """Append like ``messages_append``; with a key, a retry returns the first result.

    Returns (messages, created).
    """
    return _append_once(
        actor,
        idempotency_key,
        request_hash,
        lambda: messages_append(actor, conversation=conversation, messages=messages),
    )


def _append_once(
    actor: Principal,
    idempotency_key: str | None,
    request_hash: str,
    append: Callable[[], list[Message]],
) -> tuple[list[Message], bool]:
    """``append()``, once per ``idempotency_key`` of ``actor``: a retry gets the messages
    the first request appended (those still there), and (messages, created) says which.

    A key reused for a different request (another ``request_hash``) is a conflict. Two
    concurrent requests with one key serialise on the key's unique index. The caller holds
    a transaction: the key is claimed in the one that appends.
    """
    if not idempotency_key:
        return append(), True
    if len(idempotency_key) > IDEMPOTENCY_KEY_MAX_LENGTH:
        raise InvalidInput.for_field(
            "Idempotency-Key",
            f"must be at most {IDEMPOTENCY_KEY_MAX_LENGTH} characters",
            location="header",
        )
    record_id = _claim_key(actor.id, idempotency_key, request_hash)
    if record_id is None:
        record = IdempotentRequest.objects.get(principal_id=actor.id, key=idempotency_key)
        if record.request_hash != request_hash:
            raise Conflict("this Idempotency-Key was already used for a different request")
        return list(
            Message.objects.without_search_data().filter(id__in=record.message_ids).order_by("seq")
        ), False
    appended = append()
    IdempotentRequest.objects.filter(pk=record_id).update(message_ids=[str(m.id) for m in appended])
    return appended, True


def _claim_key(principal_id: str, key: str, request_hash: str) -> int | None:
    """The id of a new record of ``key``, or None if the key is taken. One statement (an
    ORM ``get_or_create`` sends four: a read, a savepoint, the insert, its release). A
    request with the same key in flight holds the key's unique index entry until it ends:
    this one waits for it, then finds the key taken."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO idempotent_request (principal_id, key, request_hash, message_ids, created_at)
            VALUES (%s, %s, %s, '[]'::jsonb, now())
            ON CONFLICT (principal_id, key) DO NOTHING
            RETURNING id
            """,
            [principal_id, key, request_hash],
        )
        row = cursor.fetchone()
    return row[0] if row else None


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
            title=f"{agent.name} (local)",
            metadata={"local_agent": agent.name},
        )
        agent.save(update_fields=["local_conversation"])
    return agent.local_conversation


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
    messages, created = _append_once(
        agent.as_principal(),
        idempotency_key,
        request_hash,
        lambda: _local_append(
            agent, [NewMessage(content=content, role=role, metadata=metadata or {})]
        ),
    )
    if not messages:
        raise Conflict("the message stored with this Idempotency-Key has been deleted since")
    return messages[0], created
