"""Writes of tool records (the memory bank): saved with a summary and its vector at once,
summarised again by the observer's LLM when there is one, deleted by task, embedded later
when the embedding backend was down."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from agents_api import observer
from agents_api.models import Agent, Memory, SummarySource, ToolRecord
from agents_api.selectors import memory_off_for, tool_records_about
from agents_api.services.memories import memory_off_refusal
from conversations.models import Conversation, Message
from conversations.selectors import group_owners
from memsvc.api.errors import Conflict, InvalidInput
from memsvc.api.idempotency import write_once
from memsvc.api.principals import Principal, agent_uuid_of
from memsvc.db import held_keys, hold_users
from memsvc.text import shows_nothing
from search.services import (
    embed_pending_rows,
    embed_rows,
    reembed_all_rows,
    vectors_or_none,
    write_vectors,
)


@dataclass
class NewToolRecord:
    tool_name: str
    raw_input: dict = field(default_factory=dict)
    raw_output: object = None
    summary: str = ""  # "": the observer writes it
    task_id: str = ""
    step: int | None = None
    conversation: Conversation | None = None


def _vectors(texts: list[str]):
    return vectors_or_none(texts, what="tool records")


def tool_records_create(
    actor: Principal,
    *,
    agent: Agent,
    records: Sequence[NewToolRecord],
    idempotency_key: str | None = None,
    request_hash: str = "",
) -> tuple[list[ToolRecord], bool]:
    """Store tool interactions of ``agent``, made for the user ``actor`` acts for (if it
    does: 409 when that user turned memory off), all or nothing, each searchable at once:
    with the caller's summary or the observer's deterministic one, embedded before the
    transaction opens (the model's time holds no locks). With a key, a retry gets the first
    request's records back and stores nothing (``write_once``; 409 when some of them were
    deleted since). Returns (records, created). The caller hands new ones to the observer
    once committed (``tasks.enqueue_tool_record_observation``), as a write's other
    after-commit work is handed on by its view."""
    # A summary of nothing to read (spaces, a zero-width space) is none: the observer's
    # (it was kept, and the record had no words to be found by: review).
    given = ["" if shows_nothing(new.summary) else new.summary for new in records]
    summaries = [
        summary or observer.fallback_summary(new.tool_name, new.raw_input, new.raw_output)
        for summary, new in zip(given, records, strict=True)
    ]
    model, vectors = _vectors(summaries)
    rows = [
        ToolRecord(
            agent=agent,
            user_id=actor.on_behalf_of or "",
            conversation=new.conversation,
            task_id=new.task_id,
            step=new.step,
            tool_name=new.tool_name,
            raw_input=new.raw_input,
            raw_output=new.raw_output,
            summary=summaries[index],
            summary_source=SummarySource.CALLER if given[index] else SummarySource.FALLBACK,
        )
        for index, new in enumerate(records)
    ]
    with transaction.atomic():
        # The user it acts for and the owners of the conversations named (the record is kept
        # about them too): their erase takes turns with it (an erase that waited for it then
        # left it labelled with the erased user; review).
        owners = _owners(records)
        hold_users([actor.on_behalf_of or "", *owners])
        # Made now, once the user's erase (which holds them) is over: a record that waited
        # for it was dated before it, and an import of the agent's document left it out as
        # kept before the erase (review).
        now = timezone.now()
        for index, row in enumerate(rows):
            # A microsecond apart, in the order given: listed in the order they were made
            # (``selectors.TOOL_RECORD_ORDER``), not by their random ids (outside review).
            row.created_at = now + timedelta(microseconds=index)
            if vectors is not None:
                row.embedding, row.embedding_model, row.embedded_at = vectors[index], model, now
        stored, created = write_once(
            actor,
            idempotency_key,
            request_hash,
            lambda: _store(actor, records, rows, owners),
            ToolRecord.objects.defer(*ToolRecord.SEARCH_DATA),
            kind="tool record",
        )
    return stored, created


def _store(
    actor: Principal, records: Sequence[NewToolRecord], rows: list[ToolRecord], owners: list
) -> list[ToolRecord]:
    # An agent keeps nothing new about a user who turned memory off (409, as for memories
    # and blocks), nor about the owner of a conversation it names, whoever it acts for (such
    # a record is kept about that owner: ``selectors.tool_records_about``; review): their
    # settings locked in one statement, in one order (one by one, two creates naming each
    # other's users' conversations deadlocked). A retry of a request stored before gets it
    # back all the same.
    off = memory_off_for([actor.on_behalf_of or "", *owners], lock=True)
    if actor.on_behalf_of in off:  # (the user it acts for: named)
        raise memory_off_refusal(actor.on_behalf_of)
    if off:  # (an owner, whom an agent acting for someone else is not told of)
        raise Conflict("the owner of a conversation named has turned memory off")
    _hold_conversations(records)
    return ToolRecord.objects.bulk_create(rows)


def _owners(records: Sequence[NewToolRecord]) -> list[str]:
    """The users who own the conversations the records name, in order."""
    wanted = {new.conversation.pk for new in records if new.conversation is not None}
    if not wanted:
        return []
    owners = group_owners(Conversation.objects.filter(pk__in=wanted).values("group_id"))
    return sorted(owner for owner in set(owners.values()) if not agent_uuid_of(owner))


def _hold_conversations(records: Sequence[NewToolRecord]) -> None:
    """Hold the conversations the records name until they commit (``held_keys``): one
    deleted meanwhile is refused, 400 as the view refuses an unknown one; a deletion that
    comes later waits, and then unlinks the records from it (they outlive it)."""
    wanted = {new.conversation.pk for new in records if new.conversation is not None}
    if wanted and held_keys(Conversation, wanted) != wanted:
        raise InvalidInput.for_field("conversationId", "no such conversation")


@transaction.atomic
def tool_records_delete(actor: Principal, *, records) -> int:
    """Delete every record of a queryset the caller chose (``selectors.tool_records_of``).
    Acting for a user, only those of them kept about that user (``tool_records_about``:
    made for them, or of a conversation they own, as their erase takes them): what they
    read of others' in a conversation they share, as a reader too, is not theirs to delete
    (review)."""
    if actor.on_behalf_of:
        records = records.filter(tool_records_about(actor.on_behalf_of))
    deleted, _ = records.delete()
    return deleted


def tool_record_observe(record_id) -> bool:
    """Replace a record's deterministic summary by the observer LLM's, with its vector;
    whether it was replaced. ``LLMError`` when the model fails (the record keeps what it
    had). Returns quietly when the record is gone or already summarised otherwise."""
    record = (
        ToolRecord.objects.filter(id=record_id, summary_source=SummarySource.FALLBACK)
        .only("tool_name", "raw_input", "raw_output", "summary")
        .first()
    )
    if record is None:
        return False
    summary = observer.observe(record.tool_name, record.raw_input, record.raw_output)
    model, vectors = _vectors([summary])
    with transaction.atomic():
        # Conditional: a record deleted or summarised meanwhile is left as it is.
        changed = ToolRecord.objects.filter(
            id=record.id, summary_source=SummarySource.FALLBACK, summary=record.summary
        ).update(
            summary=summary,
            summary_source=SummarySource.LLM,
            # Without a new vector the old one would describe the old summary: the sweep
            # embeds the new one when the backend is back.
            embedding=None,
            embedding_model="",
            embedded_at=None,
        )
        if changed and vectors is not None:
            with connection.cursor() as cursor:
                write_vectors(
                    cursor,
                    ToolRecord._meta.db_table,
                    [record.id],
                    vectors,
                    model=model,
                    at=timezone.now(),
                    force=False,
                )
    return bool(changed)


def tool_records_embed(record_ids: Sequence, *, backend=None, force: bool = False) -> int:
    return embed_rows(ToolRecord, record_ids, text_field="summary", backend=backend, force=force)


def tool_records_embed_pending(
    *, backend=None, max_batches: int | None = None, patient: bool = False
) -> int:
    """Embed every record still waiting for a vector, oldest first (the sweep, reindex)."""
    return embed_pending_rows(
        ToolRecord, text_field="summary", backend=backend, max_batches=max_batches, patient=patient
    )


def still_waiting(written_by) -> dict[str, int]:
    """How many rows written by ``written_by`` still wait for a vector, by corpus (messages,
    memories, tool records): what ``memsvc reindex`` names once it is done."""
    corpora = (("messages", Message), ("memories", Memory), ("tool records", ToolRecord))
    return {
        name: model.objects.filter(embedded_at__isnull=True, created_at__lte=written_by).count()
        for name, model in corpora
    }


def tool_records_reembed_all(*, backend=None) -> int:
    return reembed_all_rows(ToolRecord, text_field="summary", backend=backend)
