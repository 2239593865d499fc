"""Selectors that other apps build on."""

import pytest

from conversations.models import AccessLevel
from conversations.selectors import conversations_visible_to, visible_conversation_ids
from memsvc.api.principals import Principal
from tests.factories import ConversationFactory, ConversationGroupFactory, MembershipFactory

pytestmark = pytest.mark.django_db


def test_the_visible_ids_are_the_visible_conversations():
    agent = Principal.for_agent("0b7f6e1c-0000-4000-8000-000000000001")
    alice_only = ConversationFactory(group=ConversationGroupFactory(owner="alice"))
    shared = ConversationFactory(group=ConversationGroupFactory(owner="alice"))
    MembershipFactory(group=shared.group, principal_id=agent.id, access_level=AccessLevel.WRITER)
    agent_only = ConversationFactory(group=ConversationGroupFactory(owner="bob"))
    MembershipFactory(group=agent_only.group, principal_id=agent.id)
    ConversationFactory(group=ConversationGroupFactory(owner="carol"))
    cases = {
        Principal.user("alice"): {alice_only.id, shared.id},
        agent: {shared.id, agent_only.id},
        # Acting for alice, the agent needs both memberships.
        Principal.for_agent(agent.agent_id, on_behalf_of="alice"): {shared.id},
        Principal.user("stranger"): set(),
    }
    for principal, expected in cases.items():
        ids = set(visible_conversation_ids(principal).values_list("id", flat=True))
        assert ids == expected, principal
        assert ids == set(conversations_visible_to(principal).values_list("id", flat=True))


@pytest.mark.django_db
def test_a_conversations_view_is_a_condition_a_subquery_may_hold():
    """``conversation_messages`` inside another query's ``Exists``: the view's condition
    named its columns in the outer query (a ``FieldError``: code review)."""
    from django.db.models import Exists, OuterRef

    from conversations.models import Conversation
    from conversations.selectors import conversation_messages
    from tests.factories import MessageFactory

    talked = MessageFactory(content="hello").conversation
    quiet = ConversationFactory()
    holding = Conversation.objects.filter(
        Exists(conversation_messages(talked).filter(conversation_id=OuterRef("pk")))
    )
    assert list(holding) == [talked] and quiet not in holding


@pytest.mark.django_db
def test_titles_are_read_of_the_conversations_the_principal_sees_only():
    from conversations.selectors import conversation_titles

    mine = ConversationFactory(group__owner="alice", title="Mine")
    theirs = ConversationFactory(group__owner="bob", title="Bob's")
    assert conversation_titles(Principal.user("alice"), [mine.id, theirs.id]) == {mine.id: "Mine"}
