"""A user's data rights: ``GET /v1/user/export`` and ``POST /v1/user/erase``.

alice owns a conversation bob writes in; bob owns one alice writes in, with a fork bob made
at alice's message and a transfer he offered her; charlie is a stranger with data of his
own; an agent keeps memories and blocks about alice and bob.
"""

import json
import threading
import tracemalloc
import uuid
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction
from django.db.models import Q
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from agents_api.models import (
    Agent,
    Memory,
    MemoryBlock,
    MemoryBlockRevision,
    ToolRecord,
    UserErasure,
    UserMemorySetting,
)
from agents_api.portability.export import agent_header, document_chunks
from agents_api.portability.importing import document_import
from agents_api.portability.records import NUMBER_MAX
from agents_api.portability.sections import AGENT_SECTIONS
from agents_api.selectors import memory_off_for
from agents_api.services import (
    NewToolRecord,
    api_key_create,
    memories,
    memory_block_create,
    memory_block_update,
    memory_save,
    memory_setting_update,
    tool_records_create,
    user_erase,
)
from conversations import selectors
from conversations.models import (
    Conversation,
    ConversationGroup,
    Membership,
    Message,
    OwnershipTransfer,
)
from conversations.selectors import access_conversation, messages_elsewhere
from conversations.services import (
    NewMessage,
    conversation_create,
    conversation_delete,
    conversation_fork,
    membership_create,
    message_append,
    messages_append,
    ownership_transfer_accept,
    ownership_transfer_start,
)
from memsvc import cli
from memsvc.api.errors import NotFound
from memsvc.api.parsers import MAX_JSON_DEPTH
from memsvc.api.principals import Principal
from search.services import embed_pending
from tests.agents_api.conftest import AgentCredential, make_agent
from tests.conftest import Persona
from tests.db import recorded_statements, while_held
from tests.factories import AgentFactory, ConversationFactory, messages_inserted

pytestmark = pytest.mark.django_db


def call(api, method, path, as_, body=None, status=200):
    response = api.call(method, path, as_=as_, body=body)
    assert response.status_code == status, response.content[:500]
    return response.json() if response.content else None


def export(api, user) -> dict:
    response = api.get("/v1/user/export", as_=user)
    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Type"] == "application/json"
    assert "no-store" in response["Cache-Control"]  # (kept by no browser or proxy: review)
    return json.loads(b"".join(response.streaming_content))


@pytest.fixture
def world():
    """Built with the services the API calls (the API's own tests are elsewhere): about 20
    requests a test through the API were most of this module's time."""
    as_alice, as_bob = Principal.user("alice"), Principal.user("bob")

    def say(who, conversation, content):
        return message_append(who, conversation=conversation, content=content)

    def share(who, conversation, principal_id):
        membership_create(
            who, conversation=conversation, principal_id=principal_id, access_level="writer"
        )

    ours = conversation_create(as_alice, title="Alice's plans")
    say(as_alice, ours, "Alice plans a trip to Zanzibar")
    share(as_alice, ours, "bob")
    say(as_bob, ours, "Bob likes the Zanzibar idea")

    his = conversation_create(as_bob, title="Bob's diary")
    say(as_bob, his, "Bob keeps a quokka diary")
    share(as_bob, his, "alice")
    hers = say(as_alice, his, "Alice hums xylophone tunes")
    reply = say(as_bob, his, "Bob answers about quokkas")
    fork = conversation_fork(as_bob, conversation=his, message=reply, title="Bob's fork")
    say(as_bob, fork, "Bob goes on in his fork")
    offered = conversation_create(as_bob, title="Bob's gift")
    ownership_transfer_start(as_bob, conversation=offered, to_principal="alice")

    strangers = conversation_create(Principal.user("charlie"), title="Charlie's notes")
    say(Principal.user("charlie"), strangers, "Charlie writes alone")

    agent = AgentFactory()
    actor = agent.as_principal()
    memory_save(actor, agent=agent, user_id="alice", content="Alice is allergic to nuts")
    memory_save(actor, agent=agent, user_id="bob", content="Bob runs marathons")
    memory_save(actor, agent=agent, content="The agent speaks French")
    block = memory_block_create(actor, agent=agent, user_id="alice", label="human", value="A")
    memory_block_update(actor, block=block, append="likes tea")
    memory_block_create(actor, agent=agent, user_id="bob", label="human", value="B")
    hotels = NewToolRecord(
        tool_name="search_hotels",
        raw_input={"city": "Lisbon"},
        raw_output={"results": [{"id": "htl-001", "price": 120}]},
        task_id="trip",
        step=1,
        conversation=his,
    )
    nothing = NewToolRecord(tool_name="ping", raw_output=None, summary="No answer")
    tool_records_create(actor, agent=agent, records=[hotels, nothing])
    embed_pending()
    return SimpleNamespace(
        ours=str(ours.id),
        his=str(his.id),
        hers=str(hers.id),
        fork=str(fork.id),
        offered=str(offered.id),
        agent=agent,
    )


def state_of_others() -> dict:
    """Everything in the database that is not alice's: what her erase must leave as it was
    but for her messages in bob's conversation (and the fork point of bob's fork)."""
    hers = Membership.objects.filter(principal_id="alice", access_level="owner").values("group_id")
    return {
        "conversations": sorted(
            Conversation.objects.exclude(group_id__in=hers).values_list(
                "id", "title", "metadata", "updated_at", "forked_at_conversation_id"
            )
        ),
        "messages": sorted(
            Message.objects.exclude(conversation__group_id__in=hers)
            .exclude(author_principal="alice")
            .values_list("id", "seq", "content", "embedded_at", "parent_message_id")
        ),
        "memberships": sorted(
            Membership.objects.exclude(group_id__in=hers)
            .exclude(principal_id="alice")
            .values_list("group_id", "principal_id", "access_level")
        ),
        "transfers": sorted(
            OwnershipTransfer.objects.exclude(group_id__in=hers)
            .exclude(from_principal="alice")
            .exclude(to_principal="alice")
            .values_list("id", "status")
        ),
        "memories": sorted(Memory.objects.exclude(user_id="alice").values_list("id", "content")),
        "blocks": sorted(MemoryBlock.objects.exclude(user_id="alice").values_list("id", "value")),
        "revisions": sorted(
            MemoryBlockRevision.objects.exclude(block__user_id="alice").values_list("id", "value")
        ),
    }


def contents(records) -> list[str]:
    return [record["content"] for record in records]


# --- export ----------------------------------------------------------------------------------


def test_the_export_holds_everything_kept_about_the_user(api, alice, world):
    document = export(api, alice)
    assert document["format"] == "memsvc-export" and document["kind"] == "user"
    assert document["userId"] == "alice"
    assert [c["id"] for c in document["conversations"]] == [world.ours]
    assert contents(document["messages"]) == [
        "Alice plans a trip to Zanzibar",
        "Bob likes the Zanzibar idea",  # her conversation's, whoever wrote them
    ]
    assert {(m["userId"], m["accessLevel"]) for m in document["memberships"]} == {
        ("alice", "owner"),
        ("bob", "writer"),
    }
    [elsewhere] = document["membershipsElsewhere"]
    assert (elsewhere["conversationId"], elsewhere["accessLevel"]) == (world.his, "writer")
    assert contents(document["messagesElsewhere"]) == ["Alice hums xylophone tunes"]
    [offer] = document["ownershipTransfersElsewhere"]
    assert (offer["conversationId"], offer["toUserId"], offer["status"]) == (
        world.offered,
        "alice",
        "pending",
    )
    assert contents(document["memories"]) == ["Alice is allergic to nuts"]
    [block] = document["memoryBlocks"]
    assert (block["agentId"], block["userId"], block["value"]) == (
        str(world.agent.id),
        "alice",
        "A\nlikes tea",
    )
    assert [revision["value"] for revision in block["revisions"]] == ["A", "A\nlikes tea"]


def test_the_export_leaves_out_memories_whose_time_is_up(api, alice, tmp_path, world):
    """An expired memory is gone everywhere (``models.LIVE``: not listed, not found, saved
    anew), the prune only reclaims its row: neither the user's export nor an agent's holds
    it, as neither shows one that was pruned. The erase takes its row too, and counts what
    the export showed."""
    gone, _ = memory_save(
        world.agent.as_principal(), agent=world.agent, user_id="alice", content="Alice had a cold"
    )
    Memory.objects.filter(pk=gone.pk).update(expires_at=timezone.now())
    assert contents(export(api, alice)["memories"]) == ["Alice is allergic to nuts"]
    agents = cli_export(tmp_path, "agent", "agent", str(world.agent.id))
    assert "Alice had a cold" not in contents(agents["memories"])
    assert call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})["memories"] == 1
    assert not Memory.objects.filter(pk=gone.pk).exists()


def test_the_export_of_someone_else_is_impossible(api, alice, bob, charlie, helper, world):
    text = json.dumps(export(api, charlie))
    for theirs in ("Zanzibar", "xylophone", "quokka", "nuts", "marathons", "alice", "bob"):
        assert theirs not in text
    # No parameter reaches another user's data: the token's user is the only subject (one
    # it does not take is refused).
    response = api.get("/v1/user/export", as_=charlie, userId="alice")
    assert response.status_code == 400 and "userId" in response.json()["details"]
    # bob's export has his message in alice's conversation, not hers.
    bobs = export(api, bob)
    assert contents(bobs["messagesElsewhere"]) == ["Bob likes the Zanzibar idea"]
    assert "Alice plans" not in json.dumps(bobs)
    assert contents(bobs["memories"]) == ["Bob runs marathons"]
    # Only a user's own token: no token, or an agent's key, is refused.
    assert api.get("/v1/user/export").status_code == 401
    assert api.post("/v1/user/erase", {"confirm": "alice"}).status_code == 401
    for_alice = helper.acting_for("alice")  # even with the impersonate scope
    assert api.get("/v1/user/export", as_=for_alice).status_code == 401
    assert api.post("/v1/user/erase", {"confirm": "alice"}, as_=for_alice).status_code == 401
    assert Memory.objects.filter(user_id="alice").exists()


def test_the_export_is_streamed_a_batch_at_a_time(api, alice, world):
    """10,000 messages are written a batch at a time, never as one string."""
    conversation = Conversation.objects.get(id=world.ours)
    content = "message number {n} " + "x" * 200
    messages_inserted(conversation, 10_000, content, author_principal="alice", author_name="alice")
    response = api.get("/v1/user/export", as_=alice)
    assert response.streaming
    tracemalloc.start()
    try:
        sizes = [len(chunk) for chunk in response.streaming_content]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    total = sum(sizes)
    assert total > 2_500_000
    assert len(sizes) >= 20
    assert max(sizes) < total / 10
    # The largest thing held at once is a batch, not the document.
    assert peak < total / 2, (peak, total)


# --- erase -----------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [{"confirm": "bob"}, {"confirm": ""}, {}, {"confirm": 1}])
def test_erase_needs_the_users_own_id_to_confirm(api, alice, world, body):
    before = state_of_others(), export(api, alice)
    response = api.post("/v1/user/erase", body, as_=alice)
    assert response.status_code == 400
    assert response.json()["code"] == "validation_error"
    assert "confirm" in response.json()["details"]
    before[1].pop("exportedAt")
    after = export(api, alice)
    after.pop("exportedAt")
    assert (state_of_others(), after) == before


def test_erase_removes_what_is_kept_about_the_user_and_nothing_of_others(
    api, alice, bob, charlie, world
):
    others = state_of_others()
    charlies = export(api, charlie)
    erased = call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    assert erased == {
        "conversations": 1,
        "messages": 3,  # her conversation's two, and hers in bob's
        "memberships": 2,
        "ownershipTransfers": 1,  # bob's pending offer to her
        "memories": 1,
        "memoryBlocks": 1,
        "toolRecords": 0,  # the agent's, in bob's conversation: not hers
    }
    after = export(api, alice)
    assert all(after[name] == [] for name in after if isinstance(after[name], list))
    assert state_of_others() == others
    charlies_after = export(api, charlie)
    assert {**charlies_after, "exportedAt": None} == {**charlies, "exportedAt": None}

    # bob's conversations read as before, without her message.
    messages = call(api, "GET", f"/v1/user/conversations/{world.his}/messages", bob)["data"]
    assert contents(messages) == ["Bob keeps a quokka diary", "Bob answers about quokkas"]
    # His fork (made at her message) starts at the message before it instead.
    fork = call(api, "GET", f"/v1/user/conversations/{world.fork}/messages", bob)["data"]
    assert contents(fork) == ["Bob keeps a quokka diary", "Bob goes on in his fork"]
    # She reaches none of it any more; bob's offer to her is gone.
    assert api.get(f"/v1/user/conversations/{world.his}", as_=alice).status_code == 404
    assert call(api, "GET", "/v1/user/ownership-transfers", bob)["data"] == []
    # What she owned is gone for bob too (it was hers).
    assert api.get(f"/v1/user/conversations/{world.ours}", as_=bob).status_code == 404


def test_erase_removes_the_users_login_to_the_pages_and_no_operators(api, alice, bob):
    """Their login (name and password hash) outlived the erase, and went on opening the
    pages (outside review). An operator's staff account is the admin's to remove."""
    User = get_user_model()
    User.objects.create_user("alice", password="a long passphrase")
    User.objects.create_user("bob", password="a long passphrase", is_staff=True)
    User.objects.create_user("carol", password="a long passphrase")
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    call(api, "POST", "/v1/user/erase", bob, {"confirm": "bob"})
    assert sorted(User.objects.values_list("username", flat=True)) == ["bob", "carol"]


def test_erase_forgets_the_idempotency_keys_the_user_sent_and_no_one_elses(api, alice, bob):
    """A key names what its sender sent (the ids of their messages, a hash of the turn):
    the erased user's go with the rest of what is kept about them."""
    from memsvc.models import IdempotentRequest

    for persona in (alice, bob):
        conversation = call(api, "POST", "/v1/user/conversations", persona, {}, status=201)
        path = f"/v1/user/conversations/{conversation['id']}/messages"
        sent = api.post(path, {"content": "hi"}, as_=persona, headers={"HTTP_IDEMPOTENCY_KEY": "k"})
        assert sent.status_code == 201
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    assert list(IdempotentRequest.objects.values_list("principal_id", flat=True)) == ["bob"]


def test_tool_records_made_for_the_user_or_in_their_conversations_go_with_the_erase(
    api, alice, bob, tmp_path, world, capsys
):
    """A tool record outlives its conversation (deleted: unlinked), but not the erase of the
    user it was made for, nor of the owner of its conversation; the export holds what the
    erase takes (it held only those made for her: the agent's own records of her
    conversation were erased unseen, and an import could not bring them back), and
    ``memsvc import`` puts them back."""
    agent = world.agent
    [for_her], _ = tool_records_create(
        Principal.for_agent(agent.id, on_behalf_of="alice"),
        agent=agent,
        records=[NewToolRecord(tool_name="lookup_allergies", raw_output={"nuts": True})],
    )
    ours = Conversation.objects.get(id=world.ours)
    [in_hers], _ = tool_records_create(
        agent.as_principal(),
        agent=agent,
        records=[
            NewToolRecord(tool_name="book_flight", raw_output={"to": "Zanzibar"}, conversation=ours)
        ],
    )
    [for_bob_in_hers], _ = tool_records_create(
        Principal.for_agent(agent.id, on_behalf_of="bob"),
        agent=agent,
        records=[NewToolRecord(tool_name="rate_idea", raw_output=5, conversation=ours)],
    )
    taken = {for_her.id, in_hers.id, for_bob_in_hers.id}
    others = set(ToolRecord.objects.exclude(id__in=taken).values_list("id"))
    assert len(others) == 2  # the world's: in bob's conversation, and the agent's own

    first = cli_export(tmp_path, "first", "user", "alice")
    exported = {(r["toolName"], r["userId"], r["conversationId"]) for r in first["toolRecords"]}
    assert exported == {
        ("lookup_allergies", "alice", None),
        ("book_flight", None, world.ours),
        ("rate_idea", "bob", world.ours),
    }
    assert {r["id"] for r in export(api, alice)["toolRecords"]} == {str(i) for i in taken}
    assert call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})["toolRecords"] == 3
    assert set(ToolRecord.objects.values_list("id")) == others

    assert cli.main(["import", str(tmp_path / "first.json")]) == 0
    assert "toolRecords: 3" in capsys.readouterr().err
    assert cli_export(tmp_path, "second", "user", "alice") == first


def test_an_agents_records_of_a_conversation_she_deleted_still_go_with_her_erase(api, alice, world):
    """Unlinked when she deleted the conversation, the agent's own records of it were about
    nobody: her export left them out, her erase left them behind (review). They are kept
    about her; one made for bob stays his, one of an agent's own conversation its own."""
    agent = world.agent
    ours = Conversation.objects.get(id=world.ours)
    own = conversation_create(agent.as_principal(), title="The agent's notes")
    [in_hers, in_its_own], _ = tool_records_create(
        agent.as_principal(),
        agent=agent,
        records=[
            NewToolRecord(tool_name="passport", raw_output={"no": "P-123"}, conversation=ours),
            NewToolRecord(tool_name="note", raw_output=1, conversation=own),
        ],
    )
    [for_bob], _ = tool_records_create(
        Principal.for_agent(agent.id, on_behalf_of="bob"),
        agent=agent,
        records=[NewToolRecord(tool_name="rate_idea", raw_output=5, conversation=ours)],
    )
    call(api, "DELETE", f"/v1/user/conversations/{world.ours}", alice, status=204)
    conversation_delete(agent.as_principal(), conversation=own)
    kept = dict(ToolRecord.objects.values_list("id", "user_id"))
    assert (kept[in_hers.id], kept[for_bob.id], kept[in_its_own.id]) == ("alice", "bob", "")
    mine = [in_hers.id, for_bob.id, in_its_own.id]
    assert not ToolRecord.objects.filter(id__in=mine, conversation__isnull=False).exists()
    assert str(in_hers.id) in {r["id"] for r in export(api, alice)["toolRecords"]}
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    left = set(ToolRecord.objects.values_list("id", flat=True))
    assert in_hers.id not in left and {for_bob.id, in_its_own.id} <= left


def test_a_deleted_conversations_records_are_kept_about_its_owner_in_two_updates(world):
    """Its records were loaded, then updated 100 ids a statement (a conversation of 50,000
    memory-bank records: 1,000 statements under the deletion's locks; review)."""
    agent = world.agent
    ours = Conversation.objects.get(id=world.ours)
    new = [
        NewToolRecord(tool_name=f"step_{i}", raw_output=i, conversation=ours) for i in range(100)
    ]
    for _ in range(3):
        tool_records_create(agent.as_principal(), agent=agent, records=new)
    with CaptureQueriesContext(connection) as statements:
        conversation_delete(Principal.user("alice"), conversation=ours)
    writes = [q["sql"] for q in statements if q["sql"].startswith('UPDATE "tool_record"')]
    assert len(writes) == 2, writes
    assert ToolRecord.objects.filter(user_id="alice", conversation=None).count() == 300


@pytest.mark.parametrize("per_statement", [1000, 1])
def test_after_an_erase_no_memory_cites_an_erased_message(
    api, alice, bob, world, per_statement, monkeypatch
):
    """Others' memories (bob's, the agent's own) that cited her turns (hers in bob's
    conversation, and bob's in the conversation she owned: erased with it) cite them no
    more: the memory stays, the turns that stay are still cited, and one whose only
    evidence was erased cites nothing (DESIGN.md's data rights say nothing of it: the fact
    is the agent's, the turns were hers). The memories are rewritten a batch a statement
    (each row about 3 ms: thousands in one statement met the statement timeout)."""
    monkeypatch.setattr(memories, "CITATIONS_FORGOTTEN_PER_STATEMENT", per_statement)
    agent, actor = world.agent, world.agent.as_principal()
    for conversation in (world.ours, world.his):
        group = Conversation.objects.get(id=conversation).group
        Membership.objects.create(
            group=group, principal_id=agent.principal_id, access_level="reader"
        )
    bobs_there = Message.objects.get(conversation_id=world.ours, author_principal="bob").id
    bobs_own = Message.objects.get(content="Bob keeps a quokka diary").id
    hers = uuid.UUID(world.hers)

    def cites(user_id, content, message_ids):
        memory, _ = memory_save(
            actor, agent=agent, user_id=user_id, content=content, message_ids=message_ids
        )
        return memory

    both = cites("bob", "Bob keeps quokkas near a xylophone", [bobs_own, hers])
    only_erased = cites("", "Zanzibar sounds good to Bob", [bobs_there, hers])
    untouched = cites("bob", "Bob writes a diary", [bobs_own])
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})

    cited = dict(Memory.objects.values_list("id", "message_ids"))
    assert (cited[both.id], cited[only_erased.id], cited[untouched.id]) == (
        [bobs_own],
        [],
        [bobs_own],
    )
    erased = {hers, bobs_there}
    assert not any(erased & set(ids) for ids in cited.values())


def test_erase_is_all_or_nothing(api, alice, world):
    """A failure at the last step (a trigger refusing to delete blocks) leaves everything."""
    before = state_of_others(), export(api, alice)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql
            AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$;
            CREATE TRIGGER refuse_block_delete BEFORE DELETE ON memory_block
            FOR EACH ROW EXECUTE FUNCTION refuse();
            """
        )
    with pytest.raises(DatabaseError, match="refused"):
        user_erase(Principal.user("alice"), confirm="alice")
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER refuse_block_delete ON memory_block; DROP FUNCTION refuse()")
    before[1].pop("exportedAt")
    after = export(api, alice)
    after.pop("exportedAt")
    assert (state_of_others(), after) == before


def test_erase_takes_the_user_turns_an_agent_wrote_for_them(api, alice, bob, helper, world):
    """An agent acting for alice in bob's conversation signs her turns with her id."""
    share = {"userId": helper.agent.principal_id, "accessLevel": "writer"}
    call(api, "POST", f"/v1/user/conversations/{world.his}/memberships", bob, share, 201)
    turns = {
        "messages": [
            {"role": "user", "content": "Alice dictates a note"},
            {"role": "assistant", "content": "The agent notes it"},
        ]
    }
    path = f"/v1/agent/conversations/{world.his}/messages"
    call(api, "POST", path, helper.acting_for("alice"), turns, 201)
    assert "Alice dictates a note" in contents(export(api, alice)["messagesElsewhere"])
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    messages = call(api, "GET", f"/v1/user/conversations/{world.his}/messages", bob)["data"]
    assert contents(messages) == [
        "Bob keeps a quokka diary",
        "Bob answers about quokkas",
        "The agent notes it",
    ]


def test_the_turns_an_agent_wrote_for_a_member_stay_theirs_once_they_are_removed(
    api, alice, bob, helper, world
):
    """Found by membership alone, alice's turns that the agent wrote for her in bob's
    conversation left her export, and stayed after her erase, once bob had removed her
    (outside review). A turn the agent signs with the id of someone who is no member is
    not theirs: no one's words come into their export, or go with their erase, by a name."""
    share = {"userId": helper.agent.principal_id, "accessLevel": "writer"}
    call(api, "POST", f"/v1/user/conversations/{world.his}/memberships", bob, share, 201)
    path = f"/v1/agent/conversations/{world.his}/messages"
    hers = {"messages": [{"role": "user", "content": "Alice confides a pomegranate"}]}
    call(api, "POST", path, helper.acting_for("alice"), hers, 201)
    named = {"messages": [{"role": "user", "content": "Named a stranger", "authorName": "dave"}]}
    call(api, "POST", path, helper, named, 201)
    # Nor is a reader's, who could not have written it.
    share = {"userId": "gina", "accessLevel": "reader"}
    call(api, "POST", f"/v1/user/conversations/{world.his}/memberships", bob, share, 201)
    named = {"messages": [{"role": "user", "content": "Named a reader", "authorName": "gina"}]}
    call(api, "POST", path, helper, named, 201)
    assert contents(export(api, Persona("gina"))["messagesElsewhere"]) == []
    call(api, "DELETE", f"/v1/user/conversations/{world.his}/memberships/alice", bob, status=204)

    exported = contents(export(api, alice)["messagesElsewhere"])
    assert "Alice confides a pomegranate" in exported
    assert "Named a stranger" not in contents(export(api, Persona("dave"))["messagesElsewhere"])
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    call(api, "POST", "/v1/user/erase", Persona("dave"), {"confirm": "dave"})
    messages = call(api, "GET", f"/v1/user/conversations/{world.his}/messages", bob)["data"]
    assert "Alice confides a pomegranate" not in contents(messages)
    assert "Named a stranger" in contents(messages)


def test_whose_turns_they_are_and_what_users_saw_last_come_back_with_an_import(
    api, alice, bob, helper
):
    """Re-decided by the members at import, a removed member's turns were no longer hers,
    and a reader named as a turn's author gained it; the conversation's users' time was its
    last hidden turn's (review). Both travel in the document now."""
    carol, dave = Persona("carol"), Persona("dave")
    ours = call(api, "POST", "/v1/agent/conversations", helper.acting_for("alice"), {}, 201)["id"]
    for who in ("carol", "dave"):
        share = {"userId": who, "accessLevel": "writer"}
        call(api, "POST", f"/v1/user/conversations/{ours}/memberships", alice, share, 201)
    path = f"/v1/agent/conversations/{ours}/messages"
    turns = {"messages": [{"role": "user", "content": "Carol confides a kumquat"}]}
    call(api, "POST", path, helper.acting_for("carol"), turns, 201)
    for who in ("carol", "dave"):
        call(api, "DELETE", f"/v1/user/conversations/{ours}/memberships/{who}", alice, status=204)
    share = {"userId": "dave", "accessLevel": "writer"}
    call(api, "POST", f"/v1/user/conversations/{ours}/memberships", alice, share, 201)
    named = {"messages": [{"role": "user", "content": "Dave, named", "authorName": "dave"}]}
    call(api, "POST", path, helper.acting_for("alice"), named, 201)  # alice's agent: not dave's
    hidden = {"role": "agent", "content": "note", "channel": "memory", "visibility": "agent"}
    call(api, "POST", path, helper, {"messages": [hidden]}, 201)
    seen = Conversation.objects.get(id=ours).seen_at
    assert Conversation.objects.get(id=ours).updated_at > seen

    document = export(api, alice)
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    document_import(document)
    assert Conversation.objects.get(id=ours).seen_at == seen
    assert contents(export(api, carol)["messagesElsewhere"]) == ["Carol confides a kumquat"]
    assert contents(export(api, dave)["messagesElsewhere"]) == []


def test_the_users_messages_elsewhere_are_found_without_reading_the_whole_table(
    world, sequences_kept
):
    """An export and an erase find the user's messages through indexes (their own, the
    turns signed for them in their groups): one condition with OR read the whole message
    table (a sequential scan whatever the indexes, 120-230 ms at 300,000 messages). The
    plan is the one for a service holding 5,000 more messages of others, 10 in each of 500
    conversations, every table it reads analysed: the plan depends on this test's rows
    alone. (The 5,000 were one conversation's and the messages alone analysed: with the
    small tables analysed too, by an earlier test or autovacuum, a conversation of 1,000
    messages on average made reading the table whole the better plan, and the test failed
    now and then.)"""
    columns = ", ".join(
        field.column
        for field in Message._meta.concrete_fields
        if field.column not in ("id", "seq") and not getattr(field, "generated", False)
    )
    sql, params = messages_elsewhere("alice").query.sql_with_params()
    copied = ", ".join(f"o.id AS {c}" if c == "conversation_id" else c for c in columns.split(", "))
    tables = "conversation_group, conversation, membership, message"
    with transaction.atomic(), connection.cursor() as cursor:
        others = [ConversationFactory(group__owner="charlie").id for _ in range(500)]
        cursor.execute(
            f"INSERT INTO message (id, {columns}) "  # noqa: S608 (the model's own columns)
            f"SELECT gen_random_uuid(), {copied} FROM message, unnest(%s::uuid[]) AS o(id), "
            "generate_series(1, 10) WHERE content = 'Charlie writes alone'",
            [others],
        )
        cursor.execute(f"ANALYZE {tables}")
        cursor.execute(f"EXPLAIN (COSTS OFF) {sql}", params)
        plan = "\n".join(line for (line,) in cursor.fetchall())
        transaction.set_rollback(True)
    # ANALYZE's row counts outlive a rollback (PostgreSQL writes them in place): counted
    # again without the rows, for the tests after this one.
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {tables}")
    assert "Seq Scan on message" not in plan, plan
    assert "message_author" in plan, plan
    assert "message_written_for" in plan, plan


@pytest.mark.parametrize("hers_first", [False, True])
def test_after_an_erase_an_agents_context_still_goes_on_after_what_its_summary_covers(
    api, alice, bob, helper, hers_first
):
    """bob's agent summarised his conversation up to alice's message: once she is erased,
    the summary covers up to the message before hers (none: nothing), and the context
    still holds bob's later messages, not only the summary."""
    for_bob = helper.acting_for("bob")
    his = call(api, "POST", "/v1/agent/conversations", for_bob, {"title": "Bob's"}, 201)["id"]
    share = {"userId": "alice", "accessLevel": "writer"}
    call(api, "POST", f"/v1/user/conversations/{his}/memberships", bob, share, 201)
    path = f"/v1/agent/conversations/{his}"
    before_hers = None
    if not hers_first:
        first = {"messages": [{"role": "user", "content": "b0"}]}
        before_hers = call(api, "POST", f"{path}/messages", for_bob, first, 201)["data"][0]["id"]
    hers = call(
        api, "POST", f"/v1/user/conversations/{his}/messages", alice, {"content": "a1"}, 201
    )
    later = [{"role": "user", "content": "b2"}, {"role": "assistant", "content": "b3"}]
    call(api, "POST", f"{path}/messages", for_bob, {"messages": later}, 201)
    summary = {
        "title": "t",
        "summary": "S",
        "untilMessageId": hers["id"],
        "summarizedAt": "2026-11-01T10:00:00Z",
    }
    call(api, "POST", f"{path}/summaries", helper, summary, 201)
    assert contents(call(api, "GET", f"{path}/context", helper)["messages"]) == ["S", "b2", "b3"]

    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    after = call(api, "GET", f"{path}/context", helper)["messages"]
    assert contents(after) == ["S", "b2", "b3"]
    assert after[0]["metadata"]["untilMessageId"] == before_hers


@pytest.mark.django_db(transaction=True)
def test_erase_takes_a_message_appended_while_it_runs(api, alice, bob):
    """An append of hers in flight when the erase starts ends first and is erased with the
    rest: her message does not outlive her membership."""
    his = call(api, "POST", "/v1/user/conversations", bob, {"title": "Bob's"}, 201)["id"]
    share = {"userId": "alice", "accessLevel": "writer"}
    call(api, "POST", f"/v1/user/conversations/{his}/memberships", bob, share, 201)

    def appending():
        actor = Principal.user("alice")
        conversation = access_conversation(actor, his, need="writer", summary=False)
        message_append(actor, conversation=conversation, content="Alice's last word")

    erased = while_held(
        appending, lambda: call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    )
    assert (erased["messages"], erased["memberships"]) == (1, 1)
    assert not Message.objects.filter(author_principal="alice").exists()


def written_about_alice(agent, way: str, document: dict | None):
    """What an agent (or, for her switch, alice herself) writes about alice, one way."""
    actor = agent.as_principal()
    if way == "import":  # (of another agent's memory about her)
        return document_import(document, into=agent)
    if way.startswith("memory"):
        return memory_save(actor, agent=agent, user_id="alice", content="Alice is in Lisbon")
    if way == "block":
        return memory_block_create(actor, agent=agent, user_id="alice", label="trip", value="L")
    if way == "block change":
        block = MemoryBlock.objects.get(agent=agent, user_id="alice", label="human")
        return memory_block_update(actor, block=block, append="is in Lisbon")
    if way == "tool record":
        return tool_records_create(
            Principal.for_agent(agent.id, on_behalf_of="alice"),
            agent=agent,
            records=[NewToolRecord(tool_name="locate", raw_output={"city": "Lisbon"})],
        )
    assert way == "her switch"
    return memory_setting_update(Principal.user("alice"), enabled=True)


def before_writing_about_alice(agent, way: str) -> dict | None:
    """What a write needs before it: for an import, its document."""
    if way == "memory, her switch on":  # (a row, which a save locks)
        memory_setting_update(Principal.user("alice"), enabled=True)
    if way == "block change":
        memory_block_create(agent.as_principal(), agent=agent, user_id="alice", label="human")
    if way != "import":
        return None
    source = AgentFactory(name="source")
    memory_save(source.as_principal(), agent=source, user_id="alice", content="Alice is in Lisbon")
    document = json.loads("".join(document_chunks(agent_header(source), AGENT_SECTIONS, source)))
    source.delete()
    # Dated later than any erase: what is older than hers, an import skips (its own test),
    # and this import is to write (set to now, ``not_after_now``), or to be erased.
    document["memories"][0]["createdAt"] = "2999-01-01T00:00:00Z"
    return document


def kept_about_alice() -> dict:
    return {
        "memories": list(Memory.objects.filter(user_id="alice").values_list("content")),
        "blocks": list(MemoryBlock.objects.filter(user_id="alice").values_list("label")),
        "revisions": MemoryBlockRevision.objects.filter(block__user_id="alice").count(),
        "tool records": list(ToolRecord.objects.filter(user_id="alice").values_list("tool_name")),
        "switch": list(UserMemorySetting.objects.filter(user_id="alice").values_list("user_id")),
    }


NOTHING = {"memories": [], "blocks": [], "revisions": 0, "tool records": [], "switch": []}
# What each write keeps when it comes after the erase (none: her block to change is gone).
AFTER_THE_ERASE = {
    "memory": {"memories": [("Alice is in Lisbon",)]},
    "memory, her switch on": {"memories": [("Alice is in Lisbon",)]},
    "block": {"blocks": [("trip",)], "revisions": 1},
    "block change": {},
    "tool record": {"tool records": [("locate",)]},
    "her switch": {"switch": [("alice",)]},
    "import": {"memories": [("Alice is in Lisbon",)]},
}
WRITES = list(AFTER_THE_ERASE)


@pytest.mark.parametrize("way", WRITES)
@pytest.mark.django_db(transaction=True)
def test_erase_waits_for_a_write_about_the_user_in_flight_and_takes_it(api, alice, way):
    """A write about alice (an agent's memory, block, tool record made for her, an import;
    her own switch) has not committed when she erases her data. The erase's deletes could
    not see it, and it committed after them: 200, and the fact about her was still kept (a
    block's change: its new revision was not collected, and the erase failed, a 500). The
    erase waits for the writes about her in flight (``hold_users``), then takes what they
    wrote."""
    agent = AgentFactory()
    document = before_writing_about_alice(agent, way)

    erased = while_held(
        lambda: written_about_alice(agent, way, document),
        lambda: call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"}),
    )
    assert kept_about_alice() == NOTHING
    assert erased["memories"] + erased["memoryBlocks"] + erased["toolRecords"] == (
        0 if way == "her switch" else 1
    )


def not_found_or(write):
    """What ``write()`` returned, or the NotFound it raised: a write that comes after the
    erase may find what it needed gone with the user."""
    try:
        return write()
    except NotFound as exc:
        return exc


@pytest.mark.parametrize("way", WRITES)
@pytest.mark.django_db(transaction=True)
def test_a_write_about_the_user_during_their_erase_waits_and_then_writes(alice, way):
    """The other order: alice's erase has not committed when the write about her comes. It
    waits for the erase (it takes nothing the erase waits for first: no deadlock), then
    writes: a fact kept after her erase is a new one, kept while her memory is on."""
    agent = AgentFactory()
    document = before_writing_about_alice(agent, way)

    written = while_held(
        lambda: user_erase(Principal.user("alice"), confirm="alice"),
        lambda: not_found_or(lambda: written_about_alice(agent, way, document)),
        waits=True,
    )
    if way == "block change":  # (her block went with her erase)
        assert isinstance(written, NotFound), written
    assert kept_about_alice() == NOTHING | AFTER_THE_ERASE[way]


@pytest.mark.django_db(transaction=True)
def test_a_tool_record_that_waited_for_an_erase_is_dated_after_it(monkeypatch):
    """A tool record for alice came as her erase ran, waited for it, then was written, but
    dated as it came: before the erase, and an import of the agent's document left it out
    as kept before it (review). Here her erase commits just as the record's write asks for
    her hold."""
    from agents_api.services import tool_records

    agent = AgentFactory()
    real_hold = tool_records.hold_users

    def erase_first(user_ids, **options):
        def erase():
            try:
                user_erase(Principal.user("alice"), confirm="alice")
            finally:
                connection.close()

        eraser = threading.Thread(target=erase)
        eraser.start()
        eraser.join()
        return real_hold(user_ids, **options)

    monkeypatch.setattr(tool_records, "hold_users", erase_first)
    tool_records_create(
        Principal.for_agent(agent.id, on_behalf_of="alice"),
        agent=agent,
        records=[NewToolRecord(tool_name="locate", raw_output={"city": "Lisbon"})],
    )
    record = ToolRecord.objects.get(user_id="alice")
    assert record.created_at > UserErasure.objects.get(user_id="alice").erased_at


def bobs_conversation_for(way: str, agent) -> Conversation:
    """Bob's conversation, and what a write in it about alice needs before it: her
    membership for her own append and the turns an agent signs with her id (the agent a
    writer there), an offer of ownership for her to accept."""
    bob = Principal.user("bob")
    his = conversation_create(bob, title="Bob's", writer_ids=[agent.as_principal().id])
    if way in {"her append", "her turn, signed by an agent", "ownership accepted"}:
        membership_create(bob, conversation=his, principal_id="alice", access_level="writer")
    if way == "ownership accepted":
        ownership_transfer_start(bob, conversation=his, to_principal="alice")
    return his


def written_in_conversations_about_alice(agent, way: str, his: Conversation):
    """What alice, bob or an agent writes about alice in the conversations app, one way."""
    alice, bob = Principal.user("alice"), Principal.user("bob")
    if way == "her conversation":
        return conversation_create(alice, title="Alice's new")
    if way == "her conversation, made by an agent":
        acting = Principal.for_agent(agent.id, on_behalf_of="alice")
        return conversation_create(acting, title="For Alice", writer_ids=[acting.id])
    if way == "membership":
        return membership_create(bob, conversation=his, principal_id="alice", access_level="reader")
    if way == "ownership offered":
        return ownership_transfer_start(bob, conversation=his, to_principal="alice")
    if way == "ownership accepted":
        transfer = OwnershipTransfer.objects.get(group_id=his.group_id, to_principal="alice")
        return ownership_transfer_accept(alice, transfer=transfer)
    if way == "her append":
        return message_append(alice, conversation=his, content="Alice is in Lisbon")
    assert way == "her turn, signed by an agent"
    return messages_append(
        agent.as_principal(),
        conversation=his,
        messages=[NewMessage(content="Alice is in Lisbon", author_name="alice")],
    )


def kept_in_conversations_about_alice() -> dict:
    return {
        "memberships": list(
            Membership.objects.filter(principal_id="alice").values_list("access_level")
        ),
        "transfers": OwnershipTransfer.objects.filter(
            Q(from_principal="alice") | Q(to_principal="alice")
        ).count(),
        "messages": list(messages_elsewhere("alice").values_list("content")),
    }


NOTHING_IN_CONVERSATIONS = {"memberships": [], "transfers": 0, "messages": []}
# What each write keeps when it comes after the erase (none: her membership, and the
# offer to her, went with her erase).
AFTER_THE_ERASE_IN_CONVERSATIONS = {
    "her conversation": {"memberships": [("owner",)]},
    "her conversation, made by an agent": {"memberships": [("owner",)]},
    "membership": {"memberships": [("reader",)]},
    "ownership offered": {"transfers": 1},
    "ownership accepted": {},
    "her append": {},
    "her turn, signed by an agent": {},
}
CONVERSATION_WRITES = list(AFTER_THE_ERASE_IN_CONVERSATIONS)


@pytest.mark.parametrize("way", CONVERSATION_WRITES)
@pytest.mark.django_db(transaction=True)
def test_erase_waits_for_a_conversation_write_about_the_user_in_flight_and_takes_it(
    api, alice, way
):
    """A write about alice in the conversations app (a conversation of hers, a membership
    or an offer of ownership given to her, her accepting one, a turn of hers) has not
    committed when she erases her data. The erase's deletes could not see the new rows, and
    they committed after them: 200, and she still owned a conversation, was still a member
    of bob's or still had his offer (her accepting it: the erase deleted the owner's
    membership it had just made, a 500). The erase waits for the writes about her in flight
    (``hold_users``), then takes what they wrote. (Her turns, hers or signed with her id by
    an agent, were taken already: they update the conversation's row, which the erase
    locks.)"""
    agent = AgentFactory()
    his = bobs_conversation_for(way, agent)

    while_held(
        lambda: written_in_conversations_about_alice(agent, way, his),
        lambda: call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"}),
    )
    assert kept_in_conversations_about_alice() == NOTHING_IN_CONVERSATIONS
    assert not selectors.groups_owned_by("alice").exists()


@pytest.mark.parametrize("way", CONVERSATION_WRITES)
@pytest.mark.django_db(transaction=True)
def test_a_conversation_write_about_the_user_during_their_erase_waits_and_then_writes(alice, way):
    """The other order: alice's erase has not committed when the write about her comes. It
    waits for the erase (its hold comes before the group's, the conversation's and the
    membership's locks it takes, which the erase takes after its own: no deadlock), then
    writes anew, or finds what it needed gone with her (404)."""
    agent = AgentFactory()
    his = bobs_conversation_for(way, agent)

    written = while_held(
        lambda: user_erase(Principal.user("alice"), confirm="alice"),
        lambda: not_found_or(lambda: written_in_conversations_about_alice(agent, way, his)),
        waits=True,
    )
    if way in {"ownership accepted", "her append"}:  # (her membership went with her erase)
        assert isinstance(written, NotFound), written
    expected = NOTHING_IN_CONVERSATIONS | AFTER_THE_ERASE_IN_CONVERSATIONS[way]
    assert kept_in_conversations_about_alice() == expected


def test_a_write_holds_the_user_it_is_about_in_one_statement_and_its_own_not_at_all():
    """The hold a write takes against its user's erase costs one statement; an agent's own
    memory is about no user, and never waits for an erase."""
    agent = AgentFactory()
    actor = agent.as_principal()

    def holds(write) -> list:
        with recorded_statements() as sent:
            write()
        return [sql for sql in sent if "pg_advisory_xact_lock_shared" in sql]

    assert len(holds(lambda: memory_save(actor, agent=agent, user_id="alice", content="A"))) == 1
    assert holds(lambda: memory_save(actor, agent=agent, content="The agent speaks French")) == []
    assert holds(lambda: memory_block_create(actor, agent=agent, label="persona")) == []


def test_a_conversation_write_holds_the_users_it_is_about_in_one_statement_and_agents_not():
    """Each conversation write about users holds them in one statement; one about agents
    only (an agent's own conversation, an agent given access) never waits for an erase."""
    agent = AgentFactory()
    alice, bob = Principal.user("alice"), Principal.user("bob")

    def holds(write) -> list:
        with recorded_statements() as sent:
            write()
        return [sql for sql in sent if "pg_advisory_xact_lock_shared" in sql]

    his = conversation_create(bob, title="Bob's")
    for write in [
        lambda: conversation_create(alice, title="Alice's", writer_ids=[agent.as_principal().id]),
        lambda: membership_create(
            bob, conversation=his, principal_id="alice", access_level="reader"
        ),
        lambda: ownership_transfer_start(bob, conversation=his, to_principal="alice"),
        lambda: ownership_transfer_accept(alice, transfer=OwnershipTransfer.objects.get()),
    ]:
        assert len(holds(write)) == 1
    assert holds(lambda: conversation_create(agent.as_principal(), title="Its own")) == []
    assert (
        holds(
            lambda: membership_create(
                alice, conversation=his, principal_id=agent.as_principal().id, access_level="writer"
            )
        )
        == []
    )


# --- memsvc export / memsvc import -----------------------------------------------------------


def cli_export(tmp_path, name: str, *args) -> dict:
    path = tmp_path / f"{name}.json"
    assert cli.main(["export", *args, "-o", str(path)]) == 0
    document = json.loads(path.read_text(encoding="utf-8"))
    document.pop("exportedAt")
    return document


def test_a_user_round_trip_export_erase_import_gives_the_same_export(
    api, alice, bob, tmp_path, world, capsys
):
    first = cli_export(tmp_path, "first", "user", "alice")
    over_http = export(api, alice)
    over_http.pop("exportedAt")
    assert first == over_http

    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    assert uuid.UUID(world.ours) in UserErasure.objects.get(user_id="alice").conversation_ids
    assert cli.main(["import", str(tmp_path / "first.json")]) == 0
    assert "messagesElsewhere: 1" in capsys.readouterr().err
    assert cli_export(tmp_path, "second", "user", "alice") == first
    # What her document brought back is no longer of what her erase took (a record made
    # in it after, kept unlinked when it is deleted, was left out of imports; review).
    assert UserErasure.objects.get(user_id="alice").conversation_ids == []

    # Her message is back in its place in bob's conversation, and her conversation works.
    messages = call(api, "GET", f"/v1/user/conversations/{world.his}/messages", bob)["data"]
    assert contents(messages) == [
        "Bob keeps a quokka diary",
        "Alice hums xylophone tunes",
        "Bob answers about quokkas",
    ]
    ours = call(api, "GET", f"/v1/user/conversations/{world.ours}", bob)
    assert ours["ownerUserId"] == "alice" and ours["accessLevel"] == "writer"
    call(
        api,
        "POST",
        f"/v1/user/conversations/{world.ours}/messages",
        alice,
        {"content": "Again"},
        201,
    )

    # The same document again collides with what is stored: nothing is imported.
    before = cli_export(tmp_path, "third", "user", "alice")
    assert cli.main(["import", str(tmp_path / "first.json")]) == 1
    assert "nothing imported" in capsys.readouterr().err
    assert cli_export(tmp_path, "fourth", "user", "alice") == before


def test_an_owners_older_document_brings_back_nothing_of_a_member_erased_since(
    api, alice, bob, tmp_path, world, capsys
):
    """An owner's document holds every member's turns and memberships in the owner's
    conversations: imported after a member's erase, it brought them back (review). What
    the member wrote before their erase stays erased; the rest comes back."""
    # (A tool record an agent made for her in bob's conversation: his document holds it.)
    ToolRecord.objects.create(
        agent=world.agent,
        user_id="alice",
        conversation_id=world.his,
        tool_name="lookup",
        raw_output={"secret": "alice's"},
        summary="lookup",
    )
    document = cli_export(tmp_path, "bob", "user", "bob")
    assert "Alice hums xylophone tunes" in contents(document["messages"])
    assert "alice" in {m["userId"] for m in document["memberships"]}
    assert "alice" in {r["userId"] for r in document["toolRecords"]}
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    # Her own document, of nothing, imported: the record of her erase stays (forgetting
    # it let any older document bring back what it had erased; review).
    assert import_file(tmp_path, cli_export(tmp_path, "alice", "user", "alice")) == 0
    call(api, "POST", "/v1/user/erase", bob, {"confirm": "bob"})
    assert import_file(tmp_path, document) == 0
    err = capsys.readouterr().err
    assert "messages: 3 (1 skipped" in err and "memberships: 2 (1 skipped" in err, err
    assert not ToolRecord.objects.filter(user_id="alice").exists()

    messages = call(api, "GET", f"/v1/user/conversations/{world.his}/messages", bob)["data"]
    assert contents(messages) == ["Bob keeps a quokka diary", "Bob answers about quokkas"]
    assert not Membership.objects.filter(principal_id="alice").exists()
    assert not OwnershipTransfer.objects.filter(to_principal="alice").exists()
    assert not Message.objects.filter(author_principal="alice").exists()
    assert UserErasure.objects.filter(user_id="alice").exists()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_memory_switch_is_exported_kept_off_by_an_erase_and_imported(
    api, alice, tmp_path, world, capsys, enabled
):
    """The user's switch is theirs too. An erase takes it unless it is off: "off" says only
    that agents must not remember them, and is kept so that they do not start again."""
    memory_setting_update(Principal.user("alice"), enabled=enabled)
    first = cli_export(tmp_path, "first", "user", "alice")
    [setting] = first["memorySetting"]
    assert setting["memoryEnabled"] is enabled

    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    assert memory_off_for(["alice"]) == ({"alice"} if not enabled else set())
    assert UserMemorySetting.objects.filter(user_id="alice").exists() is not enabled

    assert cli.main(["import", str(tmp_path / "first.json")]) == 0
    capsys.readouterr()
    assert cli_export(tmp_path, "second", "user", "alice") == first


def test_a_conversation_dated_later_than_the_import_is_imported_as_of_now(
    api, alice, tmp_path, world, capsys
):
    """A document's conversation active "in 2100" (a clock ahead, an edit) made every walk
    of the user's list end in another catch-up pass, until 2100."""
    for_alice = world.agent.as_principal(on_behalf_of="alice")
    made_for_her = NewToolRecord(tool_name="lookup", raw_output={"ok": True}, summary="Looked")
    tool_records_create(for_alice, agent=world.agent, records=[made_for_her])
    memory_setting_update(Principal.user("alice"), enabled=True)
    document = cli_export(tmp_path, "first", "user", "alice")
    for conversation in document["conversations"]:
        conversation["createdAt"] = conversation["updatedAt"] = "2100-01-01T00:00:00Z"
    # So did a membership made "in 2100" (one given meanwhile is listed by the walk too),
    # and a message or a memory "of 2100" was the newest of every list (review). Block
    # revisions "of 2099" were the newest for good: every real change was trimmed at once;
    # a block, a tool record, a transfer or the memory switch "of 2100" too (review).
    for section in (
        "memberships",
        "membershipsElsewhere",
        "messages",
        "memories",
        "memoryBlocks",
        "toolRecords",
        "ownershipTransfersElsewhere",
    ):
        assert document[section], section
        for record in document[section]:
            record["createdAt"] = "2100-01-01T00:00:00Z"
            for revision in record.get("revisions", []):
                revision["createdAt"] = "2100-01-01T00:00:00Z"
    document["memoryBlocks"][0]["updatedAt"] = "2100-01-01T00:00:00Z"
    assert document["memorySetting"]
    for setting in document["memorySetting"]:
        setting["updatedAt"] = "2100-01-01T00:00:00Z"
    (tmp_path / "edited.json").write_text(json.dumps(document), encoding="utf-8")
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    assert cli.main(["import", str(tmp_path / "edited.json")]) == 0
    capsys.readouterr()

    now = timezone.now()
    page = call(api, "GET", "/v1/user/conversations?limit=50", alice)
    assert page["data"] and all(parse_datetime(c["updatedAt"]) <= now for c in page["data"])
    assert page["nextCursor"] is None  # nothing "moved" after the walk began
    assert not Membership.objects.filter(created_at__gt=now).exists()
    assert not Message.objects.filter(created_at__gt=now).exists()
    assert not Memory.objects.filter(created_at__gt=now).exists()
    for model in (MemoryBlock, MemoryBlockRevision, ToolRecord, OwnershipTransfer):
        assert not model.objects.filter(created_at__gt=now).exists(), model
    assert not MemoryBlock.objects.filter(updated_at__gt=now).exists()
    assert not UserMemorySetting.objects.filter(updated_at__gt=now).exists()


@pytest.mark.parametrize(
    ("section", "field", "value", "why"),
    [
        ("conversations", "title", "line1\nline2\x1b[31m", "control characters"),
        ("conversations", "metadata", {"k": "v" * 20_000}, "metadata"),
        ("messages", "content", "   ", "must not be empty"),
        ("messages", "content", "x" * 100_001, "content"),
        ("messages", "metadata", {"k": "v" * 20_000}, "metadata"),
        # Ids as every API takes them (review: an agent came to own a user's conversation).
        ("memberships", "userId", "bo\u200bb", "invisible characters"),
        ("memberships", "userId", "agent:nobody", "must be agent:<the agent's id>"),
        ("messages", "authorPrincipal", "\u202eecila", "bidirectional control characters"),
    ],
)
def test_a_user_import_holds_what_the_api_holds(
    api, alice, tmp_path, world, capsys, section, field, value, why
):
    """An import stored a title, a message or metadata the API refuses (review)."""
    document = cli_export(tmp_path, "first", "user", "alice")
    document[section][0][field] = value
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    assert import_file(tmp_path, document) == 1
    err = capsys.readouterr().err
    assert "nothing imported" in err and why in err, err
    assert not Conversation.objects.filter(id=world.ours).exists()


@pytest.mark.parametrize(
    ("user_id", "why"),
    [
        ("eve\u200b", "invisible characters"),
        ("agent:5f0c2c8e-6a43-4c1e-9d2b-0d6f7a3e1b24", "must name a user"),
    ],
)
def test_a_user_document_of_an_id_no_user_can_have_is_not_imported(
    api, alice, tmp_path, world, capsys, user_id, why
):
    """A document's ``userId`` was checked only to be a string: "eve\u200b" (listed as
    "eve") and ``agent:<id>`` (then owner of the conversations) were imported (review)."""
    document = cli_export(tmp_path, "first", "user", "alice")
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    assert import_file(tmp_path, {**document, "userId": user_id}) == 1
    err = capsys.readouterr().err
    assert "nothing imported: userId: " in err and why in err, err
    assert not Conversation.objects.filter(id=world.ours).exists()


@pytest.mark.parametrize(
    ("offer", "why"),
    [
        ({"fromUserId": "bob", "toUserId": "charlie"}, "a pending offer not made by alice"),
        (
            {"fromUserId": "alice", "toUserId": "agent:5f0c2c8e-6a43-4c1e-9d2b-0d6f7a3e1b24"},
            "must name a user",
        ),
    ],
)
def test_a_user_document_with_an_offer_its_owner_could_not_make_is_not_imported(
    api, alice, tmp_path, world, capsys, offer, why
):
    """A pending offer of her own conversation from bob, who never owned it, was imported:
    its recipient's accept was refused, and she could neither see it nor make another
    (review)."""
    document = cli_export(tmp_path, "first", "user", "alice")
    [conversation] = [c for c in document["conversations"] if c["id"] == str(world.ours)]
    offer = {
        "id": str(uuid.uuid4()),
        "conversationGroupId": conversation["conversationGroupId"],
        "conversationId": conversation["id"],
        "status": "pending",
        "createdAt": conversation["createdAt"],
        "resolvedAt": None,
        **offer,
    }
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    assert import_file(tmp_path, {**document, "ownershipTransfers": [offer]}) == 1
    err = capsys.readouterr().err
    assert "nothing imported: ownershipTransfers" in err and why in err, err
    assert not Conversation.objects.filter(id=world.ours).exists()


def test_a_title_and_a_name_stored_before_the_one_line_rules_come_back_with_an_import(
    api, alice, tmp_path, world, capsys
):
    """A title or a name is held to the rules of today when it is given (a line separator,
    a zero-width space at an end), not when an import restores it as the API once stored
    it: the export of one was refused, and the user's data lost with the erase (review)."""
    title = "line one\u2028line two"
    response = api.post("/v1/user/conversations", {"title": title}, as_=alice)
    assert response.status_code == 400 and "one line" in response.content.decode()
    Conversation.objects.filter(id=world.ours).update(title=title)
    Agent.objects.filter(id=world.agent.id).update(name="legacy\u200b")
    document = cli_export(tmp_path, "first", "user", "alice")
    agents = cli_export(tmp_path, "agent", "agent", str(world.agent.id))
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    assert import_file(tmp_path, document) == 0, capsys.readouterr().err
    assert Conversation.objects.get(id=world.ours).title == title
    world.agent.delete()
    assert import_file(tmp_path, agents) == 0, capsys.readouterr().err
    assert Agent.objects.get(id=agents["agent"]["id"]).name == "legacy\u200b"


def test_a_membership_of_an_agent_not_here_is_kept_for_its_own_document(
    api, alice, tmp_path, world, capsys
):
    """The API refuses to share with an agent that does not exist; an import keeps its
    membership, for the agent's own document to find (it was skipped, and a server restored
    from its documents lost every agent's place in its conversations: review). It reaches
    nothing meanwhile."""
    document = cli_export(tmp_path, "first", "user", "alice")
    [owner] = [m for m in document["memberships"] if m["userId"] == "alice"][:1]
    gone = {
        **owner,
        "userId": "agent:5f0c2c8e-6a43-4c1e-9d2b-0d6f7a3e1b24",
        "accessLevel": "reader",
    }
    document["memberships"].append(gone)
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    assert import_file(tmp_path, document) == 0, capsys.readouterr().err
    assert "memberships: 3\n" in capsys.readouterr().err
    assert Membership.objects.filter(principal_id=gone["userId"]).exists()
    members = call(api, "GET", f"/v1/user/conversations/{world.ours}/memberships", alice)
    assert gone["userId"] in {member["userId"] for member in members["data"]}


def test_a_label_stored_before_the_name_rule_comes_back_with_an_import(
    api, alice, tmp_path, world, capsys
):
    """Only a label given is held to the name rule: one stored before it was exported, and
    its import refused, the user's or agent's data lost with the erase (review). So is a
    memory's tag of nothing to read."""
    MemoryBlock.objects.create(agent=world.agent, user_id="alice", label="prefs ", value="tea")
    Memory.objects.filter(user_id="alice").update(tags=["nuts", " "])
    document = cli_export(tmp_path, "first", "user", "alice")
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    assert import_file(tmp_path, document) == 0, capsys.readouterr().err
    assert MemoryBlock.objects.get(user_id="alice", label="prefs ").value == "tea"
    assert Memory.objects.get(user_id="alice").tags == ["nuts", " "]


def test_an_agent_round_trip_export_drop_import_gives_the_same_export(tmp_path, world, capsys):
    agent, agent_id = world.agent, str(world.agent.id)
    first = cli_export(tmp_path, "first", "agent", agent.name)
    assert first["agent"]["id"] == str(agent.id)
    assert {block["userId"] for block in first["memoryBlocks"]} == {"alice", "bob"}
    assert sorted(contents(first["memories"])) == [
        "Alice is allergic to nuts",
        "Bob runs marathons",
        "The agent speaks French",
    ]
    hotels, nothing = sorted(
        first["toolRecords"], key=lambda record: record["toolName"], reverse=True
    )
    assert (hotels["conversationId"], hotels["taskId"], hotels["step"]) == (world.his, "trip", 1)
    assert hotels["output"] == {"results": [{"id": "htl-001", "price": 120}]}
    assert (nothing["output"], nothing["summary"], nothing["summarySource"]) == (
        None,
        "No answer",
        "caller",
    )
    block_ids = sorted(MemoryBlock.objects.filter(agent=agent).values_list("id", flat=True))
    agent.delete()
    assert cli.main(["import", str(tmp_path / "first.json")]) == 0
    assert cli_export(tmp_path, "second", "agent", agent_id) == first
    # Blocks keep their ids (Letta's routes name them so), and new ones never take one.
    assert sorted(MemoryBlock.objects.filter(agent_id=agent_id).values_list("id", flat=True)) == (
        block_ids
    )
    newer = memory_block_create(
        Agent.objects.get(id=agent_id).as_principal(),
        agent=Agent.objects.get(id=agent_id),
        label="new",
    )
    assert newer.id > max(block_ids)

    # Into the agent as it is now: its blocks are there already, so nothing is imported.
    assert cli.main(["import", str(tmp_path / "first.json")]) == 1
    assert "nothing imported" in capsys.readouterr().err
    assert cli.main(["export", "agent", "nobody"]) == 1


@pytest.mark.parametrize("users", [("alice", "bob"), ("bob", "alice")])
def test_a_server_comes_back_whole_from_its_users_then_its_agents_documents(
    api, alice, tmp_path, world, capsys, users
):
    """A restore into an empty server: two users who wrote in each other's conversations
    (the second document's turns elsewhere and offers were stored by the first: "nothing
    imported"), then an agent a member of a conversation made for it (its membership was
    skipped while the agent was not here, and its own document holds none: review)."""
    agent = world.agent
    ours = Conversation.objects.get(id=world.ours)
    membership_create(
        Principal.user("alice"),
        conversation=ours,
        principal_id=agent.principal_id,
        access_level="writer",
    )
    hers = Message.objects.get(conversation=ours, content__startswith="Alice plans")
    memory_save(
        agent.as_principal(),
        agent=agent,
        user_id="alice",
        content="Alice plans Zanzibar",
        message_ids=[hers.id],
    )
    documents = {name: cli_export(tmp_path, name, "user", name) for name in ("alice", "bob")}
    documents[agent.name] = cli_export(tmp_path, agent.name, "agent", agent.name)
    ConversationGroup.objects.all().delete()
    Agent.objects.all().delete()

    for name in (*users, agent.name):
        assert cli.main(["import", str(tmp_path / f"{name}.json")]) == 0, capsys.readouterr()
    for name, document in documents.items():
        kind = "agent" if name == agent.name else "user"
        assert cli_export(tmp_path, f"{name}-again", kind, name) == document, name
    context = call(api, "GET", f"/v1/agent/conversations/{world.ours}/context", key_of(agent))
    assert "Alice plans a trip to Zanzibar" in contents(context["messages"])


def test_an_agents_older_document_brings_back_nothing_an_owners_erase_took(
    tmp_path, world, alice, api
):
    """The agent's records of alice's conversation (its own, and one made for bob there)
    and its memory's citation of her turn, exported before her erase: the erase took them,
    the conversation with them, so its document came back with the records unlinked (as
    when a conversation is only deleted) and the memory citing a message that no longer
    exists (review). Her erasure keeps the ids of the conversations it took: they stay
    erased."""
    agent = world.agent
    ours = Conversation.objects.get(id=world.ours)
    in_hers = NewToolRecord(
        tool_name="book_flight", raw_output={"to": "Zanzibar"}, conversation=ours
    )
    tool_records_create(agent.as_principal(), agent=agent, records=[in_hers])
    for_bob_in_hers = NewToolRecord(tool_name="rate_idea", raw_output=5, conversation=ours)
    tool_records_create(
        Principal.for_agent(agent.id, on_behalf_of="bob"), agent=agent, records=[for_bob_in_hers]
    )
    Membership.objects.create(
        group=ours.group, principal_id=agent.principal_id, access_level="reader"
    )
    Membership.objects.create(
        group=Conversation.objects.get(id=world.his).group,
        principal_id=agent.principal_id,
        access_level="reader",
    )
    bobs_own = Message.objects.get(content="Bob keeps a quokka diary").id
    memory_save(
        agent.as_principal(),
        agent=agent,
        content="Quokkas and xylophones",
        message_ids=[bobs_own, uuid.UUID(world.hers)],
    )
    document = cli_export(tmp_path, "first", "agent", agent.name)
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    # Through the API, into another agent (which sees neither conversation: what it may
    # keep comes unlinked; the erased conversation's records came back so too: review).
    newcomer = make_agent("newcomer", ("read", "write", "impersonate"))
    imported = api.post("/v1/agent/import", document, as_=newcomer)
    assert imported.status_code == 200, imported.content[:300]
    assert imported.json()["skipped"]["toolRecords"] == 2
    kept = ToolRecord.objects.filter(agent=newcomer.agent).values_list("tool_name", flat=True)
    assert sorted(kept) == ["ping", "search_hotels"]

    agent_id = agent.id
    agent.delete()
    assert import_file(tmp_path, document) == 0
    records = ToolRecord.objects.filter(agent_id=agent_id)
    assert sorted(records.values_list("tool_name", "conversation_id")) == [
        ("ping", None),
        ("search_hotels", uuid.UUID(world.his)),
    ]
    assert Memory.objects.get(agent_id=agent_id, content="Quokkas and xylophones").message_ids == [
        bobs_own
    ]


def test_an_agents_older_document_brings_back_nothing_a_later_owners_erase_took(
    tmp_path, world, alice, bob, api
):
    """Bob gave his conversation to Alice after the agent's export, and Alice was then
    erased: the document named the owner it knew, Bob, and its record of that conversation
    came back (review). What went with an erase is told by the erasure, not the document."""
    agent = world.agent
    his = Conversation.objects.get(id=world.his)  # (the world's search_hotels record is of it)
    document = cli_export(tmp_path, "first", "agent", agent.name)
    offer = call(
        api,
        "POST",
        f"/v1/user/conversations/{world.his}/transfer-ownership",
        bob,
        {"newOwnerUserId": "alice"},
        202,
    )
    call(api, "POST", f"/v1/user/ownership-transfers/{offer['id']}/accept", alice)
    assert call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})["toolRecords"] >= 1
    assert not Conversation.objects.filter(id=his.id).exists()
    agent_id = agent.id
    agent.delete()
    assert import_file(tmp_path, document) == 0
    tools = ToolRecord.objects.filter(agent_id=agent_id).values_list("tool_name", flat=True)
    assert list(tools) == ["ping"]


@pytest.mark.parametrize(
    "metadata",
    [{"letta": "x"}, {"letta": {"tags": 5}}, {"letta": {"model": 5}}, ["not", "an", "object"]],
)
def test_an_agent_whose_letta_settings_letta_could_not_read_is_not_imported(
    tmp_path, world, capsys, metadata
):
    """Forged Letta settings were imported, and every Letta list of the owner's agents was
    a 500 after (``dict(...)`` of a string, tags that are a number)."""
    document = cli_export(tmp_path, "first", "agent", world.agent.name)
    world.agent.delete()
    document["agent"]["metadata"] = metadata
    assert import_file(tmp_path, document) == 1
    assert "nothing imported" in capsys.readouterr().err
    assert not Agent.objects.filter(id=document["agent"]["id"]).exists()
    # As the Letta API keeps them, they are imported; a null is kept as the check read it,
    # left out (a kept {"tags": null} made every Letta list a 500).
    document["agent"]["metadata"] = {
        "team": "a",
        "letta": {"tags": ["x"], "model": "m", "description": None},
    }
    assert import_file(tmp_path, document) == 0
    assert Agent.objects.get(id=document["agent"]["id"]).metadata == {
        "team": "a",
        "letta": {"tags": ["x"], "model": "m"},
    }


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("\u202ebob", "bidirectional control characters"),
        ("bob ", "must not begin or end with a space"),
        ("bob\tsmith", "control characters"),
    ],
)
def test_an_agent_named_as_no_api_names_one_is_not_imported(tmp_path, world, capsys, name, why):
    """The name rule of every API that makes an agent (``NAME_RULES``) holds for an
    import too: a document's "\u202ebob" was imported, and showed as "bob" reversed."""
    document = cli_export(tmp_path, "first", "agent", world.agent.name)
    world.agent.delete()
    assert import_file(tmp_path, {**document, "agent": {**document["agent"], "name": name}}) == 1
    err = capsys.readouterr().err
    assert "nothing imported" in err and why in err, err
    assert not Agent.objects.filter(id=document["agent"]["id"]).exists()


def test_an_agent_described_longer_than_the_apis_take_is_not_imported(tmp_path, world, capsys):
    """The Letta routes show an agent's description, and take 2,000 characters of it: a
    document's was imported whatever its length (review)."""
    document = cli_export(tmp_path, "first", "agent", world.agent.name)
    world.agent.delete()
    long = {**document, "agent": {**document["agent"], "description": "d" * 2_001}}
    assert import_file(tmp_path, long) == 1
    err = capsys.readouterr().err
    assert "nothing imported" in err and "description" in err, err
    assert not Agent.objects.filter(id=document["agent"]["id"]).exists()


def test_an_agent_document_is_not_imported_into_another_owners_agent(tmp_path, world, capsys):
    """The document's agent id names an agent here of someone else (another owner, another
    key's): its records went into that agent. Refused, and nothing stored; an agent of the
    document's owner with its name but another id is refused too, with the reason."""
    exported = cli_export(tmp_path, "first", "agent", world.agent.name)
    planted = {**exported["memories"][0], "id": str(uuid.uuid4()), "content": "Planted"}
    document = {**exported, "memoryBlocks": [], "toolRecords": [], "memories": [planted]}
    theirs = make_agent("theirs").agent  # (owned by "ops")
    assert theirs.owner_principal != world.agent.owner_principal
    path = tmp_path / "forged.json"
    for agent, why in (
        ({**document["agent"], "id": str(theirs.id)}, f"{theirs.id} is an agent of ops"),
        ({**document["agent"], "ownerPrincipal": "mallory"}, "is an agent of"),
        ({**document["agent"], "id": str(uuid.uuid4())}, "has an agent named"),
    ):
        path.write_text(json.dumps({**document, "agent": agent}))
        assert cli.main(["import", str(path)]) == 1
        err = capsys.readouterr().err
        assert "nothing imported" in err and why in err, err
    assert not Memory.objects.filter(content="Planted").exists()
    assert Agent.objects.count() == 2

    # Into the document's own agent (its owner's): what is new in it is added.
    path.write_text(json.dumps(document))
    assert cli.main(["import", str(path)]) == 0
    assert Memory.objects.get(content="Planted").agent == world.agent


@pytest.mark.parametrize("subject", ["", f"agent:{uuid.UUID(int=1)}"])
def test_the_export_of_no_user_is_refused(tmp_path, world, capsys, subject):
    """(`memsvc export user ""`, an unset shell variable, wrote every agent's own memories
    and blocks as a user's.)"""
    path = tmp_path / "nobody.json"
    assert cli.main(["export", "user", subject, "-o", str(path)]) == 1
    assert "user id must" in capsys.readouterr().err
    assert not path.exists()


def test_a_users_document_links_its_tool_records_only_to_conversations_they_are_in(
    api, alice, tmp_path, world, capsys
):
    """A record linked to charlie's conversation, which alice is not in, was imported so
    linked: listed among its records, taken by charlie's export and erase (review). It is
    kept, unlinked, as the agent API's import keeps one of a conversation it cannot see."""
    for_alice = world.agent.as_principal(on_behalf_of="alice")
    made_for_her = NewToolRecord(tool_name="lookup", raw_output={"ok": True}, summary="Looked")
    [record], _ = tool_records_create(for_alice, agent=world.agent, records=[made_for_her])
    document = cli_export(tmp_path, "first", "user", "alice")
    charlies = Conversation.objects.get(title="Charlie's notes")
    [planted] = document["toolRecords"]
    planted["conversationId"] = str(charlies.id)
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    assert not ToolRecord.objects.filter(id=record.id).exists()
    assert import_file(tmp_path, document) == 0
    capsys.readouterr()
    restored = ToolRecord.objects.get(id=planted["id"])
    assert restored.conversation_id is None and restored.user_id == "alice"


def test_an_agent_the_local_api_made_keyless_is_made_again_keyless(tmp_path, capsys):
    """Its document said nothing of the trust: made again by an import, the keyless caller
    that made it was refused (review). Only a local agent is trusted so (an edited
    document's user's agent is not)."""
    from agents_api.services import agent_get_or_create

    local, _ = agent_get_or_create(owner_principal="local", name="localbot", loopback_trusted=True)
    document = cli_export(tmp_path, "first", "agent", str(local.id))
    assert document["agent"]["loopbackTrusted"] is True
    local.delete()
    assert import_file(tmp_path, document) == 0
    assert Agent.objects.get(id=document["agent"]["id"]).loopback_trusted
    users = {**document["agent"], "id": str(uuid.uuid4()), "ownerPrincipal": "alice"}
    assert import_file(tmp_path, {**document, "agent": users}) == 0
    assert not Agent.objects.get(id=users["id"]).loopback_trusted
    capsys.readouterr()


@pytest.mark.django_db(transaction=True)  # (the owner's rule is checked at commit)
def test_a_document_that_breaks_a_rule_is_refused_naming_it(api, alice, tmp_path, world, capsys):
    """(It said "a record breaks a rule of what is stored", whichever of 100,000: review.)"""
    document = cli_export(tmp_path, "first", "user", "alice")
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    document["memberships"] = [m for m in document["memberships"] if m["accessLevel"] != "owner"]
    assert import_file(tmp_path, document) == 1
    err = capsys.readouterr().err
    assert "nothing imported" in err and "its owner's membership must be in the document" in err


def test_import_refuses_what_is_not_an_export(tmp_path, capsys):
    for document in ({"format": "other"}, {"format": "memsvc-export", "version": 1, "kind": "x"}):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(document))
        assert cli.main(["import", str(path)]) == 1
    path.write_text("{not json")
    assert cli.main(["import", str(path)]) == 1
    assert capsys.readouterr().err.count("nothing imported") == 3
    # An agent's document without its agent says so (it spoke of "agent[0]" and null).
    path.write_text(json.dumps({"format": "memsvc-export", "version": 1, "kind": "agent"}))
    assert cli.main(["import", str(path)]) == 1
    assert "agent: missing" in capsys.readouterr().err
    # A number too long for Python's decoder, in our words (its named its setting: review).
    path.write_text('{"format": "memsvc-export", "version": ' + "1" * 4301 + "}")
    assert cli.main(["import", str(path)]) == 1
    assert capsys.readouterr().err == "nothing imported: a number has more than 4300 digits\n"


@pytest.mark.parametrize("depth", [900, 100_000])
def test_import_refuses_a_document_nested_too_deep_with_a_reason(tmp_path, capsys, depth):
    """As the API refuses such a body. (A traceback: RecursionError.)"""
    path = tmp_path / "deep.json"
    metadata = "[" * depth + "]" * depth
    path.write_text(
        '{"format": "memsvc-export", "version": 1, "kind": "user", "userId": "alice", '
        f'"conversations": [{{"metadata": {metadata}}}]}}'
    )
    assert cli.main(["import", str(path)]) == 1
    assert "nothing imported" in capsys.readouterr().err
    assert not Conversation.objects.exists()


def test_an_export_to_a_file_it_cannot_write_says_why(tmp_path, world, capsys):
    """(A traceback: FileNotFoundError.)"""
    assert cli.main(["export", "user", "alice", "-o", str(tmp_path / "no" / "such.json")]) == 1
    assert "No such file or directory" in capsys.readouterr().err


@pytest.mark.django_db(transaction=True)
def test_the_export_streams_over_real_http_from_one_snapshot(live_server, alice):
    """Through a real server (its own transaction per request): chunked, not sized up
    front, and read in a REPEATABLE READ snapshot."""
    headers = {"Authorization": alice.auth_headers()["HTTP_AUTHORIZATION"]}
    with httpx.Client(base_url=live_server.url, headers=headers) as http:
        made = http.post("/v1/user/conversations", json={"title": "Live"}).json()
        for n in range(3):
            http.post(f"/v1/user/conversations/{made['id']}/messages", json={"content": f"m{n}"})
        with http.stream("GET", "/v1/user/export") as response:
            assert response.status_code == 200
            assert "content-length" not in response.headers
            document = json.loads(b"".join(response.iter_bytes()))
    assert contents(document["messages"]) == ["m0", "m1", "m2"]


def test_erase_ends_the_transfers_the_user_offered(api, alice, bob, world):
    """Her pending offer of her conversation to bob goes with the conversation; a transfer
    bob accepted from her stays his conversation, without the record naming her."""
    body = {"newOwnerUserId": "bob"}
    call(api, "POST", f"/v1/user/conversations/{world.ours}/transfer-ownership", alice, body, 202)
    given = call(api, "POST", "/v1/user/conversations", alice, {"title": "A gift"}, 201)["id"]
    offer = call(
        api, "POST", f"/v1/user/conversations/{given}/transfer-ownership", alice, body, 202
    )
    call(api, "POST", f"/v1/user/ownership-transfers/{offer['id']}/accept", bob)
    assert len(call(api, "GET", "/v1/user/ownership-transfers", bob)["data"]) == 2  # both ways

    erased = call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    assert erased["ownershipTransfers"] == 3  # hers pending, the accepted one, bob's to her
    assert erased["memberships"] == 3  # owner of hers, writer in bob's, manager of the gift
    assert call(api, "GET", "/v1/user/ownership-transfers", bob)["data"] == []
    gift = call(api, "GET", f"/v1/user/conversations/{given}", bob)
    assert (gift["ownerUserId"], gift["accessLevel"]) == ("bob", "owner")
    accepted = call(api, "GET", "/v1/user/ownership-transfers?status=accepted", bob)["data"]
    assert accepted == []


def test_an_import_renumbers_messages_whose_places_are_taken(api, alice, bob, tmp_path, world):
    """Another server's messages hold the places: they come in new ones, in their order."""
    document = cli_export(tmp_path, "first", "user", "alice")
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    taken = Message.objects.order_by("seq").values_list("seq", flat=True)[0]
    for offset, message in enumerate(document["messages"]):
        message["seq"] = taken + offset  # as numbered elsewhere: one of them is bob's
    path = tmp_path / "elsewhere.json"
    path.write_text(json.dumps({**document, "exportedAt": None}))
    assert cli.main(["import", str(path)]) == 0
    messages = call(api, "GET", f"/v1/user/conversations/{world.ours}/messages", alice)["data"]
    assert contents(messages) == ["Alice plans a trip to Zanzibar", "Bob likes the Zanzibar idea"]
    seqs = list(Message.objects.filter(conversation_id=world.ours).values_list("seq", flat=True))
    assert min(seqs) > Message.objects.exclude(conversation_id=world.ours).order_by("-seq")[0].seq


def sequences() -> tuple[int, int]:
    """Where the sequences numbering messages' places and blocks are."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT pg_sequence_last_value('message_seq'),
                   pg_sequence_last_value(pg_get_serial_sequence('memory_block', 'id'))
            """
        )
        return cursor.fetchone()


@pytest.fixture
def sequences_kept():
    """Puts the sequences back after the test: their changes outlive its rollback."""
    before = sequences()
    yield
    with connection.cursor() as cursor:
        for sequence, value in zip(
            ("'message_seq'", "pg_get_serial_sequence('memory_block', 'id')"), before, strict=True
        ):
            cursor.execute(f"SELECT setval({sequence}, %s, %s)", [value or 1, value is not None])


def import_file(tmp_path, document: dict) -> int:
    path = tmp_path / "forged.json"
    path.write_text(json.dumps({**document, "exportedAt": None}))
    return cli.main(["import", str(path)])


def test_a_refused_import_leaves_the_sequences_as_they_were(
    api, alice, tmp_path, world, capsys, sequences_kept
):
    """Numbers kept (a message's place, a block's id) move their sequence only once every
    row is in: a sequence's change outlives the rollback of a refused import."""
    document = cli_export(tmp_path, "first", "user", "alice")
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    before = sequences()
    document["messages"][0]["seq"] = 2**50
    [block] = document["memoryBlocks"]
    twice = {**block, "id": 2**50 + 1, "revisions": []}  # the same label twice: refused
    document["memoryBlocks"] = [{**block, "id": 2**50}, twice]
    assert import_file(tmp_path, document) == 1
    assert "nothing imported" in capsys.readouterr().err
    assert sequences() == before
    made = call(api, "POST", "/v1/user/conversations", alice, {"title": "After"}, 201)
    call(api, "POST", f"/v1/user/conversations/{made['id']}/messages", alice, {"content": "x"}, 201)
    assert Message.objects.get(conversation_id=made["id"]).seq < 2**50


@pytest.mark.parametrize("until", ["garbage", 7, None])
def test_an_import_refuses_a_summary_that_covers_no_message_id(
    api, alice, tmp_path, world, capsys, until
):
    """A summary's ``untilMessageId`` is what an agent's context reads: a message id, or
    null (every message it covered is gone). Anything else was imported, and the
    conversation's context answered 400 from then on."""
    document = cli_export(tmp_path, "first", "user", "alice")
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    first = document["messages"][0]
    summary = {**first, "id": str(uuid.uuid4()), "seq": first["seq"] + 10**6}
    summary.update(channel="summary", visibility="agent", role="system")
    summary["metadata"] = {"untilMessageId": until, "summarizedAt": "2026-11-01T10:00:00Z"}
    document["messages"].append(summary)
    if until is None:
        assert import_file(tmp_path, document) == 0
        return
    assert import_file(tmp_path, document) == 1
    assert "untilMessageId: a message id, or null" in capsys.readouterr().err
    assert not Message.objects.filter(id=summary["id"]).exists()


def test_an_import_cannot_use_a_sequence_up(api, alice, tmp_path, world, capsys, sequences_kept):
    """Numbers past ``NUMBER_MAX`` are refused; one at it still leaves the sequence room."""
    document = cli_export(tmp_path, "first", "user", "alice")
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    before = sequences()
    for section, key in (("messages", "seq"), ("memoryBlocks", "id")):
        too_large = json.loads(json.dumps(document))
        too_large[section][0][key] = 2**63 - 1
        assert import_file(tmp_path, too_large) == 1
        assert f"{section}[0]" in capsys.readouterr().err
        assert sequences() == before

    document["messages"][0]["seq"] = NUMBER_MAX
    assert import_file(tmp_path, document) == 0
    call(api, "POST", f"/v1/user/conversations/{world.ours}/messages", alice, {"content": "y"}, 201)
    assert Message.objects.order_by("-seq")[0].seq == NUMBER_MAX + 1


def memberships_messages_transfers() -> tuple:
    return (
        sorted(Membership.objects.values_list("group_id", "principal_id", "access_level")),
        sorted(Message.objects.values_list("id", "conversation_id", "author_principal")),
        sorted(OwnershipTransfer.objects.values_list("id", "group_id", "to_principal")),
    )


def mallorys(alices: dict, **sections) -> dict:
    """A document for mallory holding only ``sections``, its records made from alice's."""
    empty = {name: [] for name, records in alices.items() if isinstance(records, list)}
    return {**alices, **empty, "userId": "mallory", **sections}


def as_membership(elsewhere: dict) -> dict:
    """A record of ``membershipsElsewhere`` as one of ``memberships``: without the
    conversation it names (a field only the former has: an import refuses a field a record
    does not have)."""
    return {name: value for name, value in elsewhere.items() if name != "conversationId"}


def forgeries(alices: dict) -> dict:
    """Documents for mallory reaching into bob's conversation ``world.his``, where alice
    is a member and writes."""
    [membership] = alices["membershipsElsewhere"]
    [message] = alices["messagesElsewhere"]
    member = {**membership, "userId": "mallory"}
    written = {**message, "id": str(uuid.uuid4()), "content": "Forged"}
    offer = {
        "id": str(uuid.uuid4()),
        "conversationGroupId": membership["conversationGroupId"],
        "conversationId": message["conversationId"],
        "fromUserId": "bob",
        "toUserId": "mallory",
        "status": "pending",
        "createdAt": message["createdAt"],
        "resolvedAt": None,
    }
    bobs = {**written, "authorPrincipal": "bob", "authorName": "bob"}
    # A conversation of a group of her own, forked from his: a fork reads its parent's words.
    group = str(uuid.uuid4())
    fork = {
        "id": str(uuid.uuid4()),
        "conversationGroupId": group,
        "title": "Mine",
        "metadata": {},
        "forkedAtConversationId": message["conversationId"],
        "forkedAtMessageId": message["id"],
        "createdAt": message["createdAt"],
        "updatedAt": message["createdAt"],
    }
    owner = {**as_membership(member), "conversationGroupId": group, "accessLevel": "owner"}
    root = {**fork, "forkedAtConversationId": None, "forkedAtMessageId": None}
    her_summary = {"authorPrincipal": "mallory", "authorName": "mallory", "role": "system"}
    her_summary |= {"channel": "summary", "visibility": "agent"}
    return {
        "his group": mallorys(
            alices, memberships=[{**as_membership(member), "accessLevel": "manager"}]
        ),
        "his conversation": mallorys(alices, messages=[{**written, "authorPrincipal": "mallory"}]),
        "an offer of his": mallorys(alices, ownershipTransfers=[offer]),
        "bob's words": mallorys(alices, membershipsElsewhere=[member], messagesElsewhere=[bobs]),
        # A summary of his conversation "by" her: his agent's context opened with it (review).
        "a summary in his": mallorys(
            alices,
            membershipsElsewhere=[member],
            messagesElsewhere=[{**written, **her_summary}],
        ),
        "a fork of his": mallorys(alices, conversations=[fork], memberships=[owner]),
        "one made his": mallorys(
            alices,
            conversations=[root],
            memberships=[{**owner, "userId": "bob"}, {**owner, "accessLevel": "manager"}],
            messages=[{**bobs, "conversationId": root["id"]}],
        ),
    }


@pytest.mark.parametrize(
    "forgery",
    [
        "his group",
        "his conversation",
        "an offer of his",
        "bob's words",
        "a summary in his",
        "a fork of his",
        "one made his",
    ],
)
def test_a_user_document_holds_only_its_users_records(tmp_path, world, capsys, forgery):
    """Checked against its subject: of others' conversations it holds only the user's own
    membership and messages; of its own, the user is the owner. (A conversation of the
    document forked from bob's, in a group of mallory's own, was imported: she read his
    conversation through it. One that bob owned, with his words, was made in his list.)"""
    document = forgeries(cli_export(tmp_path, "alice", "user", "alice"))[forgery]
    err = refused_changing_nothing(tmp_path, capsys, document)
    assert "is not" in err, err


def refused_changing_nothing(tmp_path, capsys, document: dict) -> str:
    """What ``memsvc import`` said refusing ``document``, once it is known to have written
    nothing of it."""
    before = memberships_messages_transfers(), Conversation.objects.count()
    assert import_file(tmp_path, document) == 1
    err = capsys.readouterr().err
    assert "nothing imported" in err, err
    assert (memberships_messages_transfers(), Conversation.objects.count()) == before
    return err


def forked_wrongly(alices: dict) -> dict:
    """Documents for mallory of two conversations of her own group, the second forked from
    the first in ways no service makes."""
    [message] = alices["messagesElsewhere"]
    [membership] = alices["membershipsElsewhere"]
    group, first, second = (str(uuid.uuid4()) for _ in range(3))

    def conversation(id_, parent, point):
        return {
            "id": id_,
            "conversationGroupId": group,
            "title": "Mine",
            "metadata": {},
            "forkedAtConversationId": parent,
            "forkedAtMessageId": point,
            "createdAt": message["createdAt"],
            "updatedAt": message["createdAt"],
        }

    def said(in_conversation, seq):
        return {
            **message,
            "id": str(uuid.uuid4()),
            "conversationId": in_conversation,
            "seq": seq,
            "authorPrincipal": "mallory",
            "authorName": "mallory",
        }

    in_first, in_second = said(first, 2**40), said(second, 2**40 + 1)
    owner = {**as_membership(membership), "userId": "mallory", "conversationGroupId": group}
    owner["accessLevel"] = "owner"

    def document(*conversations):
        return mallorys(
            alices,
            conversations=list(conversations),
            memberships=[owner],
            messages=[in_first, in_second],
        )

    return {
        "in a ring": document(
            conversation(first, second, in_second["id"]),
            conversation(second, first, in_first["id"]),
        ),
        "at its own message": document(
            conversation(first, None, None), conversation(second, first, in_second["id"])
        ),
    }


@pytest.mark.parametrize("forgery", ["in a ring", "at its own message"])
def test_a_document_whose_forks_are_no_tree_is_refused(tmp_path, world, capsys, forgery):
    """Conversations forked from each other in a ring were imported: reading one walked the
    ring until the statement timed out (a connection held 30 s, then a 503, on every read).
    A fork's point is a message of what it forks from."""
    document = forked_wrongly(cli_export(tmp_path, "alice", "user", "alice"))[forgery]
    err = refused_changing_nothing(tmp_path, capsys, document)
    assert "nothing imported: conversations:" in err and "fork" in err, err


def test_a_user_document_holds_tool_records_of_its_own_conversations_only(tmp_path, world, capsys):
    """A record the user's document holds that was not made for them is one of their own
    conversations (as ``tool_records_kept_about`` exports them): one of bob's conversation,
    or an agent's own, refuses the document."""
    agent_records = {
        r["toolName"]: r
        for r in cli_export(tmp_path, "a", "agent", world.agent.name)["toolRecords"]
    }
    alices = cli_export(tmp_path, "alice", "user", "alice")
    for record in (agent_records["search_hotels"], agent_records["ping"]):
        stranger = {**record, "id": str(uuid.uuid4())}
        assert import_file(tmp_path, mallorys(alices, toolRecords=[stranger])) == 1
        err = capsys.readouterr().err
        assert "nothing imported: toolRecords: records of an agent's own, not of 'mallory'" in err
    assert ToolRecord.objects.count() == 2


def test_a_users_messages_come_back_only_where_they_are_a_member(tmp_path, world, capsys):
    """Elsewhere, where the document gives the user no membership, their messages are
    skipped (a member removed leaves theirs behind)."""
    alices = cli_export(tmp_path, "alice", "user", "alice")
    [message] = alices["messagesElsewhere"]
    written = {**message, "id": str(uuid.uuid4()), "authorPrincipal": "mallory"}
    assert import_file(tmp_path, mallorys(alices, messagesElsewhere=[written])) == 0
    assert "messagesElsewhere: 0 (1 skipped" in capsys.readouterr().err
    assert not Message.objects.filter(author_principal="mallory").exists()


# --- an agent's memory through its own key ---------------------------------------------------


def key_of(agent, scopes=("read", "write")) -> AgentCredential:
    return AgentCredential(agent, api_key_create(agent=agent, scopes=list(scopes))[1])


def agent_export(api, credential) -> dict:
    response = api.get("/v1/agent/export", as_=credential)
    assert response.status_code == 200, response.content[:300]
    assert response.streaming
    assert response["Content-Type"] == "application/json"
    document = json.loads(b"".join(response.streaming_content))
    document.pop("exportedAt")
    return document


def memory_of_the_agent(agent) -> dict:
    """What an agent keeps, without what an import makes anew (ids, times, vectors)."""
    return {
        "memories": sorted(
            Memory.objects.filter(agent=agent).values_list(
                "user_id", "content", "importance", "tags", "message_ids"
            )
        ),
        "blocks": sorted(
            MemoryBlock.objects.filter(agent=agent).values_list("user_id", "label", "value")
        ),
        "revisions": sorted(
            MemoryBlockRevision.objects.filter(block__agent=agent).values_list(
                "block__label", "block__user_id", "value", "actor_principal"
            )
        ),
        "tool_records": sorted(
            ToolRecord.objects.filter(agent=agent).values_list(
                "tool_name", "conversation_id", "task_id", "summary"
            )
        ),
    }


def test_an_agent_exports_its_own_memory_with_its_key(api, tmp_path, world):
    """The same document ``memsvc export agent`` writes, and only the key's agent's."""
    document = agent_export(api, key_of(world.agent))
    assert document == cli_export(tmp_path, "cli", "agent", str(world.agent.id))
    assert document["kind"] == "agent"
    assert document["agent"]["id"] == str(world.agent.id)
    assert len(document["memories"]) == 3
    assert len(document["toolRecords"]) == 2

    stranger = make_agent("stranger")
    theirs = agent_export(api, stranger)
    assert theirs["agent"]["id"] == str(stranger.agent.id)
    assert (theirs["memories"], theirs["memoryBlocks"], theirs["toolRecords"]) == ([], [], [])


def test_an_import_takes_a_block_about_a_user_from_any_key_as_the_api_does(api, helper):
    """A block about a user is made by any key (``?userId=``: agents learn about new
    users); so is its import (one that asked for ``impersonate`` refused a plain key its own
    export: review)."""
    block = {"label": "prefs", "value": "Bob likes tea"}
    made = api.post("/v1/agent/memory-blocks?userId=bob", block, as_=helper)
    assert made.status_code == 201, made.content
    document = agent_export(api, helper)
    plain = make_agent("plain")
    assert api.post("/v1/agent/import", document, as_=plain).status_code == 200
    kept = MemoryBlock.objects.filter(agent=plain.agent).values_list("user_id", "value")
    assert list(kept) == [("bob", "Bob likes tea")]


def test_an_import_takes_back_what_is_about_an_id_that_became_memsvcs_own(api, helper):
    """``local`` and ``memsvc`` became memsvc's own (the owners of its agents) after some
    kept memory about users so named: the agent's export of it was refused by its own
    import (review). What is about them is the agent's to keep; no user may name them."""
    for label, user_id in [("prefs", "keeper"), ("notes", "keeper2")]:
        made = api.post(
            f"/v1/agent/memory-blocks?userId={user_id}", {"label": label, "value": "v"}, as_=helper
        )
        assert made.status_code == 201, made.content
    assert api.post("/v1/agent/memories", {"content": "Likes tea", "userId": "keeper"}, as_=helper)
    # (Stored so before the rule: no API takes these ids now.)
    MemoryBlock.objects.filter(user_id="keeper").update(user_id="local")
    MemoryBlock.objects.filter(user_id="keeper2").update(user_id="memsvc")
    Memory.objects.filter(user_id="keeper").update(user_id="local")
    document = agent_export(api, helper)
    plain = make_agent("plain")
    imported = api.post("/v1/agent/import", document, as_=plain)
    assert imported.status_code == 200, imported.content
    assert sorted(
        MemoryBlock.objects.filter(agent=plain.agent).values_list("user_id", flat=True)
    ) == ["local", "memsvc"]
    assert list(Memory.objects.filter(agent=plain.agent).values_list("user_id", flat=True)) == [
        "local"
    ]
    refused = api.post("/v1/agent/memories", {"content": "x", "userId": "local"}, as_=helper)
    assert refused.status_code == 400


def test_an_import_makes_a_tool_record_for_a_user_only_with_a_key_that_may_act_for_them(
    api, helper
):
    """Through the API a tool record is a user's only by ``X-On-Behalf-Of`` (the
    ``impersonate`` scope); an import by a read and write key planted one "made for" bob,
    which then showed in his export and went with his erase (outside review)."""
    made = api.post(
        "/v1/agent/tool-records",
        {"taskId": "t1", "toolName": "lookup", "input": {}, "output": {}},
        as_=helper.acting_for("bob"),
    )
    assert made.status_code == 201, made.content
    document = agent_export(api, helper)
    assert [r["userId"] for r in document["toolRecords"]] == ["bob"]

    plain, trusted = make_agent("plain"), make_agent("trusted", ("read", "write", "impersonate"))
    refused = api.post("/v1/agent/import", document, as_=plain)
    assert refused.status_code == 400, refused.content
    assert "'impersonate'" in refused.json()["error"]
    assert not ToolRecord.objects.filter(agent=plain.agent).exists()
    assert api.post("/v1/agent/import", document, as_=trusted).status_code == 200
    assert list(
        ToolRecord.objects.filter(agent=trusted.agent).values_list("user_id", flat=True)
    ) == ["bob"]


def test_an_import_needs_a_key_that_may_read(api, helper):
    """Its 409 told a write-only key whether a memory's content is kept already, which a
    save refuses it (review)."""
    memory_save(helper.agent.as_principal(), agent=helper.agent, content="The PIN is 4812")
    document = agent_export(api, helper)
    writer = make_agent(helper.agent.name, scopes=("write",))  # (a second key of the agent)
    refused = api.post("/v1/agent/import", document, as_=writer)
    assert refused.status_code == 403, refused.content
    assert refused.json()["error"] == "this API key lacks the 'read' scope"
    assert Memory.objects.filter(agent=helper.agent).count() == 1


def test_an_agents_import_refuses_a_block_of_blanks_as_its_writes_do(api, helper):
    """(A value of blanks alone, which every write refuses, was stored by an import, and
    headed the agent's context: review.)"""
    made = api.post("/v1/agent/memory-blocks", {"label": "l", "value": "v"}, as_=helper)
    assert made.status_code == 201, made.content
    document = agent_export(api, helper)
    block = {**document["memoryBlocks"][0], "value": "\u200b  "}
    plain = make_agent("blank")
    refused = api.post("/v1/agent/import", {**document, "memoryBlocks": [block]}, as_=plain)
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"].endswith(
        "memoryBlocks: 'l': value: the block would hold nothing but blanks"
    )
    assert not MemoryBlock.objects.filter(agent=plain.agent).exists()


def test_an_imports_records_are_of_the_json_types_the_export_says(api, helper):
    """(A block's limit "5000", readOnly 0 and an importance "0.5" were converted and
    stored; review.) Refused as a request body's values are, nothing imported."""
    made = api.post("/v1/agent/memory-blocks", {"label": "l", "value": "v"}, as_=helper)
    assert made.status_code == 201, made.content
    document = agent_export(api, helper)
    plain = make_agent("typed")
    for field, value in [("limit", "5000"), ("readOnly", 0)]:
        block = {**document["memoryBlocks"][0], field: value}
        refused = api.post("/v1/agent/import", {**document, "memoryBlocks": [block]}, as_=plain)
        assert refused.status_code == 400, refused.content
        assert field in refused.json()["error"]
    assert not MemoryBlock.objects.filter(agent=plain.agent).exists()


def test_an_imports_records_hold_no_field_the_export_does_not_write(api, helper):
    """(A memory's record with a field of no memory was imported, where the API refuses
    it: review.) Named, nothing imported."""
    save = {"content": "Alice likes tea", "userId": "alice"}
    assert api.post("/v1/agent/memories", save, as_=helper).status_code == 201
    document = agent_export(api, helper)
    document["memories"][0]["zzz"] = 1
    other = make_agent("strict")
    refused = api.post("/v1/agent/import", document, as_=other)
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"].endswith('memories[0]: {"zzz": ["unknown field"]}')
    # (Named where it is, as a batch's refusal names it: it was one text under "body".)
    assert refused.json()["details"] == {"memories[0].zzz": ["unknown field"]}
    assert not Memory.objects.filter(agent=other.agent).exists()


def test_an_agents_import_is_held_to_the_apis_tag_rule(api, helper):
    """A tag of nothing to read is refused by the API, and was stored by its import (the
    document's records take tags as stored, for ``memsvc import``; review)."""
    save = {"content": "Alice likes tea", "userId": "alice"}
    assert api.post("/v1/agent/memories", save, as_=helper).status_code == 201
    document = agent_export(api, helper)
    other = make_agent("tagged")
    for tags, said in [
        (["tea", "\u200b"], "memories: the tag '\\u200b': must not be empty"),
        # (A save refuses it too: " a " and "a" were two tags.)
        (["a", " a "], "memories: the tag ' a ': must not begin or end with a space"),
    ]:
        document["memories"][0]["tags"] = tags
        refused = api.post("/v1/agent/import", document, as_=other)
        assert refused.status_code == 400, refused.content
        assert refused.json()["error"].endswith(said)
        assert not Memory.objects.filter(agent=other.agent).exists()


def test_an_agent_imports_an_export_as_if_it_had_written_it(api, world):
    """Into another agent: every record, with what that agent cannot see here left out."""
    source = world.agent
    # The source agent reads bob's conversation, where alice hummed, and cites her turn.
    group = Conversation.objects.get(id=world.his).group
    Membership.objects.create(group=group, principal_id=source.principal_id, access_level="reader")
    memory_save(
        source.as_principal(),
        agent=source,
        user_id="alice",
        content="Alice hums xylophone tunes",
        message_ids=[uuid.UUID(world.hers)],
    )
    document = agent_export(api, key_of(source))
    before = memory_of_the_agent(source)

    newcomer = make_agent("newcomer")
    response = api.post("/v1/agent/import", document, as_=newcomer)
    assert response.status_code == 200, response.content[:500]
    counts = {"memoryBlocks": 2, "memories": 4, "toolRecords": 2}
    assert response.json() == {"stored": counts, "skipped": dict.fromkeys(counts, 0)}

    imported = memory_of_the_agent(newcomer.agent)
    cited = [i for *_, ids in before["memories"] for i in ids]
    assert [str(i) for i in cited] == [world.hers]
    # The newcomer is no member of bob's conversation: neither the cited turn nor the tool
    # record's conversation comes with it; all else does.
    assert imported["memories"] == [(*row, []) for *row, _ in before["memories"]]
    assert imported["blocks"] == before["blocks"]
    assert imported["tool_records"] == [
        (name, None, *rest) for name, _, *rest in before["tool_records"]
    ]
    assert {actor for *_, actor in imported["revisions"]} == {newcomer.agent.principal_id}
    assert {actor for *_, actor in before["revisions"]} == {source.principal_id}
    # New ids: no row of the source's was touched or taken.
    assert not set(Memory.objects.filter(agent=newcomer.agent).values_list("id", flat=True)) & set(
        Memory.objects.filter(agent=source).values_list("id", flat=True)
    )
    assert memory_of_the_agent(source) == before
    # Found by keyword before its vector is made.
    found = api.post(
        "/v1/agent/memories/search", {"query": "marathons", "mode": "keyword"}, as_=newcomer
    )
    assert found.status_code == 200
    assert found.json()["data"] == []  # bob's memory is about bob: not the agent's own
    found = api.post(
        "/v1/agent/memories/search",
        {"query": "marathons", "mode": "keyword", "userId": "bob"},
        as_=newcomer,
    )
    assert [hit["content"] for hit in found.json()["data"]] == ["Bob runs marathons"]


def test_what_an_agent_imports_has_its_vectors_once_the_import_commits(
    api, world, django_capture_on_commit_callbacks
):
    """Not a minute later, at the sweeps' next run: semantic search finds it at once."""
    document = agent_export(api, key_of(world.agent))
    newcomer = make_agent("newcomer")
    with django_capture_on_commit_callbacks(execute=True):
        assert api.post("/v1/agent/import", document, as_=newcomer).status_code == 200
    for rows in (Memory.objects, ToolRecord.objects):
        imported = rows.filter(agent=newcomer.agent)
        assert imported.exists()
        assert not imported.filter(embedding__isnull=True).exists()


def test_an_agent_imports_an_export_of_values_as_deep_as_the_api_takes(api):
    """A tool record's output as deeply nested as a request may make it sits two levels
    deeper in the export (the section's list, the record): the import refused the whole
    document ("must not be nested more than 64 levels")."""
    source, newcomer = make_agent("deep-source"), make_agent("deep-newcomer")
    deepest = json.loads("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    record = {"toolName": "nest", "taskId": "t", "step": 1, "input": {}, "output": deepest}
    assert api.post("/v1/agent/tool-records", record, as_=source).status_code == 201
    too_deep = {**record, "output": [deepest]}
    assert api.post("/v1/agent/tool-records", too_deep, as_=source).status_code == 400

    document = agent_export(api, source)
    response = api.post("/v1/agent/import", document, as_=newcomer)
    assert response.status_code == 200, response.content[:500]
    assert ToolRecord.objects.get(agent=newcomer.agent).raw_output == deepest
    # Deeper than any record's value may be: refused still, by the parser.
    document["toolRecords"][0]["output"] = [[deepest]]
    refused = api.post("/v1/agent/import", document, as_=make_agent("deep-other"))
    assert refused.status_code == 400


def test_an_import_refuses_a_part_no_export_writes(api, world):
    """A typo ("memroies") had its records skipped in silence, and the import said it was
    done (review): refused, naming it, nothing stored."""
    document = agent_export(api, key_of(world.agent))
    document["memroies"] = document.pop("memories")
    newcomer = make_agent("newcomer")
    refused = api.post("/v1/agent/import", document, as_=newcomer)
    assert refused.status_code == 400, refused.content[:300]
    assert refused.json()["error"].endswith("memroies: no part of agent documents")
    assert not MemoryBlock.objects.filter(agent=newcomer.agent).exists()


def test_an_import_that_collides_stores_nothing(api, world):
    """Imported twice: its blocks' labels (and memories) are the agent's already: 409."""
    document = agent_export(api, key_of(world.agent))
    newcomer = make_agent("newcomer")
    assert api.post("/v1/agent/import", document, as_=newcomer).status_code == 200
    kept = memory_of_the_agent(newcomer.agent)
    response = api.post("/v1/agent/import", document, as_=newcomer)
    assert response.status_code == 409, response.content[:300]
    assert response.json()["code"] == "conflict"
    # What collided, named (one message said "a block's label, a memory's content or an id
    # in it": review); PostgreSQL's words stay inside.
    assert response.json()["error"].endswith(
        "a block's label is stored already, or is in the document twice"
    )
    assert "Failing row" not in response.json()["error"]
    assert memory_of_the_agent(newcomer.agent) == kept
    # The same memory twice in one document collides with itself: nothing stored.
    twice = {**document, "memories": [document["memories"][0]] * 2, "memoryBlocks": []}
    third = make_agent("third")
    response = api.post("/v1/agent/import", twice, as_=third)
    assert response.status_code == 409
    assert response.json()["error"].endswith(
        "a memory's content is stored already, or is in the document twice"
    )
    assert not Memory.objects.filter(agent__name="third").exists()


def test_an_import_of_a_memory_the_agent_kept_until_it_expired_stores_it_anew(api, world):
    """An expired memory is gone (not listed, not found, saved again as new): its words in
    an import were a 409 "stored already" until the prune ran."""
    document = agent_export(api, key_of(world.agent))
    newcomer = make_agent("newcomer")
    assert api.post("/v1/agent/import", document, as_=newcomer).status_code == 200
    Memory.objects.filter(agent=newcomer.agent).update(expires_at=timezone.now())
    memories_only = {**document, "memoryBlocks": [], "toolRecords": []}
    response = api.post("/v1/agent/import", memories_only, as_=newcomer)
    assert response.status_code == 200, response.content[:300]
    assert response.json()["stored"]["memories"] == len(document["memories"])
    again = Memory.objects.filter(agent=newcomer.agent)
    assert again.count() == len(document["memories"])
    assert not again.filter(expires_at__lte=timezone.now()).exists()


def test_an_agent_import_skips_what_is_about_a_user_who_turned_memory_off(api, world):
    """Her memory, her block and the tool record made for her (``POST /v1/agent/...``
    about her is a 409 for each; the record was imported)."""
    tool_records_create(
        Principal.for_agent(world.agent.id, on_behalf_of="alice"),
        agent=world.agent,
        records=[NewToolRecord(tool_name="lookup_allergies", raw_output={"nuts": True})],
    )
    document = agent_export(api, key_of(world.agent))
    memory_setting_update(Principal.user("alice"), enabled=False)
    # (A key that may act for users: the document holds a tool record made for one.)
    newcomer = make_agent("newcomer", ("read", "write", "impersonate"))
    response = api.post("/v1/agent/import", document, as_=newcomer)
    assert response.status_code == 200, response.content[:400]
    assert response.json()["stored"] == {"memoryBlocks": 1, "memories": 2, "toolRecords": 2}
    assert response.json()["skipped"] == {"memoryBlocks": 1, "memories": 1, "toolRecords": 1}
    kept = memory_of_the_agent(newcomer.agent)
    assert "alice" not in {user for user, *_ in kept["memories"]}
    assert "alice" not in {user for user, *_ in kept["blocks"]}
    records = ToolRecord.objects.filter(agent=newcomer.agent)
    assert sorted(records.values_list("tool_name", flat=True)) == ["ping", "search_hotels"]


def test_an_agent_import_skips_what_was_about_a_user_before_she_was_erased(api, world):
    """Her memory, her block and the tool record made for her, exported before her erase,
    stay erased when the document comes back (they were put back); what the agent learned
    about her after it is kept, as it keeps anything new."""
    tool_records_create(
        Principal.for_agent(world.agent.id, on_behalf_of="alice"),
        agent=world.agent,
        records=[NewToolRecord(tool_name="lookup_allergies", raw_output={"nuts": True})],
    )
    before = agent_export(api, key_of(world.agent))
    user_erase(Principal.user("alice"), confirm="alice")
    memory_save(
        world.agent.as_principal(), agent=world.agent, user_id="alice", content="Alice is new"
    )
    after = agent_export(api, key_of(world.agent))

    newcomer = make_agent("newcomer", ("read", "write", "impersonate"))
    response = api.post("/v1/agent/import", before, as_=newcomer)
    assert response.status_code == 200, response.content[:400]
    assert response.json()["stored"] == {"memoryBlocks": 1, "memories": 2, "toolRecords": 2}
    assert response.json()["skipped"] == {"memoryBlocks": 1, "memories": 1, "toolRecords": 1}
    assert not Memory.objects.filter(user_id="alice").exclude(agent=world.agent).exists()
    assert not MemoryBlock.objects.filter(user_id="alice").exists()
    assert not ToolRecord.objects.filter(user_id="alice").exists()

    third = make_agent("third")
    response = api.post("/v1/agent/import", after, as_=third)
    assert response.status_code == 200, response.content[:400]
    assert response.json()["skipped"]["memories"] == 0
    assert list(
        Memory.objects.filter(agent=third.agent, user_id="alice").values_list("content", flat=True)
    ) == ["Alice is new"]


def test_a_users_import_erases_again_only_what_its_document_brought_back(
    api, alice, bob, tmp_path, world, capsys
):
    """Alice's record (made for her, in no conversation) is not in Bob's document: his
    import, erasing again what it brought back of those erased since it was made, took it
    too, and counted it against his own records (review)."""
    tool_records_create(
        Principal.for_agent(world.agent.id, on_behalf_of="alice"),
        agent=world.agent,
        records=[NewToolRecord(tool_name="lookup_allergies", raw_output={"nuts": True})],
    )
    alices, bobs = (
        cli_export(tmp_path, "alice", "user", "alice"),
        cli_export(tmp_path, "bob", "user", "bob"),
    )
    assert "lookup_allergies" not in {record["toolName"] for record in bobs["toolRecords"]}
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    assert import_file(tmp_path, alices) == 0  # (hers, back)
    call(api, "POST", "/v1/user/erase", bob, {"confirm": "bob"})
    capsys.readouterr()
    assert import_file(tmp_path, bobs) == 0
    assert f"toolRecords: {len(bobs['toolRecords'])}\n" in capsys.readouterr().err
    assert ToolRecord.objects.filter(user_id="alice", tool_name="lookup_allergies").exists()


def test_an_import_keeps_only_the_newest_revisions_this_server_keeps(tmp_path, world, settings):
    """A document from a server that keeps more revisions (or all: 0) put every one back,
    listed until the block's next write (review)."""
    block = MemoryBlock.objects.get(agent=world.agent, user_id="alice")
    for line in range(4):
        block = memory_block_update(world.agent.as_principal(), block=block, append=f"l{line}")
    newest = list(
        block.revisions.order_by(*MemoryBlockRevision.NEWEST_FIRST).values_list("value", flat=True)
    )
    assert len(newest) == 6
    cli_export(tmp_path, "first", "agent", str(world.agent.id))
    world.agent.delete()

    settings.MEMSVC_BLOCK_REVISIONS_KEPT = 3
    assert cli.main(["import", str(tmp_path / "first.json")]) == 0
    restored = MemoryBlock.objects.get(user_id="alice")
    assert (
        list(
            restored.revisions.order_by(*MemoryBlockRevision.NEWEST_FIRST).values_list(
                "value", flat=True
            )
        )
        == newest[:3]
    )
    # Another block's, fewer than that, all kept.
    assert MemoryBlockRevision.objects.filter(block__user_id="bob").count() == 1


def test_what_a_user_brought_back_herself_survives_her_agents_move(
    api, alice, tmp_path, world, capsys
):
    """Alice erased, then imported her own document: her memory and block are back with
    their old dates. The operator then moved the agent (export, drop, import): its import
    skipped them as older than her erase (review). Erased again, it skips them again."""
    alices = cli_export(tmp_path, "alice", "user", "alice")
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    assert import_file(tmp_path, alices) == 0
    cli_export(tmp_path, "agent", "agent", str(world.agent.id))
    world.agent.delete()
    capsys.readouterr()
    assert cli.main(["import", str(tmp_path / "agent.json")]) == 0
    assert "skipped" not in capsys.readouterr().err
    assert Memory.objects.filter(user_id="alice").count() == 1
    assert MemoryBlock.objects.filter(user_id="alice").count() == 1

    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    Agent.objects.all().delete()
    assert cli.main(["import", str(tmp_path / "agent.json")]) == 0
    assert not Memory.objects.filter(user_id="alice").exists()
    assert not MemoryBlock.objects.filter(user_id="alice").exists()


def test_an_operators_import_skips_what_was_about_a_user_before_she_was_erased(
    tmp_path, world, capsys
):
    """``memsvc import`` of an agent's document made before her erase (the agent restored
    after a drop) does not put back what the erase took about her."""
    cli_export(tmp_path, "first", "agent", str(world.agent.id))
    user_erase(Principal.user("alice"), confirm="alice")
    agent_id = world.agent.id
    world.agent.delete()

    assert cli.main(["import", str(tmp_path / "first.json")]) == 0
    err = capsys.readouterr().err
    for section in ("memoryBlocks: 1", "memories: 2"):
        assert f"{section} (1 skipped" in err, err
    assert not Memory.objects.filter(user_id="alice").exists()
    assert not MemoryBlock.objects.filter(user_id="alice").exists()
    assert Memory.objects.filter(agent_id=agent_id, user_id="bob").exists()


def test_an_operators_import_skips_what_is_about_a_user_who_turned_memory_off(
    tmp_path, world, capsys
):
    """``memsvc import`` of an agent's document (moved between servers, restored after a
    drop) put back her memory, her block and the record made for her, as the agent's own
    import does not: an agent keeps nothing new about her, whoever brings it. It says how
    many it skipped, and why."""
    tool_records_create(
        Principal.for_agent(world.agent.id, on_behalf_of="alice"),
        agent=world.agent,
        records=[NewToolRecord(tool_name="lookup_allergies", raw_output={"nuts": True})],
    )
    cli_export(tmp_path, "first", "agent", str(world.agent.id))
    memory_setting_update(Principal.user("alice"), enabled=False)
    agent_id = world.agent.id
    world.agent.delete()

    assert cli.main(["import", str(tmp_path / "first.json")]) == 0
    err = capsys.readouterr().err
    for section in ("memoryBlocks: 1", "memories: 2", "toolRecords: 2"):
        assert f"{section} (1 skipped" in err, err
    assert "turned memory off" in err
    assert not Memory.objects.filter(user_id="alice").exists()
    assert not MemoryBlock.objects.filter(user_id="alice").exists()
    assert not ToolRecord.objects.filter(user_id="alice").exists()
    assert Memory.objects.filter(agent_id=agent_id, user_id="bob").exists()


def test_an_agent_import_skips_memories_whose_time_is_up(api, world):
    """As the API refuses an ``expiresAt`` that is not in the future."""
    document = agent_export(api, key_of(world.agent))
    gone = next(m for m in document["memories"] if m["content"] == "Bob runs marathons")
    gone["expiresAt"] = "2020-01-01T00:00:00Z"
    newcomer = make_agent("newcomer")
    response = api.post("/v1/agent/import", document, as_=newcomer)
    assert response.status_code == 200
    assert (response.json()["stored"]["memories"], response.json()["skipped"]["memories"]) == (
        2,
        1,
    )
    kept = memory_of_the_agent(newcomer.agent)["memories"]
    assert "Bob runs marathons" not in {content for _, content, *_ in kept}


def test_what_an_agent_imports_is_new_and_its_own(api, world):
    """Nothing in a document outlives the import that the agent could not have written:
    block numbers, a block's history (by whom, when), times to come, a memory's uses."""
    document = agent_export(api, key_of(world.agent))
    future, block = "9999-01-01T00:00:00Z", document["memoryBlocks"][0]
    block.update(id=NUMBER_MAX, createdAt=future, updatedAt=future)
    block["revisions"] = [{"value": "forged", "actor": "alice", "createdAt": future}] * 60
    document["memories"][0].update(accessCount=99_999, createdAt=future, updatedAt=future)
    newcomer = make_agent("newcomer")
    assert api.post("/v1/agent/import", document, as_=newcomer).status_code == 200

    blocks = MemoryBlock.objects.filter(agent=newcomer.agent)
    assert max(blocks.values_list("id", flat=True)) < 1_000_000
    revisions = MemoryBlockRevision.objects.filter(block__agent=newcomer.agent)
    assert revisions.count() == blocks.count()
    assert {r.actor_principal for r in revisions} == {newcomer.agent.principal_id}
    assert sorted(r.value for r in revisions) == sorted(b.value for b in blocks)
    now = timezone.now()
    memories = Memory.objects.filter(agent=newcomer.agent)
    assert max(memories.values_list("created_at", flat=True)) <= now
    assert max(blocks.values_list("updated_at", flat=True)) <= now
    assert set(memories.values_list("access_count", "last_accessed_at")) == {(0, None)}
    # The sequence went on from where it was: the next block of any agent is made.
    later = api.post("/v1/agent/memory-blocks", {"label": "later"}, as_=make_agent("other"))
    assert later.status_code == 201, later.content


def bad_documents(document: dict):
    memory = document["memories"][0]
    yield "not a document", {"format": "other"}
    yield "a user's document", {**document, "kind": "user", "userId": "alice"}
    yield (
        "a record without content",
        {
            **document,
            "memories": [{k: v for k, v in memory.items() if k != "content"}],
        },
    )
    yield "an importance of 7", {**document, "memories": [{**memory, "importance": 7}]}
    yield "a NUL", {**document, "memories": [{**memory, "content": "nuts\u0000"}]}
    yield "a tag too long to store", {**document, "memories": [{**memory, "tags": ["t" * 101]}]}
    yield "a null record", {**document, "memories": [memory, None]}
    yield "metadata not an object", {**document, "memories": [{**memory, "metadata": [1]}]}
    yield "blank content", {**document, "memories": [{**memory, "content": "   "}]}
    yield "about an agent", {**document, "memories": [{**memory, "userId": "agent:1"}]}
    yield "about a tab", {**document, "memories": [{**memory, "userId": "bo\tb"}]}
    block = document["memoryBlocks"][0]
    yield "a value over its limit", {**document, "memoryBlocks": [{**block, "limit": 1}]}
    yield "a block number past bigint", {**document, "memoryBlocks": [{**block, "id": 2**64}]}
    yield "no agent", {k: v for k, v in document.items() if k != "agent"}
    yield "a list of sections", [document]


def test_a_bad_document_is_a_400_and_stores_nothing(api, world):
    document = agent_export(api, key_of(world.agent))
    newcomer = make_agent("newcomer")
    for why, bad in bad_documents(document):
        response = api.post("/v1/agent/import", bad, as_=newcomer)
        assert response.status_code == 400, (why, response.content[:300])
        body = response.json()
        assert body["code"] == "validation_error", why
        # (A record's field named where it is, "memories[0].content"; else the body.)
        assert body["error"].startswith(("body: nothing imported: ", "nothing imported: ")), why
        assert body["details"] and all(
            place == "body" or "[" in place for place in body["details"]
        ), (why, body)
        assert not any(memory_of_the_agent(newcomer.agent).values()), why


def test_an_agents_memory_is_its_own_not_a_users_nor_a_readers(api, world, helper):
    document = agent_export(api, key_of(world.agent))
    reader = key_of(world.agent, scopes=("read",))
    assert api.get("/v1/agent/export", as_=reader).status_code == 200
    refused = api.post("/v1/agent/import", document, as_=reader)
    assert refused.status_code == 403
    for method, path, body in (
        ("GET", "/v1/agent/export", None),
        ("POST", "/v1/agent/import", document),
    ):
        response = api.call(method, path, as_=helper.acting_for("alice"), body=body)
        assert response.status_code == 403, response.content[:300]
        assert "acting for alice" in response.json()["error"]
    assert not Memory.objects.filter(agent=helper.agent).exists()


def test_fork_trees_are_read_in_one_walk_whatever_their_depth():
    """``_forks_form_trees`` on a chain of 2,000 forks, each at its grandparent's message
    (an ancestor's: accepted), then one forked at its child's message (refused). Walking
    each fork's whole ancestry took 14.8 s for this chain, inside the import's transaction."""
    from agents_api.portability.importing import _forks_form_trees
    from agents_api.portability.restore import ImportRefused

    ids = [uuid.uuid4() for _ in range(2000)]
    said = {conversation: uuid.uuid4() for conversation in ids}
    chain = [
        {
            "id": ids[i],
            "forked_at_conversation_id": ids[i - 1] if i else None,
            "forked_at_message_id": said[ids[i - 2]] if i >= 2 else None,
        }
        for i in range(len(ids))
    ]
    messages = [{"id": said[c], "conversation_id": c} for c in ids]
    _forks_form_trees({"conversations": chain, "messages": messages})
    chain[5]["forked_at_message_id"] = said[ids[6]]  # its own fork's message
    with pytest.raises(ImportRefused, match="fork point is not a message it forks from"):
        _forks_form_trees({"conversations": chain, "messages": messages})
    chain[5]["forked_at_message_id"], chain[0]["forked_at_conversation_id"] = None, ids[1999]
    with pytest.raises(ImportRefused, match="is forked from itself"):
        _forks_form_trees({"conversations": chain, "messages": messages})


# --- an export brought back after the world moved on (review) -------------------------------


def test_an_offer_cancelled_since_the_export_is_not_brought_back(
    api, alice, bob, charlie, tmp_path, capsys
):
    """Bob's export held alice's offer, pending; she cancelled it and gave the conversation
    to charlie. Imported, the offer came back pending, and bob's accept made him owner and
    charlie a manager. Now it is not restored, and a stale offer is refused at accept."""
    mine = call(api, "POST", "/v1/user/conversations", alice, {"title": "Plans"}, 201)["id"]
    path = f"/v1/user/conversations/{mine}/transfer-ownership"
    offer = call(api, "POST", path, alice, {"newOwnerUserId": "bob"}, 202)
    document = export(api, bob)
    assert [t["status"] for t in document["ownershipTransfersElsewhere"]] == ["pending"]
    call(api, "DELETE", f"/v1/user/ownership-transfers/{offer['id']}", alice, status=204)
    given = call(api, "POST", path, alice, {"newOwnerUserId": "charlie"}, 202)
    call(api, "POST", f"/v1/user/ownership-transfers/{given['id']}/accept", charlie)
    call(api, "POST", "/v1/user/erase", bob, {"confirm": "bob"})

    assert import_file(tmp_path, document) == 0
    assert call(api, "GET", "/v1/user/ownership-transfers", bob)["data"] == []
    # (Were it restored as it was: its sender owns nothing now.)
    OwnershipTransfer.objects.filter(id=given["id"]).update(status="cancelled")
    stale = OwnershipTransfer.objects.create(
        group_id=document["ownershipTransfersElsewhere"][0]["conversationGroupId"],
        conversation_id=mine,
        from_principal="alice",
        to_principal="bob",
    )
    refused = api.post(f"/v1/user/ownership-transfers/{stale.id}/accept", as_=bob)
    assert refused.status_code == 409, refused.content
    assert call(api, "GET", f"/v1/user/conversations/{mine}", charlie)["accessLevel"] == "owner"


def test_an_offer_beside_a_new_one_is_skipped_not_the_whole_import(
    api, alice, bob, charlie, tmp_path, capsys
):
    """Bob's export held alice's pending offer; she cancelled it and offered the
    conversation to charlie. The revived offer broke the one-pending-offer rule: nothing of
    bob's document was imported ("a block's label ... is stored already")."""
    mine = call(api, "POST", "/v1/user/conversations", alice, {"title": "Plans"}, 201)["id"]
    member = {"userId": "bob", "accessLevel": "writer"}
    call(api, "POST", f"/v1/user/conversations/{mine}/memberships", alice, member, 201)
    call(api, "POST", f"/v1/user/conversations/{mine}/messages", bob, {"content": "hi"}, 201)
    path = f"/v1/user/conversations/{mine}/transfer-ownership"
    offer = call(api, "POST", path, alice, {"newOwnerUserId": "bob"}, 202)
    document = export(api, bob)
    call(api, "DELETE", f"/v1/user/ownership-transfers/{offer['id']}", alice, status=204)
    call(api, "POST", "/v1/user/erase", bob, {"confirm": "bob"})
    call(api, "POST", path, alice, {"newOwnerUserId": "charlie"}, 202)

    assert import_file(tmp_path, document) == 0
    assert "ownershipTransfersElsewhere: 0" in capsys.readouterr().err
    said = call(api, "GET", f"/v1/user/conversations/{mine}/messages", bob)["data"]
    assert [m["content"] for m in said] == ["hi"]


def test_a_reply_whose_parent_was_erased_since_comes_back_without_it(
    api, alice, bob, charlie, helper, tmp_path, capsys
):
    """Bob's turn (recorded by the agent acting for him) replied to charlie's in alice's
    conversation; charlie's erase took the turn (bob's stored reply lost its parent), then
    bob erased his data: his import failed whole ("a record breaks a rule of what is
    stored")."""
    made = call(api, "POST", "/v1/agent/conversations", helper.acting_for("alice"), {}, 201)
    mine = made["id"]
    for person in ("bob", "charlie"):
        member = {"userId": person, "accessLevel": "writer"}
        call(api, "POST", f"/v1/user/conversations/{mine}/memberships", alice, member, 201)
    messages = f"/v1/user/conversations/{mine}/messages"
    asked = call(api, "POST", messages, charlie, {"content": "who comes?"}, 201)
    reply = {"role": "user", "content": "I do", "parentMessageId": asked["id"]}
    path = f"/v1/agent/conversations/{mine}/messages"
    call(api, "POST", path, helper.acting_for("bob"), {"messages": [reply]}, 201)
    document = export(api, bob)
    assert [m["parentMessageId"] for m in document["messagesElsewhere"]] == [asked["id"]]
    call(api, "POST", "/v1/user/erase", charlie, {"confirm": "charlie"})
    call(api, "POST", "/v1/user/erase", bob, {"confirm": "bob"})

    assert import_file(tmp_path, document) == 0
    [back] = call(api, "GET", messages, bob)["data"]
    assert (back["content"], back["parentMessageId"]) == ("I do", None)


def erased_at_once(start: threading.Barrier, user_id: str):
    """``user_erase`` of ``user_id`` once the other threads of ``start`` are there too."""
    try:
        start.wait(10)
        return user_erase(Principal.user(user_id), confirm=user_id)
    finally:
        connection.close()  # (this thread's)


@pytest.mark.django_db(transaction=True)
def test_two_people_who_offered_each_other_a_conversation_erase_at_once():
    """Each erase locked the offers of its own groups first and the other's offer to it last,
    after the other's erase had locked that offer and waited for a conversation of the first:
    a deadlock, one erase a 503, every time (review)."""
    for round_ in range(3):
        people = [f"crossing-{round_}-{side}" for side in "ab"]
        for giver, taker in (people, people[::-1]):
            conversation = conversation_create(Principal.user(giver), title="Offered")
            ownership_transfer_start(
                Principal.user(giver), conversation=conversation, to_principal=taker
            )
        start = threading.Barrier(2)
        with ThreadPoolExecutor(2) as pool:
            erasers = [pool.submit(erased_at_once, start, person) for person in people]
            erased = [eraser.result(30) for eraser in erasers]
        assert [e.conversations for e in erased] == [1, 1]
        assert not OwnershipTransfer.objects.filter(group__conversations__title="Offered").exists()
        assert not Conversation.objects.filter(title="Offered").exists()


def test_a_user_document_imported_over_itself_names_what_is_stored_already(
    api, alice, tmp_path, world, capsys
):
    document = cli_export(tmp_path, "first", "user", "alice")
    capsys.readouterr()
    assert import_file(tmp_path, document) != 0
    said = capsys.readouterr().err
    assert "a conversation group's id is stored already, or is in the document twice" in said


def test_a_message_place_in_a_document_twice_is_said_as_that(api, alice, tmp_path, world, capsys):
    """(A duplicated ``seq`` was reported as a duplicated id, where no id was: review.)"""
    document = cli_export(tmp_path, "first", "user", "alice")
    call(api, "POST", "/v1/user/erase", alice, {"confirm": "alice"})
    messages = document["messages"]
    assert len(messages) >= 2
    messages[-1]["seq"] = messages[-2]["seq"]
    path = tmp_path / "twice.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    capsys.readouterr()
    assert cli.main(["import", str(path)]) != 0
    said = capsys.readouterr().err
    assert "a message's place (seq) is taken here, or is in the document twice" in said
    assert not Conversation.objects.filter(group__memberships__principal_id="alice").exists()
