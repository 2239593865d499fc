"""The database itself refuses data that breaks the invariants of DESIGN.md."""

import pytest
from django.core.exceptions import ValidationError
from django.db import DataError, IntegrityError, connection, transaction
from django.utils import timezone

from conversations.models import (
    AccessLevel,
    Conversation,
    ConversationGroup,
    Membership,
    Message,
    OwnershipTransfer,
    TransferStatus,
)
from tests.db import check_deferred_constraints, refused
from tests.factories import (
    ConversationFactory,
    ConversationGroupFactory,
    MembershipFactory,
    MessageFactory,
    OwnershipTransferFactory,
)

pytestmark = pytest.mark.django_db


# --- exactly one owner per group -------------------------------------------------------------


def test_a_group_cannot_have_two_owners():
    group = ConversationGroupFactory(owner="alice")
    with refused(IntegrityError, match="membership_one_owner_per_group"):
        Membership.objects.create(group=group, principal_id="bob", access_level="owner")
    assert Membership.objects.filter(group=group, access_level="owner").count() == 1


def test_a_group_without_an_owner_is_refused_at_commit():
    with pytest.raises(IntegrityError, match="exactly one owner"), transaction.atomic():
        group = ConversationGroup.objects.create()
        Membership.objects.create(group=group, principal_id="bob", access_level="writer")
        check_deferred_constraints()


def test_removing_the_owner_is_refused_at_commit():
    group = ConversationGroupFactory(owner="alice")
    with pytest.raises(IntegrityError, match="exactly one owner"), transaction.atomic():
        Membership.objects.filter(group=group, principal_id="alice").delete()
        check_deferred_constraints()
    assert Membership.objects.filter(group=group, access_level="owner").exists()


def test_demoting_the_owner_without_a_successor_is_refused():
    group = ConversationGroupFactory(owner="alice")
    with pytest.raises(IntegrityError, match="exactly one owner"), transaction.atomic():
        Membership.objects.filter(group=group, principal_id="alice").update(
            access_level=AccessLevel.MANAGER
        )
        check_deferred_constraints()


def test_handing_ownership_over_within_one_transaction_is_allowed():
    group = ConversationGroupFactory(owner="alice")
    MembershipFactory(group=group, principal_id="bob", access_level="writer")
    with transaction.atomic():
        Membership.objects.filter(group=group, principal_id="alice").update(access_level="manager")
        Membership.objects.filter(group=group, principal_id="bob").update(access_level="owner")
        check_deferred_constraints()
    owners = list(group.memberships.filter(access_level="owner").values_list("principal_id"))
    assert owners == [("bob",)]


def test_deleting_a_group_takes_its_memberships_with_it():
    group = ConversationGroupFactory(owner="alice")
    ConversationFactory(group=group)
    group.delete()
    check_deferred_constraints()
    assert not Membership.objects.filter(group_id=group.id).exists()


@pytest.mark.django_db(transaction=True)
def test_the_owner_check_runs_on_a_real_commit():
    with pytest.raises(IntegrityError, match="exactly one owner"), transaction.atomic():
        ConversationGroup.objects.create()
    assert ConversationGroup.objects.count() == 0


# --- memberships and transfers ---------------------------------------------------------------


def test_a_principal_has_one_membership_per_group():
    group = ConversationGroupFactory(owner="alice")
    MembershipFactory(group=group, principal_id="bob")
    with pytest.raises(IntegrityError, match="membership_unique"), transaction.atomic():
        MembershipFactory(group=group, principal_id="bob", access_level="writer")


def test_unknown_access_levels_are_refused():
    group = ConversationGroupFactory(owner="alice")
    with refused(IntegrityError, match="membership_access_level_valid"):
        Membership.objects.create(group=group, principal_id="bob", access_level="admin")


def test_at_most_one_pending_transfer_per_group():
    conversation = ConversationFactory()
    OwnershipTransferFactory(conversation=conversation, to_principal="bob")
    with refused(IntegrityError, match="transfer_one_pending_per_group"):
        OwnershipTransferFactory(conversation=conversation, to_principal="charlie")


def test_resolved_transfers_do_not_block_a_new_one():
    conversation = ConversationFactory()
    OwnershipTransferFactory(
        conversation=conversation, status=TransferStatus.DECLINED, resolved_at=timezone.now()
    )
    OwnershipTransferFactory(conversation=conversation, to_principal="charlie")
    assert OwnershipTransfer.objects.filter(group=conversation.group).count() == 2


def test_a_transfer_to_oneself_is_refused():
    conversation = ConversationFactory()
    with pytest.raises(IntegrityError, match="transfer_to_someone_else"), transaction.atomic():
        OwnershipTransferFactory(
            conversation=conversation, from_principal="alice", to_principal="alice"
        )


# --- messages --------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["content", "author_name"])
def test_nul_characters_cannot_be_stored_in_text(field):
    message = MessageFactory.build(conversation=ConversationFactory(), **{field: "a\x00b"})
    with pytest.raises(ValidationError) as excinfo:
        message.full_clean()
    assert field in excinfo.value.message_dict
    with pytest.raises((ValueError, DataError)), transaction.atomic():
        message.save()
    assert not Message.objects.exists()


def test_nul_characters_cannot_be_stored_in_metadata():
    conversation = ConversationFactory()
    with pytest.raises(DataError), transaction.atomic():
        MessageFactory(conversation=conversation, metadata={"note": "a\x00b"})
    assert not Message.objects.exists()


def test_metadata_must_be_a_json_object():
    conversation = ConversationFactory()
    with refused(IntegrityError, match="message_metadata_is_object"):
        MessageFactory(conversation=conversation, metadata=["a", "list"])


@pytest.mark.parametrize(
    ("field", "value", "constraint"),
    [
        ("channel", "email", "message_channel_valid"),
        ("role", "robot", "message_role_valid"),
        ("visibility", "public", "message_visibility_valid"),
        ("content", "", "message_content_not_empty"),
    ],
)
def test_messages_with_invalid_values_are_refused(field, value, constraint):
    conversation = ConversationFactory()
    with pytest.raises(IntegrityError, match=constraint), transaction.atomic():
        MessageFactory(conversation=conversation, **{field: value})


def test_an_embedding_needs_its_model():
    message = MessageFactory()
    message.embedding = [0.1] * 384
    with refused(IntegrityError, match="message_embedding_has_model"):
        message.save(update_fields=["embedding"])


def test_seq_is_one_global_increasing_order():
    first, second = ConversationFactory(), ConversationFactory()
    messages = [MessageFactory(conversation=c) for c in (first, second, first, second)]
    seqs = [m.seq for m in messages]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == 4
    assert [m.seq for m in Message.objects.order_by("seq")] == seqs


def test_the_full_text_vector_covers_speaker_and_content():
    message = MessageFactory(author_name="Caroline", content="I adopted two running dogs")
    stored = Message.objects.get(pk=message.pk)
    assert "'carolin'" in stored.search_vector
    assert "'dog'" in stored.search_vector
    assert Message.objects.filter(search_vector="caroline dogs").get() == message


# --- conversations and forks -----------------------------------------------------------------


def test_a_fork_point_needs_a_parent_conversation():
    parent_message = MessageFactory()
    with refused(IntegrityError, match="conversation_fork_point_needs_parent"):
        Conversation.objects.create(
            group=parent_message.conversation.group, forked_at_message=parent_message
        )


def test_deleting_a_conversation_deletes_the_forks_below_it():
    root = ConversationFactory()
    shared = MessageFactory(conversation=root)
    fork = ConversationFactory(
        group=root.group, forked_at_conversation=root, forked_at_message=shared
    )
    fork_of_fork = ConversationFactory(group=root.group, forked_at_conversation=fork)
    MessageFactory(conversation=fork_of_fork)
    root.delete()
    assert not Conversation.objects.filter(pk__in=[root.pk, fork.pk, fork_of_fork.pk]).exists()
    assert not Message.objects.exists()


# The columns a migration added to tables every process writes: a process of the release
# before them, still running while the next release's migrations are applied, inserts rows
# without them (review: every new conversation and append was a 500 until it restarted).
ADDED_COLUMNS = [
    ("conversation", "seen_at"),
    ("message", "written_for"),
    ("memory_listing", "scope"),
]


@pytest.mark.parametrize(("table", "column"), ADDED_COLUMNS)
def test_a_column_added_for_new_code_has_a_default_in_the_database(table, column):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_default, is_nullable FROM information_schema.columns"
            " WHERE table_name = %s AND column_name = %s",
            [table, column],
        )
        [(default, nullable)] = cursor.fetchall()
    assert default is not None or nullable == "YES"
