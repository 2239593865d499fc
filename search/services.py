"""Writes of the search app: message vectors.

A message is committed first and embedded afterwards (``tasks.enqueue_embedding`` runs on commit).
Whatever the queue loses, the periodic sweep finds again: a message is never left
unsearchable because of a broker problem, and keywords find it meanwhile.
"""

import logging
import threading
import time
from collections.abc import Sequence
from datetime import timedelta

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from conversations.models import Channel, Conversation, Message
from memsvc.db import lock_key
from search.embeddings import (
    EmbeddingBackend,
    EmbeddingError,
    LocalBackend,
    configured_backend,
    embedded_within,
    embedding_text,
    is_remote,
    vector_literal,
)

logger = logging.getLogger(__name__)

EMBED_BATCH = 256

# One statement for a whole batch; the condition on embedded_at makes a racing worker's
# second write impossible.
_UPDATE_VECTORS = """
UPDATE {table} AS m
SET embedding = v.embedding::vector, embedding_model = %s, embedded_at = %s
FROM unnest(%s::uuid[], %s::text[]) AS v(id, embedding)
WHERE m.id = v.id {only_pending}
RETURNING m.id
"""

# A worker's task takes this many other waiting messages with its own (the oldest first):
# under a stream of appends the backlog goes out in batches, each paying for one task and
# one set of statements (the model itself runs int8 texts one at a time, see
# ``search.onnx_encoder``; docs/benchmarks.md).
TASK_BATCH = 32

# Rows the backend refused for good lately (a text too long for its model, one it answers
# NaN for), by table, with when: this process leaves them out of the waiting rows a task
# takes along and of its sweeps for ``REFUSED_SECONDS``, then asks again (the model may
# have been changed). Each batch that held one was refused whole and sent again text by
# text (every append cost two requests), and a reindex stopped on it (review). Per process:
# each worker process learns it once; a reindex asks each such row once.
REFUSED_SECONDS = 600
_refused: dict[str, dict[str, float]] = {}
_refused_lock = threading.Lock()  # (a web process's request threads embed too)


def refused_lately(table: str) -> list[str]:
    """The ids of ``table`` the backend refused for good in this process lately."""
    since = time.monotonic() - REFUSED_SECONDS
    with _refused_lock:
        rows = _refused.get(table, {})
        for row_id in [row_id for row_id, at in rows.items() if at < since]:
            del rows[row_id]
        return list(rows)


def _note_refused(table: str, row_id) -> None:
    with _refused_lock:
        _refused.setdefault(table, {})[str(row_id)] = time.monotonic()


# The messages to embed, claimed: each by a session-level advisory lock on its name
# (``claim_name``; ``memsvc.db.lock_key``'s names, one of its own), held until
# its vector is written, and those another worker holds skipped. Not a lock of the row: held
# while the model ran (a minute for a batch on a busy machine), row locks kept a deletion of
# those messages (a user's erase, a conversation's) waiting past its statement timeout,
# again and again while a backlog was embedded (review). The rows are read once
# (``MATERIALIZED``), so no lock is taken of one the statement does not answer; the ones
# asked for and the oldest waiting, each by its index (under an ``OR`` the ids' index was
# not used: code review).
_CLAIM = """
WITH waiting AS MATERIALIZED (
    SELECT id, author_name, content, channel, conversation_id, seq FROM message
    WHERE id = ANY(%s::uuid[]) {only_pending}
    UNION
    SELECT * FROM (
        SELECT id, author_name, content, channel, conversation_id, seq FROM message
        WHERE embedded_at IS NULL AND NOT id = ANY(%s::uuid[]) ORDER BY seq LIMIT %s) AS oldest
)
SELECT id, author_name, content, channel, conversation_id FROM waiting
WHERE pg_try_advisory_lock(hashtextextended(%s || id::text, 0))
ORDER BY seq
"""
_RELEASE = """
SELECT pg_advisory_unlock(hashtextextended(%s || id, 0)) FROM unnest(%s::text[]) AS id
"""
# The claimed rows a write may take at once: those another transaction holds are left (a
# deletion's, which deletes them or updates them, a reply's or a summary's): waiting for it,
# the write locked rows in another order than its, and one of the two was ended as a
# deadlock, the deletion perhaps (code review). Left waiting, they are the sweep's. A
# re-embedding (``force``, every row's vector replaced by the new model's) cannot leave
# them to a sweep, which takes waiting rows only: it waits, locking in the order a deletion
# locks messages (``conversations.services._lock_messages``), by id.
_FREE_TO_WRITE = """
SELECT id FROM message WHERE id = ANY(%s::uuid[]) FOR NO KEY UPDATE SKIP LOCKED
"""
_ALL_TO_WRITE = """
SELECT id FROM message WHERE id = ANY(%s::uuid[]) ORDER BY id FOR NO KEY UPDATE
"""
CLAIM_PREFIX = lock_key("embedding", "")  # (followed by the message's id, in ``_CLAIM``)


def claim_name(message_id) -> str:
    """The name a worker embedding the message holds (``_CLAIM``)."""
    return lock_key("embedding", message_id)


def embed_messages(
    message_ids: Sequence,
    *,
    backend: EmbeddingBackend | None = None,
    force: bool = False,
    batch: int = 0,
) -> int:
    """Embed these messages; returns how many got a vector. With ``batch``, other messages
    still waiting come along, oldest first, up to ``batch`` in all.

    Idempotent: without ``force`` only messages still waiting (``embedded_at IS NULL``) are
    embedded. The messages are claimed for the time it takes (``_CLAIM``): a second worker
    skips those one is embedding, so a message's vector is written once. A message deleted
    meanwhile is not written. ``force`` re-embeds (a new model). Not inside a transaction
    (the claims outlive one; every caller's messages are committed).
    """
    backend = backend or configured_backend()
    ids = [str(message_id) for message_id in message_ids]
    claimed = None  # (None: the claim's own statement failed, having taken who knows which)
    with connection.cursor() as cursor:
        try:
            cursor.execute(
                _CLAIM.format(only_pending="" if force else "AND embedded_at IS NULL"),
                [ids, refused_lately("message"), max(batch - len(ids), 0), CLAIM_PREFIX],
            )
            rows = cursor.fetchall()
            claimed = [str(row[0]) for row in rows]
            if not rows:
                return 0
            kept, vectors = _vectors(
                backend,
                {row[0]: embedding_text(row[1], row[2]) for row in rows},
                own=set(ids),
                table="message",
            )
            by_id = dict(zip(kept, vectors, strict=True))
            now = timezone.now()
            with transaction.atomic():
                if force:  # (a row held for good by a transaction left open: an error, said)
                    cursor.execute("SET LOCAL lock_timeout = '10s'")
                cursor.execute(
                    _ALL_TO_WRITE if force else _FREE_TO_WRITE, [[str(row_id) for row_id in kept]]
                )
                free = {row_id for (row_id,) in cursor.fetchall()}
                rows = [row for row in rows if row[0] in free]  # (in ``seq`` order)
                written = write_vectors(
                    cursor,
                    "message",
                    [row[0] for row in rows],
                    [by_id[row[0]] for row in rows],
                    model=backend.model,
                    at=now,
                    force=force,
                )
        finally:
            _release(cursor, claimed)
        summarized = {
            c for m, _, _, channel, c in rows if channel == Channel.SUMMARY and m in written
        }
    # Once the vectors are committed: a deletion locks conversations before messages (one
    # that moves a summary off a deleted turn updates it), so this waits for the
    # conversation holding none of its messages, rather than each waiting for the other.
    if summarized:
        Conversation.objects.filter(id__in=summarized).update(vectorized_at=now)
    return len(written)


def _release(cursor, claimed: list[str] | None) -> None:
    """Let go of the claims of these messages (``_CLAIM``); of every claim the session holds
    when which is not known (None: every session-level advisory lock it holds, which only
    these are; ``migrate``'s is its own process's). A session that cannot let go of them is
    ended, and they with it, unless it is in a transaction (a test's): else they stayed on a
    persistent connection, and no worker took those messages until it closed (code
    review)."""
    try:
        if claimed is None:
            cursor.execute("SELECT pg_advisory_unlock_all()")
        elif claimed:
            cursor.execute(_RELEASE, [CLAIM_PREFIX, claimed])
    except DatabaseError as exc:
        logger.info("the embedding claims end with their connection (%s)", exc)
        if not connection.in_atomic_block:
            connection.close()


def _vectors(backend: EmbeddingBackend, texts: dict, *, own: set[str], table: str) -> tuple:
    """The ids of ``texts`` (id -> text, claimed rows of ``table``) the backend embeds, and
    their vectors: all in one call, unless it refuses the batch for good (a text too long
    for its model, say). Then the rows asked for (``own``) alone, and else each alone: a row
    it refuses stays waiting (found by keywords, logged, ``refused_lately``) without keeping
    the others waiting, nor every later batch, which takes the oldest waiting rows along. A
    transient error is raised as it is; the refusal is raised when it refuses every row."""
    ids = list(texts)
    try:
        return ids, list(backend.embed(list(texts.values())))
    except EmbeddingError as exc:
        # (Credentials refused: every text alone would be refused alike.)
        if exc.of_every_text:
            raise
        refusal = exc
    asked = [row_id for row_id in ids if str(row_id) in own]
    if asked and len(asked) < len(ids):
        try:
            return asked, list(backend.embed([texts[row_id] for row_id in asked]))
        except EmbeddingError as exc:
            if exc.transient:
                raise
    kept, vectors = [], []
    for row_id in ids:
        try:
            # (A row alone was asked already.)
            alone = refusal if len(ids) == 1 else None
            vectors.append(_embedded_alone(backend, texts[row_id], alone, f"{table} {row_id}"))
        except EmbeddingError as exc:
            if exc.transient:
                raise
            logger.warning("%s %s left without a vector: %s", table, row_id, exc)
            _note_refused(table, row_id)
            continue
        kept.append(row_id)
    if not kept:
        raise refusal
    return kept, vectors


# A text a remote service refuses is asked again cut to its first half, and so on down to this
# many characters: a model's limit (OpenAI's 8,192 tokens, a self-hosted model's 512) left a
# long message without a vector for good (review), where the local model reads the first 256
# tokens of any text. Only a refusal of the input (its HTTP status) is tried shorter: a
# vector of NaN is no length's (code review).
MIN_CUT_CHARS = 500
INPUT_REFUSED = frozenset({400, 413, 422})


def _embedded_alone(
    backend: EmbeddingBackend, text: str, refusal: EmbeddingError | None, name: str
):
    """``text``'s vector (``refusal``: the backend's answer to it already). A remote
    backend's refusal of the input (``INPUT_REFUSED``) is asked again of its first half,
    down to ``MIN_CUT_CHARS``; the vector of the longest part it takes, or the first
    refusal."""
    first, asked = refusal, text
    while True:
        if refusal is None:
            try:
                vector = backend.embed([asked])[0]
            except EmbeddingError as exc:
                if exc.of_every_text:
                    raise
                refusal = exc
            else:
                if asked is not text:
                    logger.info(
                        "%s: embedded its first %d of %d characters (%s)",
                        name,
                        len(asked),
                        len(text),
                        first,
                    )
                return vector
        first = first or refusal
        if (
            len(asked) <= MIN_CUT_CHARS
            or not is_remote(backend)
            or refusal.status not in INPUT_REFUSED
        ):
            raise first
        asked, refusal = asked[: len(asked) // 2], None


def write_vectors(cursor, table: str, ids: list, vectors, *, model: str, at, force: bool) -> set:
    """Store the vectors of these rows of ``table`` (messages, memories) in one statement;
    the ids written. Without ``force`` only rows still waiting are written, so two workers
    racing for a row write it once. Caller holds a transaction.

    A vector can always be made again: if a crash loses this commit, the row is still
    waiting and the sweep embeds it. So the writer need not wait for the flush.
    """
    cursor.execute("SET LOCAL synchronous_commit = off")
    cursor.execute(
        _UPDATE_VECTORS.format(
            table=table, only_pending="" if force else "AND m.embedded_at IS NULL"
        ),
        [model, at, list(ids), [vector_literal(vector) for vector in vectors]],
    )
    return {row_id for (row_id,) in cursor.fetchall()}


def messages_embedded_now(message_ids: Sequence) -> None:
    """Embed these committed messages on the caller's path, as a memory is: the local API's
    stores (``learning()``'s, sent off its caller's path), whose next context request,
    a moment later, is to find them by meaning (a fact said in one session was missing
    from the next begun at once: the worker's turn came a second or two later; review).
    What fails here (the backend, the database) is left to the worker and the sweep,
    which the append has queued the messages for as every append does. The local model
    only, and once its graph is made: a remote backend's time (up to its 60 s timeout,
    hung) was every store's (review), as making the graph would be the first one's."""
    backend = configured_backend()
    if not (isinstance(backend, LocalBackend) and backend.prepared()):
        return
    try:
        embed_messages(message_ids, backend=backend)
    except (EmbeddingError, DatabaseError) as exc:
        logger.info("messages left to the worker to embed (%s)", exc)


# How long a save waits for its rows' vectors from a remote embedding service: one that hung
# kept each memory's or tool record's save for the client's whole 60 s, and a few of them
# every request thread of the web process, searches included (review).
REMOTE_SAVE_SECONDS = 10.0


def vectors_or_none(texts: list[str], *, what: str) -> tuple:
    """(model, vectors) for rows about to be written (memories, tool records), embedded in one
    call; (None, None) when the backend fails, or a remote one does not answer within
    ``REMOTE_SAVE_SECONDS``: the rows are stored anyway, found by keywords, and embedded
    later by their sweep."""
    backend = configured_backend()
    try:
        return backend.model, list(embedded_within(backend, texts, REMOTE_SAVE_SECONDS))
    except EmbeddingError as exc:
        logger.warning("%s saved without vectors (%s); the sweep will embed them", what, exc)
        return None, None


def embed_rows(model, ids: Sequence, *, text_field: str, backend=None, force: bool = False) -> int:
    """Give these rows of a corpus other than messages (memories, tool records) a vector of
    their ``text_field``; how many got one. Without ``force`` only rows still waiting, and
    the write is conditional (``write_vectors``), so racing sweeps write each once."""
    backend = backend or configured_backend()
    rows = model.objects.filter(pk__in=list(ids))
    if not force:
        rows = rows.filter(embedded_at__isnull=True)
    rows = dict(rows.values_list("pk", text_field))
    if not rows:
        return 0
    # (A text the backend refuses for good stays waiting without keeping the others waiting:
    # it failed the whole batch, and every later sweep, the oldest rows first, stopped on it.)
    kept, vectors = _vectors(backend, rows, own=set(), table=model._meta.db_table)
    rows = [(row_id, rows[row_id]) for row_id in kept]
    with transaction.atomic(), connection.cursor() as cursor:
        # The model ran without locks: a row whose text changed meanwhile (a PATCH) keeps
        # what that change gave it, not a vector of its old text. Locked, so none changes
        # between this read and the write.
        now_texts = dict(
            model.objects.select_for_update()
            .filter(pk__in=[row_id for row_id, _ in rows])
            .order_by("pk")
            .values_list("pk", text_field)
        )
        fresh = [
            (row_id, vector)
            for (row_id, text), vector in zip(rows, vectors, strict=True)
            if now_texts.get(row_id) == text
        ]
        if not fresh:
            return 0
        written = write_vectors(
            cursor,
            model._meta.db_table,
            [row_id for row_id, _ in fresh],
            [vector for _, vector in fresh],
            model=backend.model,
            at=timezone.now(),
            force=force,
        )
    return len(written)


def embed_pending_rows(
    model,
    *,
    text_field: str,
    backend=None,
    batch: int = EMBED_BATCH,
    max_batches=None,
    patient: bool = False,
) -> int:
    """Embed every row of ``model`` still waiting for a vector, oldest first (a sweep,
    ``memsvc reindex``), served by the table's partial index on ``created_at``."""

    waiting = model.objects.filter(embedded_at__isnull=True).order_by("created_at")
    if patient:  # (the rows there as it begins: see ``embed_pending``)
        waiting = waiting.filter(created_at__lte=timezone.now())

    def pending() -> list:
        left = waiting.exclude(pk__in=refused_lately(model._meta.db_table))
        return list(left.values_list("pk", flat=True)[:batch])

    def embed(ids) -> int:
        return embed_rows(model, ids, text_field=text_field, backend=backend)

    return _embed_waiting(pending, embed, max_batches=max_batches, patient=patient)


# ``patient``: how long a reindex waits for others that keep every waiting row to themselves.
PATIENCE_SECONDS = 60.0
PATIENCE_POLL_SECONDS = 0.2


def _embed_waiting(pending, embed, *, max_batches: int | None, patient: bool) -> int:
    """Batch after batch, ``embed`` (how many got a vector) what ``pending()`` finds
    waiting, until nothing waits; how many got one. A batch that gets none is another's (a
    worker, a second ``memsvc reindex``): a sweep leaves the rest to them and the next
    sweep; ``patient`` (the command) waits for them and carries on, so that it ends with
    nothing waiting (a second reindex said "embedded 0" and left rows waiting: review), at
    most ``PATIENCE_SECONDS`` without a row's progress (a process stuck holding them)."""
    total = batches = 0
    stalled = {"since": None, "waiting": None}
    refused = None
    while max_batches is None or batches < max_batches:
        ids = pending()
        if not ids:
            break
        try:
            done = embed(ids)
        except EmbeddingError as exc:
            # A batch of rows the backend refuses for good, each said and left out of the
            # next ones (``refused_lately``): the rest go on (a reindex stopped there, before
            # the memories and tool records: review). Else (the backend down, refusing
            # memsvc's key, or the same rows again) raised.
            if exc.of_every_text or ids == refused:
                raise
            refused = ids
            batches += 1
            continue
        total += done
        batches += 1
        if done:
            continue
        if not patient:
            break  # someone else is on these; the next sweep will see
        if ids != stalled["waiting"]:  # others got on: a new wait starts
            stalled.update(since=time.monotonic(), waiting=ids)
        elif time.monotonic() - stalled["since"] > PATIENCE_SECONDS:
            break
        time.sleep(PATIENCE_POLL_SECONDS)
    return total


def reembed_all_rows(model, *, text_field: str, backend=None, batch: int = EMBED_BATCH) -> int:
    """Re-embed every row of ``model`` with the configured model (after a model change),
    batch by batch in id order. Rows written meanwhile get that model's vector anyway."""
    backend = backend or configured_backend()
    return _reembedded_in_order(
        model.objects.all(),
        "pk",
        lambda ids: embed_rows(model, ids, text_field=text_field, backend=backend, force=True),
        batch=batch,
    )


def _reembedded_in_order(rows, key: str, embed, *, batch: int | None = None) -> int:
    """``embed(ids)`` (how many it embedded) for every row of ``rows``, batch by batch in
    ``key`` order; how many in all. (Written once for messages and for other rows: code
    review.)"""
    total, last = 0, None
    while True:
        page = rows.order_by(key)
        if last is not None:
            page = page.filter(**{f"{key}__gt": last})
        found = list(page.values_list(key, "pk")[: batch or EMBED_BATCH])
        if not found:
            return total
        last = found[-1][0]
        total += embed([row_id for _, row_id in found])


def pending_message_ids(
    *, older_than_seconds: float = 0, limit: int = EMBED_BATCH, through_seq: int | None = None
) -> list:
    """Messages waiting for a vector, oldest first (served by the partial index); with
    ``through_seq``, those written by then."""
    waiting = Message.objects.filter(embedded_at__isnull=True)
    if through_seq is not None:
        waiting = waiting.filter(seq__lte=through_seq)
    if older_than_seconds:
        # Leave the newest to the task queued for them. (Imported messages carry old
        # times and may be embedded by both: the conditional write keeps that harmless.)
        waiting = waiting.filter(
            created_at__lt=timezone.now() - timedelta(seconds=older_than_seconds)
        )
    waiting = waiting.exclude(id__in=refused_lately("message"))
    return list(waiting.order_by("seq").values_list("id", flat=True)[:limit])


def embed_pending(
    *,
    older_than_seconds: float = 0,
    backend=None,
    max_batches: int | None = None,
    patient: bool = False,
) -> int:
    """Embed what is waiting, batch by batch (the sweep, ``memsvc reindex``). ``patient``
    (the command): what waits as it begins; written later, a worker's (under appends that
    never stopped, each batch found new rows, and it waited for a held one for good:
    review)."""
    through_seq = None
    if patient:
        with connection.cursor() as cursor:  # (the last ``seq`` given: ``Message.seq``)
            cursor.execute("SELECT last_value FROM message_seq")
            through_seq = cursor.fetchone()[0]
    return _embed_waiting(
        lambda: pending_message_ids(older_than_seconds=older_than_seconds, through_seq=through_seq),
        lambda ids: embed_messages(ids, backend=backend),
        max_batches=max_batches,
        patient=patient,
    )


RESIZE_LOCK_SECONDS = 5


def vector_columns_resized(width: int) -> list[str]:
    """Make every table's ``embedding`` column ``width`` wide (a model of another width:
    ``memsvc reindex --all --resize``); the tables changed. Their rows' vectors, of the old
    model, cannot be kept: each row waits for the new model's (found by keywords meanwhile),
    and the HNSW index is made again by the change. One transaction: all or none. It locks
    each table whole while it runs: the service is stopped (it refuses to start until the
    columns fit the model)."""
    from search.checks import VECTOR_TABLES, column_dimensions

    changed = [table for table, found in column_dimensions().items() if found != width]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # (ALTER TABLE waits for none)
        # A running service holds the tables: refused (``OperationalError``) rather than
        # every request queued behind the change (code review).
        cursor.execute(f"SET LOCAL lock_timeout = '{RESIZE_LOCK_SECONDS}s'")
        for table in VECTOR_TABLES:
            if table in changed:
                # (A change of type sets the type's storage again: the vectors kept in the
                # row, as the migrations made them: ``conversations`` 0004.)
                cursor.execute(
                    f"ALTER TABLE {table} ALTER COLUMN embedding TYPE vector(%s) USING NULL, "
                    "ALTER COLUMN embedding SET STORAGE MAIN",
                    [width],
                )
                cursor.execute(
                    f"UPDATE {table} SET embedding_model = '', embedded_at = NULL"  # noqa: S608 (ours)
                )
    return changed


def reembed_all(*, backend=None) -> int:
    """Re-embed every message with the configured model (after a model change)."""
    backend = backend or configured_backend()
    return _reembedded_in_order(
        Message.objects.all(),
        "seq",
        lambda ids: embed_messages(ids, backend=backend, force=True),
    )
