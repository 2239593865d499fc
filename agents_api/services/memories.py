"""Writes of long-term memories: saved with their vectors and merged with what they repeat, updated, deleted, counted, pruned, embedded later."""

import functools
import operator
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
from django.db import IntegrityError, connection, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from agents_api.models import (
    LIVE,
    MEMORY_DEFAULT_IMPORTANCE,
    MEMORY_LISTING_TTL,
    MEMORY_MAX_MESSAGES,
    MEMORY_MAX_TAGS,
    MEMORY_TTL,
    Agent,
    Memory,
    MemoryListing,
    MemorySource,
    UserMemorySetting,
    claims,
    content_hash,
    default_expiry,
    same_words,
)
from agents_api.selectors import MEMORIES, memory_off_for, memory_scope, messages_seen_by
from conversations.models import Message
from memsvc.api.errors import Conflict, InvalidInput, NotFound
from memsvc.api.principals import Principal
from memsvc.db import held_keys, hold_users, lock_name, locked_row
from search.embeddings import unread_parts, vector_literal
from search.services import embed_pending_rows, embed_rows, reembed_all_rows, vectors_or_none
from search.statements import execute_planned, nearest_order, nearest_settings, order_on
from search.tuning import configured_tuning

# A new memory this close (cosine similarity) to one the agent already keeps about the same
# user, stating the same numbers and negations (``models.claims``), is the same fact in
# other words: it is merged into that one.
NEAR_DUPLICATE_SIMILARITY = 0.95
# A text at least this near one stored that says the same words but for their punctuation
# ("Oslo!!", "Oslo": 0.90) repeats it too (``models.same_words``).
SAME_WORDS_SIMILARITY = 0.8
# The longest text (in characters other than blanks) that a vector surely reads whole: each
# token of the tokenizers of the models memsvc is used with holds a character at least, and
# the smallest window among them is all-MiniLM-L6-v2's 256 tokens, two of them its markers.
# A longer text's vector may end before the text does: two texts alike in their first 250
# words were one near-duplicate, and the second's fact (an allergy) was dropped (review).
# Such a text repeats another only in the same words (``SAME_WORDS_SIMILARITY``).
NEAR_DUPLICATE_MAX_CHARS = 254
# kagent: a memory used this often by the time it expires is kept another MEMORY_TTL.
POPULAR_ACCESS_COUNT = 10
# Inserts of one new fact a save tries while the row it collides with keeps vanishing
# before it can be merged into (``_insert_new``).
INSERT_ATTEMPTS = 3


@dataclass
class NewMemory:
    content: str
    summary: str = ""
    importance: float | None = None  # not given: the default, or a known fact's own
    tags: Sequence[str] = ()
    metadata: dict = field(default_factory=dict)
    expires_at: datetime | None = None
    message_ids: Sequence = ()  # the turns it rests on (``Memory.message_ids``)


def memory_vectors(texts: list[str]):
    """(model, vectors) of memories about to be saved (``vectors_or_none``): asked before
    any transaction, so that the model's time holds no locks."""
    return vectors_or_none(texts, what="memories")


def _nearest_memories(agent: Agent, user_id: str, model: str, vectors: list) -> list:
    """For each of ``vectors``: (id, cosine distance) of the memory nearest to it among the
    agent's memories of this user (not expired ones: those are gone), or (None, None); in one
    statement, found as search finds its candidates: exact distances in a small scope, the
    HNSW graph in a large one (an agent's own store of a hundred thousand memories)."""
    if not vectors:
        return []
    scope = memory_scope(agent.id, user_id)
    tuning = configured_tuning()
    with connection.cursor() as cursor:
        order = nearest_order(cursor, MEMORIES, scope, 1, tuning)
        rows = execute_planned(
            cursor,
            f"""
            SELECT q.i, near.id, near.distance
            FROM unnest(%s::vector[]) WITH ORDINALITY AS q(v, i)
            CROSS JOIN LATERAL (
                SELECT m.id, m.embedding <=> q.v AS distance FROM memory m
                WHERE m.embedding_model = %s AND {scope.sql}
                ORDER BY {order_on(order, "q.v")} LIMIT 1
            ) near
            """,  # noqa: S608 (our own fragments; every value is a parameter)
            [[vector_literal(v) for v in vectors], model, *scope.params],
            nearest_settings(order, 1, tuning),
        )
    nearest = [(None, None)] * len(vectors)
    for index, memory_id, distance in rows:
        nearest[index - 1] = (memory_id, distance)
    return nearest


def _live_by_hash(agent: Agent, user_id: str, hashes) -> dict:
    """The stored memories of the agent about this user holding one of these texts
    (``content_hash``), by hash, locked for a merge. Never an expired one: that fact is gone,
    and saving it again keeps it anew (``expired_copies_forget``), not the old row with its
    old uses."""
    same = Memory.objects.select_for_update().filter(
        LIVE, agent=agent, user_id=user_id, content_hash__in=set(hashes)
    )
    return {memory.content_hash: memory for memory in same}


def expired_copies_forget(memories: Sequence[Memory]) -> None:
    """Delete the expired memories holding the text of one of ``memories`` (about to be
    stored: the same agent, user and unique content hash), as the prune would have: the
    same fact stored again is a new memory, not a collision with one that is gone."""
    # (One condition per agent and user, not per memory: a batch's hundred-way OR cost more
    # to compile than to run.)
    hashes: dict = {}
    for memory in memories:
        hashes.setdefault((memory.agent_id, memory.user_id), set()).add(memory.content_hash)
    same = [
        Q(agent_id=agent_id, user_id=user_id, content_hash__in=sorted(of_them))
        for (agent_id, user_id), of_them in hashes.items()
    ]
    if same:
        Memory.objects.filter(~LIVE).filter(functools.reduce(operator.or_, same)).delete()


def _violates(exc: IntegrityError, constraint: str) -> bool:
    """Whether PostgreSQL refused the row because of ``constraint`` (and not another one)."""
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None) == constraint


def _merged(memory: Memory, new: NewMemory) -> Memory:
    """What saving a known fact again changes: the higher importance, every tag and cited
    turn, and a life at least as long as the new one would have had (in place, not saved:
    ``_merge`` saves it)."""
    if new.importance is not None:  # (a save that says none leaves it as it is)
        memory.importance = max(memory.importance, new.importance)
    # The newest tags and citations, if a fact found again and again would hold more than
    # a memory may (a save of more is refused).
    memory.tags = _newest(memory.tags, new.tags, MEMORY_MAX_TAGS)
    memory.expires_at = max(memory.expires_at, new.expires_at or default_expiry())
    memory.updated_at = timezone.now()
    cited = list(dict.fromkeys([*memory.message_ids, *new.message_ids]))  # (as first cited)
    memory.message_ids = cited[-MEMORY_MAX_MESSAGES:]
    return memory


def _newest(kept, given, most: int) -> list:
    """``kept`` and ``given`` once each, ``given`` the newest (last, whether kept already or
    not: a tag the newest save sent again was dropped as one of the oldest; review), at most
    the ``most`` newest."""
    again = set(given)
    return [*(item for item in kept if item not in again), *dict.fromkeys(given)][-most:]


def _merge(memory: Memory, new: NewMemory) -> Memory:
    """``new`` merged into the stored ``memory`` (``_merged``), saved."""
    _merged(memory, new)
    memory.save(update_fields=["importance", "tags", "message_ids", "expires_at", "updated_at"])
    return memory


def memories_save(
    actor: Principal,
    *,
    agent: Agent,
    user_id: str = "",
    memories: Sequence[NewMemory],
    source: str = MemorySource.API,
    items: str | None = "memories",
    embedded: tuple | None = None,
) -> list[tuple[Memory, bool]]:
    """Save memories of ``agent`` about ``user_id`` ("" for its own), all or nothing.

    Each is (memory, created): a memory that repeats a stored one (``_store_memories``, or an
    earlier one of the same batch) is merged into it instead of stored twice. All are
    embedded in one call before the transaction (the model's time holds no locks), so a
    near-duplicate is caught at once. 409 when the user turned memory off; 400 when one
    cites a message the actor does not see (``memories[1].messageIds``, the batch's
    ``items`` named; None: one memory's, ``messageIds``). ``embedded``: their (model,
    vectors) from ``memory_vectors``, for a caller that saves inside a transaction of its
    own and asked before it.
    """
    refuse_if_memory_off(user_id)
    cited = [new.message_ids for new in memories]
    _refuse_missing_messages(cited, messages_seen_by(actor, _flat(cited)), items=items)
    model, vectors = embedded or memory_vectors([new.content for new in memories])
    return _store_memories(agent, user_id, memories, source, model, vectors, items)


def _flat(cited: Sequence[Sequence]) -> list:
    return [i for message_ids in cited for i in message_ids]


def _hold_cited_messages(cited: Sequence[Sequence], items: str | None) -> None:
    """Hold the messages a memory is about to cite until its write commits (``held_keys``):
    one deleted since the writer saw it (a user's erase, which strips its id from the
    memories already stored, ``memory_citations_forget``) is "no such message", and a
    deletion that comes later waits, then finds this memory to strip. First in the write's
    transaction but for its user's hold (``hold_users``, which the erase takes before
    anything): the erase locks the messages before any memory or setting, so a write waiting
    here holds nothing the erase waits for."""
    wanted = set(_flat(cited))
    if wanted:
        _refuse_missing_messages(cited, held_keys(Message, wanted), items=items)


def _refuse_missing_messages(cited: Sequence[Sequence], found: set, *, items: str | None) -> None:
    """A memory cites only messages there, that its writer may see (``found``): another's
    message is "no such message", like a random id. 400 naming the first memory of
    ``cited`` (the ids each cites) that cites another: ``items[1].messageIds`` (review: a
    batch's refusal named no memory), ``messageIds`` when ``items`` is None."""
    for index, message_ids in enumerate(cited):
        missing = sorted(str(i) for i in set(message_ids) - found)
        if missing:
            refused = InvalidInput.for_field("messageIds", f"no such message: {missing[0]}")
            raise refused.within(f"{items}[{index}]") if items else refused


def refuse_if_memory_off(user_id: str, *, lock: bool = False) -> None:
    """409 when the user turned memory off; ``lock``: their setting stays as read until the
    transaction ends (``memory_off_for``)."""
    if user_id and memory_off_for([user_id], lock=lock):
        raise memory_off_refusal(user_id)


def memory_off_refusal(user_id: str) -> Conflict:
    return Conflict(f"{user_id} has turned memory off: no new memories about them are kept")


@transaction.atomic
def _store_memories(agent, user_id, memories, source, model, vectors, items):
    """``memories_save``'s write, in a few statements whatever the batch's size: the stored
    memories repeating the batch's texts, then the nearest stored one to each new text, then
    one insert of the new facts. Each memory of the batch, in order, is merged into the one
    it repeats: a stored memory or a new one earlier in the batch, of the same normalised
    text, else the nearest of them (cosine similarity ``NEAR_DUPLICATE_SIMILARITY`` or more),
    else it is a new fact."""
    # (Read before any lock: a text's claims and hash cost its length, which no other save
    # of the agent's should wait for; review.)
    hashes = [content_hash(new.content) for new in memories]
    said = [claims(new.content) for new in memories]
    hold_users([user_id])
    _hold_cited_messages([new.message_ids for new in memories], items)
    # Again under the setting's row lock: a switch turned off while the batch was embedded
    # wins (the switch's write waits for this transaction, or this one sees it).
    refuse_if_memory_off(user_id, lock=True)
    # One save at a time of this agent's memories about this user: a near-duplicate saved
    # by a concurrent request is seen (not stored twice), and two batches holding the same
    # new facts in another order do not each wait for the other's row (a deadlock).
    lock_name("memories", agent.pk, user_id)
    now = timezone.now()
    by_hash = _live_by_hash(agent, user_id, hashes)  # (and the batch's new facts, as they come)
    texts = [new.content for new in memories]
    near = _stored_near_duplicates(agent, user_id, model, vectors, texts, said, hashes, by_hash)
    fresh: dict = {}  # each new fact (a Memory not yet stored) -> the saves it holds
    embedded_fresh: dict[int, Memory] = {}  # the new facts with a vector, by their index
    units = _unit_rows(vectors)
    saved = []
    for index, new in enumerate(memories):
        vector = vectors[index] if vectors else None
        same = by_hash.get(hashes[index])
        if same is None and vector is not None:
            same = _nearest_repeat(near.get(index), units, embedded_fresh, index, said, texts)
        if same is not None:
            if same in fresh:
                fresh[same].append(new)
                _merged(same, new)
            else:
                _merge(same, new)
            saved.append((same, False))
            continue
        memory = Memory(
            agent=agent,
            user_id=user_id,
            content=new.content,
            content_hash=hashes[index],
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
            embedded_fresh[index] = memory
        by_hash[hashes[index]] = memory
        fresh[memory] = [new]
        saved.append((memory, True))
    merged_instead = _insert_new(fresh)
    # (A memory merged into later in the batch is the same object wherever it appears:
    # each is answered as the batch left it.)
    return [
        (merged_instead[memory], False) if memory in merged_instead else (memory, created)
        for memory, created in saved
    ]


def _stored_near_duplicates(agent, user_id, model, vectors, texts, said, hashes, by_hash) -> dict:
    """For each new text (``texts``, by index) that repeats no stored text, the stored memory
    nearest to it if it is a near-duplicate (or says the same words: ``models.same_words``)
    stating the same ``claims`` (``said``, by index):
    (that memory, locked, or None if it was deleted while this waited for its row: the fact
    is new again; the distance). Near as the row is once locked: a change of its content
    committed while this waited for it (a PATCH) is measured again. (The save was merged
    into whatever the row had become, and its fact stored nowhere: review, 27 of 60.)"""
    asked = [i for i, hashed in enumerate(hashes) if vectors and hashed not in by_hash]
    nearest = _nearest_memories(agent, user_id, model, [vectors[i] for i in asked])
    found = {
        i: memory_id
        for i, (memory_id, distance) in zip(asked, nearest, strict=True)
        if distance is not None and distance <= 1 - NEAR_DUPLICATE_SIMILARITY
    }
    # Farther, the same words but for their punctuation (read first without a lock: most
    # are another fact, whose row this save must not hold).
    farther = {
        i: memory_id
        for i, (memory_id, distance) in zip(asked, nearest, strict=True)
        if i not in found and distance is not None and distance <= 1 - SAME_WORDS_SIMILARITY
    }
    if farther:
        stored = dict(Memory.objects.filter(pk__in=farther.values()).values_list("pk", "content"))
        found |= {
            i: memory_id
            for i, memory_id in farther.items()
            if same_words(stored.get(memory_id, ""), texts[i])
        }
    rows = {memory.pk: memory for memory in by_hash.values()}
    missing = set(found.values()) - rows.keys()
    if missing:
        rows |= Memory.objects.select_for_update().filter(LIVE, pk__in=missing).in_bulk()
    near = {}
    for i, memory_id in found.items():
        memory = rows.get(memory_id)
        if memory is None:
            near[i] = (None, None)
            continue
        distance = _distance_to(memory, vectors[i], model)
        if (
            distance is not None
            and _repeats(distance, memory.content, texts[i])
            and claims(memory.content) == said[i]
        ):
            near[i] = (memory, distance)
    return near


def _repeats(distance: float, text: str, other: str) -> bool:
    """Whether ``other`` at cosine ``distance`` from ``text`` repeats it (their ``claims``
    aside): a near-duplicate, both read whole by their vectors (``NEAR_DUPLICATE_MAX_CHARS``)
    with the same words the model cannot read (``unread_parts``: "eats ข้าวผัด" and "eats
    ต้มยำ", "flag is 🇯🇵" and "flag is 🇫🇷" were one vector, the second fact merged into the
    first and lost; review), or the same words (``models.same_words``) a little farther."""
    near = (
        distance <= 1 - NEAR_DUPLICATE_SIMILARITY
        and _read_whole(text)
        and _read_whole(other)
        and unread_parts(text) == unread_parts(other)
    )
    return near or (distance <= 1 - SAME_WORDS_SIMILARITY and same_words(text, other))


def _read_whole(text: str) -> bool:
    """Whether every part of ``text`` is surely in its vector (``NEAR_DUPLICATE_MAX_CHARS``),
    its characters counted decomposed (NFD): a tokenizer reads a Hangul syllable as its two
    or three letters, an accented letter as its letter and its accent (254 Korean syllables
    were 428-585 tokens; code review)."""
    decomposed = unicodedata.normalize("NFD", text)
    return (
        len(decomposed) <= NEAR_DUPLICATE_MAX_CHARS
        or len("".join(decomposed.split())) <= NEAR_DUPLICATE_MAX_CHARS
    )


def _distance_to(memory: Memory, vector, model: str) -> float | None:
    """The cosine distance from ``vector`` (of ``model``) to ``memory`` as its row holds it
    now; None when it holds no vector of that model (its new content not embedded yet)."""
    if memory.embedding is None or memory.embedding_model != model:
        return None
    units = _unit_rows([vector, memory.embedding])
    return float(1 - units[0] @ units[1])


def _unit_rows(vectors) -> np.ndarray | None:
    """The vectors as rows of unit length (their dot products: cosine similarities)."""
    if not vectors:
        return None
    rows = np.asarray(vectors, dtype=np.float64)
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def _nearest_repeat(stored, units: np.ndarray, embedded_fresh: dict, index: int, said, texts):
    """The memory the batch's text ``index`` repeats in other words: the nearer of the stored
    near-duplicate (``_stored_near_duplicates``) and the batch's earlier new facts stating
    the same ``claims`` (``said``, by index) that repeat it (near enough, or the same words:
    ``models.same_words``, of ``texts``)."""
    best, best_distance = None, None
    if stored is not None and stored[0] is not None:
        best, best_distance = stored
    earlier = [i for i in embedded_fresh if said[i] == said[index]]
    if earlier:
        distances = 1 - units[earlier] @ units[index]
        repeats = [
            (float(distance), i)
            for distance, i in zip(distances, earlier, strict=True)
            if _repeats(distance, texts[i], texts[index])
        ]
        if repeats:
            distance, nearest = min(repeats)
            if best_distance is None or distance <= best_distance:
                best = embedded_fresh[nearest]
    return best


def _insert_new(fresh: dict) -> dict:
    """Store the new facts (each with the saves it holds), in one statement. One whose text
    was committed meanwhile by a writer that does not take a save's turn (an update of
    another memory's content, an import) is merged into that row instead; that row may be
    gone again before it is read (deleted, changed once more, expired): the insert is then
    tried again. Any other refusal (a check constraint) is the caller's error. Returns the
    stored rows merged into instead (new memory -> that row)."""
    instead: dict = {}
    waiting = list(fresh)
    for _ in range(INSERT_ATTEMPTS):
        expired_copies_forget(waiting)
        Memory.objects.bulk_create(waiting, ignore_conflicts=True)
        inserted = set(
            Memory.objects.filter(pk__in=[m.pk for m in waiting]).values_list("pk", flat=True)
        )
        collided = [memory for memory in waiting if memory.pk not in inserted]
        if not collided:
            return instead
        first = collided[0]
        stored = _live_by_hash(first.agent, first.user_id, [m.content_hash for m in collided])
        waiting = []
        for memory in collided:
            existing = stored.get(memory.content_hash)
            if existing is None:
                waiting.append(memory)
                continue
            for new in fresh[memory]:
                _merge(existing, new)
            instead[memory] = existing
    raise Conflict("this memory was changed by another request while it was saved; try again")


def memory_save(
    actor: Principal, *, agent: Agent, user_id: str = "", source=MemorySource.API, **fields
):
    """One memory (``memories_save``): (memory, created)."""
    [result] = memories_save(
        actor,
        agent=agent,
        user_id=user_id,
        memories=[NewMemory(**fields)],
        source=source,
        items=None,
    )
    return result


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
    changed fact is a new one), or when the agent keeps the new content already.

    New content is embedded before the transaction, as a save's (the model's time holds no
    lock); the vector is of the very text written, whatever the memory held meanwhile."""
    # Only the turns it does not cite yet must be there: the ids it cites, sent back as its
    # GET gave them, held one deleted since, and the change was a 400 "no such message"
    # (outside review). (A deletion leaves the ids: stripping them from every citing memory
    # rewrote each row and its vector's index entry, 3 ms a memory: docs/benchmarks.md.)
    new_citations = None
    if message_ids is not None:
        cited = set(memory.message_ids)
        new_citations = [i for i in message_ids if i not in cited]
        seen = messages_seen_by(actor, new_citations)
        _refuse_missing_messages([new_citations], seen, items=None)
    refuse_if_memory_off(memory.user_id)
    model, vectors = (None, None)
    if content is not None and content != memory.content:
        model, vectors = memory_vectors([content])
    changes = {
        "summary": summary,
        "importance": importance,
        "metadata": metadata,
        "expires_at": expires_at,
        "tags": None if tags is None else list(dict.fromkeys(tags)),
        "message_ids": None if message_ids is None else list(dict.fromkeys(message_ids)),
    }
    return _write_memory_update(
        memory,
        content,
        vectors[0] if vectors else None,
        model,
        {name: value for name, value in changes.items() if value is not None},
        new_citations or (),
    )


@transaction.atomic
def _write_memory_update(
    read: Memory, content: str | None, vector, model, changes: dict, new_citations: Sequence
) -> Memory:
    """``memory_update``'s write of the memory ``read``; ``vector`` (of ``model``):
    ``content``'s, or None; ``new_citations``: the turns it did not cite when the change was
    read. Its locks in a save's order (``_store_memories``): the user, their setting, then
    the row (the row before the setting, a change and a save merging into the same memory
    each held what the other waited for: a deadlock, 503; code review). A memory's user
    never changes."""
    hold_users([read.user_id])
    _hold_cited_messages([new_citations], None)
    refuse_if_memory_off(read.user_id, lock=True)
    memory = locked_row(Memory.objects, read.pk, missing="memory not found")
    if content in (None, memory.content) and all(
        getattr(memory, name) == value for name, value in changes.items()
    ):
        return memory  # nothing changes, not even ``updatedAt`` (as a conversation's)
    if content is not None and content != memory.content:
        hashed = content_hash(content)
        if hashed != memory.content_hash:  # (another fact: an expired copy of it is gone)
            memory.content_hash = hashed
            expired_copies_forget([memory])
        memory.content = content
        # None: the content was as this request asked when it was read (so not embedded),
        # and changed since, or the backend failed: the sweep embeds it.
        memory.embedding = vector
        memory.embedding_model = model if vector is not None else ""
        memory.embedded_at = timezone.now() if vector is not None else None
    for name, value in changes.items():
        setattr(memory, name, value)
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
    hold_users([actor.id])
    setting, _ = UserMemorySetting.objects.update_or_create(
        user_id=actor.id, defaults={"memory_enabled": enabled, "updated_at": timezone.now()}
    )
    return setting


@transaction.atomic
def memory_delete(actor: Principal, *, memory: Memory) -> None:
    """Delete a memory; 404 when a concurrent request deleted it first (three DELETEs at
    once each answered 204; review)."""
    deleted, _ = Memory.objects.filter(pk=memory.pk).delete()
    if not deleted:
        raise NotFound("memory not found")


@transaction.atomic
def memories_delete(actor: Principal, *, memories) -> int:
    """Delete every memory of a queryset the caller chose (``selectors.memories_of``, with
    the expired ones: else the prune could give one a new life); how many of them had not
    expired (the others were gone already, and no list showed them)."""
    memories.exclude(LIVE).delete()
    deleted, _ = memories.delete()
    return deleted


# Memories rewritten by one statement of an erase: each is a new row version in every index
# (its vector's graph too), about 3 ms (docs/benchmarks.md, "A deleted message's citations"):
# a user cited by thousands stays within ``MEMSVC_STATEMENT_TIMEOUT_SECONDS``.
CITATIONS_FORGOTTEN_PER_STATEMENT = 1000


def memory_citations_forget(message_ids: Sequence) -> int:
    """No memory (any agent's, about anyone) cites one of ``message_ids`` any more: the
    messages of a user's erase (``user_erase``), which nothing may point at afterwards. A
    memory keeps its other citations in their order, and stays when they were all erased:
    the fact is its agent's, only the turns were the user's. How many memories changed."""
    if not message_ids:
        return 0
    erased = list(set(message_ids))
    with connection.cursor() as cursor:
        # Joined and filtered by hash: ``&&`` and ``<> ALL`` compare every pair, and an
        # erase may take a great many messages.
        cursor.execute(
            """
            SELECT DISTINCT citing.id
            FROM memory citing
            CROSS JOIN LATERAL unnest(citing.message_ids) AS c(id)
            JOIN unnest(%s::uuid[]) AS erased(id) ON erased.id = c.id
            WHERE NOT (citing.message_ids = '{}'::uuid[])
            ORDER BY citing.id
            """,
            [erased],
        )
        citing = [memory_id for (memory_id,) in cursor.fetchall()]
        for start in range(0, len(citing), CITATIONS_FORGOTTEN_PER_STATEMENT):
            cursor.execute(
                """
                WITH erased AS (SELECT unnest(%s::uuid[]) AS id)
                UPDATE memory m
                SET message_ids = ARRAY(
                    SELECT c.id FROM unnest(m.message_ids) WITH ORDINALITY AS c(id, n)
                    WHERE c.id NOT IN (SELECT id FROM erased) ORDER BY c.n
                )
                WHERE m.id = ANY(%s)
                """,
                [erased, citing[start : start + CITATIONS_FORGOTTEN_PER_STATEMENT]],
            )
    return len(citing)


def memories_touch(memory_ids: Sequence) -> int:
    """Count a use of each memory searches returned, one per time it is named (the uses of a
    process's searches are sent together: ``tasks.enqueue_memory_touch``). How many
    memories were there to count. A memory that has expired since its search is not
    counted: a use arriving late must not make the prune extend what it would delete."""
    uses = Counter(str(memory_id) for memory_id in memory_ids)
    now = timezone.now()
    touched = 0
    for times in sorted(set(uses.values())):
        touched += Memory.objects.filter(
            LIVE, id__in=[memory_id for memory_id, n in uses.items() if n == times]
        ).update(access_count=F("access_count") + times, last_accessed_at=now)
    return touched


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
        # ``expiresAt`` + 15 days (kagent's, DESIGN's); from ``now`` for one a late run
        # finds expired that long: it would come out expired still, and be deleted next time
        # with its count reset. The caller's ``now``, not the database's clock: a run told
        # the time extends past it.
        expires_at=Case(
            When(expires_at__gt=now - MEMORY_TTL, then=F("expires_at") + MEMORY_TTL),
            default=Value(now + MEMORY_TTL),
        ),
        access_count=0,
    )
    # The orders of walks by popularity begun long enough ago (a cursor into one is a 400).
    MemoryListing.objects.filter(created_at__lt=now - MEMORY_LISTING_TTL).delete()
    return PruneResult(deleted=deleted, extended=extended)


def memories_embed(memory_ids: Sequence, *, backend=None, force: bool = False) -> int:
    """Give these memories a vector (saved while the backend was down, or a new model)."""
    return embed_rows(Memory, memory_ids, text_field="content", backend=backend, force=force)


def memories_reembed_all(*, backend=None, batch: int = 256) -> int:
    """Re-embed every memory with the configured model (after a model change)."""
    return reembed_all_rows(Memory, text_field="content", backend=backend, batch=batch)


def memories_embed_pending(
    *, backend=None, batch: int = 256, max_batches: int | None = None, patient: bool = False
) -> int:
    """Embed every memory still waiting for a vector, oldest first (the sweep, reindex)."""
    return embed_pending_rows(
        Memory,
        text_field="content",
        backend=backend,
        batch=batch,
        max_batches=max_batches,
        patient=patient,
    )
