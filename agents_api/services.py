"""Every write to agents, API keys, memory blocks and long-term memories. The acting
principal comes first."""

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from agents_api.keys import hash_secret, new_key
from agents_api.models import (
    DEFAULT_BLOCK_LIMIT,
    MEMORY_TTL,
    Agent,
    ApiKey,
    IdempotentRequest,
    Memory,
    MemoryBlock,
    MemoryBlockRevision,
    MemorySource,
    Scope,
    content_hash,
    default_expiry,
)
from conversations.models import Message, Role
from conversations.services import NewMessage, conversation_create, messages_append
from memsvc.api.errors import Conflict, Forbidden, InvalidInput
from memsvc.api.principals import Principal
from search.embeddings import EmbeddingError, configured_backend, vector_literal

logger = logging.getLogger(__name__)

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


# --- long-term memories ----------------------------------------------------------------------

# A new memory this close (cosine similarity) to one the agent already keeps about the same
# user is the same fact in other words: it is merged into that one.
NEAR_DUPLICATE_SIMILARITY = 0.95
# kagent: a memory used this often by the time it expires is kept another MEMORY_TTL.
POPULAR_ACCESS_COUNT = 10


@dataclass
class NewMemory:
    content: str
    summary: str = ""
    importance: float = 0.5
    tags: Sequence[str] = ()
    metadata: dict = field(default_factory=dict)
    expires_at: datetime | None = None


def _memory_vectors(texts: list[str]):
    """Vectors for new memories, in one call; None when the backend fails (the memories are
    stored anyway, found by keywords, and embedded later by the sweep)."""
    backend = configured_backend()
    try:
        return backend.model, list(backend.embed(texts))
    except EmbeddingError as exc:
        logger.warning("memories saved without vectors (%s); the sweep will embed them", exc)
        return None, None


_NEAREST_MEMORY = """
SELECT id FROM memory
WHERE agent_id = %s AND user_id = %s AND embedding_model = %s
  AND (embedding <=> %s::vector) <= %s
ORDER BY (embedding <=> %s::vector) + 0
LIMIT 1
"""


def _same_memory(agent: Agent, user_id: str, new: NewMemory, model, vector) -> Memory | None:
    """The stored memory that ``new`` repeats: the same normalised text, or (with a vector)
    one at ``NEAR_DUPLICATE_SIMILARITY`` or closer. Locked for the merge."""
    same = Memory.objects.select_for_update().filter(
        agent=agent, user_id=user_id, content_hash=content_hash(new.content)
    )
    found = same.first()
    if found is None and vector is not None:
        distance = 1 - NEAR_DUPLICATE_SIMILARITY
        with connection.cursor() as cursor:
            # Exact distances over this agent's memories of this user (+ 0: not the graph,
            # whose walk may stop short inside a scope this narrow).
            literal = vector_literal(vector)
            cursor.execute(_NEAREST_MEMORY, [agent.id, user_id, model, literal, distance, literal])
            row = cursor.fetchone()
        if row is not None:
            found = Memory.objects.select_for_update().get(pk=row[0])
    return found


def _violates(exc: IntegrityError, constraint: str) -> bool:
    """Whether PostgreSQL refused the row because of ``constraint`` (and not another one)."""
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None) == constraint


def _merge(memory: Memory, new: NewMemory) -> Memory:
    """What saving a known fact again changes: the higher importance, every tag, and a life
    at least as long as the new one would have had."""
    memory.importance = max(memory.importance, new.importance)
    memory.tags = list(dict.fromkeys([*memory.tags, *new.tags]))
    memory.expires_at = max(memory.expires_at, new.expires_at or default_expiry())
    memory.updated_at = timezone.now()
    memory.save(update_fields=["importance", "tags", "expires_at", "updated_at"])
    return memory


@transaction.atomic
def memories_save(
    actor: Principal,
    *,
    agent: Agent,
    user_id: str = "",
    memories: Sequence[NewMemory],
    source: str = MemorySource.API,
) -> list[tuple[Memory, bool]]:
    """Save memories of ``agent`` about ``user_id`` ("" for its own), all or nothing.

    Each is (memory, created): a memory that repeats a stored one (``_same_memory``, or an
    earlier one of the same batch) is merged into it instead of stored twice. All are
    embedded in one call before the transaction, so a near-duplicate is caught at once.
    """
    model, vectors = _memory_vectors([new.content for new in memories])
    now = timezone.now()
    saved = []
    for index, new in enumerate(memories):
        vector = vectors[index] if vectors else None
        existing = _same_memory(agent, user_id, new, model, vector)
        if existing is not None:
            saved.append((_merge(existing, new), False))
            continue
        memory = Memory(
            agent=agent,
            user_id=user_id,
            content=new.content,
            content_hash=content_hash(new.content),
            summary=new.summary,
            tags=list(dict.fromkeys(new.tags)),
            importance=new.importance,
            metadata=new.metadata,
            source=source,
            expires_at=new.expires_at or now + MEMORY_TTL,
            created_at=now,
            updated_at=now,
        )
        if vector is not None:
            memory.embedding, memory.embedding_model, memory.embedded_at = vector, model, now
        try:
            with transaction.atomic():
                memory.save(force_insert=True)
        except IntegrityError as exc:
            # The same fact saved by a concurrent request: the unique content hash makes it
            # one row, which is merged into now that it is visible. Any other refusal (a
            # check constraint) is the caller's error.
            if not _violates(exc, "memory_unique_content"):
                raise
            saved.append((_merge(_same_memory(agent, user_id, new, None, None), new), False))
            continue
        saved.append((memory, True))
    return saved


def memory_save(
    actor: Principal, *, agent: Agent, user_id: str = "", source=MemorySource.API, **fields
):
    """One memory (``memories_save``): (memory, created)."""
    [result] = memories_save(
        actor, agent=agent, user_id=user_id, memories=[NewMemory(**fields)], source=source
    )
    return result


@transaction.atomic
def memory_update(
    actor: Principal,
    *,
    memory: Memory,
    content: str | None = None,
    summary: str | None = None,
    importance: float | None = None,
    tags: Sequence[str] | None = None,
    metadata: dict | None = None,
    expires_at: datetime | None = None,
) -> Memory:
    """Change a memory; new content gets a new vector (or waits for the sweep)."""
    memory = Memory.objects.select_for_update().get(pk=memory.pk)
    if content is not None and content != memory.content:
        memory.content = content
        memory.content_hash = content_hash(content)
        model, vectors = _memory_vectors([content])
        memory.embedding = vectors[0] if vectors else None
        memory.embedding_model = model or ""
        memory.embedded_at = timezone.now() if vectors else None
    for name, value in (
        ("summary", summary),
        ("importance", importance),
        ("metadata", metadata),
        ("expires_at", expires_at),
    ):
        if value is not None:
            setattr(memory, name, value)
    if tags is not None:
        memory.tags = list(dict.fromkeys(tags))
    memory.updated_at = timezone.now()
    try:
        with transaction.atomic():
            memory.save()
    except IntegrityError as exc:
        if not _violates(exc, "memory_unique_content"):
            raise
        raise Conflict("the agent already keeps a memory with this content") from None
    return Memory.objects.get(pk=memory.pk)


@transaction.atomic
def memory_delete(actor: Principal, *, memory: Memory) -> None:
    memory.delete()


@transaction.atomic
def memories_delete(actor: Principal, *, memories) -> int:
    """Delete every memory of a queryset the caller chose (``selectors.memories_of``)."""
    deleted, _ = memories.delete()
    return deleted


def memories_touch(memory_ids: Sequence) -> int:
    """Count one more use of each memory a search returned."""
    return Memory.objects.filter(id__in=list(memory_ids)).update(
        access_count=F("access_count") + 1, last_accessed_at=timezone.now()
    )


@dataclass(frozen=True)
class PruneResult:
    deleted: int
    extended: int


@transaction.atomic
def memories_prune(*, now: datetime | None = None) -> PruneResult:
    """kagent's lifecycle: an expired memory used fewer than ``POPULAR_ACCESS_COUNT`` times
    is deleted; a more popular one lives another ``MEMORY_TTL`` and counts its uses afresh.

    Safe to run twice at once: each statement re-checks its condition on rows another run
    has just changed (READ COMMITTED), so a memory is deleted or extended once.
    """
    now = now or timezone.now()
    expired = Memory.objects.filter(expires_at__lte=now)
    deleted, _ = expired.filter(access_count__lt=POPULAR_ACCESS_COUNT).delete()
    extended = expired.filter(access_count__gte=POPULAR_ACCESS_COUNT).update(
        # From ``now``, not from the old expiry: one that a late run finds long expired
        # would come out expired still, and be deleted next time with its count reset.
        # The caller's ``now``, not the database's clock: a run told the time extends past it.
        expires_at=now + MEMORY_TTL,
        access_count=0,
    )
    return PruneResult(deleted=deleted, extended=extended)


def memories_embed(memory_ids: Sequence, *, backend=None, force: bool = False) -> int:
    """Give these memories a vector (saved while the backend was down, or a new model).
    Without ``force`` only those still waiting; the write is conditional, so racing
    sweeps write each once."""
    backend = backend or configured_backend()
    rows = Memory.objects.filter(id__in=list(memory_ids))
    if not force:
        rows = rows.filter(embedded_at__isnull=True)
    rows = list(rows.values_list("id", "content"))
    if not rows:
        return 0
    vectors = backend.embed([content for _, content in rows])
    now = timezone.now()
    written = 0
    with transaction.atomic():
        for (memory_id, _), vector in zip(rows, vectors, strict=True):
            waiting = Memory.objects.filter(pk=memory_id)
            if not force:
                waiting = waiting.filter(embedded_at__isnull=True)
            written += waiting.update(
                embedding=vector, embedding_model=backend.model, embedded_at=now
            )
    return written


def memories_reembed_all(*, backend=None, batch: int = 256) -> int:
    """Re-embed every memory with the configured model (after a model change), batch by
    batch in id order. Memories saved meanwhile get that model's vector when saved."""
    backend = backend or configured_backend()
    total, last_id = 0, None
    while True:
        rows = Memory.objects.order_by("id")
        if last_id is not None:
            rows = rows.filter(id__gt=last_id)
        ids = list(rows.values_list("id", flat=True)[:batch])
        if not ids:
            return total
        last_id = ids[-1]
        total += memories_embed(ids, backend=backend, force=True)


def memories_embed_pending(
    *, backend=None, batch: int = 256, max_batches: int | None = None
) -> int:
    """Embed every memory still waiting for a vector, oldest first (the sweep, reindex)."""
    total = batches = 0
    while max_batches is None or batches < max_batches:
        ids = list(
            Memory.objects.filter(embedded_at__isnull=True)
            .order_by("created_at")
            .values_list("id", flat=True)[:batch]
        )
        done = memories_embed(ids, backend=backend) if ids else 0
        total += done
        batches += 1
        if done == 0:
            break
    return total
