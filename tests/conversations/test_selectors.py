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
