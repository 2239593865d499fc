"""Conversations and messages through the user API: contents, paging, validation."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from conversations.models import Conversation, Membership, Message, Role, Visibility
from tests.agents_api.conftest import make_agent
from tests.api import another_list, rekeyed
from tests.factories import AgentFactory, ConversationFactory, MembershipFactory, MessageFactory

pytestmark = pytest.mark.django_db


def create(api, persona, **body):
    response = api.post("/v1/user/conversations", body, as_=persona)
    assert response.status_code == 201, response.content
    return response.json()


def walk(api, persona, path, limit, on_each_page=None):
    """Every item of a paged list, following ``nextCursor``."""
    items, cursor = [], None
    while True:
        params = {"limit": str(limit)}
        if cursor:
            params["after"] = cursor
        response = api.get(path, as_=persona, **params)
        assert response.status_code == 200, response.content
        body = response.json()
        assert len(body["data"]) <= limit
        items.extend(body["data"])
        if on_each_page:
            on_each_page()
        cursor = body["nextCursor"]
        if cursor is None:
            return items


def test_create_get_patch_conversation(api, alice):
    created = create(api, alice, title="Plans", metadata={"topic": "travel"})
    assert created["metadata"] == {"topic": "travel"}  # (written, and never read back: review)
    assert created["ownerUserId"] == "alice"
    assert created["accessLevel"] == "owner"
    assert created["forkedAtConversationId"] is None
    assert created["lastMessagePreview"] is None

    fetched = api.get(f"/v1/user/conversations/{created['id']}", as_=alice).json()
    assert fetched == created

    patched = api.patch(
        f"/v1/user/conversations/{created['id']}", {"metadata": {"topic": "food"}}, as_=alice
    ).json()
    assert patched["title"] == "Plans"
    assert patched["metadata"] == {"topic": "food"}
    assert Conversation.objects.get(id=created["id"]).metadata == {"topic": "food"}
    assert patched["updatedAt"] > created["updatedAt"]


def test_a_patch_that_changes_nothing_leaves_the_conversation_where_it_was(api, alice):
    # ``updatedAt`` orders the conversation lists: an empty PATCH moved a conversation to the
    # top of its members' lists, though nothing in it had changed.
    created = create(api, alice, title="Plans")
    response = api.patch(f"/v1/user/conversations/{created['id']}", {}, as_=alice)
    assert response.status_code == 200, response.content
    assert response.json()["updatedAt"] == created["updatedAt"]
    assert (
        Conversation.objects.get(id=created["id"])
        .updated_at.isoformat()
        .startswith(created["updatedAt"][:19])
    )


def test_creating_for_an_agent_makes_it_a_writer(api, alice):
    agent = AgentFactory()
    created = create(api, alice, agentId=str(agent.id))
    memberships = dict(
        Membership.objects.filter(group__conversations__id=created["id"]).values_list(
            "principal_id", "access_level"
        )
    )
    assert memberships == {"alice": "owner", f"agent:{agent.id}": "writer"}


def test_an_unknown_agent_is_refused_and_nothing_is_created(api, alice):
    response = api.post(
        "/v1/user/conversations",
        {"agentId": "00000000-0000-4000-8000-000000000000"},
        as_=alice,
    )
    assert response.status_code == 400
    assert response.json()["details"] == {"agentId": ["no such agent"]}
    assert not Conversation.objects.exists()


def test_appended_messages_have_the_documented_shape(api, alice):
    conversation = create(api, alice)
    response = api.post(
        f"/v1/user/conversations/{conversation['id']}/messages",
        {"content": "  Hello  ", "metadata": {"client": "web"}},
        as_=alice,
    )
    assert response.status_code == 201
    message = response.json()
    assert set(message) == {
        "id",
        "conversationId",
        "role",
        "channel",
        "visibility",
        "authorName",
        "content",
        "metadata",
        "parentMessageId",
        "createdAt",
    }
    assert message["content"] == "  Hello  "
    assert (message["role"], message["channel"], message["visibility"]) == (
        "user",
        "history",
        "user",
    )
    assert message["authorName"] == "alice"
    listed = api.get("/v1/user/conversations", as_=alice).json()["data"]
    assert listed[0]["lastMessagePreview"] == "  Hello  "


def test_the_list_is_newest_activity_first_and_searchable(api, alice, bob):
    old = create(api, alice, title="Old news")
    new = create(api, alice, title="Fresh", metadata={"project": "apollo"})
    shared = ConversationFactory(group__owner="bob", title="Bob's")
    MembershipFactory(group=shared.group, principal_id="alice", access_level="reader")
    api.post(f"/v1/user/conversations/{old['id']}/messages", {"content": "bump"}, as_=alice)

    listed = api.get("/v1/user/conversations", as_=alice).json()["data"]
    assert [c["id"] for c in listed] == [old["id"], str(shared.id), new["id"]]
    assert [c["updatedAt"] for c in listed] == sorted(
        (c["updatedAt"] for c in listed), reverse=True
    )
    levels = {c["id"]: (c["accessLevel"], c["ownerUserId"]) for c in listed}
    assert levels[str(shared.id)] == ("reader", "bob")

    by_title = api.get("/v1/user/conversations", as_=alice, query="old").json()["data"]
    assert [c["id"] for c in by_title] == [old["id"]]
    by_metadata = api.get("/v1/user/conversations", as_=alice, query="apollo").json()["data"]
    assert [c["id"] for c in by_metadata] == [new["id"]]


def test_the_query_matches_the_titles_and_metadata_values_not_the_json_around_them(api, alice):
    """What a user writes matches: a title, a text or number anywhere in the metadata; the
    JSON that every metadata object has (keys, quotes, braces) matches nothing."""
    plain = create(api, alice, title="Weekend plans")
    nested = create(
        api,
        alice,
        title="Trip",
        metadata={"trip": {"places": ["Lisbon", "Porto"], "budget": 1200}, "done": True},
    )
    create(api, alice, title="Other", metadata={"project": "apollo"})

    def found(query):
        response = api.get("/v1/user/conversations", as_=alice, query=query)
        assert response.status_code == 200, response.content
        return {c["id"] for c in response.json()["data"]}

    assert found("PORTO") == {nested["id"]}  # a text in a list in an object, any case
    assert found("120") == {nested["id"]}  # a number
    assert found("weekend") == {plain["id"]}
    for json_syntax in ['"', "{", ":", '"project"', "project", "budget", "true", "places"]:
        assert found(json_syntax) == set(), json_syntax
    assert found("%") == found("_") == set()  # LIKE's wildcards are letters like any other
    assert api.get("/v1/user/conversations", as_=alice, query="\\").status_code == 200


def test_the_query_reads_accents_case_and_letter_forms_as_search_does(api, alice):
    """A title written decomposed was not found by the same word composed (nor the other
    way), "istanbul" did not find "İstanbul", nor "STRASSE" "Straße", where message search
    finds all of them (review)."""
    titles = {
        "cafe": create(api, alice, title="Cafe\u0301 talk")["id"],
        "istanbul": create(api, alice, title="\u0130stanbul trip")["id"],
        "strasse": create(api, alice, title="Gro\u00dfe Stra\u00dfe")["id"],
        "wide": create(api, alice, title="Plans", metadata={"tag": "\uff26\uff35\uff2c\uff2c"})[
            "id"
        ],
    }

    def found(query):
        response = api.get("/v1/user/conversations", as_=alice, query=query)
        return {c["id"] for c in response.json()["data"]}

    assert found("caf\u00e9") == found("CAFE") == {titles["cafe"]}
    assert found("istanbul") == found("\u0130STANBUL") == {titles["istanbul"]}
    assert found("STRASSE") == found("stra\u00dfe") == {titles["strasse"]}
    assert found("full") == {titles["wide"]}  # (a full-width value in the metadata)
    # A fullwidth percent sign or low line is folded to LIKE's wildcard: none is one here
    # ("100\uff05" found every text holding "100"; code review).
    assert found("Gro\uff05") == found("\uff3f") == found("e\uff3c") == set()


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/v1/user/conversations", "limit="),  # (an empty one was the default's 20)
        ("/v1/user/conversations", "limit=abc&limit=2"),  # (read as its last)
        ("/v1/user/conversations", "query=a&query=b"),
        ("/v1/agent/memories", "order=popular&order=recent"),
        ("/v1/agent/memories", "limit="),
    ],
)
def test_a_query_parameter_empty_or_given_twice_is_400(api, alice, path, query):
    from tests.agents_api.conftest import make_agent

    who = alice if path.startswith("/v1/user") else make_agent("helper")
    response = api.get(f"{path}?{query}", as_=who)
    assert response.status_code == 400, response.content
    name = query.split("=")[0]
    assert response.json()["details"] == {name: [response.json()["details"][name][0]]}


def test_walking_conversation_pages_returns_each_once(api, alice):
    ids = {create(api, alice, title=f"c{i}")["id"] for i in range(7)}
    walked = walk(api, alice, "/v1/user/conversations", limit=3)
    assert [c["id"] for c in walked if c["id"] in ids] == [c["id"] for c in walked]
    assert sorted(c["id"] for c in walked) == sorted(ids)


def test_a_conversation_with_activity_between_pages_is_not_lost(api, alice):
    """Latest activity first: a conversation the walk has not reached yet that gets a
    message moves ahead of the cursor. The walk still lists it, after the others, with its
    new activity (a client keeps the latest of an id); then it ends."""
    an_hour_ago = timezone.now() - timedelta(hours=1)
    conversations = [
        ConversationFactory(
            group__owner="alice", title=f"c{i}", updated_at=an_hour_ago + timedelta(minutes=i)
        )
        for i in range(7)
    ]
    Membership.objects.update(created_at=an_hour_ago)  # (made with them, as they say)
    path = f"/v1/user/conversations/{conversations[1].id}/messages"
    writes = [lambda: api.post(path, {"content": "back on top"}, as_=alice)]

    def someone_writes():
        if writes:
            assert writes.pop()().status_code == 201

    walked = walk(api, alice, "/v1/user/conversations", limit=3, on_each_page=someone_writes)

    assert [c["title"] for c in walked] == ["c6", "c5", "c4", "c3", "c2", "c0", "c1"]
    assert walked[-1]["lastMessagePreview"] == "back on top"
    assert walked[-1]["updatedAt"] > walked[0]["updatedAt"]
    # A walk now (the message is an hour younger than the rest) lists it first, once.
    again = walk(api, alice, "/v1/user/conversations", limit=3)
    assert [c["title"] for c in again] == ["c1", "c6", "c5", "c4", "c3", "c2", "c0"]


@pytest.mark.parametrize("how", ["shared", "transferred"])
def test_a_conversation_given_between_pages_is_not_lost(api, alice, bob, how):
    """One the walker is given while the walk runs (shared with them, or theirs by an
    accepted transfer) has no new activity, and sorted in behind the cursor: the walk ended
    without it (review). It is listed after the others, as one with activity is."""
    an_hour_ago = timezone.now() - timedelta(hours=1)
    for i in range(7):
        ConversationFactory(
            group__owner="alice", title=f"c{i}", updated_at=an_hour_ago + timedelta(minutes=i)
        )
    # Newer than every one of Alice's: ahead of any cursor of her walk.
    bobs = ConversationFactory(group__owner="bob", title="bob's", updated_at=timezone.now())
    Membership.objects.update(created_at=an_hour_ago)  # (made with them, as they say)
    given = []

    def bob_gives_it():
        if given:
            return
        if how == "shared":
            body = {"userId": "alice", "accessLevel": "reader"}
            path = f"/v1/user/conversations/{bobs.id}/memberships"
            given.append(api.post(path, body, as_=bob).status_code)
        else:
            path = f"/v1/user/conversations/{bobs.id}/transfer-ownership"
            offer = api.post(path, {"newOwnerUserId": "alice"}, as_=bob).json()
            accept = f"/v1/user/ownership-transfers/{offer['id']}/accept"
            given.append(api.post(accept, as_=alice).status_code)

    walked = walk(api, alice, "/v1/user/conversations", limit=3, on_each_page=bob_gives_it)

    assert given == [201] if how == "shared" else given == [200]
    assert [c["title"] for c in walked] == ["c6", "c5", "c4", "c3", "c2", "c1", "c0", "bob's"]


@pytest.mark.parametrize(
    "key",
    [
        ["", "2026-01-01T00:00:00", "", ""],  # a time without its zone
        ["", "yesterday", "", ""],
        ["", "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00+00:00", "not-a-uuid"],
        ["", "2026-01-01T00:00:00+00:00", "", "5d0b0dcb-77f4-4b7d-9f3e-2a4f5b1d6c7e"],
        ["2026-02-30T00:00:00+00:00", "2026-01-01T00:00:00+00:00", "", ""],
        # Moments no cursor of ours holds: so close to Python's first that the next pass
        # starts before it (a 500), before it or after its last once in UTC (a 400 from
        # the database, not naming the cursor; or read as a moment)
        ["", "0001-01-01T00:00:00+00:00", "", ""],
        ["0001-01-01T00:00:00+05:00", "2026-01-01T00:00:00+00:00", "", ""],
        ["", "9999-12-31T23:59:59-23:59", "", ""],
        ["", "2026-01-01T00:00:00+00:00", "0001-01-01T00:00:00+23:59", str(uuid.uuid4())],
    ],
)
def test_a_forged_conversation_cursor_is_400(api, alice, key):
    forged = rekeyed(cursor_of_alices_list(api, alice), *key)
    response = api.get("/v1/user/conversations", as_=alice, after=forged)
    assert response.status_code == 400, response.content
    assert "after" in response.json()["details"]


@pytest.mark.parametrize(
    "key",
    [
        ["", "2026-01-01T00:00:00-23:59", "", ""],
        ["", "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00+16:00", str(uuid.uuid4())],
    ],
)
def test_a_cursor_moment_at_an_offset_postgresql_does_not_take_is_read_in_utc(api, alice, key):
    """Python reads offsets up to 23:59, PostgreSQL up to 15:59: the database refused the
    cursor with a 400 naming nothing. Each moment is the same one in UTC."""
    forged = rekeyed(cursor_of_alices_list(api, alice), *key)
    response = api.get("/v1/user/conversations", as_=alice, after=forged)
    assert response.status_code == 200, response.content


def cursor_of_alices_list(api, alice) -> str:
    """A ``nextCursor`` of alice's conversations (a pass that ends with one moved since)."""
    ConversationFactory.create_batch(2, group__owner="alice")
    cursor = api.get("/v1/user/conversations", as_=alice, limit=1).json()["nextCursor"]
    assert cursor
    return cursor


def test_a_cursor_of_another_list_filter_or_caller_is_400_not_its_page(api, alice, bob):
    """A cursor held only its place in the list (and the pass): the agent's list of the
    same conversations, bob's, another ``query``'s, or the messages of another conversation
    read it as a place of their own, and answered a wrong page or a wrong end (review). A
    list's own cursors still walk it."""
    agent = make_agent("lister")
    made = []
    for i in range(3):
        made.append(create(api, alice, title=f"Plans {i}", agentId=str(agent.agent.id)))
        path = f"/v1/user/conversations/{made[-1]['id']}/memberships"
        shared = api.post(path, {"userId": "bob", "accessLevel": "reader"}, as_=alice)
        assert shared.status_code == 201, shared.content
    for persona, path in [
        (alice, "/v1/user/conversations"),
        (bob, "/v1/user/conversations"),
        (agent, "/v1/agent/conversations"),
    ]:
        titles = [c["title"] for c in walk(api, persona, path, limit=1)]
        assert titles == ["Plans 2", "Plans 1", "Plans 0"], persona
    alices = api.get("/v1/user/conversations", as_=alice, limit=1).json()["nextCursor"]
    agents = api.get("/v1/agent/conversations", as_=agent, limit=1).json()["nextCursor"]
    for persona, path, cursor, params in [
        (bob, "/v1/user/conversations", alices, {}),
        (alice, "/v1/user/conversations", alices, {"query": "Plans"}),
        (agent, "/v1/agent/conversations", alices, {}),
        (alice, "/v1/user/conversations", agents, {}),
    ]:
        refused = api.get(path, as_=persona, after=cursor, **params)
        assert another_list(refused), (persona, params, refused.content)

    messages = [f"/v1/user/conversations/{c['id']}/messages" for c in made[:2]]
    for path in messages:
        for i in range(3):
            assert api.post(path, {"content": f"m{i}"}, as_=alice).status_code == 201
    walked = walk(api, alice, messages[0], limit=1)
    assert [m["content"] for m in walked] == ["m0", "m1", "m2"]
    cursor = api.get(messages[0], as_=alice, limit=1).json()["nextCursor"]
    for persona, path in [(alice, messages[1]), (bob, messages[0])]:
        refused = api.get(path, as_=persona, after=cursor)
        assert another_list(refused), (persona, path, refused.content)


def test_walking_message_pages_while_messages_arrive_returns_each_once(api, alice):
    conversation = create(api, alice)
    path = f"/v1/user/conversations/{conversation['id']}/messages"
    for i in range(10):
        api.post(path, {"content": f"m{i}"}, as_=alice)
    arrivals = iter(range(10, 14))

    def someone_writes():
        index = next(arrivals, None)
        if index is not None:
            api.post(path, {"content": f"m{index}"}, as_=alice)

    walked = [m["content"] for m in walk(api, alice, path, limit=3, on_each_page=someone_writes)]

    assert walked == [f"m{i}" for i in range(14)]


@pytest.mark.parametrize("rows", [3, 30])
def test_lists_run_a_bounded_number_of_queries(api, alice, rows, django_assert_max_num_queries):
    for _ in range(rows):
        conversation = ConversationFactory(group__owner="alice")
        MessageFactory.create_batch(2, conversation=conversation)
    [last] = Conversation.objects.order_by("-created_at")[:1]
    MembershipFactory(group=last.group, principal_id="bob")

    # Each request also meets the rate limits (memsvc.api.ratelimit): its address's failed
    # authentications are read, and the request is counted against alice.
    counted = 2
    with django_assert_max_num_queries(1 + counted):
        assert api.get("/v1/user/conversations", as_=alice, limit="50").status_code == 200
    with django_assert_max_num_queries(3 + counted):
        assert api.get(f"/v1/user/conversations/{last.id}/messages", as_=alice).status_code == 200
    with django_assert_max_num_queries(2 + counted):
        assert (
            api.get(f"/v1/user/conversations/{last.id}/memberships", as_=alice).status_code == 200
        )
    with django_assert_max_num_queries(2 + counted):
        assert api.get(f"/v1/user/conversations/{last.id}/forks", as_=alice).status_code == 200


def test_appending_takes_a_constant_number_of_queries(api, alice):
    conversation = create(api, alice)
    path = f"/v1/user/conversations/{conversation['id']}/messages"
    api.post(path, {"content": "warm up"}, as_=alice)
    with CaptureQueriesContext(connection) as first:
        api.post(path, {"content": "one"}, as_=alice)
    MessageFactory.create_batch(50, conversation_id=conversation["id"])
    with CaptureQueriesContext(connection) as later:
        api.post(path, {"content": "two"}, as_=alice)
    assert len(first) == len(later)


def test_a_message_sent_again_with_its_idempotency_key_is_stored_once(api, alice, bob):
    """A chat frontend whose answer was lost sends the turn again with the same key: the
    first message comes back, marked replayed, and nothing more is stored (it was stored
    twice: the user API ignored the header). The key is alice's own: bob's same key is
    his, and the key with another message is a conflict."""
    conversation = create(api, alice)
    MembershipFactory(
        group_id=conversation["conversationGroupId"], principal_id="bob", access_level="writer"
    )
    path = f"/v1/user/conversations/{conversation['id']}/messages"
    key = {"HTTP_IDEMPOTENCY_KEY": "turn-1"}
    first = api.post(path, {"content": "Book the train"}, as_=alice, headers=key)
    again = api.post(path, {"content": "Book the train"}, as_=alice, headers=key)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert Message.objects.filter(content="Book the train").count() == 1

    other = api.post(path, {"content": "Book the plane"}, as_=alice, headers=key)
    assert other.status_code == 409
    assert other.json()["error"] == "this Idempotency-Key was already used for a different request"
    assert not Message.objects.filter(content="Book the plane").exists()

    his = api.post(path, {"content": "Book the train"}, as_=bob, headers=key)
    assert his.status_code == 201 and his.json()["id"] != first.json()["id"]
    assert Message.objects.filter(content="Book the train").count() == 2

    empty = api.post(path, {"content": "x"}, as_=alice, headers={"HTTP_IDEMPOTENCY_KEY": ""})
    assert empty.status_code == 400


def test_a_conversation_or_fork_created_again_with_its_idempotency_key_is_made_once(api, alice):
    """A retry of a create whose answer was lost made a second conversation, or fork: the
    header was taken and ignored (review)."""
    key = {"HTTP_IDEMPOTENCY_KEY": "new-1"}
    first = api.post("/v1/user/conversations", {"title": "Trip"}, as_=alice, headers=key)
    again = api.post("/v1/user/conversations", {"title": "Trip"}, as_=alice, headers=key)
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"] and again["Idempotent-Replayed"] == "true"
    assert Conversation.objects.count() == 1
    other = api.post("/v1/user/conversations", {"title": "Other"}, as_=alice, headers=key)
    assert other.status_code == 409 and Conversation.objects.count() == 1

    path = f"/v1/user/conversations/{first.json()['id']}/messages"
    turn = api.post(path, {"content": "Rome or Paris?"}, as_=alice).json()
    fork_path = f"{path}/{turn['id']}/fork"
    key = {"HTTP_IDEMPOTENCY_KEY": "fork-1"}
    body = {"newMessage": {"content": "Rome or Madrid?"}}
    forked = [api.post(fork_path, body, as_=alice, headers=key) for _ in range(2)]
    assert [f.status_code for f in forked] == [201, 201]
    assert forked[0].json()["id"] == forked[1].json()["id"]
    assert Conversation.objects.count() == 2
    assert Message.objects.filter(content="Rome or Madrid?").count() == 1


BAD_INPUT = [
    ("POST", "/conversations", {"title": "x" * 501}, "title"),
    ("POST", "/conversations", {"title": "a\x00b"}, "title"),
    # A title is one line: no control characters (as in a user id).
    ("POST", "/conversations", {"title": "tab\there"}, "title"),
    ("POST", "/conversations", {"title": "two\nlines"}, "title"),
    ("POST", "/conversations", {"title": "\x1b[31mred"}, "title"),
    ("PATCH", "/conversations/{c}", {"title": "bell\x07"}, "title"),
    ("POST", "/conversations/{c}/messages/{m}/fork", {"title": "del\x7f"}, "title"),
    ("POST", "/conversations", {"metadata": ["not", "an", "object"]}, "metadata"),
    ("POST", "/conversations", {"metadata": {"big": "x" * 17_000}}, "metadata"),
    ("POST", "/conversations", {"metadata": {"k": "a\x00"}}, "metadata"),
    ("POST", "/conversations", {"agentId": "not-a-uuid"}, "agentId"),
    ("POST", "/conversations", {"titel": "typo"}, "titel"),
    ("POST", "/conversations", ["not", "an", "object"], "body"),
    ("PATCH", "/conversations/{c}", {"title": 5}, "title"),
    ("POST", "/conversations/{c}/messages", {}, "content"),
    ("POST", "/conversations/{c}/messages", {"content": ""}, "content"),
    ("POST", "/conversations/{c}/messages", {"content": "   "}, "content"),
    ("POST", "/conversations/{c}/messages", {"content": "\u200b\u2060"}, "content"),
    ("POST", "/conversations/{c}/messages", {"content": "x" * 100_001}, "content"),
    ("POST", "/conversations/{c}/messages", {"content": "nul\x00here"}, "content"),
    ("POST", "/conversations/{c}/messages", {"content": "ok", "metadata": "s"}, "metadata"),
    ("POST", "/conversations/{c}/messages", {"content": ["a"]}, "content"),
    (
        "POST",
        "/conversations/{c}/messages/{m}/fork",
        {"newMessage": {"content": ""}},
        "newMessage.content",
    ),
    (
        "POST",
        "/conversations/{c}/memberships",
        {"userId": "bob", "accessLevel": "admin"},
        "accessLevel",
    ),
    ("POST", "/conversations/{c}/memberships", {"accessLevel": "reader"}, "userId"),
    ("PATCH", "/conversations/{c}/memberships/bob", {"accessLevel": "boss"}, "accessLevel"),
    ("POST", "/conversations/{c}/transfer-ownership", {}, "newOwnerUserId"),
    (
        "POST",
        "/conversations/{c}/transfer-ownership",
        {"newOwnerUserId": "alice"},
        "newOwnerUserId",
    ),
]


def everything():
    return (
        sorted(Conversation.objects.values_list("id", "title", "metadata", "updated_at")),
        sorted(Membership.objects.values_list("principal_id", "access_level")),
        Message.objects.count(),
    )


@pytest.mark.parametrize(("method", "path", "body", "field"), BAD_INPUT)
def test_bad_input_is_a_400_naming_the_field_and_writes_nothing(
    api, alice, method, path, body, field
):
    conversation = ConversationFactory(group__owner="alice")
    message = MessageFactory(conversation=conversation)
    MembershipFactory(group=conversation.group, principal_id="bob")
    before = everything()

    response = api.call(
        method, "/v1/user" + path.format(c=conversation.id, m=message.id), as_=alice, body=body
    )

    assert response.status_code == 400, response.content
    error = response.json()
    assert error["code"] == "validation_error"
    assert field in error["details"]
    assert field in error["error"]
    assert everything() == before


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "201"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"after": "not a cursor"}, "after"),
        ({"after": "WyJ4Il0"}, "after"),  # base64 of ["x"]: ours in form, not in content
    ],
)
def test_bad_paging_parameters_are_400(api, alice, params, field):
    conversation = ConversationFactory(group__owner="alice")
    for path in ["/v1/user/conversations", f"/v1/user/conversations/{conversation.id}/messages"]:
        response = api.get(path, as_=alice, **params)
        assert response.status_code == 400, path
        assert field in response.json()["details"]


def test_a_body_that_is_not_json_is_400(api, alice, client):
    response = client.post(
        "/v1/user/conversations",
        data="{not json",
        content_type="application/json",
        **alice.auth_headers(),
    )
    assert response.status_code == 400
    assert response.json()["code"] == "validation_error"


def test_users_are_not_shown_the_id_of_a_parent_they_do_not_see(api, alice):
    """A reply whose parent is an agent-only turn showed that turn's id as its
    ``parentMessageId`` to users, a message none of their lists holds (review): null, as a
    fork point they do not see is not shown either. A parent they see is shown."""
    conversation = ConversationFactory(group__owner="alice")
    asked = MessageFactory(conversation=conversation, content="Which hotel?")
    hidden = MessageFactory(
        conversation=conversation, role=Role.AGENT, visibility=Visibility.AGENT, content="note"
    )
    MessageFactory(
        conversation=conversation, role=Role.AGENT, content="The Grand", parent_message=hidden
    )
    MessageFactory(conversation=conversation, content="Thanks", parent_message=asked)
    path = f"/v1/user/conversations/{conversation.id}/messages"
    listed = api.get(path, as_=alice).json()["data"]
    parents = {message["content"]: message["parentMessageId"] for message in listed}
    assert parents == {"Which hotel?": None, "The Grand": None, "Thanks": str(asked.id)}
    found = api.post(
        "/v1/user/search/messages", {"query": "Grand", "mode": "keyword"}, as_=alice
    ).json()["data"]
    assert [(hit["message"]["content"], hit["message"]["parentMessageId"]) for hit in found] == [
        ("The Grand", None)
    ]
