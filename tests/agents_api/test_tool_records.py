"""Tool records (the memory bank) through the agent API: the documented shapes, found by
vector and by keyword (an identifier only the raw output holds), paged by task, deleted by
task, who reaches what, and bad input refused with nothing written."""

import uuid

import numpy as np
import pytest

from agents_api.models import SummarySource, ToolRecord
from agents_api.services import NewToolRecord, memory_setting_update, tool_records_create
from agents_api.tasks import sweep_unembedded_tool_records_task
from conversations.models import Conversation
from conversations.services import conversation_delete
from memsvc import cli
from memsvc.api.errors import InvalidInput
from memsvc.api.principals import Principal
from search.embeddings import configured_backend
from tests.agents_api.conftest import make_agent
from tests.agents_api.test_api import agent_conversation
from tests.agents_api.test_memory_lifecycle import BrokenBackend
from tests.api import another_list, items_after, rekeyed
from tests.conversations.test_services import shared_group, waits_for

pytestmark = pytest.mark.django_db

RECORDS = "/v1/agent/tool-records"

HOTELS = {
    "results": [
        {"id": "htl-001", "name": "Grand Hotel", "price": 120},
        {"id": "htl-002", "name": "Harbour Inn", "price": 95},
        {"id": "htl-003", "name": "Old Town Rooms", "price": 80},
    ]
}


def create(api, credential, tool_name="search_hotels", output=HOTELS, **body):
    response = api.post(RECORDS, {"toolName": tool_name, "output": output, **body}, as_=credential)
    assert response.status_code == 201, response.content
    return response.json()


def search(api, credential, query, **body):
    response = api.post(f"{RECORDS}/search", {"query": query, **body}, as_=credential)
    assert response.status_code == 200, response.content
    return response.json()["data"]


def snapshot():
    return sorted(
        ToolRecord.objects.values_list("id", "agent_id", "task_id", "tool_name", "summary")
    )


@pytest.fixture
def backend_down(monkeypatch):
    broken = BrokenBackend()
    monkeypatch.setattr("search.services.configured_backend", lambda: broken)
    return broken


def test_create_returns_the_documented_record_kept_whole_and_embedded(api, helper):
    output = {**HOTELS, "page": {"next": None, "total": 3}, "note": "ünïcode ✓"}
    record = create(
        api, helper, input={"city": "Lisbon", "nights": 2}, output=output, taskId="trip-1", step=1
    )
    assert record == {
        "traceId": record["traceId"],
        "taskId": "trip-1",
        "conversationId": None,
        "step": 1,
        "toolName": "search_hotels",
        "input": {"city": "Lisbon", "nights": 2},
        "output": output,
        "summary": record["summary"],
        "createdAt": record["createdAt"],
    }
    stored = ToolRecord.objects.get(id=record["traceId"])
    assert stored.raw_output == output
    # Without an LLM the observer's deterministic summary is written at once, and embedded.
    assert stored.summary_source == SummarySource.FALLBACK
    assert "search_hotels" in record["summary"]
    assert "htl-001, htl-002, htl-003" in record["summary"]
    assert "results: 3 items" in record["summary"]
    [expected] = configured_backend().embed([stored.summary])
    assert np.dot(stored.embedding, expected) > 0.999
    assert api.get(f"{RECORDS}/{record['traceId']}", as_=helper).json() == record


def test_any_json_is_an_output_and_a_callers_summary_is_kept(api, helper):
    for output in [None, 42, "plain text", [1, 2, 3], {"_raw": "not json"}]:
        record = create(api, helper, tool_name="echo", output=output, summary="my summary")
        assert record["output"] == output
        assert record["summary"] == "my summary"
    assert set(ToolRecord.objects.values_list("summary_source", flat=True)) == {"caller"}
    # One of nothing to read is none: the observer's (review: it was kept, words of nothing).
    for blank in ("\t \n", "   ", "\u200b"):
        record = create(api, helper, tool_name="echo", output={"id": "WS-1"}, summary=blank)
        assert "WS-1" in record["summary"] and "Tool echo returned" in record["summary"]


def test_a_record_can_name_a_conversation_the_agent_sees(api, helper):
    conversation = agent_conversation(api, helper)
    record = create(api, helper, conversationId=conversation["id"])
    assert record["conversationId"] == conversation["id"]


def test_search_returns_the_top_3_by_default_best_first(api, helper):
    create(api, helper, "get_weather", {"city": "Lisbon", "forecast": "sunny, 24 degrees"})
    create(api, helper, "search_flights", {"flights": [{"id": "TP-1234", "from": "LHR"}]})
    create(api, helper, "search_hotels", HOTELS)
    create(api, helper, "book_hotel", {"booking": {"hotel_id": "htl-002", "status": "confirmed"}})
    create(api, helper, "get_exchange_rate", {"from": "EUR", "to": "GBP", "rate": 0.85})
    hits = search(api, helper, "which hotels were found and what do they cost")
    assert len(hits) == 3
    assert hits[0]["toolName"] == "search_hotels"
    assert hits[0]["output"] == HOTELS  # the fact store's raw data, whole
    scores = [hit["score"] for hit in hits]
    assert scores == sorted(scores, reverse=True)
    assert len(search(api, helper, "hotel", topK=5)) == 5


def test_an_identifier_only_the_output_holds_is_found_by_keyword_at_once(
    api, helper, backend_down, monkeypatch
):
    """No vector at all (the embedding backend is down) and a caller's summary that names
    no id: the hotel id in the raw output alone finds the record."""
    create(api, helper, "search_hotels", HOTELS, summary="Found three places to stay.")
    create(api, helper, "get_weather", {"forecast": "rain"}, summary="Weather looked up.")
    assert ToolRecord.objects.filter(embedding__isnull=False).count() == 0
    monkeypatch.undo()  # the backend is back for the query, the records still have no vector
    hits = search(api, helper, "htl-003", topK=1)
    assert [hit["summary"] for hit in hits] == ["Found three places to stay."]
    hits = search(api, helper, "Harbour Inn", topK=1)
    assert hits[0]["toolName"] == "search_hotels"


def test_a_word_after_a_dash_excludes_the_records_holding_it(api, helper):
    create(api, helper, "search_hotels", HOTELS)
    create(api, helper, "book_hotel", {"booking": {"hotel_id": "htl-002", "status": "confirmed"}})
    hits = search(api, helper, "hotel -htl-003", topK=5)
    assert [hit["toolName"] for hit in hits] == ["book_hotel"]


def test_search_and_list_narrow_to_a_task(api, helper):
    create(api, helper, taskId="trip-1", step=1)
    create(api, helper, taskId="trip-2", step=1)
    hits = search(api, helper, "hotels", taskId="trip-2")
    assert [hit["taskId"] for hit in hits] == ["trip-2"]
    assert search(api, helper, "hotels", taskId="no-such-task") == []


def test_list_by_task_pages_in_the_order_made(api, helper):
    for step in range(1, 6):
        create(api, helper, f"tool_{step}", taskId="long", step=step)
    create(api, helper, "elsewhere", taskId="other")
    first = api.get(RECORDS, as_=helper, taskId="long", limit=2).json()
    assert [r["step"] for r in first["data"]] == [1, 2] and first["nextCursor"]
    rest = items_after(api, RECORDS, first["nextCursor"], as_=helper, taskId="long", limit=2)
    steps = [1, 2] + [r["step"] for r in rest]
    assert steps == [1, 2, 3, 4, 5]
    assert len(api.get(RECORDS, as_=helper).json()["data"]) == 6  # every task
    assert api.get(RECORDS, as_=helper, after="garbage!").status_code == 400
    assert api.get(RECORDS, as_=helper, limit=0).status_code == 400
    # ``?taskId=`` (a client's empty variable) listed the records of no task (review).
    create(api, helper, "no task")
    empty = api.get(RECORDS, as_=helper, taskId="")
    assert empty.status_code == 400
    assert empty.json()["details"] == {"taskId": ["must not be empty"]}


def test_a_cursor_moment_without_an_offset_is_malformed(api, helper):
    """memsvc writes every cursor's moment with its offset: one without was read as the
    machine's local time (review)."""
    create(api, helper, taskId="t")
    create(api, helper, taskId="t")
    of_task = api.get(RECORDS, as_=helper, taskId="t", limit=1).json()["nextCursor"]
    of_all = api.get(RECORDS, as_=helper, limit=1).json()["nextCursor"]
    record_id = str(uuid.uuid4())
    for moment, status in (("2026-01-01T00:00:00", 400), ("2026-01-01T00:00:00+00:00", 200)):
        after = rekeyed(of_task, moment, record_id)
        response = api.get(RECORDS, as_=helper, taskId="t", after=after)
        assert response.status_code == status, (moment, response.content)
    forged = rekeyed(of_all, "2026-01-01", record_id)
    assert "after" in api.get(RECORDS, as_=helper, after=forged).json()["details"]


def test_a_cursor_of_another_task_or_caller_is_400_not_its_page(api, helper, rival):
    """A cursor held only the last record's place (createdAt, id): with another ``taskId``,
    none, or by another agent or one acting for a user, it answered that list's records
    made after it, as if that list were walked (or ended) there (review). A list's own
    cursors still walk it."""
    for step in (1, 2, 3):
        create(api, helper, f"tool_{step}", taskId="task1", step=step)
    create(api, helper, "later", taskId="task2")
    create(api, rival, "the rival's", taskId="task1")
    first = api.get(RECORDS, as_=helper, taskId="task1", limit=1).json()
    rest = items_after(api, RECORDS, first["nextCursor"], as_=helper, taskId="task1", limit=1)
    steps = [r["step"] for r in first["data"] + rest]
    assert steps == [1, 2, 3]
    cursor = first["nextCursor"]
    for credential, params in [
        (helper, {"taskId": "task2"}),
        (helper, {}),
        (helper.acting_for("alice"), {"taskId": "task1"}),
        (rival, {"taskId": "task1"}),
    ]:
        refused = api.get(RECORDS, as_=credential, after=cursor, **params)
        assert another_list(refused), (params, refused.content)


def test_delete_by_task(api, helper):
    create(api, helper, taskId="done")
    create(api, helper, taskId="done")
    create(api, helper, taskId="ongoing")
    response = api.call("DELETE", f"{RECORDS}?taskId=done", as_=helper)
    assert response.status_code == 200
    assert response.json() == {"deleted": 2}
    assert list(ToolRecord.objects.values_list("task_id", flat=True)) == ["ongoing"]
    # Without a task nothing is deleted: clearing every task at once is not one request.
    missing = api.call("DELETE", RECORDS, as_=helper)
    assert missing.status_code == 400
    assert missing.json()["details"] == {"taskId": [missing.json()["details"]["taskId"][0]]}
    assert ToolRecord.objects.count() == 1
    # A narrowing it does not know is refused, not ignored (the whole task was deleted).
    narrowed = api.call("DELETE", f"{RECORDS}?taskId=ongoing&step=2", as_=helper)
    assert narrowed.status_code == 400
    assert narrowed.json()["details"] == {"step": ["unknown query parameter"]}
    assert ToolRecord.objects.count() == 1


def test_a_task_id_longer_than_a_record_keeps_is_refused_wherever_it_is_given(api, helper):
    """A list or a delete by a task id of 256 characters answered 200 with nothing, where a
    create and a search refused it (review): 400 naming it, nothing deleted."""
    longest = create(api, helper, taskId="t" * 255)
    assert [
        r["traceId"] for r in api.get(RECORDS, as_=helper, taskId="t" * 255).json()["data"]
    ] == [longest["traceId"]]
    for method in ("GET", "DELETE"):
        response = api.call(method, f"{RECORDS}?taskId={'t' * 256}", as_=helper)
        assert response.status_code == 400, (method, response.content)
        assert response.json()["details"] == {"taskId": ["must be at most 255 characters"]}
    assert ToolRecord.objects.count() == 1


# --- who reaches what ------------------------------------------------------------------------


def test_another_agents_record_is_404_and_untouched(api, helper, rival):
    record = create(api, helper, taskId="secret-task")
    before = snapshot()
    assert api.get(f"{RECORDS}/{record['traceId']}", as_=rival).status_code == 404
    assert api.get(f"{RECORDS}/not-a-uuid", as_=rival).status_code == 404
    assert api.get(RECORDS, as_=rival, taskId="secret-task").json()["data"] == []
    assert search(api, rival, "htl-001") == []
    assert search(api, rival, "hotels", taskId="secret-task") == []
    deleted = api.call("DELETE", f"{RECORDS}?taskId=secret-task", as_=rival)
    assert deleted.json() == {"deleted": 0}
    assert snapshot() == before


def test_a_conversation_the_agent_does_not_see_is_refused(api, helper, rival):
    theirs = agent_conversation(api, rival)
    before = snapshot()
    response = api.post(
        RECORDS, {"toolName": "t", "output": 1, "conversationId": theirs["id"]}, as_=helper
    )
    assert response.status_code == 400
    assert "conversationId" in response.json()["details"]
    assert snapshot() == before
    assert Conversation.objects.filter(id=theirs["id"]).exists()


def test_acting_for_a_user_reaches_only_what_that_user_may_see(api, alice, bob, helper):
    """As messages are narrowed: an agent acting for alice reaches the records of the
    conversations both see (whoever they were made for) and those made for alice outside
    any conversation; not bob's, nor the agent's own outside a conversation."""

    def conversation_with_helper(user):
        body = {"agentId": str(helper.agent.id)}
        response = api.post("/v1/user/conversations", body, as_=user)
        assert response.status_code == 201, response.content
        return response.json()["id"]

    hers, his = conversation_with_helper(alice), conversation_with_helper(bob)
    as_alice, as_bob = helper.acting_for("alice"), helper.acting_for("bob")
    reached = {
        create(api, as_alice, "alice_in_hers", taskId="t", conversationId=hers)["traceId"],
        create(api, as_alice, "alice_alone", taskId="t")["traceId"],
        create(api, helper, "own_in_hers", taskId="t", conversationId=hers)["traceId"],
    }
    hidden = {
        create(api, as_bob, "bob_in_his", taskId="t", conversationId=his)["traceId"],
        create(api, as_bob, "bob_alone", taskId="t")["traceId"],
        create(api, helper, "own_alone", taskId="t")["traceId"],
    }

    def listed(credential, **params):
        return {r["traceId"] for r in api.get(RECORDS, as_=credential, **params).json()["data"]}

    assert listed(as_alice) == listed(as_alice, taskId="t") == reached
    assert listed(helper) == reached | hidden  # the agent itself reaches all its records
    assert {hit["traceId"] for hit in search(api, as_alice, "hotels", topK=10)} == reached
    for trace_id in hidden:
        assert api.get(f"{RECORDS}/{trace_id}", as_=as_alice).status_code == 404
    for trace_id in reached:
        assert api.get(f"{RECORDS}/{trace_id}", as_=as_alice).status_code == 200
    assert api.call("DELETE", f"{RECORDS}?taskId=t", as_=as_alice).json() == {"deleted": 3}
    assert {str(i) for i in ToolRecord.objects.values_list("id", flat=True)} == hidden


def test_acting_for_a_reader_deletes_only_what_was_kept_about_them(api, bob, charlie, helper):
    """Charlie reads bob's conversation, so an agent acting for him reaches its records;
    his delete of the task took them all, the record made for bob (the owner) and the
    agent's own too (review). He deletes what is kept about him (made for him, or of a
    conversation he owns: as his erase); bob, the owner, deletes the rest."""
    body = {"agentId": str(helper.agent.id)}
    his = api.post("/v1/user/conversations", body, as_=bob).json()["id"]
    shared = {"userId": "charlie", "accessLevel": "reader"}
    assert api.post(f"/v1/user/conversations/{his}/memberships", shared, as_=bob).status_code == 201
    as_bob, as_charlie = helper.acting_for("bob"), helper.acting_for("charlie")
    for_bob = create(api, as_bob, "for_bob", taskId="t", conversationId=his)["traceId"]
    own = create(api, helper, "own", taskId="t", conversationId=his)["traceId"]
    create(api, as_charlie, "for_charlie", taskId="t", conversationId=his)
    listed = api.get(RECORDS, as_=as_charlie, taskId="t").json()["data"]
    assert len(listed) == 3

    assert api.call("DELETE", f"{RECORDS}?taskId=t", as_=as_charlie).json() == {"deleted": 1}
    assert {str(i) for i in ToolRecord.objects.values_list("id", flat=True)} == {for_bob, own}
    assert api.call("DELETE", f"{RECORDS}?taskId=t", as_=as_bob).json() == {"deleted": 2}
    assert not ToolRecord.objects.exists()


def test_a_record_sent_again_with_its_idempotency_key_is_stored_once(api, helper):
    """A create whose answer was lost is sent again with its key: the first record back
    (201, ``Idempotent-Replayed``), nothing stored; the same key acting for a user is
    another request (409)."""
    body = {"toolName": "search_hotels", "output": HOTELS, "taskId": "trip", "step": 1}
    first = api.post(RECORDS, body, as_=helper, headers={"HTTP_IDEMPOTENCY_KEY": "step-1"})
    again = api.post(RECORDS, body, as_=helper, headers={"HTTP_IDEMPOTENCY_KEY": "step-1"})
    assert first.status_code == again.status_code == 201, again.content
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    for_alice = api.post(
        RECORDS, body, as_=helper.acting_for("alice"), headers={"HTTP_IDEMPOTENCY_KEY": "step-1"}
    )
    assert for_alice.status_code == 409
    assert for_alice.json()["code"] == "conflict"
    assert ToolRecord.objects.count() == 1


def test_no_record_is_kept_for_a_user_who_turned_memory_off(api, helper):
    """As memories and blocks: acting for her, a 409 and nothing stored (an agent's import
    skips such records too); the agent's own records are stored as before."""
    memory_setting_update(Principal.user("alice"), enabled=False)
    body = {"toolName": "lookup_allergies", "output": {"nuts": True}}
    refused = api.post(RECORDS, body, as_=helper.acting_for("alice"))
    assert refused.status_code == 409, refused.content
    assert "turned memory off" in refused.json()["error"]
    assert not ToolRecord.objects.exists()
    assert api.post(RECORDS, body, as_=helper.acting_for("bob")).status_code == 201
    assert api.post(RECORDS, body, as_=helper).status_code == 201


def test_search_finds_no_record_about_a_user_who_turned_memory_off(api, helper):
    """As a memory search about her finds nothing: the records made for her before she
    turned memory off are not found (they were, by the agent's search and acting for her),
    by the agent API and the local API alike; they stay, for her export and erase. On
    again, they are found again."""
    hers = create(api, helper.acting_for("alice"), output={"hotel": "htl-777", "for": "alice"})
    mine = create(api, helper, output={"hotel": "htl-777", "for": "the agent"})
    memory_setting_update(Principal.user("alice"), enabled=False)

    assert [hit["traceId"] for hit in search(api, helper, "htl-777")] == [mine["traceId"]]
    assert search(api, helper.acting_for("alice"), "htl-777") == []
    local = api.post(
        "/tool-records/search",
        {"agent_name": helper.agent.name, "query": "htl-777"},
        as_=helper,
    )
    assert local.status_code == 200, local.content
    assert [hit["trace_id"] for hit in local.json()] == [mine["traceId"]]
    assert ToolRecord.objects.filter(id=hers["traceId"]).exists()

    memory_setting_update(Principal.user("alice"), enabled=True)
    found = {hit["traceId"] for hit in search(api, helper, "htl-777")}
    assert found == {hers["traceId"], mine["traceId"]}


def test_nothing_new_is_kept_of_her_conversations_once_memory_is_off(api, alice, helper):
    """The agent's own record of a conversation she owns is kept about her (her export
    and erase take it): with memory off it was still stored, and found (review). Refused,
    as one made for her; those made before stay, not found."""
    body = {"agentId": str(helper.agent.id)}
    hers = api.post("/v1/user/conversations", body, as_=alice).json()["id"]
    before = create(api, helper, output={"id": "carol-medical-77"}, conversationId=hers)
    memory_setting_update(Principal.user("alice"), enabled=False)
    refused = api.post(RECORDS, {"toolName": "t", "output": 1, "conversationId": hers}, as_=helper)
    assert refused.status_code == 409, refused.content
    # (Not named to an agent that does not act for her: review.)
    assert refused.json()["error"] == "the owner of a conversation named has turned memory off"
    assert list(ToolRecord.objects.values_list("id", flat=True)) == [uuid.UUID(before["traceId"])]
    assert search(api, helper, "carol-medical-77") == []
    memory_setting_update(Principal.user("alice"), enabled=True)
    assert [hit["traceId"] for hit in search(api, helper, "carol-medical-77")] == [
        before["traceId"]
    ]


def test_the_local_search_leaves_out_the_records_it_is_told_to(api, helper):
    """The memory bank holds the last step's records already: the search gives the best of
    the others (it had asked for 20 and filtered them out: a step of 20 calls got none)."""
    first = create(api, helper, output={"hotel": "htl-777", "n": 1})
    second = create(api, helper, output={"hotel": "htl-777", "n": 2})

    def found(**extra) -> object:
        body = {"agent_name": helper.agent.name, "query": "htl-777", "top_k": 1, **extra}
        return api.post("/tool-records/search", body, as_=helper)

    assert len(found().json()) == 1
    kept = found(exclude_trace_ids=[first["traceId"]])
    assert [hit["trace_id"] for hit in kept.json()] == [second["traceId"]]
    both = [first["traceId"], second["traceId"]]
    assert found(exclude_trace_ids=both).json() == []
    for refused in (["not-an-id"], [first["traceId"]] * 1001, "htl"):
        response = found(exclude_trace_ids=refused)
        assert response.status_code == 422, response.content
        assert response.json()["detail"][0]["loc"][:2] == ["body", "exclude_trace_ids"]


def test_a_record_outlives_its_conversation_as_an_import_keeps_it(api, alice, helper):
    """The record is the agent's memory: deleting its conversation unlinks it (as an import
    keeps a record whose conversation is gone), it does not delete it."""
    body = {"agentId": str(helper.agent.id)}
    conversation = api.post("/v1/user/conversations", body, as_=alice).json()["id"]
    record = create(api, helper, taskId="trip", conversationId=conversation)
    deleted = api.call("DELETE", f"/v1/user/conversations/{conversation}", as_=alice)
    assert deleted.status_code == 204
    assert not Conversation.objects.filter(id=conversation).exists()
    kept = api.get(f"{RECORDS}/{record['traceId']}", as_=helper).json()
    assert kept == {**record, "conversationId": None}
    assert [hit["traceId"] for hit in search(api, helper, "htl-002")] == [record["traceId"]]


@pytest.mark.django_db(transaction=True)
def test_a_record_racing_the_deletion_of_its_conversation_is_refused():
    """The record's conversation was seen, then deleted before the record is written: a 400
    naming it, not a 500 when the record's foreign key is checked at commit."""
    racer = make_agent("racer")
    conversation = shared_group(**{racer.agent.principal_id: "writer"})

    refused = waits_for(
        lambda: conversation_delete(Principal.user("alice"), conversation=conversation),
        lambda: tool_records_create(
            racer.agent.as_principal(),
            agent=racer.agent,
            records=[NewToolRecord(tool_name="t", raw_output=1, conversation=conversation)],
        ),
    )

    assert isinstance(refused, InvalidInput), refused
    assert "conversationId" in refused.details
    assert not ToolRecord.objects.exists()


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", RECORDS, {"toolName": "t", "output": 1}),
        ("DELETE", f"{RECORDS}?taskId=t", None),
    ],
)
def test_a_read_key_cannot_write(api, helper, method, path, body):
    create(api, helper, taskId="t")
    reader = make_agent("helper", scopes=["read"])
    before = snapshot()
    response = api.call(method, path, as_=reader, body=body)
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden"
    assert snapshot() == before
    assert len(search(api, reader, "hotels")) == 1  # reading is what the key is for


def test_a_write_only_key_cannot_read(api, helper):
    record = create(api, helper)
    writer = make_agent("helper", scopes=["write"])
    assert api.post(f"{RECORDS}/search", {"query": "x"}, as_=writer).status_code == 403
    assert api.get(RECORDS, as_=writer).status_code == 403
    assert api.get(f"{RECORDS}/{record['traceId']}", as_=writer).status_code == 403


def test_without_a_key_it_is_401(api, alice):
    assert api.get(RECORDS).status_code == 401
    assert api.post(f"{RECORDS}/search", {"query": "x"}).status_code == 401
    # A user's token is a credential of the wrong kind for the agent API.
    assert api.post(RECORDS, {"toolName": "t", "output": 1}, as_=alice).status_code == 401
    assert not ToolRecord.objects.exists()


# --- bad input: 400 naming the field, nothing written ----------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"output": 1}, "toolName"),
        ({"toolName": "", "output": 1}, "toolName"),
        ({"toolName": "   ", "output": 1}, "toolName"),  # (kept: review)
        ({"toolName": "\u200b", "output": 1}, "toolName"),
        ({"toolName": "t"}, "output"),
        ({"toolName": "t", "output": 1, "input": [1, 2]}, "input"),
        ({"toolName": "t", "output": {"a": "nul\x00here"}}, "output"),
        ({"toolName": "t", "output": "x" * (1024 * 1024 + 1)}, "output"),
        ({"toolName": "t", "output": 1, "step": -1}, "step"),
        ({"toolName": "t", "output": 1, "step": 2**31}, "step"),
        ({"toolName": "t", "output": 1, "taskId": "t" * 256}, "taskId"),
        # Names, as a block's label or a tag is (review: these were kept).
        ({"toolName": "a\nb", "output": 1}, "toolName"),
        ({"toolName": " t", "output": 1}, "toolName"),
        ({"toolName": "t", "output": 1, "taskId": " x"}, "taskId"),
        ({"toolName": "t", "output": 1, "taskId": "x\u202e"}, "taskId"),
        ({"toolName": "t", "output": 1, "conversationId": "nope"}, "conversationId"),
        ({"toolName": "t", "output": 1, "conversationId": "5" * 32}, "conversationId"),
        ({"toolName": "t", "output": 1, "colour": "red"}, "colour"),
    ],
)
def test_bad_records_are_400_naming_the_field(api, helper, body, field):
    response = api.post(RECORDS, body, as_=helper)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "validation_error"
    assert field in response.json()["details"]
    assert not ToolRecord.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "query"),
        ({"query": "  "}, "query"),
        ({"query": "x", "topK": 0}, "topK"),
        ({"query": "x", "topK": 21}, "topK"),
        ({"query": "x", "mode": "semantic"}, "mode"),
    ],
)
def test_bad_searches_are_400_naming_the_field(api, helper, body, field):
    response = api.post(f"{RECORDS}/search", body, as_=helper)
    assert response.status_code == 400
    assert field in response.json()["details"]


# --- the embedding pipeline ------------------------------------------------------------------


def test_a_record_saved_while_the_backend_is_down_is_embedded_by_the_sweep(
    api, helper, backend_down, monkeypatch
):
    record = create(api, helper)
    stored = ToolRecord.objects.get(id=record["traceId"])
    assert (stored.embedding, stored.embedded_at) == (None, None)
    monkeypatch.undo()
    assert sweep_unembedded_tool_records_task.apply().get() == 1
    stored.refresh_from_db()
    [expected] = configured_backend().embed([stored.summary])
    assert np.dot(stored.embedding, expected) > 0.999
    assert sweep_unembedded_tool_records_task.apply().get() == 0


def test_reindex_embeds_waiting_records(api, helper, backend_down, monkeypatch, capsys):
    record = create(api, helper)
    monkeypatch.undo()
    assert cli.main(["reindex"]) == 0
    assert "and 1 tool records" in capsys.readouterr().err
    assert ToolRecord.objects.get(id=record["traceId"]).embedded_at is not None
