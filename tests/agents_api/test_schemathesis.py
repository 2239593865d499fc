"""Property-based tests of the agent API against its own OpenAPI schema (schemathesis), as
``tests/memsvc/test_schemathesis.py`` does for the user API (read it for why the requests
go through the WSGI handler with ``transaction=True``).

Every ``/v1/agent`` operation gets generated requests with an agent's key (read and write,
not impersonate: a generated ``X-On-Behalf-Of`` is then a documented 403). Path ids are
mostly random; a hook mixes in the ids of what the agent keeps (a conversation with
messages, a memory, a memory block, a tool record) so the success paths run too.
"""

import uuid

import pytest
from django.db import transaction
from hypothesis import HealthCheck, settings

from agents_api.models import Memory, ToolRecord, content_hash
from agents_api.services import api_key_create
from tests.factories import (
    AgentFactory,
    ConversationFactory,
    ConversationGroupFactory,
    MembershipFactory,
    MemoryBlockFactory,
    MessageFactory,
)
from tests.schema_cases import CHECKS, served_schema, with_known_ids

pytestmark = pytest.mark.django_db(transaction=True)

schema = served_schema(r"^/v1/agent/")

AGENT = uuid.UUID("00000000-0000-4000-8000-0000000000a9")
CONVERSATION = uuid.UUID("00000000-0000-4000-8000-00000000a901")
MESSAGE = uuid.UUID("00000000-0000-4000-8000-00000000a911")
MEMORY = uuid.UUID("00000000-0000-4000-8000-00000000a921")
TOOL_RECORD = uuid.UUID("00000000-0000-4000-8000-00000000a931")

KNOWN = {
    "conversationId": [str(CONVERSATION)],
    "memoryId": [str(MEMORY)],
    "traceId": [str(TOOL_RECORD)],
    "label": ["human"],
}


@schema.hook
def flatmap_path_parameters(context, path_parameters):
    """Keep the generated value or swap in the id of something the agent keeps."""
    return with_known_ids(KNOWN, path_parameters)


@pytest.fixture
def agent_headers():
    """An agent that writes in a conversation of alice's, with a memory about alice, a block
    and a tool record; its key."""
    with transaction.atomic():
        agent = AgentFactory(id=AGENT)
        conversation = ConversationFactory(
            id=CONVERSATION, group=ConversationGroupFactory(owner="alice")
        )
        MembershipFactory(
            group=conversation.group, principal_id=agent.principal_id, access_level="writer"
        )
        MessageFactory(id=MESSAGE, conversation=conversation, content="Alice likes tea")
        Memory.objects.create(
            id=MEMORY,
            agent=agent,
            user_id="alice",
            content="likes tea",
            content_hash=content_hash("likes tea"),
        )
        MemoryBlockFactory(agent=agent, label="human", value="Alice")
        ToolRecord.objects.create(
            id=TOOL_RECORD, agent=agent, tool_name="search", raw_output={"hits": 1}, summary="1"
        )
        _, key = api_key_create(agent=agent, scopes=["read", "write"])
    return {"Authorization": f"Bearer {key}"}


@schema.parametrize()
@settings(
    max_examples=5,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_the_agent_api_conforms_to_its_schema(case, agent_headers):
    case.call_and_validate(headers=agent_headers, checks=CHECKS)
