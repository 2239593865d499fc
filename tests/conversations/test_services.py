"""Changes of one group are serialised by the group's row lock (memberships, transfers,
forks, deletions); a deletion waits for the appends in flight to its conversations.

A race is played in order: a transaction on this thread holds a lock while the competing
operation starts on another connection, which must wait for it; this transaction then
commits and the other operation ends.
"""

import threading
import uuid

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from conversations import selectors, services
from conversations.models import Conversation, Membership, Message, OwnershipTransfer
from conversations.services import NewMessage
from memsvc.api.errors import Forbidden, InvalidInput, NotFound
from memsvc.api.principals import Principal
from search.services import embed_messages
from tests.db import recorded_statements
from tests.factories import ConversationFactory, MembershipFactory


def levels(group):
    return dict(Membership.objects.filter(group=group).values_list("principal_id", "access_level"))


@pytest.mark.django_db(transaction=True)
def test_a_manager_cannot_demote_a_member_who_became_owner_meanwhile():
    """The manager's request read bob as a writer; bob accepts the transfer before the
    change is written. The change waits for the transfer's transaction, sees bob as owner
    and is refused: the group never loses its owner."""
    with transaction.atomic():  # the group and its owner commit together
        conversation = ConversationFactory(group__owner="alice")
        MembershipFactory(group=conversation.group, principal_id="bob", access_level="writer")
        MembershipFactory(group=conversation.group, principal_id="mia", access_level="manager")
    alice, bob, mia = Principal.user("alice"), Principal.user("bob"), Principal.user("mia")
    transfer = services.ownership_transfer_start(
        alice, conversation=conversation, to_principal="bob"
    )
    stale_bob = selectors.membership_of(conversation, "bob")  # what mia's request loaded

    outcome = {}

    def demote_bob():
        try:
            services.membership_update(mia, membership=stale_bob, access_level="reader")
            outcome["result"] = "demoted"
        except Forbidden as refused:
            outcome["result"] = str(refused)
        finally:
            connection.close()

    with transaction.atomic():
        services.ownership_transfer_accept(bob, transfer=transfer)
        demoter = threading.Thread(target=demote_bob)
        demoter.start()
        demoter.join(timeout=1.0)
        # Waiting on the group's lock while the transfer is not committed.
        assert demoter.is_alive()
    demoter.join(timeout=10)

    assert outcome["result"] == "the owner's access changes only by an ownership transfer"
    assert levels(conversation.group) == {"alice": "manager", "bob": "owner", "mia": "manager"}


@pytest.mark.django_db
def test_removing_a_membership_that_is_gone_meanwhile_is_404():
    conversation = ConversationFactory(group__owner="alice")
    MembershipFactory(group=conversation.group, principal_id="bob", access_level="reader")
    stale_bob = selectors.membership_of(conversation, "bob")
    Membership.objects.filter(pk=stale_bob.pk).delete()
    with pytest.raises(NotFound, match="membership not found"):
        services.membership_delete(Principal.user("alice"), membership=stale_bob)


def waits_for(hold, operation):
    """``operation()``, started on another connection while ``hold()``'s transaction is open,
    waits for that transaction; once it commits, what ``operation()`` returned or raised."""
    outcome = {}

    def run():
        try:
            outcome["result"] = operation()
        except (IntegrityError, Forbidden, InvalidInput, NotFound) as exc:  # what a race may end in
            outcome["result"] = exc
        finally:
            connection.close()

    with transaction.atomic():
        hold()
        other = threading.Thread(target=run)
        other.start()
        other.join(timeout=1.0)
        assert other.is_alive()  # waiting for this transaction
    other.join(timeout=10)
    return outcome["result"]


def shared_group(**members):
    """alice's conversation, shared with ``members`` (principal id: access level)."""
    with transaction.atomic():  # the group and its owner commit together
        conversation = ConversationFactory(group__owner="alice")
        for principal_id, access_level in members.items():
            MembershipFactory(
                group=conversation.group, principal_id=principal_id, access_level=access_level
            )
    return conversation


@pytest.mark.django_db(transaction=True)
def test_an_owner_whose_offer_is_being_accepted_cannot_offer_another():
    """alice offers to bob; while bob accepts, alice offers to carol. The second offer
    waits for the accept, finds alice no longer the owner and is refused: carol can never
    take ownership from bob."""
    conversation = shared_group()
    alice, bob = Principal.user("alice"), Principal.user("bob")
    transfer = services.ownership_transfer_start(
        alice, conversation=conversation, to_principal="bob"
    )

    refused = waits_for(
        lambda: services.ownership_transfer_accept(bob, transfer=transfer),
        lambda: services.ownership_transfer_start(
            alice, conversation=conversation, to_principal="carol"
        ),
    )

    assert isinstance(refused, Forbidden), refused
    assert not OwnershipTransfer.objects.filter(status="pending").exists()
    assert levels(conversation.group) == {"alice": "manager", "bob": "owner"}


MANAGERS_CHANGES = {
    "share": lambda mia, conversation, bob: services.membership_create(
        mia, conversation=conversation, principal_id="pal", access_level="manager"
    ),
    "change": lambda mia, conversation, bob: services.membership_update(
        mia, membership=bob, access_level="manager"
    ),
    "remove": lambda mia, conversation, bob: services.membership_delete(mia, membership=bob),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("change", MANAGERS_CHANGES)
def test_a_manager_removed_meanwhile_changes_no_membership(change):
    """mia's request was checked while she was a manager; alice removes her before the
    change is written. The change waits for the removal and is refused (she is no member)."""
    conversation = shared_group(mia="manager", bob="reader")
    mia, bob = Principal.user("mia"), selectors.membership_of(conversation, "bob")
    removed_mia = selectors.membership_of(conversation, "mia")

    refused = waits_for(
        lambda: services.membership_delete(Principal.user("alice"), membership=removed_mia),
        lambda: MANAGERS_CHANGES[change](mia, conversation, bob),
    )

    assert isinstance(refused, NotFound), refused
    assert levels(conversation.group) == {"alice": "owner", "bob": "reader"}


def fork_of(conversation):
    """A fork of ``conversation`` at a new message, made by alice."""
    alice = Principal.user("alice")
    message = services.message_append(alice, conversation=conversation, content="hi")
    return services.conversation_fork(alice, conversation=conversation, message=message)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("deleted", ["root", "fork"])
def test_an_append_racing_the_deletion_of_its_conversation_is_404(deleted):
    """The append waits for the deletion, then finds no conversation: a 404, not a message
    that refers to none (a 500)."""
    conversation = shared_group()
    if deleted == "fork":
        conversation = fork_of(conversation)
    alice = Principal.user("alice")

    refused = waits_for(
        lambda: services.conversation_delete(alice, conversation=conversation),
        lambda: services.message_append(alice, conversation=conversation, content="late"),
    )

    assert isinstance(refused, NotFound), refused
    assert not Message.objects.filter(conversation=conversation).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("deleted", ["root", "fork"])
def test_a_fork_racing_the_deletion_of_its_conversation_is_404(deleted):
    conversation = shared_group()
    if deleted == "fork":
        conversation = fork_of(conversation)
    alice = Principal.user("alice")
    message = services.message_append(alice, conversation=conversation, content="fork here")

    refused = waits_for(
        lambda: services.conversation_delete(alice, conversation=conversation),
        lambda: services.conversation_fork(
            alice, conversation=conversation, message=message, new_message={"content": "x"}
        ),
    )

    assert isinstance(refused, NotFound), refused
    assert not Message.objects.filter(content="x").exists()


@pytest.mark.django_db(transaction=True)
def test_an_offer_made_from_a_fork_being_deleted_is_404():
    """alice offers ownership from a fork while she deletes that fork: the offer waits for
    the deletion, then finds its conversation gone (404), not a 500 when the transfer's
    foreign key to the deleted fork is checked at commit."""
    fork = fork_of(shared_group())
    alice = Principal.user("alice")

    refused = waits_for(
        lambda: services.conversation_delete(alice, conversation=fork),
        lambda: services.ownership_transfer_start(alice, conversation=fork, to_principal="bob"),
    )

    assert isinstance(refused, NotFound), refused
    assert not OwnershipTransfer.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_two_fork_deletions_racing_an_offer_from_one_of_the_forks_both_end(monkeypatch):
    """Deletion A waited for the group while alice offered ownership from A's fork; then B,
    deleting another fork, locked that new offer and waited for the group, which A held; A,
    moving the offer off its fork, waited for B: a deadlock, 503 (review). A locks the
    offer made while it waited before it goes on (here: paused once it has its locks)."""
    root = shared_group()
    first, second = fork_of(root), fork_of(root)
    alice = Principal.user("alice")
    paused, go_on = threading.Event(), threading.Event()
    access_group = selectors.access_group

    def pausing_a(actor, group_id, **kwargs):
        if threading.current_thread().name == "A":
            paused.set()
            go_on.wait(10)
        return access_group(actor, group_id, **kwargs)

    monkeypatch.setattr(services.selectors, "access_group", pausing_a)
    outcomes = {}

    def delete(fork):
        try:
            services.conversation_delete(alice, conversation=fork)
            outcomes[threading.current_thread().name] = "deleted"
        except Exception as exc:  # (a deadlock's OperationalError)
            outcomes[threading.current_thread().name] = exc
        finally:
            connection.close()

    a = threading.Thread(target=delete, args=(first,), name="A")
    b = threading.Thread(target=delete, args=(second,), name="B")
    with transaction.atomic():
        services.ownership_transfer_start(alice, conversation=first, to_principal="bob")
        a.start()
        a.join(timeout=1.0)
        assert a.is_alive()  # waiting for the group, which the offer holds
    assert paused.wait(10)  # A holds its locks
    b.start()
    b.join(timeout=1.0)
    assert b.is_alive()  # waiting for A
    go_on.set()
    a.join(timeout=15)
    b.join(timeout=15)
    assert outcomes == {"A": "deleted", "B": "deleted"}
    assert set(Conversation.objects.values_list("pk", flat=True)) == {root.pk}
    assert OwnershipTransfer.objects.get().conversation_id == root.pk  # moved off the fork


@pytest.mark.django_db(transaction=True)
def test_a_member_removed_while_an_offer_to_them_is_made_loses_the_offer():
    """alice offers bob ownership while carol removes him: the removal waited for the group
    and kept the offer it had not seen; bob, no member, accepted it and became owner
    (review). The offer is cancelled with the membership."""
    conversation = shared_group(bob="writer", carol="manager")
    bob = selectors.membership_of(conversation, "bob")

    waits_for(
        lambda: services.ownership_transfer_start(
            Principal.user("alice"), conversation=conversation, to_principal="bob"
        ),
        lambda: services.membership_delete(Principal.user("carol"), membership=bob),
    )

    assert OwnershipTransfer.objects.get().status == "cancelled"
    assert levels(conversation.group) == {"alice": "owner", "carol": "manager"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("deleted", ["root", "fork"])
def test_an_owner_whose_offer_is_being_accepted_deletes_nothing(deleted):
    """alice's deletion was checked while she owned the conversation; bob accepts her offer
    before it is written. The deletion waits for the accept, finds alice a manager and is
    refused: nothing of what bob now owns is deleted."""
    conversation = shared_group()
    if deleted == "fork":
        conversation = fork_of(conversation)
    alice, bob = Principal.user("alice"), Principal.user("bob")
    transfer = services.ownership_transfer_start(
        alice, conversation=conversation, to_principal="bob"
    )

    refused = waits_for(
        lambda: services.ownership_transfer_accept(bob, transfer=transfer),
        lambda: services.conversation_delete(alice, conversation=conversation),
    )

    assert isinstance(refused, Forbidden), refused
    assert Conversation.objects.filter(pk=conversation.pk).exists()
    assert levels(conversation.group) == {"alice": "manager", "bob": "owner"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("deleted", ["root", "fork"])
def test_a_deletion_waits_for_an_append_in_flight_and_deletes_it_too(deleted):
    """The append commits while the deletion waits; the deletion then takes the appended
    message with the others, and the other conversation's stay."""
    kept = shared_group()
    alice = Principal.user("alice")
    services.message_append(alice, conversation=kept, content="a kept quokka")
    conversation = shared_group() if deleted == "root" else fork_of(kept)
    services.message_append(alice, conversation=conversation, content="an old wombat")
    embed_messages(Message.objects.values_list("id", flat=True))

    def append_and_count():
        [late] = services.messages_append(
            alice, conversation=conversation, messages=[NewMessage(content="a late zebra")]
        )
        embed_messages([late.id])

    outcome = waits_for(
        append_and_count,
        lambda: services.conversation_delete(alice, conversation=conversation),
    )

    assert outcome is None
    assert not Message.objects.filter(conversation=conversation).exists()
    assert Message.objects.filter(conversation=kept).exists()


# How bob, a writer, loses the right to append: the change, what a later append gets, and
# the memberships left.
WRITER_LOSSES = {
    "removed": (
        lambda alice, bob: services.membership_delete(alice, membership=bob),
        NotFound,
        {"alice": "owner"},
    ),
    "demoted": (
        lambda alice, bob: services.membership_update(alice, membership=bob, access_level="reader"),
        Forbidden,
        {"alice": "owner", "bob": "reader"},
    ),
}


# A write of bob's made late, and whether nothing of it was written.
LATE_WRITES = {
    "append": (
        lambda conversation: services.message_append(
            Principal.user("bob"), conversation=conversation, content="late"
        ),
        lambda conversation: not Message.objects.exists(),
    ),
    "title": (
        lambda conversation: services.conversation_update(
            Principal.user("bob"), conversation=conversation, title="late"
        ),
        lambda conversation: Conversation.objects.get(pk=conversation.pk).title != "late",
    ),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("write", LATE_WRITES)
@pytest.mark.parametrize("loss", WRITER_LOSSES)
def test_a_write_racing_the_loss_of_its_writers_access_is_refused(loss, write):
    """bob's append (or title change) was checked while he was a writer; alice removes or
    demotes him before it is written. It waits for the change and is refused (no
    membership: 404; a reader's: 403): nothing of his is written after the change has
    answered."""
    change, refusal, _ = WRITER_LOSSES[loss]
    late, nothing_written = LATE_WRITES[write]
    conversation = shared_group(bob="writer")
    bob = selectors.membership_of(conversation, "bob")

    refused = waits_for(lambda: change(Principal.user("alice"), bob), lambda: late(conversation))

    assert isinstance(refused, refusal), refused
    assert nothing_written(conversation)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("loss", WRITER_LOSSES)
def test_a_writers_loss_of_access_waits_for_their_append_in_flight(loss):
    change, _, members = WRITER_LOSSES[loss]
    conversation = shared_group(bob="writer")
    bob = selectors.membership_of(conversation, "bob")

    outcome = waits_for(
        lambda: services.message_append(
            Principal.user("bob"), conversation=conversation, content="in time"
        ),
        lambda: change(Principal.user("alice"), bob),
    )

    assert not isinstance(outcome, Exception), outcome
    assert list(Message.objects.values_list("content", flat=True)) == ["in time"]
    assert levels(conversation.group) == members


@pytest.mark.django_db(transaction=True)
def test_a_reply_racing_the_deletion_of_its_parent_is_refused():
    """The reply's parent was seen, then deleted (an erase of its author, an operator)
    before the reply is written: a 400 naming it, not a 500 when the reply's foreign key is
    checked at commit."""
    conversation = shared_group(bob="writer")
    parent = services.message_append(Principal.user("bob"), conversation=conversation, content="q")
    reply = NewMessage(content="a", role="assistant", parent_message=parent)

    refused = waits_for(
        lambda: services.messages_delete(
            Principal.user("bob"), messages=Message.objects.filter(pk=parent.pk)
        ),
        lambda: services.messages_append(
            Principal.user("alice"), conversation=conversation, messages=[reply]
        ),
    )

    assert isinstance(refused, InvalidInput), refused
    assert "parentMessageId" in refused.details
    assert not Message.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_fork_racing_the_erase_of_its_fork_points_author_starts_before_it():
    """alice forks at her turn that follows bob's while bob erases his data: the fork waits
    for the erase and starts before bob's deleted turn, not a 500 when its fork point's
    foreign key is checked at commit."""
    conversation = shared_group(bob="writer")
    services.message_append(Principal.user("bob"), conversation=conversation, content="b")
    alice = Principal.user("alice")
    turn = services.message_append(alice, conversation=conversation, content="a")

    fork = waits_for(
        lambda: services.user_conversations_erase("bob"),
        lambda: services.conversation_fork(alice, conversation=conversation, message=turn),
    )

    assert isinstance(fork, Conversation), fork
    assert Conversation.objects.get(pk=fork.pk).forked_at_message is None


@pytest.mark.django_db(transaction=True)
def test_an_erase_racing_a_fork_at_its_users_turn_moves_the_fork():
    """The fork commits first; the erase waits for it and moves it off bob's turn, not a
    500 when the deleted turn's foreign keys are checked at commit."""
    conversation = shared_group(bob="writer")
    services.message_append(Principal.user("bob"), conversation=conversation, content="b")
    alice = Principal.user("alice")
    turn = services.message_append(alice, conversation=conversation, content="a")
    forks = []

    outcome = waits_for(
        lambda: forks.append(
            services.conversation_fork(alice, conversation=conversation, message=turn)
        ),
        lambda: services.user_conversations_erase("bob"),
    )

    assert outcome.messages == 1, outcome
    assert Conversation.objects.get(pk=forks[0].pk).forked_at_message is None


@pytest.mark.django_db(transaction=True)
def test_a_summary_racing_the_erase_of_the_turn_it_covers_up_to_is_refused():
    """An agent summarises up to bob's turn while bob erases his data: the summary waits
    for the erase and is refused (the turn is gone, as a later request finds it), not kept
    covering a message that no longer exists, after which an agent's context would start
    past the summary and lose the turns between."""
    agent = Principal.for_agent(uuid.uuid4(), name="helper")
    conversation = shared_group(bob="writer", **{agent.id: "writer"})
    services.message_append(Principal.user("alice"), conversation=conversation, content="a")
    turn = services.message_append(Principal.user("bob"), conversation=conversation, content="b")

    refused = waits_for(
        lambda: services.user_conversations_erase("bob"),
        lambda: services.summary_create(
            agent,
            conversation=conversation,
            title="t",
            summary="alice said a, bob said b",
            until_message=turn,
            summarized_at=timezone.now(),
        ),
    )

    assert isinstance(refused, InvalidInput), refused
    assert "untilMessageId" in refused.details
    assert not Message.objects.filter(channel="summary").exists()


def a_fork_at_bobs_turn():
    """alice's conversation: her turn, bob's, hers again; what a fork at her second turn
    starts at is bob's."""
    conversation = shared_group(bob="writer")
    alice, bob = Principal.user("alice"), Principal.user("bob")
    first = services.message_append(alice, conversation=conversation, content="a")
    bobs = services.message_append(bob, conversation=conversation, content="b")
    turn = services.message_append(alice, conversation=conversation, content="c")
    return conversation, first, bobs, turn


@pytest.mark.django_db(transaction=True)
def test_an_operators_delete_racing_a_fork_at_the_message_moves_the_fork():
    """A fork is made at the message an operator deletes (the admin's ``messages_delete``):
    the delete waits for the fork, then moves it to the message before, as an erase does.
    (It read the forks to move before it locked anything: the fork was missed, and failed
    at commit on its fork point's foreign key, a 500.)"""
    conversation, first, bobs, turn = a_fork_at_bobs_turn()
    forks = []

    deleted = waits_for(
        lambda: forks.append(
            services.conversation_fork(
                Principal.user("alice"), conversation=conversation, message=turn
            )
        ),
        lambda: services.messages_delete(
            Principal.user("ops"), messages=Message.objects.filter(pk=bobs.pk)
        ),
    )

    assert deleted == [bobs.pk], deleted
    assert Conversation.objects.get(pk=forks[0].pk).forked_at_message_id == first.pk


@pytest.mark.django_db(transaction=True)
def test_an_operators_delete_racing_a_summary_up_to_the_message_moves_the_summary():
    """An agent summarises up to the message an operator deletes: the delete waits for the
    summary, then has it cover up to the message before. (It read the summaries before it
    locked anything: this one was missed and kept covering a message that no longer
    exists, after which an agent's context starts past the summary.)"""
    agent = Principal.for_agent(uuid.uuid4(), name="helper")
    conversation = shared_group(**{agent.id: "writer"})
    alice = Principal.user("alice")
    first = services.message_append(alice, conversation=conversation, content="a")
    turn = services.message_append(alice, conversation=conversation, content="b")
    summaries = []

    deleted = waits_for(
        lambda: summaries.append(
            services.summary_create(
                agent,
                conversation=conversation,
                title="t",
                summary="alice said a and b",
                until_message=turn,
                summarized_at=timezone.now(),
            )
        ),
        lambda: services.messages_delete(
            Principal.user("ops"), messages=Message.objects.filter(pk=turn.pk)
        ),
    )

    assert deleted == [turn.pk], deleted
    summary = Message.objects.get(pk=summaries[0].pk)
    assert summary.metadata["untilMessageId"] == str(first.pk)


@pytest.mark.django_db(transaction=True)
def test_an_erase_racing_a_fork_at_a_turn_in_a_conversation_its_user_left_moves_the_fork():
    """bob's turn stays in alice's conversation after he leaves it; alice forks at it while
    bob erases his data: the erase waits for the fork and moves it. (It locked only the
    conversations of bob's groups: the fork was missed, and failed at commit on its fork
    point's foreign key, a 500.)"""
    conversation, first, bobs, turn = a_fork_at_bobs_turn()
    bob = selectors.membership_of(conversation, "bob")
    services.membership_delete(Principal.user("bob"), membership=bob)
    forks = []

    erased = waits_for(
        lambda: forks.append(
            services.conversation_fork(
                Principal.user("alice"), conversation=conversation, message=turn
            )
        ),
        lambda: services.user_conversations_erase("bob"),
    )

    assert erased.message_ids == [bobs.pk], erased
    assert Conversation.objects.get(pk=forks[0].pk).forked_at_message_id == first.pk


@pytest.mark.django_db
def test_an_append_stamps_its_conversations_activity_once_its_messages_are_written():
    """The conversation list's walk looks for activity since it began: an append stamped
    when it started (a bulk of 100 messages of 90 KB took 4.5 s) was older than a walk that
    began meanwhile, had moved ahead of its cursor, and no page listed it (review). The row
    is locked first (``seq`` order is commit order) and written once, last."""
    alice = Principal.user("alice")
    conversation = services.conversation_create(alice, title="Plans")
    with recorded_statements() as sent:
        [message] = services.messages_append(
            alice, conversation=conversation, messages=[NewMessage(content="Hello")]
        )
    kinds = [
        sql.split()[0] + (" FOR NO KEY UPDATE" if "FOR NO KEY UPDATE" in sql else "")
        for sql in sent
        if '"conversation"' in sql.split(" WHERE")[0] or 'INTO "message"' in sql
    ]
    assert kinds == ["SELECT FOR NO KEY UPDATE", "INSERT", "UPDATE"]
    conversation.refresh_from_db()
    assert conversation.updated_at >= message.created_at
