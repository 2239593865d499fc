"""Who may do what on the user API: every endpoint against every kind of caller.

Each refused request must leave the database exactly as it was.
"""

import time
from dataclasses import dataclass

import jwt
import pytest
from django.conf import settings

from conversations.models import Conversation, Membership, Message, OwnershipTransfer
from tests.conftest import Persona
from tests.factories import ConversationFactory, MembershipFactory, MessageFactory

pytestmark = pytest.mark.django_db

OWNER, MANAGER, WRITER, READER = "owner", "manager", "writer", "reader"
RANK = {READER: 1, WRITER: 2, MANAGER: 3, OWNER: 4}


@dataclass
class World:
    conversation: Conversation
    message: Message


@pytest.fixture
def world():
    conversation = ConversationFactory(group__owner="olivia", title="Trip plans")
    message = MessageFactory(conversation=conversation, content="Where shall we go?")
    for principal, level in [("mia", MANAGER), ("will", WRITER), ("rita", READER)]:
        MembershipFactory(group=conversation.group, principal_id=principal, access_level=level)
    MembershipFactory(group=conversation.group, principal_id="target", access_level=READER)
    return World(conversation, message)


def snapshot():
    """Everything a user API request could change."""
    return (
        sorted(Conversation.objects.values_list("id", "title", "metadata", "updated_at")),
        sorted(Membership.objects.values_list("group_id", "principal_id", "access_level")),
        sorted(Message.objects.values_list("id", "content")),
        sorted(OwnershipTransfer.objects.values_list("id", "status")),
    )


# (name, method, path, body, level needed, status on success)
ENDPOINTS = [
    ("get conversation", "GET", "/conversations/{c}", None, READER, 200),
    ("update conversation", "PATCH", "/conversations/{c}", {"title": "New"}, WRITER, 200),
    ("delete conversation", "DELETE", "/conversations/{c}", None, OWNER, 204),
    ("list messages", "GET", "/conversations/{c}/messages", None, READER, 200),
    ("append message", "POST", "/conversations/{c}/messages", {"content": "Hi"}, WRITER, 201),
    ("fork", "POST", "/conversations/{c}/messages/{m}/fork", {"title": "B"}, WRITER, 201),
    ("list forks", "GET", "/conversations/{c}/forks", None, READER, 200),
    ("list memberships", "GET", "/conversations/{c}/memberships", None, READER, 200),
    (
        "share",
        "POST",
        "/conversations/{c}/memberships",
        {"userId": "newcomer", "accessLevel": "reader"},
        MANAGER,
        201,
    ),
    (
        "update membership",
        "PATCH",
        "/conversations/{c}/memberships/target",
        {"accessLevel": "writer"},
        MANAGER,
        200,
    ),
    ("revoke membership", "DELETE", "/conversations/{c}/memberships/target", None, MANAGER, 204),
    (
        "transfer ownership",
        "POST",
        "/conversations/{c}/transfer-ownership",
        {"newOwnerUserId": "newcomer"},
        OWNER,
        202,
    ),
]

CALLERS = {
    "anonymous": None,
    "bad token": {"HTTP_AUTHORIZATION": "Bearer not-a-jwt"},
    "expired token": "expired",
    "stranger": Persona("charlie"),
    "reader": Persona("rita"),
    "writer": Persona("will"),
    "manager": Persona("mia"),
    "owner": Persona("olivia"),
}


def expected_status(caller: str, needed: str, success: int) -> int:
    if caller in {"anonymous", "bad token", "expired token"}:
        return 401
    if caller == "stranger":
        return 404
    return success if RANK[caller] >= RANK[needed] else 403


def credentials(caller: str):
    value = CALLERS[caller]
    if value == "expired":
        claims = {"sub": "olivia", "exp": int(time.time()) - 3600}
        token = jwt.encode(claims, settings.MEMSVC_JWT_SECRET, algorithm="HS256")
        return {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    return value


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize(
    ("method", "path", "body", "needed", "success"),
    [pytest.param(*endpoint[1:], id=endpoint[0]) for endpoint in ENDPOINTS],
)
def test_authorization_matrix(api, world, caller, method, path, body, needed, success):
    url = "/v1/user" + path.format(c=world.conversation.id, m=world.message.id)
    before = snapshot()

    response = api.call(method, url, as_=credentials(caller), body=body)

    assert response.status_code == expected_status(caller, needed, success), response.content
    if response.status_code >= 400:
        assert set(response.json()) == {"error", "code", "details"}
        assert snapshot() == before
    if response.status_code == 401:
        assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [pytest.param(*endpoint[1:4], id=endpoint[0]) for endpoint in ENDPOINTS],
)
def test_a_stranger_cannot_tell_a_hidden_conversation_from_a_missing_one(
    api, world, charlie, method, path, body
):
    hidden = api.call(
        method,
        "/v1/user" + path.format(c=world.conversation.id, m=world.message.id),
        as_=charlie,
        body=body,
    )
    missing = api.call(
        method,
        "/v1/user" + path.format(c="00000000-0000-4000-8000-000000000000", m=world.message.id),
        as_=charlie,
        body=body,
    )
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json() == missing.json()
    assert str(world.conversation.id) not in hidden.content.decode()


def test_a_strangers_list_never_shows_other_peoples_conversations(api, world, charlie):
    ConversationFactory.create_batch(3, group__owner="someone-else")
    mine = api.post("/v1/user/conversations", {"title": "Mine"}, as_=charlie).json()

    listed = api.get("/v1/user/conversations", as_=charlie).json()["data"]

    assert [c["id"] for c in listed] == [mine["id"]]
    searched = api.get("/v1/user/conversations", as_=charlie, query="Trip").json()["data"]
    assert searched == []


def test_malformed_and_unknown_ids_are_404(api, world):
    owner = Persona("olivia")
    for path in [
        "/v1/user/conversations/not-a-uuid",
        f"/v1/user/conversations/{world.conversation.id}/messages/not-a-uuid/fork",
        "/v1/user/ownership-transfers/123",
        "/v1/user/ownership-transfers/00000000-0000-4000-8000-000000000000/accept",
        f"/v1/user/conversations/{world.conversation.id}/memberships/nobody",
    ]:
        method = "POST" if path.endswith(("fork", "accept")) else "GET"
        if path.endswith("nobody"):
            method = "DELETE"
        response = api.call(method, path, as_=owner, body={} if method == "POST" else None)
        assert response.status_code == 404, path
        assert response.json()["code"] == "not_found"
