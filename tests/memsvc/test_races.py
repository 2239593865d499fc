"""A change racing the deletion of what it changes: the request that reads the row before
the deletion commits and writes after it answers 404, never a 500 (issue 15, item 8).

The deletion runs in a transaction of its own, held open while the PATCH arrives, so the
PATCH finds the row when it checks access and waits on its lock; the deletion then commits.
"""

import pytest

from agents_api.models import Agent, ApiKey, Memory, MemoryBlock
from agents_api.services import agent_delete, api_key_create
from conversations.models import ConversationGroup, Membership
from conversations.services import conversation_create
from memsvc.api.errors import NotFound
from memsvc.api.principals import Principal
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


def while_its_agent_is_deleted(api, path: str, body: dict):
    """``POST path`` by an agent's key while the agent's deletion waits to commit."""
    credential = make_agent("racer")
    return while_held(
        lambda: agent_delete(Principal.user("ops"), agent=credential.agent),
        lambda: api.post(path, body, as_=credential),
    )


def test_a_conversation_an_agent_makes_while_it_is_deleted_is_refused(api):
    """The create waits for the deletion, then finds the agent gone: 404, nothing made. (It
    was made, owned by an agent that was no more: review.)"""
    response = while_its_agent_is_deleted(api, "/v1/agent/conversations", {"title": "Mine"})
    assert response.status_code == 404, response.content
    assert response.json()["error"] == "agent not found"
    assert not Membership.objects.exists() and not ConversationGroup.objects.exists()


def test_an_agent_deleted_while_it_makes_a_conversation_takes_it_along():
    """The other order: the deletion waits for the create, then deletes what it made."""
    agent = make_agent("racer").agent
    while_held(
        lambda: conversation_create(agent.as_principal(), title="Mine"),
        lambda: agent_delete(Principal.user("ops"), agent=agent),
    )
    assert not Agent.objects.exists()
    assert not Membership.objects.exists() and not ConversationGroup.objects.exists()


def test_a_share_with_an_agent_being_deleted_is_refused(api, alice):
    conversation = api.post("/v1/user/conversations", {"title": "t"}, as_=alice).json()
    agent = make_agent("racer").agent
    body = {"userId": agent.principal_id, "accessLevel": "writer"}
    response = while_held(
        lambda: agent_delete(Principal.user("ops"), agent=agent),
        lambda: api.post(
            f"/v1/user/conversations/{conversation['id']}/memberships", body, as_=alice
        ),
    )
    assert response.status_code == 404, response.content
    assert list(Membership.objects.values_list("principal_id", flat=True)) == ["alice"]


def test_a_memory_saved_while_its_agent_is_deleted_is_404(api):
    """The save checked its agent before the deletion committed and wrote after it: the
    memory's foreign key failed at commit, a 500 (review). Any write whose row was deleted
    meanwhile answers so."""
    response = while_its_agent_is_deleted(api, "/v1/agent/memories", {"content": "I like tea"})
    assert response.status_code == 404, response.content
    assert response.json()["error"] == "what this request refers to was deleted meanwhile"
    assert not Memory.objects.exists()


def test_a_key_made_while_its_agent_is_deleted_is_refused():
    """(Its foreign key failed at commit: ``memsvc apikey create`` showed a traceback.)"""
    agent = make_agent("racer").agent
    refused = while_held(
        lambda: agent_delete(Principal.user("ops"), agent=agent),
        lambda: refusal_of(lambda: api_key_create(agent=agent)),
    )
    assert isinstance(refused, NotFound) and refused.message == "agent not found"
    assert not ApiKey.objects.exists()


def refusal_of(call):
    try:
        call()
    except NotFound as exc:
        return exc
    return None
