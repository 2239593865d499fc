"""A user's memory switch (OpenMemory's "private chat"): while it is off, no API saves a new
memory about them (409) and every memory search about them finds nothing; on again, what
was kept is found again. Each API surface that saves or searches memories is tried."""

import pytest

from agents_api.models import Memory
from agents_api.services import memory_save, memory_setting_update
from memsvc.api.principals import Principal
from tests.agents_api.test_api import agent_conversation, append
from tests.agents_api.test_memory_extraction import MARKER, extractions, llm, turns  # noqa: F401

MEMORIES = "/v1/agent/memories"


def switch(user_id: str, *, on: bool) -> None:
    memory_setting_update(Principal.user(user_id), enabled=on)


@pytest.fixture
def kept(helper):
    agent = helper.agent
    memory, _ = memory_save(
        agent.as_principal(), agent=agent, user_id="alice", content="Alice is allergic to peanuts"
    )
    return memory


def declared_409(*operations: tuple[str, str]) -> list[str]:
    """Those of the (method, path) operations whose OpenAPI does not declare the 409 they
    answer (three did not: review)."""
    from django.test import Client

    paths = Client().get("/v1/schema", HTTP_ACCEPT="application/json").json()["paths"]
    return [f"{m} {p}" for m, p in operations if "409" not in paths[p][m]["responses"]]


def search_contents(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [hit["content"] for hit in response.json()["data"]]


@pytest.mark.django_db
def test_agent_api_saves_are_refused_with_409_and_nothing_written(api, helper, kept):
    switch("alice", on=False)
    before = sorted(Memory.objects.values_list("id", "content", "importance", "tags", "expires_at"))
    single = api.post(MEMORIES, {"content": "Alice likes jazz", "userId": "alice"}, as_=helper)
    assert single.status_code == 409
    assert single.json()["code"] == "conflict"
    repeat = api.post(MEMORIES, {"content": kept.content, "userId": "alice"}, as_=helper)
    assert repeat.status_code == 409  # not even merged into what is kept
    batch = api.post(
        f"{MEMORIES}/batch",
        {"memories": [{"content": "Alice likes jazz"}], "userId": "alice"},
        as_=helper,
    )
    assert batch.status_code == 409
    acting = api.post(MEMORIES, {"content": "Alice likes jazz"}, as_=helper.acting_for("alice"))
    assert acting.status_code == 409
    # Nor is a kept one rewritten, or kept longer.
    changed = api.patch(
        f"{MEMORIES}/{kept.id}",
        {"content": "Alice lives at 5 Elm St", "expiresAt": "2099-01-01T00:00:00Z"},
        as_=helper,
    )
    assert changed.status_code == 409
    assert changed.json()["code"] == "conflict"
    assert (
        sorted(Memory.objects.values_list("id", "content", "importance", "tags", "expires_at"))
        == before
    )
    # Other users and the agent's own memory are not affected.
    assert (
        api.post(MEMORIES, {"content": "Bob likes jazz", "userId": "bob"}, as_=helper).status_code
        == 201
    )
    assert api.post(MEMORIES, {"content": "I like jazz"}, as_=helper).status_code == 201
    assert (
        declared_409(
            ("post", MEMORIES), ("post", f"{MEMORIES}/batch"), ("patch", f"{MEMORIES}/{{memoryId}}")
        )
        == []
    )


@pytest.mark.django_db
def test_searches_about_the_user_find_nothing_until_memory_is_on_again(api, helper, alice, kept):
    query = {"query": "what is Alice allergic to?", "userId": "alice"}
    assert search_contents(api.post(f"{MEMORIES}/search", query, as_=helper)) == [kept.content]

    switch("alice", on=False)
    assert search_contents(api.post(f"{MEMORIES}/search", query, as_=helper)) == []
    acting = api.post(
        f"{MEMORIES}/search", {"query": query["query"]}, as_=helper.acting_for("alice")
    )
    assert search_contents(acting) == []
    mine = api.post("/v1/user/memories/search", {"query": "peanuts"}, as_=alice)
    assert search_contents(mine) == []
    # What was kept stays for the user to see and delete.
    assert [m["content"] for m in api.get("/v1/user/memories", as_=alice).json()["data"]] == [
        kept.content
    ]

    switch("alice", on=True)
    assert search_contents(api.post(f"{MEMORIES}/search", query, as_=helper)) == [kept.content]


@pytest.mark.django_db
def test_an_agents_context_carries_no_memories_of_a_user_who_turned_memory_off(api, helper, kept):
    conversation = agent_conversation(api, helper.acting_for("alice"))
    append(
        api, helper, conversation["id"], {"role": "user", "content": "Am I allergic to peanuts?"}
    )
    path = f"/v1/agent/conversations/{conversation['id']}/context"
    assert [m["content"] for m in api.get(path, as_=helper, memories="5").json()["memories"]] == [
        kept.content
    ]
    switch("alice", on=False)
    assert api.get(path, as_=helper, memories="5").json()["memories"] == []


@pytest.mark.django_db(transaction=True)
def test_a_private_chat_is_never_distilled_not_even_after_memory_is_on_again(
    api,
    helper,
    llm,  # noqa: F811
):
    conversation = agent_conversation(api, helper.acting_for("alice"))["id"]
    switch("alice", on=False)
    turns(api, helper, conversation, range(1, 6))
    assert extractions(llm) == []
    switch("alice", on=True)
    turns(api, helper, conversation, range(6, 10))
    assert extractions(llm) == []  # turns 1-5 were the private chat's, not counted again
    assert not Memory.objects.exists()


@pytest.mark.django_db
def test_agents_write_no_memory_block_about_a_user_who_turned_memory_off(api, helper):
    """(A block about her was still made and changed: through the agent API, and by MCP's
    append, which makes a block of a new label.)"""
    from agents_api.mcp_server.tools import Caller, _memory_block_append
    from agents_api.models import MemoryBlock
    from agents_api.services import memory_block_create
    from memsvc.api.errors import Conflict
    from tests.pages.conftest import login

    agent = helper.agent
    block = memory_block_create(
        agent.as_principal(), agent=agent, user_id="alice", label="human", value="Alice"
    )
    switch("alice", on=False)
    as_alice = helper.acting_for("alice")
    made = api.post("/v1/agent/memory-blocks", {"label": "likes", "value": "jazz"}, as_=as_alice)
    assert made.status_code == 409 and made.json()["code"] == "conflict"
    changed = api.patch("/v1/agent/memory-blocks/human", {"append": "likes jazz"}, as_=as_alice)
    assert changed.status_code == 409
    replaced = api.call("PUT", "/v1/agent/memory-blocks/human", as_alice, {"value": "jazz"})
    assert replaced.status_code == 409
    blocks = "/v1/agent/memory-blocks"
    assert (
        declared_409(
            ("post", blocks), ("patch", f"{blocks}/{{label}}"), ("put", f"{blocks}/{{label}}")
        )
        == []
    )
    mcp = Caller(agent.as_principal(on_behalf_of="alice"), agent)
    with pytest.raises(Conflict, match="turned memory off"):
        _memory_block_append(mcp, {"label": "likes", "text": "jazz"})
    assert list(MemoryBlock.objects.values_list("label", "value")) == [("human", "Alice")]
    # The agent's own blocks are not hers; and she may still edit (or empty) her own.
    assert (
        api.post("/v1/agent/memory-blocks", {"label": "mine", "value": "x"}, as_=helper).status_code
        == 201
    )
    alice_page = login("alice")
    page = alice_page.post(f"/app/memory/{agent.id}/blocks", {"label": "human", "value": ""})
    assert page.status_code == 302
    block.refresh_from_db()
    assert block.value == ""


SETTING = "/v1/user/memory-setting"


@pytest.mark.django_db
def test_a_user_turns_the_switch_through_the_user_api_as_the_pages_do(api, helper, alice):
    """It was the pages' alone: a chat frontend of its own, with the user's JWT, could not
    turn agents' memory of its user off (review)."""
    assert api.get(SETTING, as_=alice).json() == {"memoryEnabled": True, "updatedAt": None}
    turned = api.put(SETTING, {"memoryEnabled": False}, as_=alice)
    assert turned.status_code == 200, turned.content
    assert turned.json()["memoryEnabled"] is False and turned.json()["updatedAt"]
    assert api.get(SETTING, as_=alice).json() == turned.json()
    refused = api.post(MEMORIES, {"content": "Alice likes jazz", "userId": "alice"}, as_=helper)
    assert refused.status_code == 409
    assert api.put(SETTING, {"memoryEnabled": True}, as_=alice).json()["memoryEnabled"] is True
    saved = api.post(MEMORIES, {"content": "Alice likes jazz", "userId": "alice"}, as_=helper)
    assert saved.status_code == 201
    # Bad input changes nothing; an agent's key is no user's.
    for body in [{}, {"memoryEnabled": "off"}, {"memoryEnabled": None}, {"enabled": False}]:
        assert api.put(SETTING, body, as_=alice).status_code == 400, body
    assert api.get(SETTING, as_=alice).json()["memoryEnabled"] is True
    assert api.put(SETTING, {"memoryEnabled": False}, as_=helper).status_code == 401
    assert api.get(SETTING, as_=alice).json()["memoryEnabled"] is True
