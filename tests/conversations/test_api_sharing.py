"""Sharing and ownership transfer through the user API."""

import pytest

from conversations.models import Membership, OwnershipTransfer
from tests.api import another_list
from tests.conftest import Persona
from tests.factories import AgentFactory, ConversationFactory, MembershipFactory, MessageFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(alice):
    return ConversationFactory(group__owner=alice.id)


def url(conversation, suffix=""):
    return f"/v1/user/conversations/{conversation.id}{suffix}"


def levels(conversation):
    return dict(
        Membership.objects.filter(group=conversation.group).values_list(
            "principal_id", "access_level"
        )
    )


def test_share_update_and_revoke(api, alice, bob, conversation):
    shared = api.post(
        url(conversation, "/memberships"), {"userId": "bob", "accessLevel": "reader"}, as_=alice
    )
    assert shared.status_code == 201
    assert shared.json()["conversationId"] == str(conversation.id)
    assert api.get(url(conversation), as_=bob).json()["accessLevel"] == "reader"

    updated = api.patch(url(conversation, "/memberships/bob"), {"accessLevel": "writer"}, as_=alice)
    assert updated.json()["accessLevel"] == "writer"
    assert api.post(url(conversation, "/messages"), {"content": "hi"}, as_=bob).status_code == 201

    assert api.delete(url(conversation, "/memberships/bob"), as_=alice).status_code == 204
    assert api.get(url(conversation), as_=bob).status_code == 404


def test_sharing_reaches_every_fork_of_the_group(api, alice, bob, conversation):
    fork = ConversationFactory(group=conversation.group, forked_at_conversation=conversation)
    api.post(
        url(conversation, "/memberships"), {"userId": "bob", "accessLevel": "reader"}, as_=alice
    )
    assert api.get(url(fork), as_=bob).status_code == 200


def test_sharing_twice_is_a_conflict(api, alice, conversation):
    body = {"userId": "bob", "accessLevel": "reader"}
    assert api.post(url(conversation, "/memberships"), body, as_=alice).status_code == 201
    response = api.post(
        url(conversation, "/memberships"), {**body, "accessLevel": "writer"}, as_=alice
    )
    assert response.status_code == 409
    assert levels(conversation)["bob"] == "reader"


def test_a_share_sent_again_with_its_idempotency_key_answers_the_membership(
    api, alice, conversation
):
    """(A retry whose answer was lost was told "already a member", a failure of a share that
    worked; with its key it gets the membership: review.)"""
    body, key = {"userId": "bob", "accessLevel": "reader"}, {"HTTP_IDEMPOTENCY_KEY": "share-1"}
    first = api.post(url(conversation, "/memberships"), body, as_=alice, headers=key)
    again = api.post(url(conversation, "/memberships"), body, as_=alice, headers=key)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert levels(conversation) == {"alice": "owner", "bob": "reader"}


def test_sharing_with_an_agent_needs_an_existing_agent(api, alice, conversation):
    agent = AgentFactory()
    ok = api.post(
        url(conversation, "/memberships"),
        {"userId": f"agent:{agent.id}", "accessLevel": "writer"},
        as_=alice,
    )
    assert ok.status_code == 201
    missing = api.post(
        url(conversation, "/memberships"),
        {"userId": "agent:00000000-0000-4000-8000-000000000000", "accessLevel": "writer"},
        as_=alice,
    )
    assert missing.status_code == 400
    assert "userId" in missing.json()["details"]


def test_an_agent_shared_with_is_found_by_the_id_it_was_shared_with(api, alice, conversation):
    """An agent id written in capitals (a client that prints GUIDs so) is shared with as its
    canonical form; the same text then names its membership, not a 404."""
    agent = AgentFactory()
    shouted = f"agent:{str(agent.id).upper()}"
    shared = api.post(
        url(conversation, "/memberships"), {"userId": shouted, "accessLevel": "reader"}, as_=alice
    )
    assert shared.json()["userId"] == f"agent:{agent.id}"

    updated = api.patch(
        url(conversation, f"/memberships/{shouted}"), {"accessLevel": "writer"}, as_=alice
    )
    assert updated.status_code == 200, updated.content
    assert levels(conversation)[f"agent:{agent.id}"] == "writer"
    assert api.delete(url(conversation, f"/memberships/{shouted}"), as_=alice).status_code == 204
    assert f"agent:{agent.id}" not in levels(conversation)


BIDI = "must not contain bidirectional control characters"
INVISIBLE = "must not contain invisible characters (a zero-width space or joiner)"
DOT = (
    'must not be "." or "..", nor have one between its "/" (it names it in URLs, where '
    "clients drop those)"
)
OUTER = "must not begin or end with a space"


@pytest.mark.parametrize(
    ("user_id", "problem"),
    [
        # A control character (a tab, an escape) is in no user's id (``user_id_problem``, as
        # the JWT's ``sub`` and a transfer's ``newOwnerUserId``): no membership nobody can use.
        ("bob\t", "must not contain control characters"),
        ("\x1b[31mbob", "must not contain control characters"),
        # Shown as another id: a bidirectional control changes how the ids around it are
        # shown (the pages' list of members showed "\u202eecila" as "alice"; review) ...
        *[(user_id, BIDI) for user_id in ["\u202eecila", "ali\u2066ce", "bob\u200f"]],
        # ... and an invisible character is not shown ("ali\u200bce" as "alice"; review R6).
        *[
            (user_id, INVISIBLE)
            for user_id in ["ali\u200bce", "alice\u2060", "\ufeffalice", "al\u00adice"]
        ],
        ("ali\u034fce", INVISIBLE),  # a combining grapheme joiner (review R1)
        ("ali\u3164ce", INVISIBLE),  # a Hangul filler
        # Shown as two: a line separator ("mallory\u2028alice" as "mallory", then "alice"
        # on a line of its own; review).
        *[(user_id, "must be one line") for user_id in ["mallory\u2028alice", "a\u2029b"]],
        # A member's routes name them in the path, where clients resolve "." and ".." away:
        # "remove member .." was sent as the conversation's own DELETE, and deleted it.
        (".", DOT),
        ("..", DOT),
        # ... nor between its "/" (or "\\", a "/" to browsers): "remove member ../../<id>"
        # was the conversation's DELETE too (review R4).
        *[(user_id, DOT) for user_id in ["../../x", "x/..", "./..", "../x", "a\\..\\b"]],
        # Shown as "zoë" (U+00EB) and "bob", which are other ids: a letter and its combining
        # mark, fullwidth letters; a ligature, which a login's name is not (review).
        *[
            (user_id, f"must be written as it reads in Unicode's NFKC form: {normal!r}")
            for user_id, normal in [
                ("zoe\u0308", "zo\u00eb"),
                ("\uff42\uff4f\uff42", "bob"),
                ("\ufb01x", "fix"),
            ]
        ],
        # An agent's prefix in any case (review), and in fullwidth letters, whose NFKC form
        # was given as the way to write it (review).
        ("AGENT:00000000-0000-0000-0000-000000000000", "must name a user, not an agent"),
        ("\uff21gent:x", "must name a user, not an agent"),
        ("\uff4c\uff4f\uff43\uff41\uff4c", "must not be 'local': it owns memsvc's own agents"),
        # Listed as "bob": spaces and blanks at either end (review R4).
        *[(user_id, OUTER) for user_id in ["bob ", " bob", "bob\u00a0", "bob\u2800"]],
    ],
)
def test_sharing_with_an_id_no_user_can_have_is_400(api, alice, conversation, user_id, problem):
    response = api.post(
        url(conversation, "/memberships"), {"userId": user_id, "accessLevel": "reader"}, as_=alice
    )
    assert response.status_code == 400, response.content
    assert response.json()["details"] == {"userId": [problem]}
    assert levels(conversation) == {"alice": "owner"}


@pytest.mark.parametrize("actor_level", ["manager", "owner"])
def test_nobody_grants_or_removes_owner_through_memberships(api, conversation, actor_level):
    actor = Persona("mia") if actor_level == "manager" else Persona("alice")
    if actor_level == "manager":
        MembershipFactory(group=conversation.group, principal_id="mia", access_level="manager")
    MembershipFactory(group=conversation.group, principal_id="bob", access_level="reader")
    before = levels(conversation)

    grant = api.post(
        url(conversation, "/memberships"), {"userId": "carl", "accessLevel": "owner"}, as_=actor
    )
    promote = api.patch(url(conversation, "/memberships/bob"), {"accessLevel": "owner"}, as_=actor)
    demote = api.patch(
        url(conversation, "/memberships/alice"), {"accessLevel": "reader"}, as_=actor
    )
    remove = api.delete(url(conversation, "/memberships/alice"), as_=actor)

    assert [r.status_code for r in (grant, promote, demote, remove)] == [403, 403, 403, 403]
    assert all(r.json()["code"] == "forbidden" for r in (grant, promote, demote, remove))
    assert levels(conversation) == before


def test_a_member_may_leave_but_not_remove_others(api, conversation):
    MembershipFactory(group=conversation.group, principal_id="rita", access_level="reader")
    MembershipFactory(group=conversation.group, principal_id="will", access_level="writer")
    rita = Persona("rita")
    assert api.delete(url(conversation, "/memberships/will"), as_=rita).status_code == 403
    # Someone who is no member: 403 too, as a change of their level is (a 404 first: review).
    assert api.delete(url(conversation, "/memberships/nobody"), as_=rita).status_code == 403
    assert api.delete(url(conversation, "/memberships/rita"), as_=rita).status_code == 204
    assert "rita" not in levels(conversation)


def test_ownership_transfer_accepted(api, alice, bob, conversation):
    MembershipFactory(group=conversation.group, principal_id="bob", access_level="writer")
    offered = api.post(
        url(conversation, "/transfer-ownership"), {"newOwnerUserId": "bob"}, as_=alice
    )
    assert offered.status_code == 202
    transfer = offered.json()
    assert (transfer["fromUserId"], transfer["toUserId"], transfer["status"]) == (
        "alice",
        "bob",
        "pending",
    )
    assert transfer["conversationId"] == str(conversation.id)
    assert [t["id"] for t in api.get("/v1/user/ownership-transfers", as_=bob).json()["data"]] == [
        transfer["id"]
    ]
    assert [t["id"] for t in api.get("/v1/user/ownership-transfers", as_=alice).json()["data"]] == [
        transfer["id"]
    ]

    accepted = api.post(f"/v1/user/ownership-transfers/{transfer['id']}/accept", as_=bob)

    assert accepted.status_code == 200
    assert accepted.json()["status"] == "accepted"
    assert levels(conversation) == {"alice": "manager", "bob": "owner"}
    assert api.get(url(conversation), as_=bob).json()["ownerUserId"] == "bob"
    assert api.get("/v1/user/ownership-transfers", as_=bob).json()["data"] == []
    history = api.get("/v1/user/ownership-transfers", as_=bob, status="accepted").json()["data"]
    assert [t["id"] for t in history] == [transfer["id"]]
    # Once accepted, it cannot be accepted, declined or cancelled again.
    assert (
        api.post(f"/v1/user/ownership-transfers/{transfer['id']}/accept", as_=bob).status_code
        == 409
    )


def test_a_transfer_sent_again_with_its_idempotency_key_answers_the_offer(api, alice, conversation):
    """(A retry whose answer was lost was told the conversation "already has a pending
    ownership transfer": review.)"""
    body, key = {"newOwnerUserId": "bob"}, {"HTTP_IDEMPOTENCY_KEY": "transfer-1"}
    first = api.post(url(conversation, "/transfer-ownership"), body, as_=alice, headers=key)
    again = api.post(url(conversation, "/transfer-ownership"), body, as_=alice, headers=key)
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert OwnershipTransfer.objects.count() == 1


def test_transfers_are_listed_a_page_at_a_time_newest_first(api, alice, bob):
    """Anyone may offer anyone a conversation, and answered offers stay: every one was in
    one answer, unpaged (review)."""
    offered = []
    for n in range(3):
        conversation = ConversationFactory(group__owner="alice", title=f"Gift {n}")
        transfer = api.post(
            url(conversation, "/transfer-ownership"), {"newOwnerUserId": "bob"}, as_=alice
        )
        offered.append(transfer.json()["id"])
    first = api.get("/v1/user/ownership-transfers", as_=bob, limit=2).json()
    assert [t["id"] for t in first["data"]] == offered[:0:-1] and first["nextCursor"]
    rest = api.get("/v1/user/ownership-transfers", as_=bob, limit=2, after=first["nextCursor"])
    assert rest.json() == {"data": [rest.json()["data"][0]], "nextCursor": None}
    assert rest.json()["data"][0]["id"] == offered[0]
    forged = api.get("/v1/user/ownership-transfers", as_=bob, after="bm9wZQ")
    assert forged.status_code == 400 and forged.json()["details"] == {"after": ["malformed cursor"]}


def test_a_transfers_cursor_of_another_caller_or_status_is_400_not_its_page(api, alice, bob):
    """The cursor held only the last offer's place: alice, who made the offers bob
    received, or bob's list of another ``status``, read it as a place of their own list
    (review)."""
    for n in range(3):
        conversation = ConversationFactory(group__owner="alice", title=f"Gift {n}")
        api.post(url(conversation, "/transfer-ownership"), {"newOwnerUserId": "bob"}, as_=alice)
    cursor = api.get("/v1/user/ownership-transfers", as_=bob, limit=1).json()["nextCursor"]
    assert len(api.get("/v1/user/ownership-transfers", as_=bob, after=cursor).json()["data"]) == 2
    for persona, params in [(alice, {}), (bob, {"status": "declined"})]:
        refused = api.get("/v1/user/ownership-transfers", as_=persona, after=cursor, **params)
        assert another_list(refused), (persona, params, refused.content)


@pytest.mark.parametrize("verb", ["accept", "decline"])
def test_a_body_to_accept_or_decline_an_offer_is_refused_not_ignored(
    api, alice, bob, conversation, verb
):
    """They take no body: one with fields was answered 200, the fields ignored, whatever the
    client meant by them ("accept": false). No body, or ``{}``, is none."""
    transfer = api.post(
        url(conversation, "/transfer-ownership"), {"newOwnerUserId": "bob"}, as_=alice
    ).json()
    path = f"/v1/user/ownership-transfers/{transfer['id']}/{verb}"
    refused = api.post(path, {"accept": False}, as_=bob)
    assert refused.status_code == 400
    assert refused.json()["details"] == {"accept": ["unknown field"]}
    assert api.get("/v1/user/ownership-transfers", as_=bob).json()["data"][0]["status"] == "pending"
    assert api.post(path, {}, as_=bob).status_code == 200


def test_a_transfer_to_a_non_member_makes_them_owner(api, alice, conversation):
    transfer = api.post(
        url(conversation, "/transfer-ownership"), {"newOwnerUserId": "dora"}, as_=alice
    ).json()
    api.post(f"/v1/user/ownership-transfers/{transfer['id']}/accept", as_=Persona("dora"))
    assert levels(conversation) == {"alice": "manager", "dora": "owner"}


@pytest.mark.parametrize("who", ["a manager", "themselves"])
def test_an_offer_to_a_member_ends_when_they_are_removed(api, alice, bob, conversation, who):
    """Removed (or gone), the recipient of a pending offer cannot come back as owner."""
    MembershipFactory(group=conversation.group, principal_id="bob", access_level="writer")
    MembershipFactory(group=conversation.group, principal_id="carol", access_level="manager")
    offer = api.post(url(conversation, "/transfer-ownership"), {"newOwnerUserId": "bob"}, as_=alice)
    remover = Persona("carol") if who == "a manager" else bob
    assert api.delete(url(conversation, "/memberships/bob"), as_=remover).status_code == 204
    accepted = api.post(f"/v1/user/ownership-transfers/{offer.json()['id']}/accept", as_=bob)
    assert accepted.status_code == 409
    assert OwnershipTransfer.objects.get().status == "cancelled"
    assert levels(conversation) == {"alice": "owner", "carol": "manager"}
    # The owner may offer again (the cancelled offer holds nothing back).
    again = api.post(url(conversation, "/transfer-ownership"), {"newOwnerUserId": "bob"}, as_=alice)
    assert again.status_code == 202


def test_deleting_a_fork_keeps_the_groups_transfers(api, alice, bob, conversation):
    """Transfers are of the group: one offered from a fork, and the history of those
    accepted, outlive the fork (they name its parent)."""
    first = MessageFactory(conversation=conversation, role="user", content="m1")
    fork = api.post(url(conversation, f"/messages/{first.id}/fork"), {}, as_=alice)
    assert fork.status_code == 201, fork.content
    fork_id = fork.json()["id"]
    offer = api.post(
        f"/v1/user/conversations/{fork_id}/transfer-ownership", {"newOwnerUserId": "bob"}, as_=alice
    )
    assert offer.status_code == 202
    assert api.delete(f"/v1/user/conversations/{fork_id}", as_=alice).status_code == 204
    [pending] = api.get("/v1/user/ownership-transfers", as_=bob).json()["data"]
    assert pending["conversationId"] == str(conversation.id)
    accepted = api.post(f"/v1/user/ownership-transfers/{pending['id']}/accept", as_=bob)
    assert accepted.status_code == 200
    assert levels(conversation) == {"alice": "manager", "bob": "owner"}


def test_a_transfer_to_an_agent_is_refused(api, alice, conversation):
    """An agent could never accept it, and it would hold back every other offer (409)."""
    AgentFactory(name="helper")
    offered = api.post(
        url(conversation, "/transfer-ownership"), {"newOwnerUserId": "agent:helper"}, as_=alice
    )
    assert offered.status_code == 400
    assert offered.json()["code"] == "validation_error"
    assert OwnershipTransfer.objects.count() == 0


def test_a_second_pending_transfer_is_a_conflict(api, alice, conversation):
    first = api.post(url(conversation, "/transfer-ownership"), {"newOwnerUserId": "bob"}, as_=alice)
    second = api.post(
        url(conversation, "/transfer-ownership"), {"newOwnerUserId": "carl"}, as_=alice
    )
    assert (first.status_code, second.status_code) == (202, 409)
    assert second.json()["code"] == "conflict"
    assert OwnershipTransfer.objects.count() == 1


def test_declined_and_cancelled_transfers(api, alice, bob, charlie, conversation):
    first = api.post(
        url(conversation, "/transfer-ownership"), {"newOwnerUserId": "bob"}, as_=alice
    ).json()
    # Only the recipient decides; only the sender cancels; strangers do not see it.
    assert (
        api.post(f"/v1/user/ownership-transfers/{first['id']}/accept", as_=alice).status_code == 403
    )
    assert api.delete(f"/v1/user/ownership-transfers/{first['id']}", as_=bob).status_code == 403
    assert (
        api.post(f"/v1/user/ownership-transfers/{first['id']}/decline", as_=charlie).status_code
        == 404
    )

    declined = api.post(f"/v1/user/ownership-transfers/{first['id']}/decline", as_=bob)
    assert declined.json()["status"] == "declined"
    assert levels(conversation) == {"alice": "owner"}

    second = api.post(
        url(conversation, "/transfer-ownership"), {"newOwnerUserId": "bob"}, as_=alice
    ).json()
    assert api.delete(f"/v1/user/ownership-transfers/{second['id']}", as_=alice).status_code == 204
    assert OwnershipTransfer.objects.get(id=second["id"]).status == "cancelled"
    assert (
        api.post(f"/v1/user/ownership-transfers/{second['id']}/accept", as_=bob).status_code == 409
    )
    assert levels(conversation) == {"alice": "owner"}


def test_an_unknown_transfer_status_filter_is_400(api, alice):
    response = api.get("/v1/user/ownership-transfers", as_=alice, status="lost")
    assert response.status_code == 400
    assert "status" in response.json()["details"]
