"""A change racing the deletion of what it changes: the request that reads the row before
the deletion commits and writes after it answers 404, never a 500 (issue 15, item 8).

The deletion runs in a transaction of its own, held open while the PATCH arrives, so the
PATCH finds the row when it checks access and waits on its lock; the deletion then commits.
"""

import pytest

from agents_api.models import Agent, Memory, MemoryBlock
from conversations.models import ConversationGroup
from tests.agents_api.conftest import make_agent
from tests.db import while_held

pytestmark = pytest.mark.django_db(transaction=True)


def delete_while_patching(api, patch, delete) -> object:
    """``patch()`` (a request) while ``delete()`` runs in another transaction that commits
    only once the request is waiting for the row."""
    return while_held(delete, patch)


def test_a_conversation_patch_racing_its_delete_is_404(api, alice):
    conversation = api.post("/v1/user/conversations", {"title": "t"}, as_=alice).json()
    response = delete_while_patching(
        api,
        lambda: api.patch(
            f"/v1/user/conversations/{conversation['id']}", {"title": "x"}, as_=alice
        ),
        lambda: ConversationGroup.objects.filter(pk=conversation["conversationGroupId"]).delete(),
    )
    assert response.status_code == 404, response.content
    assert response.json()["code"] == "not_found"


@pytest.mark.parametrize("method", ["patch", "put"])
def test_a_memory_block_change_racing_its_delete_is_404(api, method):
    helper = make_agent("racer")
    assert api.post("/v1/agent/memory-blocks", {"label": "notes"}, as_=helper).status_code == 201
    body = {"append": "more"} if method == "patch" else {"value": "new"}
    response = delete_while_patching(
        api,
        lambda: api.call(method.upper(), "/v1/agent/memory-blocks/notes", as_=helper, body=body),
        lambda: MemoryBlock.objects.filter(label="notes").delete(),
    )
    assert response.status_code == 404, response.content


def test_a_memory_patch_racing_its_delete_is_404(api):
    helper = make_agent("racer")
    created = api.post("/v1/agent/memories", {"content": "likes tea"}, as_=helper)
    assert created.status_code == 201, created.content
    memory_id = created.json()["id"]
    response = delete_while_patching(
        api,
        lambda: api.patch(f"/v1/agent/memories/{memory_id}", {"tags": ["x"]}, as_=helper),
        lambda: Memory.objects.filter(pk=memory_id).delete(),
    )
    assert response.status_code == 404, response.content


def test_a_letta_capture_racing_its_agents_delete_is_404(api):
    helper = make_agent("racer")
    body = {"name": "travel", "memory_blocks": [], "tags": ["agentic-learning-sdk"]}
    created = api.post("/v1/agents/", body, as_=helper)
    assert created.status_code == 200, created.content
    agent_id = created.json()["id"]
    response = delete_while_patching(
        api,
        lambda: api.post(
            f"/v1/agents/{agent_id}/messages/capture",
            {
                "provider": "openai",
                "model": "gpt-test",
                "request_messages": [{"role": "user", "content": "hello"}],
                "response_dict": {"role": "assistant", "content": "hi"},
            },
            as_=helper,
        ),
        lambda: Agent.objects.filter(pk=agent_id.removeprefix("agent-")).delete(),
    )
    assert response.status_code == 404, response.content
