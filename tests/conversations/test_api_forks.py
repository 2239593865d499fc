"""Forks: O(1) to create, and each branch reads its ancestors up to the fork point."""

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from conversations.models import Channel, Conversation, Message, Role, Visibility
from tests.factories import ConversationFactory, MessageFactory, messages_inserted

pytestmark = pytest.mark.django_db


def say(api, persona, conversation_id, content):
    response = api.post(
        f"/v1/user/conversations/{conversation_id}/messages", {"content": content}, as_=persona
    )
    assert response.status_code == 201, response.content
    return response.json()


def fork(api, persona, conversation_id, message_id, **body):
    return api.post(
        f"/v1/user/conversations/{conversation_id}/messages/{message_id}/fork", body, as_=persona
    )


def contents(api, persona, conversation_id):
    response = api.get(f"/v1/user/conversations/{conversation_id}/messages", as_=persona)
    assert response.status_code == 200
    return [m["content"] for m in response.json()["data"]]


@pytest.fixture
def root(api, alice):
    conversation = api.post("/v1/user/conversations", {"title": "Root"}, as_=alice).json()
    for text in ["a1", "a2", "a3", "a4"]:
        say(api, alice, conversation["id"], text)
    return conversation


def message_id(api, persona, conversation_id, content):
    return next(
        m["id"]
        for m in api.get(f"/v1/user/conversations/{conversation_id}/messages", as_=persona).json()[
            "data"
        ]
        if m["content"] == content
    )


def test_a_fork_reads_the_parent_up_to_the_fork_point_then_its_own(api, alice, root):
    response = fork(
        api,
        alice,
        root["id"],
        message_id(api, alice, root["id"], "a3"),
        title="B",
        newMessage={"content": "b3"},
    )
    assert response.status_code == 201
    branch = response.json()
    assert branch["title"] == "B"
    assert branch["forkedAtConversationId"] == root["id"]
    assert branch["forkedAtMessageId"] == message_id(api, alice, root["id"], "a2")
    assert branch["conversationGroupId"] == root["conversationGroupId"]

    say(api, alice, root["id"], "a5")  # the parent goes on; the fork must not see it
    say(api, alice, branch["id"], "b4")

    assert contents(api, alice, branch["id"]) == ["a1", "a2", "b3", "b4"]
    assert contents(api, alice, root["id"]) == ["a1", "a2", "a3", "a4", "a5"]


def test_a_fork_of_a_fork_reads_through_every_ancestor(api, alice, root):
    branch = fork(
        api,
        alice,
        root["id"],
        message_id(api, alice, root["id"], "a4"),
        newMessage={"content": "b4"},
    ).json()
    say(api, alice, branch["id"], "b5")
    twig = fork(
        api,
        alice,
        branch["id"],
        message_id(api, alice, branch["id"], "b5"),
        newMessage={"content": "c5"},
    ).json()
    say(api, alice, branch["id"], "b6")
    say(api, alice, root["id"], "a5")

    assert contents(api, alice, twig["id"]) == ["a1", "a2", "a3", "b4", "c5"]
    assert contents(api, alice, branch["id"]) == ["a1", "a2", "a3", "b4", "b5", "b6"]

    # A fork at an inherited message: the twig's parent shares a2 with root.
    sprout = fork(
        api,
        alice,
        twig["id"],
        message_id(api, alice, twig["id"], "a2"),
        newMessage={"content": "d2"},
    ).json()
    assert contents(api, alice, sprout["id"]) == ["a1", "d2"]


def test_forking_at_the_first_message_shares_nothing(api, alice, root):
    branch = fork(api, alice, root["id"], message_id(api, alice, root["id"], "a1")).json()
    assert branch["forkedAtMessageId"] is None
    assert contents(api, alice, branch["id"]) == []
    say(api, alice, branch["id"], "fresh start")
    assert contents(api, alice, branch["id"]) == ["fresh start"]


def test_forks_lists_every_branch_root_first(api, alice, root):
    first = fork(api, alice, root["id"], message_id(api, alice, root["id"], "a2")).json()
    second = fork(api, alice, first["id"], message_id(api, alice, first["id"], "a1")).json()

    listed = api.get(f"/v1/user/conversations/{first['id']}/forks", as_=alice).json()["data"]

    assert [f["conversationId"] for f in listed] == [root["id"], first["id"], second["id"]]
    # (the seed's name of the fork's id: a UI written from it looked for it; review)
    assert [f["forkId"] for f in listed] == [f["conversationId"] for f in listed]
    assert [f["isCurrentFork"] for f in listed] == [False, True, False]
    assert listed[0]["forkedAtConversationId"] is None
    assert listed[1]["forkedAtConversationId"] == root["id"]
    assert listed[1]["forkedFromMessageId"] == listed[1]["forkedAtMessageId"]
    assert listed[1]["forkedAtMessageId"] == message_id(api, alice, root["id"], "a1")


def test_users_are_shown_a_fork_point_they_see(api, alice):
    """The fork point is the HISTORY message before the turn forked at, whoever sees it: an
    agent-only turn there was shown to users as ``forkedAtMessageId`` (and
    ``forkedFromMessageId``), a message none of their lists holds (review). They are shown
    the last message before it that they see; the fork still reads what it read."""
    parent = ConversationFactory(group__owner="alice")
    seen = MessageFactory(conversation=parent, content="a1")
    hidden = MessageFactory(
        conversation=parent, role=Role.AGENT, visibility=Visibility.AGENT, content="note"
    )
    target = MessageFactory(conversation=parent, content="a2")
    branch = fork(api, alice, parent.id, target.id).json()
    assert Conversation.objects.get(id=branch["id"]).forked_at_message_id == hidden.id
    assert branch["forkedAtMessageId"] == str(seen.id)
    shown = api.get(f"/v1/user/conversations/{branch['id']}", as_=alice).json()
    assert shown["forkedAtMessageId"] == str(seen.id)
    listed = api.get(f"/v1/user/conversations/{parent.id}/forks", as_=alice).json()["data"]
    assert (listed[1]["forkedAtMessageId"], listed[1]["forkedFromMessageId"]) == (
        str(seen.id),
        str(seen.id),
    )
    assert contents(api, alice, branch["id"]) == ["a1"]
    # A fork at the turn after a point users see shows that point itself.
    again = fork(api, alice, branch["id"], seen.id).json()
    assert again["forkedAtMessageId"] is None


def test_the_fork_list_reads_the_points_users_see_in_as_many_queries_for_any_number(api, alice):
    """Each fork whose point users do not see took two queries of its own (its view, its
    last seen message). Two forks and four are listed with as many queries, each shown
    its own point."""
    parent = ConversationFactory(group__owner="alice")
    targets = {}
    for n in (1, 2):
        seen = MessageFactory(conversation=parent, content=f"s{n}")
        MessageFactory(conversation=parent, role=Role.AGENT, visibility=Visibility.AGENT)
        targets[seen.id] = MessageFactory(conversation=parent, content=f"t{n}")
    path = f"/v1/user/conversations/{parent.id}/forks"

    def listed():
        with CaptureQueriesContext(connection) as queries:
            response = api.get(path, as_=alice)
        assert response.status_code == 200, response.content
        return response.json()["data"], len(queries.captured_queries)

    for seen_id, target in targets.items():
        assert fork(api, alice, parent.id, target.id).json()["forkedAtMessageId"] == str(seen_id)
    two, two_queries = listed()
    for target in targets.values():
        fork(api, alice, parent.id, target.id)
    four, four_queries = listed()
    assert four_queries == two_queries
    expected = [str(seen_id) for seen_id in targets]
    assert [f["forkedAtMessageId"] for f in four[1:]] == expected * 2
    assert [f["forkedAtMessageId"] for f in two[1:]] == expected


def test_a_fork_starts_only_at_a_user_history_message(api, alice):
    conversation = ConversationFactory(group__owner="alice")
    target = MessageFactory(conversation=conversation, role=Role.ASSISTANT)
    before = Conversation.objects.count()

    response = fork(api, alice, conversation.id, target.id)

    assert response.status_code == 400
    assert response.json()["code"] == "validation_error"
    assert "messageId" in response.json()["details"]
    assert Conversation.objects.count() == before


@pytest.mark.parametrize(
    ("channel", "visibility"),
    [
        (Channel.MEMORY, Visibility.USER),
        (Channel.SUMMARY, Visibility.AGENT),
        (Channel.HISTORY, Visibility.AGENT),
        (Channel.HISTORY, Visibility.SYSTEM),
    ],
)
def test_a_message_the_user_cannot_see_is_no_fork_point_like_a_random_id(
    api, alice, channel, visibility
):
    conversation = ConversationFactory(group__owner="alice")
    hidden = MessageFactory(conversation=conversation, channel=channel, visibility=visibility)
    before = Conversation.objects.count()

    refused = fork(api, alice, conversation.id, hidden.id)
    unknown = fork(api, alice, conversation.id, uuid.uuid4())

    assert refused.status_code == unknown.status_code == 404
    assert refused.json() == unknown.json()
    assert Conversation.objects.count() == before


def agent_only_turn(conversation_id) -> None:
    MessageFactory(
        conversation=Conversation.objects.get(id=conversation_id),
        role=Role.ASSISTANT,
        content="tool output",
        visibility=Visibility.AGENT,
    )


def previews(api, persona, conversation_id) -> set:
    """The conversation's preview as the list shows it, and as the conversation shows it."""
    listed = api.get("/v1/user/conversations", as_=persona).json()["data"]
    shown = api.get(f"/v1/user/conversations/{conversation_id}", as_=persona).json()
    return {c["lastMessagePreview"] for c in listed if c["id"] == conversation_id} | {
        shown["lastMessagePreview"]
    }


def test_a_new_forks_preview_is_never_an_agent_only_turn(api, alice, root):
    agent_only_turn(root["id"])
    say(api, alice, root["id"], "a5")
    branch = fork(api, alice, root["id"], message_id(api, alice, root["id"], "a5")).json()
    # The fork point is the agent-only turn before "a5": the preview is what alice saw last.
    assert branch["lastMessagePreview"] == "a4"
    assert previews(api, alice, branch["id"]) == {"a4"}


def test_a_fork_of_a_fork_at_its_first_turns_previews_what_the_user_saw_last(api, alice, root):
    """The second fork's point is the first fork's agent-only turn, which has no user turn
    before it of its own: what alice saw last is in the root."""
    first = fork(api, alice, root["id"], message_id(api, alice, root["id"], "a3")).json()
    agent_only_turn(first["id"])
    say(api, alice, first["id"], "b1")
    second = fork(api, alice, first["id"], message_id(api, alice, first["id"], "b1")).json()
    assert second["lastMessagePreview"] == "a2"
    assert previews(api, alice, second["id"]) == {"a2"}


def test_a_message_of_another_conversation_is_not_a_fork_point(api, alice):
    mine = ConversationFactory(group__owner="alice")
    other = MessageFactory(conversation=ConversationFactory(group__owner="alice"))
    assert fork(api, alice, mine.id, other.id).status_code == 404


def test_forking_costs_the_same_queries_for_10000_messages_as_for_one(api, alice):
    short = ConversationFactory(group__owner="alice")
    MessageFactory(conversation=short)  # (both forks have a fork point to show)
    short_target = MessageFactory(conversation=short)
    long = ConversationFactory(group__owner="alice")
    messages_inserted(long, 10_000, "m{n}", author_principal="alice")
    long_target = Message.objects.filter(conversation=long).order_by("-seq").first()

    with CaptureQueriesContext(connection) as one:
        assert fork(api, alice, short.id, short_target.id).status_code == 201
    with CaptureQueriesContext(connection) as many:
        assert fork(api, alice, long.id, long_target.id).status_code == 201

    assert len(many) == len(one)
    writes = [q["sql"] for q in many if q["sql"].startswith(("INSERT", "UPDATE", "DELETE"))]
    assert len(writes) == 1  # the new conversation row; no message is copied
    assert Message.objects.count() == 10_002


def test_deleting_a_fork_keeps_the_branches_below_it_that_hold_none_of_its_messages(
    api, alice, bob, root
):
    """Deleting a fork took along every fork made from it: bob's branch, made at a message
    of the root he saw through it, holding none of its messages, went with it, unasked
    (review). Such a branch stays, moved to the root, and reads what it read; one made at
    the fork's own message goes with it, and so does what was made from that one."""
    api.post(
        f"/v1/user/conversations/{root['id']}/memberships",
        {"userId": "bob", "accessLevel": "writer"},
        as_=alice,
    )
    branch = fork(api, alice, root["id"], message_id(api, alice, root["id"], "a3")).json()
    say(api, alice, branch["id"], "b3")
    say(api, alice, branch["id"], "b4")
    bobs = fork(
        api,
        bob,
        branch["id"],
        message_id(api, bob, branch["id"], "a2"),
        newMessage={"content": "x"},
    ).json()
    say(api, bob, bobs["id"], "x2")
    early = fork(api, alice, branch["id"], message_id(api, alice, branch["id"], "a1")).json()
    on_the_fork = fork(api, alice, branch["id"], message_id(api, alice, branch["id"], "b4"))
    below = fork(
        api, alice, on_the_fork.json()["id"], message_id(api, alice, root["id"], "a2")
    ).json()
    # Made from a branch that stays: it stays under it, unmoved (it was moved to the root).
    nested = fork(api, bob, bobs["id"], message_id(api, bob, bobs["id"], "x")).json()
    before = {c: contents(api, bob, c) for c in (bobs["id"], early["id"], below["id"])}

    assert api.delete(f"/v1/user/conversations/{branch['id']}", as_=alice).status_code == 204

    assert not Conversation.objects.filter(id=on_the_fork.json()["id"]).exists()
    for kept in (bobs, early, below):
        assert contents(api, bob, kept["id"]) == before[kept["id"]]
        assert Conversation.objects.get(id=kept["id"]).forked_at_conversation_id == uuid.UUID(
            root["id"]
        )
    assert before[bobs["id"]] == ["a1", "x", "x2"]
    assert Conversation.objects.get(id=nested["id"]).forked_at_conversation_id == uuid.UUID(
        bobs["id"]
    )
    assert contents(api, alice, root["id"]) == ["a1", "a2", "a3", "a4"]


def test_users_never_see_agent_only_memory_or_summary_messages(api, alice):
    conversation = ConversationFactory(group__owner="alice")
    MessageFactory(conversation=conversation, content="visible")
    MessageFactory(conversation=conversation, content="agent note", visibility=Visibility.AGENT)
    MessageFactory(conversation=conversation, content="memory", channel=Channel.MEMORY)
    MessageFactory(
        conversation=conversation,
        content="summary",
        channel=Channel.SUMMARY,
        visibility=Visibility.AGENT,
    )
    MessageFactory(conversation=conversation, content="system", visibility=Visibility.SYSTEM)

    assert contents(api, alice, conversation.id) == ["visible"]
    listed = api.get("/v1/user/conversations", as_=alice).json()["data"]
    assert listed[0]["lastMessagePreview"] == "visible"


def test_deleting_a_fork_keeps_its_parent_and_deleting_the_root_removes_the_group(api, alice, root):
    branch = fork(api, alice, root["id"], message_id(api, alice, root["id"], "a3")).json()
    say(api, alice, branch["id"], "b3")
    say(api, alice, branch["id"], "b4")
    twig = fork(api, alice, branch["id"], message_id(api, alice, branch["id"], "b4")).json()

    assert api.delete(f"/v1/user/conversations/{branch['id']}", as_=alice).status_code == 204
    assert not Conversation.objects.filter(id__in=[branch["id"], twig["id"]]).exists()
    assert contents(api, alice, root["id"]) == ["a1", "a2", "a3", "a4"]

    assert api.delete(f"/v1/user/conversations/{root['id']}", as_=alice).status_code == 204
    assert not Conversation.objects.exists()
    assert not Message.objects.exists()
    assert api.get(f"/v1/user/conversations/{root['id']}", as_=alice).status_code == 404
