"""Writes: each section of a document put back (``importing`` puts a whole one back).

Rows come back with their ids, so an export, an erase and an import give the same export
again. Conversations a user owned come back whole (their messages take new places in the
order of all messages, in the order they had); what they had in conversations of others
comes back only where those still exist, their messages in their old places. An agent's
memory comes back into that agent (made again, with its id, when it is gone). Vectors are
made anew once the import commits: messages are queued for embedding, the sweeps of
memories and tool records are run.
"""

import json

from django.db import connection, transaction
from django.utils import timezone

from agents_api.models import (
    Agent,
    Memory,
    MemoryBlock,
    MemoryBlockRevision,
    ToolRecord,
    UserMemorySetting,
    content_hash,
)
from agents_api.selectors import erased_conversations, erasures_of, memory_off_for
from agents_api.services.blocks import revisions_trim
from agents_api.services.memories import expired_copies_forget
from agents_api.tasks import sweep_unembedded_memories_task, sweep_unembedded_tool_records_task
from conversations.models import (
    AccessLevel,
    Channel,
    Conversation,
    ConversationGroup,
    Membership,
    Message,
    OwnershipTransfer,
    Role,
    TransferStatus,
)
from conversations.selectors import WRITING_LEVELS, conversations_owned_by, said_by
from memsvc.api.errors import flattened_details
from memsvc.celery import sent
from memsvc.db import held_keys
from search.services import EMBED_BATCH
from search.tasks import enqueue_embedding


class ImportRefused(Exception):
    """The document cannot be imported (nothing was). ``details``: the problems by the
    place of the field in the document (``memories[5].importance``), when a record's field
    is what is wrong (the API's 400 names them as a batch's does)."""

    def __init__(self, message: str, details: dict[str, list] | None = None):
        super().__init__(message)
        self.details = details


class ImportCollides(ImportRefused):
    """The document's rows collide with rows stored (a block's label, a memory's content,
    an id): nothing was imported."""


def parse_records(record_class, records, section: str) -> list[dict]:
    """The records of a section, validated, keyed by model field. One serializer for the
    whole list: one per record would copy its fields for each (8 of 13 s for 10,000)."""
    if not isinstance(records, list):
        raise ImportRefused(f"{section}: must be a list")
    serializer = record_class(data=records, many=True)
    if not serializer.is_valid():
        # A list with an error per record, or (a record that is null, say) a dict of them.
        errors = serializer.errors
        index, problems = next(
            (i, e)
            for i, e in (errors.items() if isinstance(errors, dict) else enumerate(errors))
            if e
        )
        raise ImportRefused(
            f"{section}[{index}]: {json.dumps(problems, ensure_ascii=False)}",
            flattened_details({section: {index: problems}}),
        )
    return [dict(record) for record in serializer.validated_data]


def _belongs_to(user_id: str, records: list[dict], key: str, section: str) -> None:
    strangers = {record[key] for record in records} - {user_id}
    if strangers:
        whose = sorted(strangers)[0]
        whose = repr(whose) if whose else "an agent's own"
        raise ImportRefused(f"{section}: records of {whose}, not of {user_id!r}")


def _embed_on_commit(message_ids: list) -> None:
    for start in range(0, len(message_ids), EMBED_BATCH):
        batch = message_ids[start : start + EMBED_BATCH]
        transaction.on_commit(lambda batch=batch: enqueue_embedding(batch))


# --- a user's conversations ------------------------------------------------------------------


def not_after_now(records: list[dict], *names: str) -> None:
    """No time of ``names`` later than now in ``records`` (a clock ahead where it was
    exported, an edited document): a conversation active, or a membership made, "in 2100"
    would lead every walk of the list into another catch-up pass until then
    (``conversations.selectors.activity_page``); a message or a memory "of 2100" would be
    the newest of every list until then."""
    now = timezone.now()
    for record in records:
        for name in names:
            if record.get(name) is not None:
                record[name] = min(record[name], now)


def restore_conversations(user_id: str, records: list[dict]) -> int:
    """The user's conversations, their groups made again with them (parents, forks)."""
    for record in records:
        record.setdefault("seen_at", record["updated_at"])
    not_after_now(records, "created_at", "updated_at", "seen_at")
    groups = {}
    for record in records:
        group_id = record["group_id"]
        groups[group_id] = min(groups.get(group_id, record["created_at"]), record["created_at"])
    ConversationGroup.objects.bulk_create(
        ConversationGroup(id=group_id, created_at=created_at)
        for group_id, created_at in groups.items()
    )
    return len(Conversation.objects.bulk_create(Conversation(**record) for record in records))


def restore_memberships(user_id: str, records: list[dict]) -> int:
    """The members of the user's conversations, agents too while they are not here: an
    agent's own document, imported next, holds no memberships, and a server restored from
    its users' and agents' documents (users first) lost every agent's place in the
    conversations made for it (review; an agent's membership used to be skipped while the
    agent was not here, as the API refuses to share with one that does not exist). It
    reaches nothing until its agent is imported, with its id."""
    not_after_now(records, "created_at")
    return len(Membership.objects.bulk_create(Membership(**record) for record in records))


def _keep_numbers(table: str, column: str, records: list[dict], key: str) -> None:
    """Rows numbered by a sequence (a message's place ``seq``, a block's id, which Letta's
    routes show) keep their old numbers when none is taken, as on the server they came
    from (``sequences_past_stored_numbers`` then moves the sequence past them). Otherwise
    (another server's rows hold them) ``key`` is dropped: they get new numbers, in the
    order they had."""
    numbers = [record[key] for record in records if key in record]
    if not numbers:  # (none, or an agent's own import: numbered by the sequence)
        return
    with connection.cursor() as cursor:
        taken = f"SELECT EXISTS (SELECT 1 FROM {table} WHERE {column} = ANY(%s))"  # noqa: S608 (our names)
        cursor.execute(taken, [numbers])
        if cursor.fetchone()[0]:
            for record in records:
                del record[key]


# The sequences of the numbers ``_keep_numbers`` keeps: table, column, sequence.
NUMBERED = [
    ("message", "seq", "'message_seq'"),
    ("memory_block", "id", "pg_get_serial_sequence('memory_block', 'id')"),
]


def sequences_past_stored_numbers() -> None:
    """Each sequence of ``NUMBERED`` moved past the largest number stored, so that no new
    row is given one an import kept. The last step of an import, every row in: a
    sequence's change outlives a rollback, and a refused import changes nothing. (Until
    then a new row may draw a number the import kept: of the two, the later to commit
    fails on the number, which is unique.)"""
    with connection.cursor() as cursor:
        for table, column, sequence in NUMBERED:
            cursor.execute(
                f"""
                SELECT setval(s, n)
                FROM (SELECT {sequence}::regclass AS s, (SELECT max({column}) FROM {table}) AS n) AS q
                WHERE n > coalesce(pg_sequence_last_value(s), 0)
                """  # noqa: S608 (our own names)
            )


def _store_messages(records: list[dict]) -> int:
    """Messages in their old places in the order of all messages (``_keep_numbers``): fork
    points and replies name messages by id, so they hold either way. A reply whose parent
    is neither in the document nor stored any more (someone else's erase took it) comes back
    without it, as the stored reply had lost it (it refused the whole import: review)."""
    _keep_numbers("message", "seq", records, "seq")
    not_after_now(records, "created_at")
    outside = {r["parent_message_id"] for r in records if r["parent_message_id"]} - {
        r["id"] for r in records
    }
    gone = outside - held_keys(Message, outside) if outside else set()
    for record in records:
        if record["parent_message_id"] in gone:
            record["parent_message_id"] = None
    undecided = [record["id"] for record in records if "written_for" not in record]
    for record in records:
        # Only what an agent's user turn may be: the user it is signed with, or nobody's.
        said = said_by(
            role=record["role"],
            author_principal=record["author_principal"],
            author_name=record["author_name"],
        )
        if record.get("written_for") and (
            record["written_for"] != said or said == record["author_principal"]
        ):
            record["written_for"] = ""
    created = Message.objects.bulk_create(
        (Message(**record) for record in records), batch_size=EMBED_BATCH
    )
    _mark_written_for(undecided)
    _embed_on_commit([message.id for message in created])
    return len(created)


# A document of an earlier version does not say whose an agent's user turns are: decided by
# the members, as the write would have.
_WRITTEN_FOR_SQL = """
UPDATE message m SET written_for = m.author_name
FROM conversation c, membership ms
WHERE m.id = ANY(%s) AND c.id = m.conversation_id AND ms.group_id = c.group_id
  AND ms.principal_id = m.author_name AND ms.principal_id NOT LIKE 'agent:%%'
  AND ms.access_level = ANY(%s) AND m.role = 'user' AND m.author_principal LIKE 'agent:%%'
"""


def _mark_written_for(message_ids: list) -> None:
    """Each restored user turn an agent wrote is its user's (``Message.written_for``) when
    it is signed with the id of a member who may write: the rule of
    ``conversations.services._signatures`` for an agent on its own
    (the memberships come back first)."""
    with connection.cursor() as cursor:
        cursor.execute(_WRITTEN_FOR_SQL, [message_ids, WRITING_LEVELS])


def restore_messages(user_id: str, records: list[dict]) -> int:
    """The messages of the user's conversations (``_store_messages``)."""
    return _store_messages(records)


def restore_transfers(user_id: str, records: list[dict]) -> int:
    """Transfers of the user's own conversations. An offer still pending is the owner's,
    who is the user (``_within_its_own``): one from anyone else was imported, and stood
    where its recipient could not take it nor the user make another (review)."""
    forged = [
        r
        for r in records
        if r["status"] == TransferStatus.PENDING and r["from_principal"] != user_id
    ]
    if forged:
        raise ImportRefused(
            f"ownershipTransfers: {forged[0]['id']} is a pending offer not made by "
            f"{user_id}, who owns its conversation"
        )
    not_after_now(records, "created_at", "resolved_at")
    return len(OwnershipTransfer.objects.bulk_create(OwnershipTransfer(**r) for r in records))


# --- what the user had in others' conversations ----------------------------------------------


def restore_memberships_elsewhere(user_id: str, records: list[dict]) -> int:
    """Memberships of groups that still exist, where the user is not a member again."""
    _belongs_to(user_id, records, "principal_id", "membershipsElsewhere")
    existing = set(
        ConversationGroup.objects.filter(id__in=[r["group_id"] for r in records]).values_list(
            "id", flat=True
        )
    )
    member = set(Membership.objects.filter(principal_id=user_id).values_list("group_id", flat=True))
    kept = [r for r in records if r["group_id"] in existing and r["group_id"] not in member]
    not_after_now(kept, "created_at")
    return len(Membership.objects.bulk_create(Membership(**record) for record in kept))


def restore_messages_elsewhere(user_id: str, records: list[dict]) -> int:
    """The user's messages (``said_by``: anyone else's refuses the document) in
    conversations that still exist and where the user is a member (again:
    ``membershipsElsewhere`` comes back first), in their old places between the others'
    messages (``_store_messages``).
    Those of a conversation the user is no member of are skipped: a member removed leaves
    their messages, but no document brings anyone's words into a conversation they are
    not in."""
    strangers = [
        r
        for r in records
        if said_by(
            role=r["role"], author_principal=r["author_principal"], author_name=r["author_name"]
        )
        != user_id
    ]
    if strangers:
        raise ImportRefused(f"messagesElsewhere: {strangers[0]['id']} is not {user_id}'s")
    # Elsewhere the user has only turns (by themselves or an agent for them): a summary, or
    # an agent's line, "by" them opened the owner's agent's context (review).
    others = [r for r in records if r["role"] != Role.USER or r["channel"] == Channel.SUMMARY]
    if others:
        raise ImportRefused(
            f"messagesElsewhere: {others[0]['id']} is not {user_id}'s turn (a user turn, "
            "not a summary)"
        )
    member = Conversation.objects.filter(
        id__in=[r["conversation_id"] for r in records], group__memberships__principal_id=user_id
    )
    kept = set(member.values_list("id", flat=True))
    return _store_messages(
        _not_stored_yet(Message, [r for r in records if r["conversation_id"] in kept])
    )


def _not_stored_yet(model, records: list[dict]) -> list[dict]:
    """The records of what the user had in others' conversations that are not stored there
    already: the owner's document, imported before, brought back every member's turns and
    offers (two users who wrote in each other's conversations could not both be restored,
    in either order: review). Stored already means the same id in the same conversation."""
    stored = set(
        model.objects.filter(id__in=[r["id"] for r in records]).values_list("id", "conversation_id")
    )
    return [r for r in records if (r["id"], r["conversation_id"]) not in stored]


def restore_transfers_elsewhere(user_id: str, records: list[dict]) -> int:
    """Transfers the user made or was offered, of conversations that still exist. An offer
    still pending in the document only while it would stand now: its sender still owns the
    conversation and no other offer is pending (one cancelled since, revived, let its
    recipient take the conversation from the owner of today; one beside a new offer refused
    the whole import: review)."""
    strangers = [r for r in records if user_id not in (r["from_principal"], r["to_principal"])]
    if strangers:
        raise ImportRefused(f"ownershipTransfersElsewhere: {strangers[0]['id']} is not {user_id}'s")
    existing = set(
        Conversation.objects.filter(id__in=[r["conversation_id"] for r in records]).values_list(
            "id", flat=True
        )
    )
    pending = [r for r in records if r["status"] == TransferStatus.PENDING]
    owners = set(
        Membership.objects.filter(
            group_id__in=[r["group_id"] for r in pending], access_level=AccessLevel.OWNER
        ).values_list("group_id", "principal_id")
    )
    offered = set(
        OwnershipTransfer.objects.filter(
            group_id__in=[r["group_id"] for r in pending], status=TransferStatus.PENDING
        ).values_list("group_id", flat=True)
    )
    kept = [
        r
        for r in _not_stored_yet(OwnershipTransfer, records)
        if r["conversation_id"] in existing
        and (
            r["status"] != TransferStatus.PENDING
            or ((r["group_id"], r["from_principal"]) in owners and r["group_id"] not in offered)
        )
    ]
    not_after_now(kept, "created_at", "resolved_at")
    return len(OwnershipTransfer.objects.bulk_create(OwnershipTransfer(**r) for r in kept))


# --- agents' memory --------------------------------------------------------------------------


def _agents_for(subject, records: list[dict], section: str, *, about=None) -> list[dict]:
    """The records whose agent is here: in an agent's document, that agent's (every record
    is put in it); in a user's, those about the user of agents that exist (others skipped).
    A record is about the user when its ``user_id`` is theirs, or ``about(record)`` says
    so; any other refuses the document. An agent's document keeps none made about a user who
    turned memory off (skipped: an agent keeps nothing new about them, whoever brings it;
    their settings locked until the import commits, as ``services.memories_save`` locks
    them), nor any made about a user before they were erased (``UserErasure``: the erase
    took it; the import holds the user, ``hold_users``, so no erase is in flight), unless
    they have brought their data back themselves since. A user's own document comes back
    whole: what was kept about them, kept while their memory was off too, then their switch
    as it was (its last section)."""
    if not isinstance(subject, Agent):
        _belongs_to(subject, [r for r in records if not (about and about(r))], "user_id", section)
        existing = set(
            Agent.objects.filter(id__in=[r["agent_id"] for r in records]).values_list(
                "id", flat=True
            )
        )
        return [record for record in records if record["agent_id"] in existing]
    for record in records:
        record["agent_id"] = subject.id
    off = memory_off_for((record["user_id"] for record in records), lock=True)
    erased = erasures_of((record["user_id"] for record in records), restored=False)
    return [
        record
        for record in records
        if record["user_id"] not in off
        and (record["user_id"] not in erased or record["created_at"] >= erased[record["user_id"]])
    ]


def _swept_on_commit(sweep) -> None:
    """Restored rows get their vectors as soon as the import commits (``sweep``, the task
    that embeds what waits), not at the sweep's next run, up to a minute later; a broker
    that is down leaves them to that run."""
    transaction.on_commit(
        lambda: sent(sweep, instead="the next sweep will embed them"), robust=True
    )


def restore_memories(subject, records: list[dict]) -> int:
    """Memories; an expired one with the same words is gone (``expired_copies_forget``),
    one kept still is a collision. They cite only messages that exist (restored before,
    or kept): an erase since the document was made took the others, and took them from
    every memory (``memory_citations_forget``)."""
    kept = _agents_for(subject, records, "memories")
    not_after_now(kept, "created_at", "updated_at", "last_accessed_at")
    cited = {message_id for record in kept for message_id in record["message_ids"]}
    existing = set(Message.objects.filter(id__in=cited).values_list("id", flat=True))
    for record in kept:
        record["message_ids"] = [i for i in record["message_ids"] if i in existing]
    if kept:
        _swept_on_commit(sweep_unembedded_memories_task)
    memories = [Memory(**record, content_hash=content_hash(record["content"])) for record in kept]
    expired_copies_forget(memories)
    return len(Memory.objects.bulk_create(memories))


def restore_memory_blocks(subject, records: list[dict]) -> int:
    """Blocks with every revision they had, under their old ids (and local API ids) when
    free (``_keep_numbers``)."""
    kept = _agents_for(subject, records, "memoryBlocks")
    _keep_numbers("memory_block", "id", kept, "id")
    # Their local API ids too, when free (a copy into another agent gets new ones).
    wanted = [record["public_id"] for record in kept if record.get("public_id")]
    taken = set(
        MemoryBlock.objects.filter(public_id__in=wanted).values_list("public_id", flat=True)
    )
    for record in kept:
        if record.get("public_id") in taken:
            del record["public_id"]
        elif record.get("public_id"):
            taken.add(record["public_id"])
    revisions = [record.pop("exported_revisions") for record in kept]
    # (Revisions "of 2099" were the newest for good: every real change was trimmed at once
    # as one past the kept number; review.)
    not_after_now(kept, "created_at", "updated_at")
    for block_revisions in revisions:
        not_after_now(block_revisions, "created_at")
    blocks = MemoryBlock.objects.bulk_create(MemoryBlock(**record) for record in kept)
    MemoryBlockRevision.objects.bulk_create(
        MemoryBlockRevision(block=block, **revision)
        for block, block_revisions in zip(blocks, revisions, strict=True)
        for revision in block_revisions
    )
    revisions_trim([block.id for block in blocks])
    return len(blocks)


def restore_memory_setting(user_id: str, records: list[dict]) -> int:
    """The user's memory switch as the document had it (the last section of a user's
    document: what agents kept about them is back before memory may be off again)."""
    not_after_now(records, "updated_at")
    for record in records[-1:]:
        UserMemorySetting.objects.update_or_create(user_id=user_id, defaults=record)
    return len(records[-1:])


def restore_tool_records(subject, records: list[dict]) -> int:
    """Tool records (an agent's, or those about a user of agents that exist: made for them,
    or of their conversations, restored before, as ``tool_records_kept_about`` exports
    them); one whose conversation is gone keeps its facts without it, as when it is
    deleted, but for one whose conversation went with its owner's erase (``UserErasure``):
    that erase took it, whoever it was made for, and it stays erased."""
    theirs = set()
    existing_of = Conversation.objects.all()
    if not isinstance(subject, Agent):
        wanted = [r["conversation_id"] for r in records if r["conversation_id"]]
        owned = conversations_owned_by(subject).filter(id__in=wanted).order_by()
        theirs = set(owned.values_list("id", flat=True))
        # A user's document links its records to conversations the user is in only: one of
        # another's was linked, and listed among that conversation's records (review).
        existing_of = existing_of.filter(group__memberships__principal_id=subject)
    kept = _agents_for(
        subject, records, "toolRecords", about=lambda r: r["conversation_id"] in theirs
    )
    not_after_now(kept, "created_at")
    existing = set(
        existing_of.filter(
            id__in=[r["conversation_id"] for r in kept if r["conversation_id"]]
        ).values_list("id", flat=True)
    )
    gone = {r["conversation_id"] for r in kept if r["conversation_id"]} - existing
    erased = erased_conversations(gone)
    rows = []
    for record in kept:
        if record["conversation_id"] in erased:
            continue
        if record["conversation_id"] not in existing:
            record["conversation_id"] = None
        rows.append(ToolRecord(**record))
    if rows:
        _swept_on_commit(sweep_unembedded_tool_records_task)
    return len(ToolRecord.objects.bulk_create(rows))
