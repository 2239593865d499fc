"""Membership changes of one group are serialised by the group's row lock."""

import threading

import pytest
from django.db import connection, transaction

from conversations import selectors, services
from conversations.models import Membership
from memsvc.api.errors import Forbidden, NotFound
from memsvc.api.principals import Principal
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
