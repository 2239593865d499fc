"""Writes of long-term memories: saved with their vectors and merged with what they repeat, updated, deleted, counted, pruned, embedded later."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from agents_api.models import (
    MEMORY_DEFAULT_IMPORTANCE,
    MEMORY_MAX_MESSAGES,
    MEMORY_MAX_TAGS,
    MEMORY_TTL,
    Agent,
    Memory,
    MemorySource,
    UserMemorySetting,
    content_hash,
    default_expiry,
)
from agents_api.selectors import MEMORIES, memory_off_for, messages_seen_by
from memsvc.api.errors import Conflict, InvalidInput
from memsvc.api.principals import Principal
from memsvc.db import lock_name, locked_row
from search.embeddings import vector_literal
from search.services import embed_pending_rows, embed_rows, reembed_all_rows, vectors_or_none
from search.statements import Scope, execute_planned, nearest_order, nearest_settings
from search.tuning import configured_tuning

# A new memory this close (cosine similarity) to one the agent already keeps about the same
# user is the same fact in other words: it is merged into that one.
NEAR_DUPLICATE_SIMILARITY = 0.95
# kagent: a memory used this often by the time it expires is kept another MEMORY_TTL.
POPULAR_ACCESS_COUNT = 10


@dataclass
class NewMemory:
    content: str
    summary: str = ""
    importance: float | None = None  # not given: the default, or a known fact's own
    tags: Sequence[str] = ()
    metadata: dict = field(default_factory=dict)
    expires_at: datetime | None = None
    message_ids: Sequence = ()  # the turns it rests on (``Memory.message_ids``)


def _memory_vectors(texts: list[str]):
    return vectors_or_none(texts, what="memories")


def _nearest_memory(agent: Agent, user_id: str, model: str, vector) -> tuple | None:
    """(id, cosine distance) of the memory nearest to ``vector`` among the agent's memories
    of this user, found as search finds its candidates: exact distances in a small scope,
    the HNSW graph in a large one (an agent's own store of a hundred thousand memories)."""
    scope = Scope("m.agent_id = %s AND m.user_id = %s", [agent.id, user_id])
    literal = vector_literal(vector)
    tuning = configured_tuning()
    with connection.cursor() as cursor:
        order = nearest_order(cursor, MEMORIES, scope, 1, tuning)
        rows = execute_planned(
            cursor,
            f"""
            SELECT m.id, m.embedding <=> %s::vector FROM memory m
            WHERE m.embedding_model = %s AND {scope.sql}
            ORDER BY {order} LIMIT 1
            """,  # noqa: S608 (our own fragments; every value is a parameter)
            [literal, model, *scope.params, literal],
            nearest_settings(order, 1, tuning),
        )
    return rows[0] if rows else None


def _same_memory(agent: Agent, user_id: str, new: NewMemory, model, vector) -> Memory | None:
    """The stored memory that ``new`` repeats: the same normalised text, or (with a vector)
    one at ``NEAR_DUPLICATE_SIMILARITY`` or closer. Locked for the merge."""
    same = Memory.objects.select_for_update().filter(
        agent=agent, user_id=user_id, content_hash=content_hash(new.content)
    )
    found = same.first()
    if found is None and vector is not None:
        nearest = _nearest_memory(agent, user_id, model, vector)
        row = nearest if nearest and nearest[1] <= 1 - NEAR_DUPLICATE_SIMILARITY else None
        if row is not None:
            # None if it was deleted while this waited for its row (by its user, the prune):
            # the fact is new again.
            found = Memory.objects.select_for_update().filter(pk=row[0]).first()
    return found


def _violates(exc: IntegrityError, constraint: str) -> bool:
    """Whether PostgreSQL refused the row because of ``constraint`` (and not another one)."""
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None) == constraint


def _merge(memory: Memory, new: NewMemory) -> Memory:
    """What saving a known fact again changes: the higher importance, every tag and cited
    turn, and a life at least as long as the new one would have had."""
    if new.importance is not None:  # (a save that says none leaves it as it is)
        memory.importance = max(memory.importance, new.importance)
    # The newest tags and citations, if a fact found again and again would hold more than
    # a memory may (a save of more is refused).
    memory.tags = list(dict.fromkeys([*memory.tags, *new.tags]))[-MEMORY_MAX_TAGS:]
    memory.expires_at = max(memory.expires_at, new.expires_at or default_expiry())
    memory.updated_at = timezone.now()
    cited = list(dict.fromkeys([*memory.message_ids, *new.message_ids]))
    memory.message_ids = cited[-MEMORY_MAX_MESSAGES:]
    memory.save(update_fields=["importance", "tags", "message_ids", "expires_at", "updated_at"])
    return memory


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
    embedded in one call before the transaction (the model's time holds no locks), so a
    near-duplicate is caught at once. 409 when the user turned memory off; 400 when one
    cites a message the actor does not see (``messageIds``).
    """
    refuse_if_memory_off(user_id)
    _refuse_unseen_messages(actor, [i for new in memories for i in new.message_ids])
    model, vectors = _memory_vectors([new.content for new in memories])
    return _store_memories(agent, user_id, memories, source, model, vectors)


def _refuse_unseen_messages(actor: Principal, message_ids: Sequence) -> None:
    """A memory cites only messages its writer may see: another's message is "no such
    message", like a random id."""
    missing = sorted(str(i) for i in set(message_ids) - messages_seen_by(actor, message_ids))
    if missing:
        raise InvalidInput.for_field("messageIds", f"no such message: {missing[0]}")


def refuse_if_memory_off(user_id: str, *, lock: bool = False) -> None:
    """409 when the user turned memory off; ``lock``: their setting stays as read until the
    transaction ends (``memory_off_for``)."""
    if user_id and memory_off_for([user_id], lock=lock):
        raise Conflict(f"{user_id} has turned memory off: no new memories about them are kept")


@transaction.atomic
def _store_memories(agent, user_id, memories, source, model, vectors):
    # Again under the setting's row lock: a switch turned off while the batch was embedded
    # wins (the switch's write waits for this transaction, or this one sees it).
    refuse_if_memory_off(user_id, lock=True)
    # One save at a time of this agent's memories about this user: a near-duplicate saved
    # by a concurrent request is seen (not stored twice), and two batches holding the same
    # new facts in another order do not each wait for the other's row (a deadlock).
    lock_name("memories", agent.pk, user_id)
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
            importance=MEMORY_DEFAULT_IMPORTANCE if new.importance is None else new.importance,
            metadata=new.metadata,
            message_ids=list(dict.fromkeys(new.message_ids)),
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
    # A memory merged into later in the batch is answered as it ends up, wherever it
    # appears (each merge reads the row afresh: the last object is the latest state).
    latest = {memory.pk: memory for memory, _ in saved}
    return [(latest[memory.pk], created) for memory, created in saved]


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
    message_ids: Sequence | None = None,
) -> Memory:
    """Change a memory; new content gets a new vector (or waits for the sweep); new
    ``message_ids`` replace the turns it cites. 409 when its user turned memory off (a
    changed fact is a new one)."""
    if message_ids is not None:
        _refuse_unseen_messages(actor, message_ids)
    memory = locked_row(Memory.objects, memory.pk, missing="memory not found")
    refuse_if_memory_off(memory.user_id, lock=True)
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
    if message_ids is not None:
        memory.message_ids = list(dict.fromkeys(message_ids))
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
def memory_setting_update(actor: Principal, *, enabled: bool) -> UserMemorySetting:
    """Turn agents' memory of the acting user on or off (``UserMemorySetting``)."""
    setting, _ = UserMemorySetting.objects.update_or_create(
        user_id=actor.id, defaults={"memory_enabled": enabled, "updated_at": timezone.now()}
    )
    return setting


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
    """Give these memories a vector (saved while the backend was down, or a new model)."""
    return embed_rows(Memory, memory_ids, text_field="content", backend=backend, force=force)


def memories_reembed_all(*, backend=None, batch: int = 256) -> int:
    """Re-embed every memory with the configured model (after a model change)."""
    return reembed_all_rows(Memory, text_field="content", backend=backend, batch=batch)


def memories_embed_pending(
    *, backend=None, batch: int = 256, max_batches: int | None = None
) -> int:
    """Embed every memory still waiting for a vector, oldest first (the sweep, reindex)."""
    return embed_pending_rows(
        Memory, text_field="content", backend=backend, batch=batch, max_batches=max_batches
    )
