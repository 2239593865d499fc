"""Property-based tests of the user API against its own OpenAPI schema (schemathesis).

The schema is what the WSGI application serves (``/v1/schema``), restricted to the
``/v1/user`` operations, and every operation gets generated requests sent in-process with
alice's bearer token. Each response must not be a 5xx, must have a documented status code
and content type, and must match the documented body schema.

Path ids are mostly random UUIDs (404s); a hook mixes in the ids of a few objects created
before each operation's test, so the success paths (200/201/204), 403 and 409 run too.
"""

import uuid

import pytest
from django.db import transaction
from hypothesis import HealthCheck, settings

from conversations.models import AccessLevel, Membership
from memsvc.tokens import mint_user_token
from tests.factories import (
    ConversationFactory,
    ConversationGroupFactory,
    MembershipFactory,
    MessageFactory,
    OwnershipTransferFactory,
)
from tests.schema_cases import CHECKS, served_schema, with_known_ids

# Requests go through the real WSGI handler, which sends `request_started`/`request_finished`
# and so runs Django's `close_old_connections`. Inside the test transaction that the plain
# `django_db` marker opens, autocommit is off, so Django sees an "unusable" connection and
# closes it: the test's transaction (and its data) is gone and the next query fails. (Django's
# own test client disconnects that signal; schemathesis's WSGI client does not.) With
# `transaction=True` each request commits for real like in production, and pytest-django
# empties the tables after each test, so every operation starts from the same seeded state.
pytestmark = pytest.mark.django_db(transaction=True)

schema = served_schema(r"^/v1/user/")

# Fixed ids, so a run is reproducible down to the requests it sends.
ALICE_CONVERSATION = uuid.UUID("00000000-0000-4000-8000-00000000a001")
ALICE_FIRST_MESSAGE = uuid.UUID("00000000-0000-4000-8000-00000000a011")
ALICE_SECOND_MESSAGE = uuid.UUID("00000000-0000-4000-8000-00000000a012")
BOB_CONVERSATION = uuid.UUID("00000000-0000-4000-8000-00000000b001")  # alice is a reader
BOB_MESSAGE = uuid.UUID("00000000-0000-4000-8000-00000000b011")
TRANSFER_TO_ALICE = uuid.UUID("00000000-0000-4000-8000-00000000c001")
TRANSFER_FROM_ALICE = uuid.UUID("00000000-0000-4000-8000-00000000c002")

KNOWN_IDS = {
    "conversationId": [str(ALICE_CONVERSATION), str(BOB_CONVERSATION)],
    "messageId": [str(ALICE_FIRST_MESSAGE), str(ALICE_SECOND_MESSAGE), str(BOB_MESSAGE)],
    "transferId": [str(TRANSFER_TO_ALICE), str(TRANSFER_FROM_ALICE)],
    "userId": ["alice", "bob", "charlie"],
}


@schema.hook
def flatmap_path_parameters(context, path_parameters):
    """Keep the generated value or swap in the id of a seeded object (or a seeded user)."""
    return with_known_ids(KNOWN_IDS, path_parameters)


@pytest.fixture
def seeded():
    """alice owns a conversation with two messages and offers it to charlie; bob owns one,
    shares it with alice as a reader, and offers another one to alice.

    (The database access comes from the module's `django_db(transaction=True)` mark.)"""
    # One transaction: a group needs its owner's membership when the transaction commits.
    with transaction.atomic():
        alice_conversation = ConversationFactory(
            id=ALICE_CONVERSATION,
            title="Alice's",
            group=ConversationGroupFactory(owner="alice"),
        )
        MessageFactory(id=ALICE_FIRST_MESSAGE, conversation=alice_conversation, content="hello")
        MessageFactory(id=ALICE_SECOND_MESSAGE, conversation=alice_conversation, content="again")
        MembershipFactory(group=alice_conversation.group, principal_id="bob")
        OwnershipTransferFactory(
            id=TRANSFER_FROM_ALICE,
            conversation=alice_conversation,
            from_principal="alice",
            to_principal="charlie",
        )

        bob_conversation = ConversationFactory(
            id=BOB_CONVERSATION, title="Bob's", group=ConversationGroupFactory(owner="bob")
        )
        MessageFactory(
            id=BOB_MESSAGE, conversation=bob_conversation, author_principal="bob", content="hi"
        )
        MembershipFactory(
            group=bob_conversation.group, principal_id="alice", access_level=AccessLevel.READER
        )
        bobs_other = ConversationFactory(
            title="Bob's other", group=ConversationGroupFactory(owner="bob")
        )
        OwnershipTransferFactory(
            id=TRANSFER_TO_ALICE,
            conversation=bobs_other,
            from_principal="bob",
            to_principal="alice",
        )
    assert Membership.objects.filter(principal_id="alice").count() == 2


@pytest.fixture
def alice_headers():
    return {"Authorization": f"Bearer {mint_user_token('alice')}"}


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,  # the same examples on every run and machine
    database=None,  # no example database: nothing from an earlier run changes what runs
    # The seeded data is made once per operation, not once per example: deliberate, the
    # examples share it (a delete makes later examples see 404s, which is fine).
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_the_user_api_conforms_to_its_schema(case, seeded, alice_headers):
    case.call_and_validate(headers=alice_headers, checks=CHECKS)
