"""Every write to conversations, memberships, transfers and messages.

One function per operation, the acting principal first. Callers have already checked that
the actor may reach the conversation at the needed level (``selectors.access_conversation``);
the policies that depend on *what* is written (never grant ``owner``, never remove the
owner) are enforced here. Each top-level operation is one transaction. What a concurrent
request may have changed since the view's check (the actor removed, the conversation
deleted) is read again under the lock the write takes: a 404 or 403, never a write made
after the change has answered.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from conversations import selectors
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
    Visibility,
)
from conversations.selectors import conversation_owner_id, history_message_before
from memsvc.api.errors import Conflict, Forbidden, InvalidInput, NotFound, Unavailable
from memsvc.api.principals import Principal, agent_uuid_of, hold_agents
from memsvc.db import held_keys, hold_users, locked_row
from search.tasks import enqueue_embedding

# --- conversations ---------------------------------------------------------------------------


@transaction.atomic
def conversation_create(
    actor: Principal,
    *,
    title: str = "",
    metadata: dict | None = None,
    writer_ids: Sequence[str] = (),
) -> Conversation:
    """A new conversation in a new group, owned by ``actor.owner_id``.

    ``writer_ids`` become writers (an agent the conversation is for, or the agent acting
    for its user). Its users held first (``hold_users``): their erase in flight ends before,
    or finds it.
    """
    hold_users([actor.owner_id, *writer_ids])
    hold_agents([actor.owner_id, *writer_ids])
    group = ConversationGroup.objects.create()
    Membership.objects.create(group=group, principal_id=actor.owner_id, access_level="owner")
    for principal_id in dict.fromkeys(writer_ids):
        if principal_id != actor.owner_id:
            Membership.objects.create(
                group=group, principal_id=principal_id, access_level=AccessLevel.WRITER
            )
    return Conversation.objects.create(group=group, title=title, metadata=metadata or {})


@transaction.atomic
def conversation_update(
    actor: Principal,
    *,
    conversation: Conversation,
    title: str | None = None,
    metadata: dict | None = None,
    as_member: bool = True,
) -> Conversation:
    """A new title or metadata, a change its members see (``updated_at``, ``seen_at``).
    ``as_member`` False: an operator (the admin), who changes any conversation."""
    conversation = locked_row(Conversation.objects, conversation.pk, missing="not found")
    if as_member:
        _hold_memberships(actor, conversation)  # a writer removed or demoted meanwhile
    if title is None and metadata is None:
        # Nothing to change: ``updated_at`` and ``seen_at`` order the members' lists, and stay.
        return conversation
    fields = ["updated_at", "seen_at"]
    if title is not None:
        conversation.title = title
        fields.append("title")
    if metadata is not None:
        conversation.metadata = metadata
        fields.append("metadata")
    conversation.updated_at = conversation.seen_at = timezone.now()
    conversation.save(update_fields=fields)
    return conversation


@transaction.atomic
def conversation_delete(
    actor: Principal, *, conversation: Conversation, need: AccessLevel | None = AccessLevel.OWNER
) -> None:
    """Delete the conversation and every fork below it that shares its messages; the others
    stay (``_branches_kept``). The root takes its group along.

    ``need``: the level the actor must still have once the group is locked (the view checked
    it before, and an ownership transfer may have been accepted since: the old owner, a
    manager now, deletes nothing of the new owner's); None for an operator (the admin), who
    acts on any conversation."""
    _lock_groups_to_delete([conversation.group_id])
    if need is not None:
        selectors.access_group(actor, conversation.group_id, need=need)
    if conversation.forked_at_conversation_id is None:
        conversation_groups_delete(actor, group_ids=[conversation.group_id])
    else:
        _lock_conversations(
            Conversation.objects.filter(pk__in=selectors.conversation_subtree(conversation))
        )
        subtree = _branches_kept(conversation)
        _messages_delete(Message.objects.filter(conversation_id__in=subtree))
        # Transfers are of the group, which stays: those made from the subtree name its parent.
        OwnershipTransfer.objects.filter(conversation_id__in=subtree).update(
            conversation_id=conversation.forked_at_conversation_id
        )
        Conversation.objects.filter(pk=conversation.pk).delete()


def _branches_kept(conversation: Conversation) -> list:
    """The ids of the conversations that go with ``conversation`` (``selectors.deletion``);
    the forks below it that stay are moved first where it says."""
    going, moved = selectors.deletion(conversation)
    for fork_id, parent in moved.items():
        Conversation.objects.filter(pk=fork_id).update(forked_at_conversation=parent)
    return going


@transaction.atomic
def conversation_groups_delete(actor: Principal, *, group_ids) -> list:
    """Delete conversation groups: every conversation, message, membership and transfer in
    them. The ids of the messages deleted."""
    _lock_groups_to_delete(group_ids)
    _lock_conversations(Conversation.objects.filter(group_id__in=group_ids))
    messages = _messages_delete(Message.objects.filter(conversation__group_id__in=group_ids))
    ConversationGroup.objects.filter(pk__in=group_ids).delete()
    return messages


def _lock_groups_to_delete(group_ids) -> None:
    """The locks of groups (``_lock_group``) whose conversations are about to be deleted: no
    fork is made in them meanwhile, and their pending transfers are locked with them
    (``_lock_offers_then_groups``)."""
    pending = OwnershipTransfer.objects.filter(
        group_id__in=group_ids, status=TransferStatus.PENDING
    )
    _lock_offers_then_groups(pending, group_ids)


# How many times ``_lock_offers_then_groups`` takes its locks again (an offer made each time
# it waited, at most one at a time a group: a few).
OFFER_LOCK_TRIES = 10


def _lock_offers_then_groups(offers, group_ids) -> None:
    """Lock ``offers`` (pending transfers, a queryset), then the groups, in the order
    accepting one takes its locks (transfer, then group): an accept racing waits, and then
    finds its transfer gone, it never deadlocks. An offer made while this waited for a
    group's lock (an offer is made under it) was not locked first: both are let go and
    taken again (a savepoint's rollback releases its row locks). Else a second deletion
    that had locked the new offer, and waited for the group, and this one, which went on to
    move the offer, waited for each other (review: a deadlock, 503); a member removed kept
    the offer made to them meanwhile, and accepted it (review)."""
    for _ in range(OFFER_LOCK_TRIES):
        savepoint = transaction.savepoint()
        locked = _lock_in_id_order(offers)
        _lock_in_id_order(ConversationGroup.objects.filter(pk__in=group_ids))
        if set(offers.values_list("id", flat=True)) <= set(locked):
            transaction.savepoint_commit(savepoint)
            return
        transaction.savepoint_rollback(savepoint)
    raise Unavailable("the conversation's offers of ownership kept changing; try again")


def _lock_in_id_order(rows) -> list:
    """Lock ``rows`` (a queryset) in id order, as every holder of them takes them; their ids."""
    return list(rows.select_for_update().order_by("id").values_list("id", flat=True))


def _groups_of(messages):
    """The groups of ``messages`` (a queryset): where a fork made at one of them, or a
    summary covering up to one, is written (a fork's may name its parent's messages). Their
    conversations are locked before ``messages_delete`` reads what to move off the messages
    (``_lock_conversations``): a fork in flight holds the conversation it is made from
    (``held_keys``), a summary the one it is appended to, so either ends first and is
    moved, or comes later and finds its message gone."""
    return messages.order_by().values("conversation__group_id")


def _lock_conversations(conversations) -> None:
    """Lock these conversations (a queryset) before their messages are collected to be
    deleted: an append in flight ends first (its messages are collected and counted out
    with the others), a later one finds its conversation gone (404, ``messages_append``).
    A group's delete holds its group's lock first, so no fork is added to it meanwhile; a
    deletion of messages does not (a fork made meanwhile of a fork that committed while it
    waited is not seen: a known gap). Rows are locked in id order, the same in every
    deletion."""
    _lock_in_id_order(conversations)


def _lock_messages(messages) -> list:
    """Lock these messages (a queryset) to delete them, in id order, as every holder of
    messages takes them (``held_keys``): a write citing several (a memory's turns) waits
    for the deletion, or the deletion for it, never each for the other. Their ids."""
    return list(
        messages.select_for_update(of=("self",)).order_by("id").values_list("id", flat=True)
    )


# --- messages --------------------------------------------------------------------------------


@dataclass
class NewMessage:
    content: str
    role: str = Role.USER
    channel: str = Channel.HISTORY
    visibility: str = Visibility.USER
    metadata: dict = field(default_factory=dict)
    author_name: str | None = None
    parent_message: Message | None = None
    created_at: datetime | None = None


@dataclass(frozen=True)
class _Signature:
    author_name: str
    written_for: str = ""  # ``Message.written_for``


def _signatures(actor: Principal, conversation: Conversation, messages: Sequence[NewMessage]):
    """The name each message is signed with, unless the writer gave one, and the user whose
    turn it is when an agent records it (``Message.written_for``). The name is part of the
    embedded and indexed text ("<author>: <content>"), so it is decided here only.

    A user's turn is signed by that user: the user the actor acts for, the actor itself, or,
    for an agent recording its conversation's turns on its own, the conversation's owner
    (an agent's own conversation: "user", as the local API signs them, not the agent's id).
    Every other turn is signed by the actor (an agent's name).

    An agent's user turn is that user's when it could have written it: an agent acting for
    a user records that user's turns (another name it gives is nobody's: frank's agent made
    a reader's export hold frank's words, and her erase delete them; review); one on its
    own, the owner's, or those of a member it names who may write (one query, only then).
    """
    signatures = []
    users_turn = None
    named = set()  # the names an agent on its own gave its user turns
    for new in messages:
        if new.author_name:
            for_whom = ""
            if new.role == Role.USER and actor.kind == "agent":
                if actor.on_behalf_of:
                    for_whom = actor.on_behalf_of if new.author_name == actor.on_behalf_of else ""
                else:
                    named.add(new.author_name)
            signatures.append(_Signature(new.author_name, for_whom))
        elif new.role == Role.USER:
            if users_turn is None:
                users_turn = actor.on_behalf_of or (
                    actor.id if actor.kind == "user" else _user_of(conversation)
                )
                users_turn = _Signature(
                    users_turn, users_turn if actor.kind == "agent" and users_turn != "user" else ""
                )
            signatures.append(users_turn)
        else:
            signatures.append(_Signature(actor.name or actor.id))
    writers = selectors.user_members(conversation, writers=True) & named if named else set()
    return [
        _Signature(signature.author_name, signature.author_name)
        if new.author_name in writers and new.role == Role.USER
        else signature
        for new, signature in zip(messages, signatures, strict=True)
    ]


def _user_of(conversation: Conversation) -> str:
    owner = conversation_owner_id(conversation)
    return "user" if agent_uuid_of(owner) else owner


def _build_message(
    actor: Principal, conversation: Conversation, new: NewMessage, signature: _Signature
) -> Message:
    return Message(
        conversation=conversation,
        role=new.role,
        channel=new.channel,
        visibility=new.visibility,
        author_principal=actor.id,
        author_name=signature.author_name,
        written_for=signature.written_for,
        content=new.content,
        metadata=new.metadata,
        parent_message=new.parent_message,
        **({"created_at": new.created_at} if new.created_at else {}),
    )


def within_message_limit(content: str) -> str:
    """What memsvc keeps of a text it records rather than is given (a captured LLM call, a
    model's answer): the first ``MEMSVC_MAX_MESSAGE_CHARS`` characters, the most any API
    takes as one message."""
    return content[: settings.MEMSVC_MAX_MESSAGE_CHARS]


# No savepoint inside a caller's transaction (an idempotent append, a fork, the local API's):
# none goes on after a failed append, and a savepoint costs two round trips.
@transaction.atomic(savepoint=False)
def messages_append(
    actor: Principal,
    *,
    conversation: Conversation,
    messages: Sequence[NewMessage],
    title: str | None = None,
) -> list[Message]:
    """Append messages in order, all or nothing; they are queued for embedding on commit.
    ``title``: the conversation's new one, set by the same update of its row. (A second
    update of a row this transaction wrote makes PostgreSQL check the row's foreign keys
    again at commit, locking its group, and a fork's parent, after the conversation: the
    reverse of a deletion's or an erase's order. A summary and a deletion at once
    deadlocked, one of them answered 503.)

    Within a conversation, ``seq`` order is commit order: the conversation's row is locked
    (FOR NO KEY UPDATE, until commit) before the messages draw their numbers, so a second
    writer draws its numbers only once the first has committed. A reader resuming after a
    message (a cursor is a ``seq``) can then never pass a number that commits later. The row
    is updated once, last (``updated_at``, ``seen_at``, ``title``): a lock is not a write,
    so the update is still the first write of the row in this transaction.

    The same lock waits for a deletion of the conversation in flight
    (``_lock_conversations``) and then finds no row: the append is a 404, not a message
    that refers to no conversation. So does an actor removed meanwhile
    (``_hold_memberships``).
    """
    locked_row(
        Conversation.objects.only("pk"),
        conversation.pk,
        missing="conversation not found",
        no_key=True,
        kept_as="append_lock",
    )
    _hold_memberships(actor, conversation)
    _hold_parents(messages)
    signatures = _signatures(actor, conversation, messages)
    created = Message.objects.bulk_create(
        [
            _build_message(actor, conversation, new, signature)
            for new, signature in zip(messages, signatures, strict=True)
        ]
    )
    # Stamped once its messages are written, as near its commit as it can be: a walk of the
    # conversation list that began while a long append ran (100 messages of 90 KB: 4.5 s)
    # looks for activity since it began, and an append stamped when it started was older
    # than that: it had moved ahead of the walk's cursor, and no page listed it (review).
    # Users are shown the change when they can read it: turns only agents read (a summary
    # that leaves the title as it was) move ``updated_at`` alone.
    now = timezone.now()
    changes = {"updated_at": now}
    if any(message.seen_by_users for message in created):
        changes["seen_at"] = now
    elif title is not None:
        changes["seen_at"] = Case(When(~Q(title=title), then=Value(now)), default=F("seen_at"))
    if title is not None:
        changes["title"] = title
    Conversation.objects.filter(pk=conversation.pk).update(**changes)
    message_ids = [message.id for message in created]
    transaction.on_commit(lambda: enqueue_embedding(message_ids))
    return created


_HOLD_MEMBERSHIPS = """
SELECT access_level FROM membership WHERE group_id = %s AND principal_id = ANY(%s) FOR KEY SHARE
"""


def _hold_memberships(actor: Principal, conversation: Conversation) -> None:
    """Hold the actor's memberships of the conversation's group until the append (or a
    change of title and metadata) commits (FOR KEY SHARE: appends do not wait for each
    other): removing or demoting the actor (``_locked_membership``) waits for the writes in
    flight, and one after it finds no membership (404) or a reader's (403), as from
    ``access_conversation``. Called after the conversation's update (or lock): a deletion of
    the group locks its conversations before it deletes the memberships, so it never waits
    for an append that waits for it."""
    with connection.cursor() as cursor:
        cursor.execute(_HOLD_MEMBERSHIPS, [conversation.group_id, list(actor.member_ids)])
        levels = [AccessLevel(level) for (level,) in cursor.fetchall()]
    lowest = min(levels, key=lambda level: level.rank) if levels else None
    selectors.refuse_below(
        lowest if len(levels) == len(actor.member_ids) else None, AccessLevel.WRITER
    )


def _hold_parents(messages: Sequence[NewMessage]) -> None:
    """Hold the messages replied to until the append commits (``held_keys``): one deleted
    meanwhile (``_messages_delete`` locks them) is refused, 400 as the view refuses a parent
    outside the conversation."""
    wanted = {new.parent_message.pk for new in messages if new.parent_message is not None}
    if wanted and held_keys(Message, wanted) != wanted:
        raise InvalidInput.for_field("parentMessageId", "not a message of this conversation")


def message_append(
    actor: Principal, *, conversation: Conversation, content: str, metadata: dict | None = None
) -> Message:
    """A user's message: role user, HISTORY channel, visible to users."""
    [message] = messages_append(
        actor,
        conversation=conversation,
        messages=[NewMessage(content=content, metadata=metadata or {})],
    )
    return message


@transaction.atomic
def summary_create(
    actor: Principal,
    *,
    conversation: Conversation,
    title: str | None,
    summary: str,
    until_message: Message,
    summarized_at: datetime,
) -> Message:
    """An agent's summary of the view up to ``until_message``: a SUMMARY message that agents
    see in place of what it covers, and the conversation's new title unless ``title`` is
    None (a refusal below rolls both back)."""
    if until_message.channel == Channel.SUMMARY:
        # The context would start after the older summary itself, so the messages between
        # what that one covers and it would be in neither.
        raise InvalidInput.for_field(
            "untilMessageId", "a summary covers messages, not another summary"
        )
    [message] = messages_append(
        actor,
        conversation=conversation,
        title=title,
        messages=[
            NewMessage(
                content=summary,
                role=Role.SYSTEM,
                channel=Channel.SUMMARY,
                visibility=Visibility.AGENT,
                metadata={
                    "untilMessageId": str(until_message.id),
                    "summarizedAt": summarized_at.astimezone(UTC)
                    .isoformat()
                    .replace("+00:00", "Z"),
                },
            )
        ],
    )
    # The message covered up to, held (``held_keys``) once the append has locked the
    # conversation: an erase of its author in flight, which locks the conversation before
    # it deletes the author's turns, has ended; one that comes later waits, then moves this
    # summary off it (``_summaries_moved_off``). Refused if it is gone, as the view refuses
    # a message outside the conversation: a summary covering no stored message would start
    # the agent's context after itself, past the turns between.
    if not held_keys(Message, [until_message.pk]):
        raise InvalidInput.for_field("untilMessageId", "not a message of this conversation")
    return message


@transaction.atomic
def messages_delete(actor: Principal, *, messages) -> list:
    """Delete these messages (a queryset), as an operator does in the admin: forks made at
    one of them starting at the history message before it instead, summaries covering up to one of them covering up to
    the message before it. The ids of those deleted.

    Their groups' conversations are locked first (``_groups_of``), then the
    messages (``_lock_messages``), as every deletion takes them: no fork or summary at one
    of them is written between the reading of those to move and the deletion. A caller that
    has locked messages already (an erase) has locked these conversations before them."""
    _lock_conversations(Conversation.objects.filter(group_id__in=_groups_of(messages)))
    _forks_moved_off(messages)
    _summaries_moved_off(messages)
    return _messages_delete(messages)


def _messages_delete(messages) -> list:
    """Delete these messages (a queryset); replies to them lose their parent. Caller makes
    sure no conversation that stays is forked at one of them (``_forks_moved_off``). The
    ids of those deleted."""
    ids = _lock_messages(messages)
    if not ids:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE message SET parent_message_id = NULL WHERE parent_message_id = ANY(%s)", [ids]
        )
        cursor.execute("DELETE FROM message WHERE id = ANY(%s) RETURNING id", [ids])
        return [message_id for (message_id,) in cursor.fetchall()]


def _forks_moved_off(messages) -> None:
    """Forks made at one of ``messages`` (about to be deleted) start instead at the history
    message before it that stays: they keep what they shared with their parent but those."""
    forks = Conversation.objects.filter(
        forked_at_message__in=messages.values("id"), forked_at_conversation__isnull=False
    ).select_related("forked_at_conversation", "forked_at_message")
    for fork in forks:
        point = history_message_before(
            fork.forked_at_conversation, fork.forked_at_message, excluding=messages
        )
        Conversation.objects.filter(pk=fork.pk).update(forked_at_message=point)


def _summaries_moved_off(messages) -> None:
    """Summaries that cover up to one of ``messages`` (about to be deleted) cover instead up
    to the message before it that stays (none: ``untilMessageId`` null, they cover nothing
    stored), so an agent's context still goes on right after what a summary covers
    (``selectors.conversation_context``), not after the summary. Summaries are in the
    groups of ``messages`` (a fork's may cover its parent's messages)."""
    ids = {str(message_id) for message_id in messages.values_list("id", flat=True)}
    summaries = (
        Message.objects.without_search_data()
        .filter(
            channel=Channel.SUMMARY,
            conversation__group_id__in=messages.values("conversation__group_id"),
            metadata__untilMessageId__in=list(ids),
        )
        .exclude(id__in=list(ids))
        .select_related("conversation")
    )
    for summary in summaries:
        until = Message.objects.without_search_data().get(id=summary.metadata["untilMessageId"])
        point = selectors.message_before(summary.conversation, until, excluding=messages)
        metadata = {**summary.metadata, "untilMessageId": str(point.id) if point else None}
        Message.objects.filter(pk=summary.pk).update(metadata=metadata)


# --- forks -----------------------------------------------------------------------------------


@transaction.atomic
def conversation_fork(
    actor: Principal,
    *,
    conversation: Conversation,
    message: Message,
    title: str | None = None,
    new_message: dict | None = None,
) -> Conversation:
    """Fork ``conversation`` at ``message`` (a user's HISTORY message of its view).

    The fork shares the view up to the last HISTORY message before ``message`` (DESIGN,
    "Forks": a summary or a memory note written after that message is not shared) and
    nothing is copied: the new row records its parent and that message. A constant number of queries,
    whatever the length of the conversation.
    """
    if message.channel != Channel.HISTORY or message.role != Role.USER:
        raise InvalidInput.for_field("messageId", "a fork starts at a user message of the history")
    # Deletions take the group's lock first: one in flight ends before the fork is made,
    # which then finds the conversation gone (404), or its actor removed meanwhile.
    _lock_group(conversation.group_id)
    selectors.access_conversation(actor, conversation.pk, need=AccessLevel.WRITER, summary=False)
    # The parent held as the fork's foreign key will hold it (``held_keys``), before the fork
    # point is read: an erase of a member in flight, which locks the group's conversations
    # before it deletes that member's turns (and moves the forks made at one), ends first;
    # one that comes later waits and then moves this fork too.
    held_keys(Conversation, [conversation.pk])
    fork = Conversation.objects.create(
        group_id=conversation.group_id,
        title=conversation.title if title is None else title,
        metadata=conversation.metadata,
        forked_at_conversation=conversation,
        forked_at_message=history_message_before(conversation, message),
    )
    if new_message is not None:
        message_append(actor, conversation=fork, **new_message)
    return fork


# --- memberships -----------------------------------------------------------------------------


def _lock_group(group_id) -> None:
    """Serialise the changes of one group's memberships (sharing, changing, removing, a
    transfer being offered or accepted), its forks and its deletions: each reads the
    memberships it changes only after this lock, so none acts on a level that another has
    just changed (a manager demoting the member who has just become owner)."""
    ConversationGroup.objects.select_for_update().filter(pk=group_id).first()


def _lock_group_as(actor: Principal, group_id, *, need: AccessLevel | None) -> None:
    """The group's lock (``_lock_group``), taken by an actor who has ``need`` in it: their
    level is checked again under the lock, since the view checked it before, and a removal
    or demotion of the actor may have committed since (a manager removed meanwhile shares
    nothing more). 404 or 403 as ``selectors.access_conversation``. ``need`` None: an
    operator's (the admin), checked by nothing."""
    _lock_group(group_id)
    if need is not None:
        selectors.access_group(actor, group_id, need=need)


def _locked_membership(actor: Principal, membership: Membership, *, need) -> Membership:
    """``membership`` as it is now, locked under its group's lock taken by an actor who has
    ``need`` (``_lock_group_as``); 404 if it is gone meanwhile. The row's lock (FOR UPDATE)
    waits for the member's appends in flight (``_hold_memberships``)."""
    _lock_group_as(actor, membership.group_id, need=need)
    current = Membership.objects.select_for_update().filter(pk=membership.pk).first()
    if current is None:
        raise NotFound("membership not found")
    return current


def _refuse_owner_level(access_level: str) -> None:
    if access_level == AccessLevel.OWNER:
        raise Forbidden("ownership is given by a transfer, not by sharing")


@transaction.atomic
def membership_create(
    actor: Principal, *, conversation: Conversation, principal_id: str, access_level: str
) -> Membership:
    """Share the conversation's group with ``principal_id`` (``principal_for_sharing``):
    the new member held first (``hold_users``), so that their erase in flight ends before,
    or finds the membership."""
    return _membership_add(
        actor, conversation.group_id, principal_id, access_level, need=AccessLevel.MANAGER
    )


@transaction.atomic
def membership_create_by_operator(
    actor: Principal, *, group_id, principal_id: str, access_level: str
) -> Membership:
    """``membership_create`` as the admin makes it: in any group."""
    return _membership_add(actor, group_id, principal_id, access_level, need=None)


def _membership_add(
    actor: Principal, group_id, principal_id: str, access_level: str, *, need
) -> Membership:
    _refuse_owner_level(access_level)
    hold_users([principal_id])
    hold_agents([principal_id])
    _lock_group_as(actor, group_id, need=need)
    try:
        with transaction.atomic():
            return Membership.objects.create(
                group_id=group_id, principal_id=principal_id, access_level=access_level
            )
    except IntegrityError:
        raise Conflict(f"{principal_id} is already a member; change their access instead") from None


@transaction.atomic
def membership_update(actor: Principal, *, membership: Membership, access_level: str) -> Membership:
    _refuse_owner_level(access_level)
    membership = _locked_membership(actor, membership, need=AccessLevel.MANAGER)
    if membership.access_level == AccessLevel.OWNER:
        raise Forbidden("the owner's access changes only by an ownership transfer")
    membership.access_level = access_level
    membership.save(update_fields=["access_level"])
    return membership


def removal_needs(actor: Principal, principal_id: str) -> str:
    """The access a removal of ``principal_id`` needs: any member but the owner may leave;
    removing another takes a manager. (The views ask it first, so that a reader removing
    someone is told 403 before whether that someone is a member, as a change of level is.)"""
    return AccessLevel.READER if principal_id == actor.id else AccessLevel.MANAGER


@transaction.atomic
def membership_delete(
    actor: Principal, *, membership: Membership, by_operator: bool = False
) -> None:
    """Remove a member (or leave). An offer of ownership to them ends with it (cancelled):
    one removed, or gone, does not come back as owner. The offer is locked before the group,
    in the order an accept takes them (``_lock_offers_then_groups``), so an accept racing
    the removal ends first (and the new owner cannot be removed). ``by_operator``: the
    admin's, who removes any member but the owner."""
    offers = OwnershipTransfer.objects.filter(
        group_id=membership.group_id,
        to_principal=membership.principal_id,
        status=TransferStatus.PENDING,
    )
    _lock_offers_then_groups(offers, [membership.group_id])
    need = None if by_operator else removal_needs(actor, membership.principal_id)
    membership = _locked_membership(actor, membership, need=need)
    if membership.access_level == AccessLevel.OWNER:
        raise Forbidden("the owner cannot be removed; transfer ownership first")
    membership.delete()
    for offer in offers:  # (locked above: no other is made while the group is)
        _resolve(offer, TransferStatus.CANCELLED)


# --- ownership transfers ---------------------------------------------------------------------


@transaction.atomic
def ownership_transfer_start(
    actor: Principal, *, conversation: Conversation, to_principal: str
) -> OwnershipTransfer:
    if to_principal == actor.id:
        raise InvalidInput.for_field("newOwnerUserId", "you already own this conversation")
    # Both users first (``hold_users``): an erase of either in flight ends before the offer,
    # or finds it.
    hold_users([actor.id, to_principal])
    # Only the owner offers: one whose offer is being accepted meanwhile is no longer it.
    # The offer names the conversation it is made from, read again under the group's lock,
    # which a deletion takes first: a fork deleted meanwhile is a 404, not a transfer
    # pointing at no conversation (its foreign key fails at commit).
    _lock_group(conversation.group_id)
    selectors.access_conversation(actor, conversation.pk, need=AccessLevel.OWNER, summary=False)
    try:
        with transaction.atomic():
            return OwnershipTransfer.objects.create(
                group_id=conversation.group_id,
                conversation=conversation,
                from_principal=actor.id,
                to_principal=to_principal,
            )
    except IntegrityError:
        raise Conflict("this conversation already has a pending ownership transfer") from None


def _lock_pending(transfer: OwnershipTransfer) -> OwnershipTransfer:
    locked = locked_row(OwnershipTransfer.objects, transfer.pk, missing="not found")
    if locked.status != TransferStatus.PENDING:
        raise Conflict(f"this transfer is already {locked.status}")
    return locked


def _resolve(transfer: OwnershipTransfer, status: str) -> OwnershipTransfer:
    transfer.status = status
    transfer.resolved_at = timezone.now()
    transfer.save(update_fields=["status", "resolved_at"])
    return transfer


@transaction.atomic
def ownership_transfer_accept(
    actor: Principal, *, transfer: OwnershipTransfer
) -> OwnershipTransfer:
    """The recipient becomes owner and the old owner a manager, in one transaction. The
    recipient held first (``hold_users``): their erase in flight ends before (and took the
    offer: 404), one that comes later finds them owner. An offer whose sender no longer owns
    the conversation (a stale one an import brought back) is a 409: accepted, it demoted
    an owner who never offered anything (review)."""
    if transfer.to_principal != actor.id:
        raise Forbidden("only the recipient can accept a transfer")
    hold_users([actor.id])
    transfer = _lock_pending(transfer)
    _lock_group(transfer.group_id)
    if not Membership.objects.filter(
        group_id=transfer.group_id,
        principal_id=transfer.from_principal,
        access_level=AccessLevel.OWNER,
    ).exists():
        raise Conflict("this offer no longer stands: its sender does not own the conversation")
    Membership.objects.filter(group_id=transfer.group_id, access_level=AccessLevel.OWNER).update(
        access_level=AccessLevel.MANAGER
    )
    Membership.objects.update_or_create(
        group_id=transfer.group_id,
        principal_id=actor.id,
        defaults={"access_level": AccessLevel.OWNER},
    )
    return _resolve(transfer, TransferStatus.ACCEPTED)


@transaction.atomic
def ownership_transfer_decline(
    actor: Principal, *, transfer: OwnershipTransfer
) -> OwnershipTransfer:
    if transfer.to_principal != actor.id:
        raise Forbidden("only the recipient can decline a transfer")
    return _resolve(_lock_pending(transfer), TransferStatus.DECLINED)


@transaction.atomic
def ownership_transfer_cancel(
    actor: Principal, *, transfer: OwnershipTransfer
) -> OwnershipTransfer:
    if transfer.from_principal != actor.id:
        raise Forbidden("only the owner who offered a transfer can cancel it")
    return _resolve(_lock_pending(transfer), TransferStatus.CANCELLED)


# --- a user's data, erased -------------------------------------------------------------------


@dataclass(frozen=True)
class ErasedConversations:
    conversations: int  # in the groups the user owned, forks included
    # Of those conversations, and the user's own elsewhere: what cited them must forget them.
    message_ids: list
    memberships: int  # the user's own, everywhere
    ownership_transfers: int  # of the user's groups, and those made to or by the user

    @property
    def messages(self) -> int:
        return len(self.message_ids)


@transaction.atomic
def user_conversations_erase(
    user_id: str, *, within=None, made_before: datetime | None = None
) -> ErasedConversations:
    """Erase what the conversations app keeps about a user: the groups they own (every
    conversation, message, membership and transfer in them), their messages in others'
    conversations, their memberships, and the transfers they made or were offered
    (a pending offer to them goes, as if declined). One transaction.

    Others' data stays as it was, but for the user's messages in it: a fork someone made
    at one of those starts at the message before it instead. The caller holds the user
    alone first (``hold_users``): a conversation, membership or offer of ownership being
    made for them ends before, and is erased here.

    ``within`` (group ids) and ``made_before``: only what is of those groups and was made
    before then (an import erasing again what its document brought back of someone erased
    since it was made: ``data_rights.user_traces_erase``).
    """

    def scoped(rows, group: str = "group_id"):
        if within is not None:
            rows = rows.filter(**{f"{group}__in": within})
        return rows if made_before is None else rows.filter(created_at__lt=made_before)

    # Pending transfers before groups, in the order accepting one takes its locks
    # (transfer, then group): an accept racing the erase waits, it never deadlocks. With
    # them, in the same statement, those of others' groups the erase deletes: locked last,
    # two people erased at once who had offered each other a conversation each held the
    # other's offer to them and waited (a deadlock, a 503; review).
    groups = scoped(selectors.groups_owned_by(user_id), "id")
    elsewhere_transfers = scoped(selectors.transfers_elsewhere(user_id))
    list(
        OwnershipTransfer.objects.filter(
            Q(group__in=groups, status=TransferStatus.PENDING)
            | Q(id__in=elsewhere_transfers.order_by().values("id"))
        )
        .select_for_update(of=("self",))
        .order_by("created_at", "id")
        .values_list("id", flat=True)
    )
    owned = list(groups.select_for_update(of=("self",)).order_by("id").values_list("id", flat=True))
    conversations = Conversation.objects.filter(group_id__in=owned).count()
    transfers = OwnershipTransfer.objects.filter(group_id__in=owned).count()

    # The user's memberships (in their own groups too), locked before their messages are
    # collected: an append of theirs in flight holds its membership (``_hold_memberships``)
    # and ends first, so its messages are collected with the others; a later one finds none
    # (404). Their conversations first, in the order an append takes its locks
    # (conversation, then membership), so that an append waiting for a membership never
    # holds a conversation that the erase then waits for (a fork moved off one of the
    # user's messages).
    # Those of the groups where their messages are too, which ``messages_delete`` locks
    # (``_groups_of``): a group they have left keeps their turns, and may be forked at one.
    theirs = scoped(Membership.objects.filter(principal_id=user_id))
    elsewhere = scoped(selectors.messages_elsewhere(user_id), "conversation__group_id")
    member_of = theirs.values("group_id")
    _lock_conversations(
        Conversation.objects.filter(group_id__in=member_of.union(_groups_of(elsewhere)))
    )
    _lock_in_id_order(theirs)
    # Then every message the erase deletes, in one statement in id order, before any is
    # deleted: a write holding some of them (a memory citing turns of the user's and of
    # another's conversation, ``held_keys``) holds none of those still to be locked here
    # while it waits for one locked already, which would be a deadlock.
    in_owned = Message.objects.filter(conversation__group_id__in=owned).values("id")
    _lock_messages(Message.objects.filter(id__in=in_owned.union(elsewhere.order_by().values("id"))))
    messages = conversation_groups_delete(Principal.user(user_id), group_ids=owned)
    messages += messages_delete(Principal.user(user_id), messages=elsewhere)
    memberships, _ = theirs.delete()
    others, _ = elsewhere_transfers.delete()
    return ErasedConversations(
        conversations=conversations,
        message_ids=messages,
        memberships=memberships + len(owned),
        ownership_transfers=transfers + others,
    )
