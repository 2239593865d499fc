"""Every write to agents, API keys and memory blocks. The acting principal comes first."""

from django.db import IntegrityError, transaction
from django.utils import timezone

from agents_api.keys import hash_secret, new_key
from agents_api.models import (
    DEFAULT_BLOCK_LIMIT,
    Agent,
    ApiKey,
    IdempotentRequest,
    MemoryBlock,
    MemoryBlockRevision,
    Scope,
)
from conversations.models import Message, Role
from conversations.services import NewMessage, conversation_create, messages_append
from memsvc.api.errors import Conflict, Forbidden, InvalidInput
from memsvc.api.principals import Principal

# --- agents and keys -------------------------------------------------------------------------


@transaction.atomic
def agent_get_or_create(
    *, owner_principal: str, name: str, description: str = "", metadata: dict | None = None
) -> tuple[Agent, bool]:
    return Agent.objects.get_or_create(
        owner_principal=owner_principal,
        name=name,
        defaults={"description": description, "metadata": metadata or {}},
    )


@transaction.atomic
def api_key_create(
    *, agent: Agent, scopes: list[str] | None = None, name: str = ""
) -> tuple[ApiKey, str]:
    """A new key for ``agent`` and its full text, which is never stored and shown only now."""
    scopes = sorted(set(scopes or [Scope.READ, Scope.WRITE]))
    unknown = set(scopes) - set(Scope.values)
    if unknown:
        raise InvalidInput.for_field("scopes", f"unknown scopes: {', '.join(sorted(unknown))}")
    public_id, secret, full_key = new_key()
    api_key = ApiKey.objects.create(
        public_id=public_id,
        agent=agent,
        name=name,
        prefix=full_key[: len("msk_") + len(public_id) + 5],
        secret_hmac=hash_secret(secret),
        scopes=scopes,
    )
    return api_key, full_key


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
    return api_key


# --- memory blocks ---------------------------------------------------------------------------


def _check_fits(value: str, limit: int, field: str) -> None:
    if len(value) > limit:
        raise InvalidInput.for_field(
            field, f"the block would hold {len(value)} characters; its limit is {limit}"
        )


def _record(block: MemoryBlock, actor: Principal) -> None:
    MemoryBlockRevision.objects.create(block=block, value=block.value, actor_principal=actor.id)


@transaction.atomic
def memory_block_create(
    actor: Principal,
    *,
    agent: Agent,
    user_id: str = "",
    label: str,
    value: str = "",
    description: str = "",
    limit: int = DEFAULT_BLOCK_LIMIT,
    read_only: bool = False,
) -> MemoryBlock:
    _check_fits(value, limit, "value")
    try:
        with transaction.atomic():
            block = MemoryBlock.objects.create(
                agent=agent,
                user_id=user_id,
                label=label,
                value=value,
                description=description,
                limit=limit,
                read_only=read_only,
            )
    except IntegrityError:
        raise Conflict(f"a memory block labelled {label!r} already exists") from None
    _record(block, actor)
    return block


@transaction.atomic
def memory_block_update(
    actor: Principal,
    *,
    block: MemoryBlock,
    value: str | None = None,
    append: str | None = None,
    replace: tuple[str, str] | None = None,
    description: str | None = None,
    limit: int | None = None,
) -> MemoryBlock:
    """Change a block: set its value, ``append`` a line, or ``replace`` (old, new) text.

    The row is locked for the whole change, so concurrent appends never lose text.
    Refused changes (read-only, over the limit, ``old`` not found) store nothing.
    """
    block = MemoryBlock.objects.select_for_update().get(pk=block.pk)
    if block.read_only:
        raise Forbidden(f"memory block {block.label!r} is read-only")
    new_value = block.value
    field = "value"
    if value is not None:
        new_value = value
    if append is not None:
        field = "append"
        new_value = f"{new_value}\n{append}" if new_value else append
    if replace is not None:
        field = "replace"
        old, new = replace
        if not old or old not in new_value:
            raise Conflict("the text to replace is not in the block")
        new_value = new_value.replace(old, new, 1)
    new_limit = block.limit if limit is None else limit
    _check_fits(new_value, new_limit, field if limit is None else "limit")
    changed = new_value != block.value
    block.value = new_value
    block.limit = new_limit
    if description is not None:
        block.description = description
    block.updated_at = timezone.now()
    block.save(update_fields=["value", "limit", "description", "updated_at"])
    if changed:
        _record(block, actor)
    return block


@transaction.atomic
def memory_block_delete(actor: Principal, *, block: MemoryBlock) -> None:
    if block.read_only:
        raise Forbidden(f"memory block {block.label!r} is read-only")
    block.delete()


# --- messages with an idempotency key --------------------------------------------------------


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

    Returns (messages, created). A key reused for a different request is a conflict. Two
    concurrent requests with one key serialise on the key's unique index.
    """
    if not idempotency_key:
        return messages_append(actor, conversation=conversation, messages=messages), True
    if len(idempotency_key) > 255:
        raise InvalidInput.for_field("Idempotency-Key", "must be at most 255 characters")
    record, created = IdempotentRequest.objects.get_or_create(
        principal_id=actor.id, key=idempotency_key, defaults={"request_hash": request_hash}
    )
    if not created:
        if record.request_hash != request_hash:
            raise Conflict("this Idempotency-Key was already used for a different request")
        return list(
            Message.objects.without_search_data().filter(id__in=record.message_ids).order_by("seq")
        ), False
    appended = messages_append(actor, conversation=conversation, messages=messages)
    record.message_ids = [str(m.id) for m in appended]
    record.save(update_fields=["message_ids"])
    return appended, True


# --- the local compatibility API -------------------------------------------------------------


@transaction.atomic
def local_conversation_for(agent: Agent):
    """The conversation holding a local agent's messages, made on first use.

    The agent owns it, so its messages are embedded, searched and shown (the admin, the
    agent API) like any other conversation's.
    """
    agent = Agent.objects.select_for_update().get(pk=agent.pk)
    if agent.local_conversation_id is None:
        agent.local_conversation = conversation_create(
            agent.as_principal(),
            title=f"{agent.name} (local)",
            metadata={"local_agent": agent.name},
        )
        agent.save(update_fields=["local_conversation"])
    return agent.local_conversation


@transaction.atomic
def local_message_append(
    agent: Agent, *, role: str, content: str, metadata: dict | None = None
) -> Message:
    """A message of the local compatibility API, in the agent's own conversation. One
    transaction: a refused message leaves no conversation made for it."""
    # The seed's server has no user ids: its speakers are "user", the agent and "system".
    speaker = {Role.USER: "user", Role.SYSTEM: "system"}.get(role)
    [message] = messages_append(
        agent.as_principal(),
        conversation=local_conversation_for(agent),
        messages=[
            NewMessage(content=content, role=role, metadata=metadata or {}, author_name=speaker)
        ],
    )
    return message
