"""The agent API: keys, isolation between agents, acting for users, messages, context."""

import base64
import io
import json
import math
import threading
import uuid
from datetime import timedelta
from uuid import uuid4

import pytest
from django.core.handlers.asgi import ASGIRequest
from django.db import connection, transaction
from django.utils import timezone

from agents_api.keys import split_key
from agents_api.models import ApiKey
from agents_api.services import api_key_revoke
from conversations.models import Conversation, Membership, Message
from conversations.services import messages_delete
from memsvc.api.principals import Principal
from memsvc.asgi import ThreadPoolHandler
from memsvc.models import IdempotentRequest
from tests.agents_api.conftest import make_agent
from tests.api import another_list, rekeyed
from tests.db import recorded_statements
from tests.factories import ConversationFactory, MembershipFactory, MessageFactory

pytestmark = pytest.mark.django_db


def agent_conversation(api, credential, **body):
    response = api.post("/v1/agent/conversations", body, as_=credential)
    assert response.status_code == 201, response.content
    return response.json()


def append(api, credential, conversation_id, *messages, **headers):
    return api.post(
        f"/v1/agent/conversations/{conversation_id}/messages",
        {"messages": list(messages)},
        as_={**credential.auth_headers(), **headers},
    )


# --- keys ------------------------------------------------------------------------------------


def test_me_names_the_agent_and_its_scopes(api, helper):
    response = api.get("/v1/agent/me", as_=helper)
    assert response.status_code == 200
    assert response.json() == {
        "id": str(helper.agent.id),
        "name": "helper",
        "principalId": f"agent:{helper.agent.id}",
        "scopes": ["impersonate", "read", "write"],
    }


def test_the_key_also_works_as_x_api_key(api, helper):
    response = api.get("/v1/agent/me", as_={"HTTP_X_API_KEY": helper.key})
    assert response.status_code == 200


def test_two_different_keys_are_refused_not_chosen_between(api, helper, rival):
    """(The X-API-Key one was taken, silently; review.) The same key twice is one key, and
    a proxy's own bearer credentials beside the key are left alone."""
    both = {"HTTP_X_API_KEY": helper.key, "HTTP_AUTHORIZATION": f"Bearer {rival.key}"}
    response = api.get("/v1/agent/me", as_=both)
    assert response.status_code == 401
    assert response.json()["error"] == "two different API keys (X-API-Key and Authorization)"
    same = {"HTTP_X_API_KEY": helper.key, "HTTP_AUTHORIZATION": f"Bearer {helper.key}"}
    assert api.get("/v1/agent/me", as_=same).status_code == 200
    proxy = {"HTTP_X_API_KEY": helper.key, "HTTP_AUTHORIZATION": "Bearer proxy-token"}
    assert api.get("/v1/agent/me", as_=proxy).json()["id"] == str(helper.agent.id)


def test_only_an_hmac_of_the_secret_is_stored(helper):
    stored = ApiKey.objects.get(agent=helper.agent)
    # (The secret is URL-safe base64, which may hold "_": the test once took the text after
    # the last one, a few characters that a hash's hex digits can hold by chance.)
    _, secret = split_key(helper.key)
    assert len(secret) == 43 and secret not in str(stored.__dict__)
    assert helper.key.startswith(stored.prefix)


@pytest.mark.parametrize(
    "credential",
    [
        None,
        "Bearer msk_nope_wrong",
        "Bearer msk_",
        "Bearer not-a-key",
        "Basic msk_a_b",
    ],
)
def test_bad_credentials_are_401(api, helper, credential):
    headers = {"HTTP_AUTHORIZATION": credential} if credential else None
    response = api.get("/v1/agent/me", as_=headers)
    assert response.status_code == 401
    assert response.json()["code"] == "unauthorized"
    assert response["WWW-Authenticate"] == "Bearer"


def test_an_unknown_id_and_a_wrong_secret_look_the_same(api, helper):
    public_id = ApiKey.objects.get(agent=helper.agent).public_id
    wrong_secret = api.get("/v1/agent/me", as_={"HTTP_X_API_KEY": f"msk_{public_id}_nope"})
    unknown_id = api.get("/v1/agent/me", as_={"HTTP_X_API_KEY": "msk_000000000000_nope"})
    assert wrong_secret.status_code == unknown_id.status_code == 401
    assert wrong_secret.json() == unknown_id.json()


def test_a_user_token_is_401_on_the_agent_api(api, alice):
    response = api.get("/v1/agent/me", as_=alice)
    assert response.status_code == 401
    assert "API key" in response.json()["error"]


def test_an_api_key_is_401_on_the_user_api(api, helper):
    assert api.get("/v1/user/conversations", as_=helper).status_code == 401


def test_a_key_is_read_with_its_agent_in_one_statement_as_the_orm_reads_them(helper):
    from agents_api.authentication import authenticate_key

    stored = ApiKey.objects.select_related("agent").get(agent=helper.agent)
    with recorded_statements() as statements:
        found = authenticate_key(helper.key)
        assert found.agent.name == "helper"  # (loaded with the key)
    # One read (and the write of ``last_used_at``, once a minute).
    assert len([sql for sql in statements if sql.lstrip().startswith("SELECT")]) == 1
    for field in ApiKey._meta.concrete_fields:  # (``scopes`` a list, times aware, ...)
        assert getattr(found, field.attname) == getattr(stored, field.attname), field.name
    for field in type(stored.agent)._meta.concrete_fields:
        assert getattr(found.agent, field.attname) == getattr(stored.agent, field.attname)
    assert not [name for name in vars(found.agent) if name.startswith("key_")]  # (its HMAC)


def test_a_revoked_key_is_401(api, helper):
    api_key_revoke(api_key=ApiKey.objects.get(agent=helper.agent))
    assert api.get("/v1/agent/me", as_=helper).status_code == 401


def test_last_used_is_written_at_most_once_a_minute(api, helper):
    api.get("/v1/agent/me", as_=helper)
    first = ApiKey.objects.get(agent=helper.agent).last_used_at
    assert first is not None
    api.get("/v1/agent/me", as_=helper)
    assert ApiKey.objects.get(agent=helper.agent).last_used_at == first
    ApiKey.objects.filter(agent=helper.agent).update(last_used_at=first - timedelta(minutes=2))
    api.get("/v1/agent/me", as_=helper)
    assert ApiKey.objects.get(agent=helper.agent).last_used_at > first


def test_a_read_key_cannot_write(api, alice):
    reader = make_agent("reader", scopes=("read",))
    before = Conversation.objects.count()
    response = api.post("/v1/agent/conversations", {"title": "x"}, as_=reader)
    assert response.status_code == 403
    assert "write" in response.json()["error"]
    assert Conversation.objects.count() == before
    assert api.get("/v1/agent/conversations", as_=reader).status_code == 200


# --- isolation and acting for users ----------------------------------------------------------


def test_agents_never_see_each_others_conversations(api, helper, rival):
    mine = agent_conversation(api, helper, title="helper's")
    append(api, helper, mine["id"], {"role": "assistant", "content": "secret plan"})

    assert api.get("/v1/agent/conversations", as_=rival).json()["data"] == []
    for method, path, body in [
        ("GET", f"/v1/agent/conversations/{mine['id']}/context", None),
        (
            "POST",
            f"/v1/agent/conversations/{mine['id']}/messages",
            {"messages": [{"role": "user", "content": "x"}]},
        ),
        (
            "POST",
            f"/v1/agent/conversations/{mine['id']}/summaries",
            {
                "title": "t",
                "summary": "s",
                "untilMessageId": mine["id"],
                "summarizedAt": "2026-01-01T00:00:00Z",
            },
        ),
    ]:
        response = api.call(method, path, as_=rival, body=body)
        assert response.status_code == 404, path
    assert Message.objects.count() == 1


def test_an_agent_sees_a_conversation_a_user_made_for_it(api, alice, helper):
    created = api.post(
        "/v1/user/conversations", {"title": "Ask", "agentId": str(helper.agent.id)}, as_=alice
    ).json()
    listed = api.get("/v1/agent/conversations", as_=helper).json()["data"]
    assert [c["id"] for c in listed] == [created["id"]]
    assert listed[0]["accessLevel"] == "writer"
    assert (
        append(api, helper, created["id"], {"role": "assistant", "content": "hi"}).status_code
        == 201
    )


def test_acting_for_a_user_needs_the_impersonate_scope(api, alice):
    plain = make_agent("plain").acting_for("alice")
    response = api.post("/v1/agent/conversations", {}, as_=plain)
    assert response.status_code == 403
    assert "impersonate" in response.json()["error"]
    assert not Conversation.objects.exists()


def test_a_conversation_created_for_a_user_belongs_to_the_user(api, alice, helper):
    created = agent_conversation(api, helper.acting_for("alice"), title="For Alice")
    assert created["ownerUserId"] == "alice"
    levels = dict(Membership.objects.values_list("principal_id", "access_level"))
    assert levels == {"alice": "owner", f"agent:{helper.agent.id}": "writer"}
    listed = api.get("/v1/user/conversations", as_=alice).json()["data"]
    assert [c["id"] for c in listed] == [created["id"]]


def test_the_user_acted_for_is_the_utf8_text_the_client_sent(api, helper):
    """A server hands a header over a character per byte: "é" arrives as two characters."""
    as_sent = "zoë".encode().decode("latin-1")
    created = agent_conversation(api, helper.acting_for(as_sent))
    assert created["ownerUserId"] == "zoë"
    for bad, problem in (
        (b"zo\xeb".decode("latin-1"), "must be UTF-8 text"),  # Latin-1 bytes, not UTF-8
        ("a\x01b", "must not contain control characters"),
        ("a\tb", "must not contain control characters"),
        # Unicode's blanks are the id's, not HTTP's to strip (review: acted for "carol").
        ("carol\u2028".encode().decode("latin-1"), "must be one line"),
        ("bob\u00a0".encode().decode("latin-1"), "must not begin or end with a space"),
    ):
        response = api.post("/v1/agent/conversations", {}, as_=helper.acting_for(bad))
        assert response.status_code == 400, response.content
        assert response.json()["details"] == {"X-On-Behalf-Of": [problem]}
    assert Conversation.objects.count() == 1


def test_a_user_acted_for_is_named_once(helper):
    """Two ``X-On-Behalf-Of`` headers ("alice", "bob") acted for the user "alice,bob":
    Django joins a repeated header's values (review). Through the web processes' own
    handler, in this thread (the test's transaction holds the key)."""
    handler = ThreadPoolHandler(1, 1)
    handler.threads.shutdown()

    def create(*acting_for: bytes):
        headers = [(b"host", b"testserver"), (b"authorization", f"Bearer {helper.key}".encode())]
        headers += [(b"x-on-behalf-of", user) for user in acting_for]
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/agent/conversations",
            "query_string": b"",
            "headers": [*headers, (b"content-type", b"application/json")],
        }
        return handler.get_response(ASGIRequest(scope, io.BytesIO(b"{}")))

    refused = create(b"alice", b"bob")
    assert refused.status_code == 400, refused.content
    assert json.loads(refused.content)["details"] == {"X-On-Behalf-Of": ["must be given once"]}
    assert not Conversation.objects.exists()
    created = create(b"alice")
    assert created.status_code == 201
    assert json.loads(created.content)["ownerUserId"] == "alice"


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        ([b"a", b"b"], "must be given once"),  # (taken as "a,b": review)
        ([b""], "must not be empty"),  # (taken as none: a retry stored twice; review)
        ([b"k\xe9\xff"], "must be UTF-8 text"),
    ],
)
def test_an_idempotency_key_is_one_utf8_text(helper, keys, problem):
    """Through the web processes' own handler (a repeated header as sent), in this thread."""
    conversation = ConversationFactory(group__owner=helper.agent.principal_id)
    handler = ThreadPoolHandler(1, 1)
    handler.threads.shutdown()
    body = json.dumps({"messages": [{"role": "user", "content": "once"}]}).encode()
    headers = [(b"host", b"testserver"), (b"authorization", f"Bearer {helper.key}".encode())]
    scope = {
        "type": "http",
        "method": "POST",
        "path": f"/v1/agent/conversations/{conversation.id}/messages",
        "query_string": b"",
        "headers": [
            *headers,
            *((b"idempotency-key", k) for k in keys),
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
        ],
    }
    refused = handler.get_response(ASGIRequest(scope, io.BytesIO(body)))
    assert refused.status_code == 400, refused.content
    assert json.loads(refused.content)["details"] == {"Idempotency-Key": [problem]}
    assert not Message.objects.exists()


def test_acting_for_a_user_applies_the_users_access_too(api, helper):
    conversation = ConversationFactory(group__owner="alice")
    MembershipFactory(
        group=conversation.group, principal_id=helper.agent.principal_id, access_level="writer"
    )
    MembershipFactory(group=conversation.group, principal_id="rita", access_level="reader")
    path = f"/v1/agent/conversations/{conversation.id}/context"

    assert api.get(path, as_=helper).status_code == 200
    assert api.get(path, as_=helper.acting_for("alice")).status_code == 200
    assert api.get(path, as_=helper.acting_for("charlie")).status_code == 404  # a stranger
    # rita only reads: acting for her, the agent cannot write either.
    write = append(
        api, helper.acting_for("rita"), conversation.id, {"role": "user", "content": "x"}
    )
    assert write.status_code == 403
    assert not Message.objects.exists()


# --- bulk append -----------------------------------------------------------------------------


def test_a_hundred_messages_in_one_call_keep_their_order(api, helper):
    conversation = agent_conversation(api, helper)
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(100)
    ]
    response = append(api, helper, conversation["id"], *messages)
    assert response.status_code == 201
    assert [m["content"] for m in response.json()["data"]] == [f"turn {i}" for i in range(100)]
    stored = Message.objects.filter(conversation_id=conversation["id"]).order_by("seq")
    assert [m.content for m in stored] == [f"turn {i}" for i in range(100)]


def test_the_body_cap_admits_the_largest_documented_bulk_append(api, helper, settings):
    """100 messages of the longest content (4-byte characters in UTF-8), each with metadata
    of the largest size, fit under the default cap; 30 such messages of plain text (refused
    by Django's old 2.5 MB limit) are stored."""
    from agents_api.api.serializers import MAX_BULK_MESSAGES
    from memsvc.api.fields import METADATA_MAX_BYTES

    longest = {
        "role": "user",
        "content": "\U0001f600" * settings.MEMSVC_MAX_MESSAGE_CHARS,
        "metadata": {"k": "\u20ac" * ((METADATA_MAX_BYTES - 20) // 3)},
        "authorName": "x" * 255,
    }
    largest = json.dumps({"messages": [longest] * MAX_BULK_MESSAGES}, ensure_ascii=False)
    assert len(largest.encode()) <= settings.MEMSVC_MAX_BODY_BYTES

    conversation = agent_conversation(api, helper)
    thirty = [{"role": "user", "content": "x" * settings.MEMSVC_MAX_MESSAGE_CHARS}] * 30
    response = append(api, helper, conversation["id"], *thirty)
    assert response.status_code == 201, response.content[:300]
    assert Message.objects.filter(conversation_id=conversation["id"]).count() == 30


def test_metadata_is_measured_as_the_compact_json_a_client_sends(api, helper):
    """16,384 bytes as JSON text: counted with a space after every "," and ":", a compact
    12,007 bytes was refused as 18,007 (review)."""
    from memsvc.api.fields import METADATA_MAX_BYTES

    conversation = agent_conversation(api, helper)
    zeros = {"a": [0] * 6000}  # 12,007 bytes compact
    at_the_limit = {"k": "x" * (METADATA_MAX_BYTES - len('{"k":""}'))}
    for metadata in (zeros, at_the_limit):
        message = {"role": "user", "content": "x", "metadata": metadata}
        assert append(api, helper, conversation["id"], message).status_code == 201
    over = {"k": "x" * (METADATA_MAX_BYTES - len('{"k":""}') + 1)}
    refused = append(
        api, helper, conversation["id"], {"role": "user", "content": "x", "metadata": over}
    )
    assert refused.status_code == 400
    assert refused.json()["details"] == {
        "messages[0].metadata": [f"must be at most {METADATA_MAX_BYTES} bytes"]
    }
    # Measured as it is kept: 1e308, five bytes sent, is kept as its 309 digits (code review).
    numbers = b"[" + b",".join([b"1e308"] * 60) + b"]"
    body = b'{"messages": [{"role": "user", "content": "x", "metadata": {"a": %s}}]}' % numbers
    kept_large = api.client.post(
        f"/v1/agent/conversations/{conversation['id']}/messages",
        body,
        content_type="application/json",
        **helper.auth_headers(),
    )
    assert kept_large.status_code == 400, kept_large.content[:200]
    assert kept_large.json()["details"] == refused.json()["details"]


def test_a_number_jsonb_cannot_hold_is_refused_naming_its_field(api, helper):
    """1e999 reads as infinity, which PostgreSQL's jsonb refuses (DRF said "Value must be
    valid JSON." of a number)."""
    conversation = agent_conversation(api, helper)
    body = b'{"messages": [{"role": "user", "content": "x", "metadata": {"a": 1e999}}]}'
    refused = api.client.post(
        f"/v1/agent/conversations/{conversation['id']}/messages",
        body,
        content_type="application/json",
        **helper.auth_headers(),
    )
    assert refused.status_code == 400, refused.content
    assert refused.json()["details"] == {
        "messages[0].metadata": ["numbers must be finite: no NaN or Infinity"]
    }


# Numbers as a client may write them, which jsonb gives back otherwise: no negative zero, and
# a float Python shows in exponent form as its digits (an integer).
NUMBERS = b'{"zero": -0.0, "hundred": 1E2, "big": 1E30, "long": 123456789012345678901234567890.5, "small": 1.5e-7, "ints": [-0, 12345678901234567890]}'


def test_a_write_answers_the_json_that_its_reads_answer(api, helper):
    """A message's metadata read ``-0.0`` and ``1.2345678901234568e+29`` in the create's
    answer, ``0.0`` and ``123456789012345680000000000000`` ever after (review); memories'
    and tool records' the same."""

    def sent(path, body: bytes):
        response = api.client.post(
            path, body, content_type="application/json", **helper.auth_headers()
        )
        assert response.status_code == 201, response.content
        return response.json()

    def read(path):
        response = api.get(path, as_=helper)
        assert response.status_code == 200, response.content
        return response.json()

    conversation = agent_conversation(api, helper)
    path = f"/v1/agent/conversations/{conversation['id']}/messages"
    body = b'{"messages": [{"role": "user", "content": "x", "metadata": %s}]}' % NUMBERS
    (message,) = sent(path, body)["data"]
    (listed,) = read(f"/v1/agent/conversations/{conversation['id']}/context")["messages"]
    # (Its keys in the order of the reads too: jsonb's, the shorter first; review.)
    assert json.dumps(message["metadata"]) == json.dumps(listed["metadata"])
    assert list(listed["metadata"]) == ["big", "ints", "long", "zero", "small", "hundred"]
    assert listed["metadata"]["big"] == 10**30
    # (-0.0 == 0.0 in Python: its sign is what tells them apart.)
    assert math.copysign(1, message["metadata"]["zero"]) == 1

    memory = sent("/v1/agent/memories", b'{"content": "a fact", "metadata": %s}' % NUMBERS)
    stored = read(f"/v1/agent/memories/{memory['id']}")
    assert json.dumps(memory["metadata"]) == json.dumps(stored["metadata"])
    body = b'{"memories": [{"content": "another fact", "metadata": %s}]}' % NUMBERS
    (saved,) = sent("/v1/agent/memories/batch", body)["data"]
    stored = read(f"/v1/agent/memories/{saved['id']}")
    assert json.dumps(saved["metadata"]) == json.dumps(stored["metadata"])

    # Keys of any length and script, and one given twice (the last kept).
    keys = rb'{"\u00e9t\u00e9": 1, "zz": 2, "\u0436": 3, "a": 4, "ab": 5, "a": 6, "Z": 7}'
    body = b'{"toolName": "look", "input": %s, "output": [%s, -0.0, %s]}' % (
        NUMBERS,
        NUMBERS,
        keys,
    )
    record = sent("/v1/agent/tool-records", body)
    stored = read(f"/v1/agent/tool-records/{record['traceId']}")
    assert json.dumps([record["input"], record["output"]]) == json.dumps(
        [stored["input"], stored["output"]]
    )
    assert record["output"][2] == {"Z": 7, "a": 6, "ab": 5, "zz": 2, "ж": 3, "été": 1}


def test_a_body_over_the_cap_is_413_in_the_error_shape(api, helper, settings):
    settings.MEMSVC_MAX_BODY_BYTES = 10_000
    conversation = agent_conversation(api, helper)
    response = append(api, helper, conversation["id"], {"role": "user", "content": "x" * 10_000})
    assert response.status_code == 413
    assert response.json() == {
        "error": "the body must be at most 10000 bytes",
        "code": "payload_too_large",
        "details": {},
    }
    assert not Message.objects.exists()


def test_more_than_a_hundred_or_none_is_400(api, helper):
    conversation = agent_conversation(api, helper)
    too_many = [{"role": "user", "content": "x"}] * 101
    assert append(api, helper, conversation["id"], *too_many).status_code == 400
    assert append(api, helper, conversation["id"]).status_code == 400
    assert not Message.objects.exists()


def test_one_invalid_message_stores_none(api, helper):
    conversation = agent_conversation(api, helper)
    response = append(
        api,
        helper,
        conversation["id"],
        {"role": "user", "content": "fine"},
        {"role": "robot", "content": "not fine"},
        {"role": "assistant", "content": "fine too"},
    )
    assert response.status_code == 400
    assert "messages[1].role" in response.json()["details"]
    assert not Message.objects.exists()


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"role": "user", "content": "x", "channel": "summary"}, "messages[0].channel"),
        ({"role": "user", "content": "x", "visibility": "public"}, "messages[0].visibility"),
        ({"role": "user", "content": ""}, "messages[0].content"),
        (
            {"role": "user", "content": "x", "createdAt": "2999-01-01T00:00:00Z"},
            "messages[0].createdAt",
        ),
        (
            {
                "role": "user",
                "content": "x",
                "parentMessageId": "00000000-0000-4000-8000-000000000000",
            },
            "messages[0].parentMessageId",
        ),
        ({"role": "user", "content": "x", "authorName": ""}, "messages[0].authorName"),
        # A speaker's name shown as what it is, on one line (review).
        *[
            ({"role": "user", "content": "x", "authorName": name}, "messages[0].authorName")
            for name in ["\u202eecila", "alice\nbob", "alice\u2028bob", " alice", "alice\u200b"]
        ],
    ],
)
def test_invalid_fields_are_named(api, helper, message, field):
    conversation = agent_conversation(api, helper)
    response = append(api, helper, conversation["id"], message)
    assert response.status_code == 400
    assert field in response.json()["details"]
    assert not Message.objects.exists()


def test_a_user_turn_in_an_agents_own_conversation_is_signed_user(api, helper):
    """Not with the agent's principal id, which would be embedded and indexed as the
    speaker's name."""
    conversation = agent_conversation(api, helper)  # the agent's own: no user acted for
    turn = append(api, helper, conversation["id"], {"role": "user", "content": "hi"}).json()
    assert turn["data"][0]["authorName"] == "user"


def test_author_names_created_at_and_parents(api, helper):
    conversation = agent_conversation(api, helper.acting_for("alice"))
    first = append(api, helper, conversation["id"], {"role": "user", "content": "hi"}).json()
    response = append(
        api,
        helper,
        conversation["id"],
        {"role": "assistant", "content": "hello", "parentMessageId": first["data"][0]["id"]},
        {
            "role": "user",
            "content": "I'm Caroline",
            "authorName": "Caroline",
            "createdAt": "2023-05-08T13:56:00Z",
            "metadata": {"dia_id": "D1:3"},
        },
    )
    assert response.status_code == 201
    reply, imported = response.json()["data"]
    assert first["data"][0]["authorName"] == "alice"  # role user: the conversation's user
    assert reply["authorName"] == "helper"  # the agent's name otherwise
    assert reply["parentMessageId"] == first["data"][0]["id"]
    assert imported["authorName"] == "Caroline"
    assert imported["createdAt"] == "2023-05-08T13:56:00Z"
    assert imported["metadata"] == {"dia_id": "D1:3"}
    seqs = list(Message.objects.order_by("seq").values_list("content", flat=True))
    assert seqs == ["hi", "hello", "I'm Caroline"]  # seq, not createdAt, fixes the order


def test_the_same_idempotency_key_twice_stores_one_set(api, helper):
    conversation = agent_conversation(api, helper)
    body = [{"role": "user", "content": "once"}, {"role": "assistant", "content": "only"}]
    first = append(api, helper, conversation["id"], *body, HTTP_IDEMPOTENCY_KEY="k-1")
    again = append(api, helper, conversation["id"], *body, HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json()
    assert again["Idempotent-Replayed"] == "true"
    assert Message.objects.count() == 2

    different = append(
        api,
        helper,
        conversation["id"],
        {"role": "user", "content": "other"},
        HTTP_IDEMPOTENCY_KEY="k-1",
    )
    assert different.status_code == 409
    assert Message.objects.count() == 2

    # Sent again after one of them was deleted: a conflict (a 201 with the one left, or
    # none, told a client whose answer was lost that both were stored; code review).
    messages_delete(Principal.user("ops"), messages=Message.objects.filter(content="only"))
    gone = append(api, helper, conversation["id"], *body, HTTP_IDEMPOTENCY_KEY="k-1")
    assert gone.status_code == 409
    assert (
        gone.json()["error"]
        == "the messages stored with this Idempotency-Key have been deleted since"
    )
    assert Message.objects.count() == 1


def test_an_idempotency_key_is_forgotten_after_its_time_by_the_daily_prune(api, helper):
    from memsvc.api.idempotency import IDEMPOTENCY_KEY_TTL, idempotency_keys_prune

    conversation = agent_conversation(api, helper)

    def keyed(content: str, key: str):
        turn = {"role": "user", "content": content}
        return append(api, helper, conversation["id"], turn, HTTP_IDEMPOTENCY_KEY=key)

    keyed("old", "old")
    keyed("new", "new")
    IdempotentRequest.objects.filter(key="old").update(
        created_at=timezone.now() - IDEMPOTENCY_KEY_TTL - timedelta(minutes=1)
    )
    assert idempotency_keys_prune() == 1
    assert list(IdempotentRequest.objects.values_list("key", flat=True)) == ["new"]
    # The old key is a new request now; the kept one is still a retry.
    again = keyed("x", "old")
    assert again.status_code == 201 and "Idempotent-Replayed" not in again
    assert keyed("new", "new")["Idempotent-Replayed"] == "true"


def test_a_key_reused_acting_for_another_user_is_a_conflict_not_a_replay(api, helper):
    """The same body acting for bob is bob's turn, not a retry of alice's: replaying alice's
    message would drop bob's without a word."""
    conversation = ConversationFactory(group__owner="alice")
    for member in (helper.agent.principal_id, "bob"):
        MembershipFactory(group=conversation.group, principal_id=member, access_level="writer")
    turn = {"role": "user", "content": "hello"}
    first = append(api, helper.acting_for("alice"), conversation.id, turn, HTTP_IDEMPOTENCY_KEY="k")
    assert first.status_code == 201
    again = append(api, helper.acting_for("bob"), conversation.id, turn, HTTP_IDEMPOTENCY_KEY="k")
    assert again.status_code == 409, again.content
    assert list(Message.objects.values_list("author_name", flat=True)) == ["alice"]


def append_with_a_key(api, helper, key: str):
    """One user turn appended to a new conversation with ``key``: the response, and the SQL
    of every statement the append sent."""
    conversation = agent_conversation(api, helper)
    with recorded_statements() as sent:
        response = append(
            api,
            helper,
            conversation["id"],
            {"role": "user", "content": "hi"},
            HTTP_IDEMPOTENCY_KEY=key,
        )
    return response, sent


def test_a_new_idempotency_key_costs_one_statement(api, helper):
    # The key is claimed by one INSERT ... ON CONFLICT DO NOTHING (not a read, then a
    # savepoint, the insert and its release), and the record is filled in once the messages
    # exist.
    response, sent = append_with_a_key(api, helper, "k-2")
    assert response.status_code == 201
    about_the_key = [sql for sql in sent if "idempotent_request" in sql]
    assert [sql.split()[0] for sql in about_the_key] == ["INSERT", "UPDATE"]
    [stored] = IdempotentRequest.objects.values_list("result_ids", flat=True)
    assert stored == [response.json()["data"][0]["id"]]


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_with_one_key_store_one_set(live_server):
    import httpx

    with transaction.atomic():
        helper = make_agent("racer")
        conversation = ConversationFactory(group__owner=helper.agent.principal_id)
    url = f"{live_server.url}/v1/agent/conversations/{conversation.id}/messages"
    headers = {"Authorization": f"Bearer {helper.key}", "Idempotency-Key": "race"}
    body = {"messages": [{"role": "user", "content": "exactly once"}]}
    results = []

    def send():
        results.append(httpx.post(url, json=body, headers=headers, timeout=30).status_code)

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert results == [201] * 4
    assert Message.objects.filter(conversation=conversation).count() == 1
    assert IdempotentRequest.objects.count() == 1
    connection.close()


# --- summaries and context -------------------------------------------------------------------


def context(api, credential, conversation_id, **params):
    response = api.get(
        f"/v1/agent/conversations/{conversation_id}/context", as_=credential, **params
    )
    assert response.status_code == 200, response.content
    return response.json()


def test_context_without_a_summary_is_every_message(api, helper):
    conversation = agent_conversation(api, helper)
    append(
        api,
        helper,
        conversation["id"],
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "agent", "content": "note", "channel": "memory", "visibility": "agent"},
    )
    body = context(api, helper, conversation["id"])
    assert body["conversationId"] == conversation["id"]
    assert [m["content"] for m in body["messages"]] == ["q1", "a1", "note"]
    assert body["nextAfterMessageId"] is None


def test_turns_users_cannot_read_do_not_move_the_conversation_in_their_lists(api, helper, alice):
    """A member is shown when the conversation last changed in a way they can read: an
    agent's hidden turns (the MEMORY channel, agent-only visibility, a summary without a new
    title) moved ``updatedAt`` and the list's order, telling them when it wrote. The agent
    is shown every change."""
    hidden, other = (
        agent_conversation(api, helper.acting_for("alice"), title="Plans") for _ in range(2)
    )

    def listed(credential, path):
        response = api.get(path, as_=credential)
        assert response.status_code == 200, response.content
        return [(c["id"], c["updatedAt"]) for c in response.json()["data"]]

    def shown(conversation):
        path = f"/v1/user/conversations/{conversation['id']}"
        return api.get(path, as_=alice).json()["updatedAt"]

    before = listed(alice, "/v1/user/conversations")
    assert [id_ for id_, _ in before] == [other["id"], hidden["id"]]
    stored = append(
        api,
        helper,
        hidden["id"],
        {"role": "agent", "content": "note", "channel": "memory", "visibility": "agent"},
        {"role": "assistant", "content": "aside", "visibility": "agent"},
    )
    assert stored.status_code == 201, stored.content
    summary = api.post(
        f"/v1/agent/conversations/{hidden['id']}/summaries",
        {
            "title": "Plans",  # as it was: nothing a user reads changed
            "summary": "Nothing yet.",
            "untilMessageId": stored.json()["data"][1]["id"],
            "summarizedAt": "2026-11-01T10:00:00Z",
        },
        as_=helper,
    )
    assert summary.status_code == 201, summary.content

    assert listed(alice, "/v1/user/conversations") == before
    assert shown(hidden) == dict(before)[hidden["id"]]
    # The agent sees its turns: the conversation moved ahead in its list.
    agent_list = listed(helper, "/v1/agent/conversations")
    assert [id_ for id_, _ in agent_list] == [hidden["id"], other["id"]]
    assert dict(agent_list)[hidden["id"]] > dict(before)[hidden["id"]]

    # A turn the user reads moves it for them too.
    append(api, helper, hidden["id"], {"role": "assistant", "content": "hello alice"})
    after = listed(alice, "/v1/user/conversations")
    assert [id_ for id_, _ in after] == [hidden["id"], other["id"]]
    assert dict(after)[hidden["id"]] > dict(before)[hidden["id"]]
    # So does a summary's new title, which users read.
    note = {"role": "agent", "content": "note", "channel": "memory", "visibility": "agent"}
    until = append(api, helper, other["id"], note).json()["data"][0]["id"]
    renamed = api.post(
        f"/v1/agent/conversations/{other['id']}/summaries",
        {
            "title": "Plans, renamed",
            "summary": "-",
            "untilMessageId": until,
            "summarizedAt": "2026-11-01T10:00:00Z",
        },
        as_=helper,
    )
    assert renamed.status_code == 201, renamed.content
    assert [id_ for id_, _ in listed(alice, "/v1/user/conversations")] == [
        other["id"],
        hidden["id"],
    ]


def test_after_a_summary_the_context_is_the_summary_then_later_messages(api, helper, alice):
    conversation = agent_conversation(api, helper.acting_for("alice"))
    stored = append(
        api,
        helper,
        conversation["id"],
        *[{"role": "user", "content": f"m{i}"} for i in range(5)],
    ).json()["data"]
    summary = api.post(
        f"/v1/agent/conversations/{conversation['id']}/summaries",
        {
            "title": "Five messages",
            "summary": "The user said m0 to m2.",
            "untilMessageId": stored[2]["id"],
            "summarizedAt": "2026-11-01T10:00:00Z",
        },
        as_=helper,
    )
    assert summary.status_code == 201
    assert summary.json()["channel"] == "summary"
    assert summary.json()["visibility"] == "agent"
    assert summary.json()["authorName"] == "helper"
    assert summary.json()["metadata"] == {
        "untilMessageId": stored[2]["id"],
        "summarizedAt": "2026-11-01T10:00:00Z",
    }
    append(api, helper, conversation["id"], {"role": "user", "content": "m5"})

    body = context(api, helper, conversation["id"])
    assert [m["content"] for m in body["messages"]] == ["The user said m0 to m2.", "m3", "m4", "m5"]
    assert Conversation.objects.get(id=conversation["id"]).title == "Five messages"
    # The user never sees the summary.
    user_view = api.get(f"/v1/user/conversations/{conversation['id']}/messages", as_=alice)
    assert [m["content"] for m in user_view.json()["data"]] == [f"m{i}" for i in range(6)]


def test_a_forks_summary_covers_no_more_once_its_fork_point_moves_before_what_it_covers(
    api, helper, alice
):
    """The fork point (a parent's turn) deleted, the fork starts at the history message
    before it, and the parent's agent note the fork's summary covers up to is out of the
    fork's view: the summary was read as covering everything up to itself, and the fork's
    own turns before it left the agent's context (review)."""
    parent = agent_conversation(api, helper.acting_for("alice"))["id"]
    _, a1, note, point, replaced = append(
        api,
        helper,
        parent,
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "agent", "channel": "memory", "visibility": "agent", "content": "note"},
        {"role": "user", "content": "point"},
        {"role": "user", "content": "replaced"},
    ).json()["data"]
    forked = api.post(
        f"/v1/user/conversations/{parent}/messages/{replaced['id']}/fork",
        {"newMessage": {"content": "f1"}},
        as_=alice,
    )
    assert forked.status_code == 201, forked.content
    fork = forked.json()["id"]
    append(api, helper, fork, {"role": "assistant", "content": "f2"})
    summary = {"title": "t", "summary": "S", "untilMessageId": note["id"]}
    summary["summarizedAt"] = "2026-11-01T10:00:00Z"
    assert (
        api.post(f"/v1/agent/conversations/{fork}/summaries", summary, as_=helper).status_code
        == 201
    )
    append(api, helper, fork, {"role": "user", "content": "f3"})
    seen = [m["content"] for m in context(api, helper, fork)["messages"]]
    assert seen == ["S", "point", "f1", "f2", "f3"]

    messages_delete(helper.agent.as_principal(), messages=Message.objects.filter(id=point["id"]))
    assert Conversation.objects.get(id=fork).forked_at_message_id == uuid.UUID(a1["id"])
    assert [m["content"] for m in context(api, helper, fork)["messages"]] == ["S", "f1", "f2", "f3"]


@pytest.mark.parametrize("until", ["garbage", 7, ["a list"]])
def test_a_summary_covering_no_id_is_read_as_one_whose_messages_are_gone(api, helper, until):
    """A summary whose ``untilMessageId`` is no id (an operator's import stored one before it
    was refused there) is read as one whose messages are all deleted: the summary, then what
    came after it. The context was a 400 for good ("is not a valid UUID")."""
    conversation = agent_conversation(api, helper.acting_for("alice"))
    stored = append(
        api, helper, conversation["id"], *[{"role": "user", "content": f"m{i}"} for i in range(3)]
    ).json()["data"]
    body = {"title": "t", "summary": "The user said m0 and m1.", "untilMessageId": stored[1]["id"]}
    body["summarizedAt"] = "2026-11-01T10:00:00Z"
    made = api.post(f"/v1/agent/conversations/{conversation['id']}/summaries", body, as_=helper)
    Message.objects.filter(id=made.json()["id"]).update(metadata={"untilMessageId": until})
    append(api, helper, conversation["id"], {"role": "user", "content": "m3"})
    assert [m["content"] for m in context(api, helper, conversation["id"])["messages"]] == [
        "The user said m0 and m1.",
        "m3",
    ]


def test_a_summary_updates_its_conversation_once(api, helper):
    """Title and time in one update: a second update of the row its append wrote made
    PostgreSQL check the row's foreign keys again at commit, locking the group after the
    conversation, the reverse of a deletion's order (a summary racing the conversation's
    delete, an erase or a membership change deadlocked: 8 of 15 pairs answered 503)."""
    conversation = agent_conversation(api, helper)
    stored = append(api, helper, conversation["id"], {"role": "user", "content": "m0"})
    with recorded_statements() as sent:
        summary = api.post(
            f"/v1/agent/conversations/{conversation['id']}/summaries",
            {
                "title": "Once",
                "summary": "S",
                "untilMessageId": stored.json()["data"][0]["id"],
                "summarizedAt": "2026-11-01T10:00:00Z",
            },
            as_=helper,
        )
    assert summary.status_code == 201
    assert len([sql for sql in sent if sql.startswith('UPDATE "conversation"')]) == 1
    assert Conversation.objects.get(id=conversation["id"]).title == "Once"


# The two ways to go on from a page: its last message's id, or its cursor.
RESUMED_BY = {"afterMessageId": "nextAfterMessageId", "after": "nextCursor"}


@pytest.mark.parametrize("resume", RESUMED_BY)
def test_context_pages_walk_every_message_once(api, helper, resume):
    conversation = agent_conversation(api, helper)
    stored = append(
        api, helper, conversation["id"], *[{"role": "user", "content": f"m{i}"} for i in range(7)]
    ).json()["data"]
    api.post(
        f"/v1/agent/conversations/{conversation['id']}/summaries",
        {
            "title": "t",
            "summary": "S",
            "untilMessageId": stored[1]["id"],
            "summarizedAt": "2026-11-01T10:00:00Z",
        },
        as_=helper,
    )
    seen, after = [], None
    while True:
        params = {"limit": "2", **({resume: after} if after else {})}
        body = context(api, helper, conversation["id"], **params)
        seen += [m["content"] for m in body["messages"]]
        after = body[RESUMED_BY[resume]]
        if after is None:
            break
    assert seen == ["S", "m2", "m3", "m4", "m5", "m6"]


def test_an_agent_waiting_for_new_messages_resumes_from_the_last_pages_end(api, helper, alice, bob):
    """The last page had no cursor (``nextCursor`` null) and the id of its last message was
    refused once that message was erased, so an agent polling for what is written next had
    no place to come back to (review). ``resumeCursor`` is on every page: the empty one gives
    back the place it was asked from."""
    conversation = agent_conversation(api, helper.acting_for("alice"))
    path = f"/v1/user/conversations/{conversation['id']}"
    shared = api.post(f"{path}/memberships", {"userId": "bob", "accessLevel": "writer"}, as_=alice)
    assert shared.status_code == 201
    assert context(api, helper, conversation["id"])["resumeCursor"] is None
    for author, content in ((alice, "a1"), (bob, "b1")):
        assert api.post(f"{path}/messages", {"content": content}, as_=author).status_code == 201
    last_page = context(api, helper, conversation["id"])
    assert last_page["nextCursor"] is None and last_page["resumeCursor"]
    waiting = context(api, helper, conversation["id"], after=last_page["resumeCursor"])
    assert waiting["messages"] == [] and waiting["resumeCursor"] == last_page["resumeCursor"]

    assert api.post("/v1/user/erase", {"confirm": "bob"}, as_=bob).status_code == 200
    assert api.post(f"{path}/messages", {"content": "a2"}, as_=alice).status_code == 201
    later = context(api, helper, conversation["id"], after=waiting["resumeCursor"])
    assert [m["content"] for m in later["messages"]] == ["a2"]
    by_id = api.get(
        f"/v1/agent/conversations/{conversation['id']}/context",
        as_=helper,
        afterMessageId=last_page["messages"][-1]["id"],
    )
    assert by_id.status_code == 400  # (what the cursor is for)


def test_a_context_cursor_of_another_conversation_or_caller_is_400(api, helper):
    """The cursor held only a place (seq, id, channel): given for another conversation's
    context, or by the agent acting for a user, it read as a place there and answered what
    follows it (review). Its own cursors still walk the context."""
    made = [agent_conversation(api, helper.acting_for("alice")) for _ in range(2)]
    for conversation in made:
        turns = [{"role": "user", "content": f"m{i}"} for i in range(3)]
        assert append(api, helper, conversation["id"], *turns).status_code == 201
    first = context(api, helper, made[0]["id"], limit="1")
    rest = context(api, helper, made[0]["id"], after=first["nextCursor"])
    assert [m["content"] for m in first["messages"] + rest["messages"]] == ["m0", "m1", "m2"]
    for credential, conversation in [(helper, made[1]), (helper.acting_for("alice"), made[0])]:
        path = f"/v1/agent/conversations/{conversation['id']}/context"
        refused = api.get(path, as_=credential, after=first["nextCursor"])
        assert another_list(refused), refused.content


def test_context_pages_go_on_past_a_message_erased_since_by_the_cursor(api, helper, alice, bob):
    """The message a page ended on is erased by its author before the next page: resumed by
    its id, the walk was refused (400, and the agent could only read everything again);
    resumed by the page's cursor, it goes on from where that message was (review)."""
    conversation = agent_conversation(api, helper.acting_for("alice"))
    path = f"/v1/user/conversations/{conversation['id']}"
    shared = api.post(f"{path}/memberships", {"userId": "bob", "accessLevel": "writer"}, as_=alice)
    assert shared.status_code == 201
    for author, content in ((alice, "a1"), (bob, "b1"), (alice, "a2")):
        assert api.post(f"{path}/messages", {"content": content}, as_=author).status_code == 201
    first = context(api, helper, conversation["id"], limit="2")
    assert [m["content"] for m in first["messages"]] == ["a1", "b1"]
    assert api.post("/v1/user/erase", {"confirm": "bob"}, as_=bob).status_code == 200
    api.post(f"{path}/messages", {"content": "a3"}, as_=alice)

    by_id = api.get(
        f"/v1/agent/conversations/{conversation['id']}/context",
        as_=helper,
        afterMessageId=first["nextAfterMessageId"],
    )
    assert by_id.status_code == 400  # (that message is gone: its id says nowhere)
    rest = context(api, helper, conversation["id"], after=first["nextCursor"])
    assert [m["content"] for m in rest["messages"]] == ["a2", "a3"]
    assert rest["nextCursor"] is None and rest["nextAfterMessageId"] is None


@pytest.mark.parametrize("resume", RESUMED_BY)
@pytest.mark.parametrize("cursor_on_the_older_summary", [False, True])
def test_a_summary_written_while_an_agent_pages_the_context_is_given_to_it(
    api, helper, cursor_on_the_older_summary, resume
):
    """(A review's finding: the next page went on after what the new summary covers, and
    neither it nor the messages it covers were ever given.)"""
    conversation = agent_conversation(api, helper)
    path = f"/v1/agent/conversations/{conversation['id']}"
    stored = append(
        api, helper, conversation["id"], *[{"role": "user", "content": f"m{i}"} for i in range(8)]
    ).json()["data"]
    summary = {"title": "t", "summarizedAt": "2026-11-01T10:00:00Z"}
    api.post(
        f"{path}/summaries",
        {**summary, "summary": "S1", "untilMessageId": stored[0]["id"]},
        as_=helper,
    )
    first = context(
        api, helper, conversation["id"], limit="1" if cursor_on_the_older_summary else "3"
    )
    read = [m["content"] for m in first["messages"]]
    assert read == (["S1"] if cursor_on_the_older_summary else ["S1", "m1", "m2"])

    api.post(
        f"{path}/summaries",
        {**summary, "summary": "S2", "untilMessageId": stored[4]["id"]},
        as_=helper,
    )
    after = first[RESUMED_BY[resume]]
    while after is not None:
        body = context(api, helper, conversation["id"], limit="3", **{resume: after})
        read += [m["content"] for m in body["messages"]]
        after = body[RESUMED_BY[resume]]
    expected = ["S1", "S2", "m5", "m6", "m7"]
    if not cursor_on_the_older_summary:
        expected = ["S1", "m1", "m2", "S2", "m5", "m6", "m7"]
    assert read == expected


def test_context_of_a_fork_reads_the_ancestors_up_to_the_fork_point(api, helper, alice):
    conversation = agent_conversation(api, helper.acting_for("alice"))
    stored = append(
        api, helper, conversation["id"], *[{"role": "user", "content": f"m{i}"} for i in range(4)]
    ).json()["data"]
    fork = api.post(
        f"/v1/user/conversations/{conversation['id']}/messages/{stored[2]['id']}/fork",
        {"newMessage": {"content": "f2"}},
        as_=alice,
    ).json()
    assert [m["content"] for m in context(api, helper, fork["id"])["messages"]] == [
        "m0",
        "m1",
        "f2",
    ]


def test_a_summary_must_cover_a_message_of_the_conversation(api, helper):
    conversation = agent_conversation(api, helper)
    other = MessageFactory()
    response = api.post(
        f"/v1/agent/conversations/{conversation['id']}/summaries",
        {
            "title": "t",
            "summary": "s",
            "untilMessageId": str(other.id),
            "summarizedAt": "2026-11-01T10:00:00Z",
        },
        as_=helper,
    )
    assert response.status_code == 400
    assert "untilMessageId" in response.json()["details"]
    assert Message.objects.filter(conversation_id=conversation["id"]).count() == 0
    assert Conversation.objects.get(id=conversation["id"]).title == ""


def test_a_summary_made_in_the_future_is_refused(api, helper):
    """As a message's ``createdAt`` (review: a summary's time was taken from any year)."""
    conversation = agent_conversation(api, helper)
    [stored] = append(api, helper, conversation["id"], {"role": "user", "content": "m"}).json()[
        "data"
    ]
    body = {"title": "t", "summary": "s", "untilMessageId": stored["id"]}
    body["summarizedAt"] = "2999-01-01T00:00:00Z"
    response = api.post(f"/v1/agent/conversations/{conversation['id']}/summaries", body, as_=helper)
    assert response.status_code == 400
    assert response.json()["details"] == {"summarizedAt": ["must not be in the future"]}
    assert Message.objects.filter(conversation_id=conversation["id"]).count() == 1


def test_a_summary_without_a_title_leaves_the_users_title(api, helper):
    """The title was required, and a blank one wiped the title the user had given (review):
    left out or blank, it stays; given, it is the title from now on."""
    conversation = agent_conversation(api, helper)
    Conversation.objects.filter(id=conversation["id"]).update(title="Keep me")
    [stored] = append(api, helper, conversation["id"], {"role": "user", "content": "m"}).json()[
        "data"
    ]
    path = f"/v1/agent/conversations/{conversation['id']}/summaries"
    body = {"summary": "s", "untilMessageId": stored["id"], "summarizedAt": "2026-01-01T00:00:00Z"}
    for title in ({}, {"title": ""}, {"title": "   "}, {"title": None}):
        assert api.post(path, {**body, **title}, as_=helper).status_code == 201
        assert Conversation.objects.get(id=conversation["id"]).title == "Keep me"
    assert api.post(path, {**body, "title": "Trip"}, as_=helper).status_code == 201
    assert Conversation.objects.get(id=conversation["id"]).title == "Trip"


def test_a_conversation_or_summary_created_again_with_its_idempotency_key_is_made_once(api, helper):
    """(A retry of either made a second one: the header was taken and ignored; review.)"""
    key = {**helper.auth_headers(), "HTTP_IDEMPOTENCY_KEY": "c-1"}
    made = [api.post("/v1/agent/conversations", {"title": "t"}, as_=key) for _ in range(2)]
    assert [m.status_code for m in made] == [201, 201]
    assert made[0].json()["id"] == made[1].json()["id"]
    assert made[1]["Idempotent-Replayed"] == "true" and Conversation.objects.count() == 1

    conversation = made[0].json()["id"]
    [stored] = append(api, helper, conversation, {"role": "user", "content": "m"}).json()["data"]
    path = f"/v1/agent/conversations/{conversation}/summaries"
    body = {"summary": "s", "untilMessageId": stored["id"], "summarizedAt": "2026-01-01T00:00:00Z"}
    key["HTTP_IDEMPOTENCY_KEY"] = "s-1"
    summaries = [api.post(path, body, as_=key) for _ in range(2)]
    assert summaries[0].json()["id"] == summaries[1].json()["id"]
    assert Message.objects.filter(channel="summary").count() == 1
    refused = api.post(path, {**body, "summary": "other"}, as_=key)
    assert refused.status_code == 409 and Message.objects.filter(channel="summary").count() == 1


def test_a_summary_cannot_end_at_another_summary(api, helper):
    conversation = agent_conversation(api, helper)
    stored = append(
        api, helper, conversation["id"], *[{"role": "user", "content": f"m{i}"} for i in range(3)]
    ).json()["data"]
    path = f"/v1/agent/conversations/{conversation['id']}/summaries"
    first = {"title": "t", "summary": "about m0", "summarizedAt": "2026-11-01T10:00:00Z"}
    older = api.post(path, {**first, "untilMessageId": stored[0]["id"]}, as_=helper).json()
    refused = api.post(path, {**first, "summary": "s", "untilMessageId": older["id"]}, as_=helper)
    assert refused.status_code == 400
    assert "another summary" in refused.json()["details"]["untilMessageId"][0]
    # m1 and m2 stay in the context, after the summary that covers m0.
    body = context(api, helper, conversation["id"])
    assert [m["content"] for m in body["messages"]] == ["about m0", "m1", "m2"]


def test_bad_context_parameters_are_400(api, helper):
    conversation = agent_conversation(api, helper)
    path = f"/v1/agent/conversations/{conversation['id']}/context"
    append(api, helper, conversation["id"], *[{"role": "user", "content": c} for c in "ab"])
    real = context(api, helper, conversation["id"], limit="1")["nextCursor"]
    assert api.get(path, as_=helper, limit="0").status_code == 400
    assert api.get(path, as_=helper, afterMessageId="nope").status_code == 400
    for cursor in (
        "nope",
        rekeyed(real, 1, "nope", "history"),
        rekeyed(real, 1, str(uuid4()), "x"),
        # nested deeper than the decoder's stack (a 500 once, review)
        base64.urlsafe_b64encode(b"[" * 5000 + b"]" * 5000).decode().rstrip("="),
    ):
        refused = api.get(path, as_=helper, after=cursor)
        assert refused.status_code == 400
        assert refused.json()["error"] == "after: malformed cursor"
    both = api.get(
        path,
        as_=helper,
        after=rekeyed(real, 1, str(uuid4()), "history"),
        afterMessageId=str(uuid4()),
    )
    assert both.json()["error"] == "after: give after or afterMessageId, not both"


def test_created_at_in_the_past_is_kept(api, helper):
    conversation = agent_conversation(api, helper)
    long_ago = (timezone.now() - timedelta(days=900)).isoformat()
    response = append(
        api, helper, conversation["id"], {"role": "user", "content": "x", "createdAt": long_ago}
    )
    assert response.status_code == 201


def test_parents_of_a_bulk_append_are_looked_up_in_one_query(api, helper):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    conversation = agent_conversation(api, helper)
    [root] = append(api, helper, conversation["id"], {"role": "user", "content": "root"}).json()[
        "data"
    ]

    def replies(count):
        return [
            {"role": "assistant", "content": f"reply {i}", "parentMessageId": root["id"]}
            for i in range(count)
        ]

    with CaptureQueriesContext(connection) as few:
        assert append(api, helper, conversation["id"], *replies(2)).status_code == 201
    with CaptureQueriesContext(connection) as many:
        assert append(api, helper, conversation["id"], *replies(60)).status_code == 201
    assert len(many) == len(few)


def test_an_append_reads_the_conversations_access_without_its_summary(api, helper):
    """A write needs the access level, not the owner and last-message preview a view shows
    (their compiled query costs more than the append's own)."""
    from django.test.utils import CaptureQueriesContext

    conversation = agent_conversation(api, helper)
    with CaptureQueriesContext(connection) as queries:
        assert (
            append(api, helper, conversation["id"], {"role": "user", "content": "hi"}).status_code
            == 201
        )
    lookups = [q["sql"] for q in queries.captured_queries if 'FROM "conversation"' in q["sql"]]
    assert lookups, [q["sql"] for q in queries.captured_queries]
    assert not [sql for sql in lookups if "last_message_preview" in sql]


@pytest.mark.django_db(transaction=True)
def test_an_append_with_a_key_is_one_transaction_without_savepoints(api, helper):
    """Claim the key, append, record the result: one BEGIN ... COMMIT, no savepoint (two
    round trips of each append's dozen)."""
    response, sent = append_with_a_key(api, helper, "k1")
    assert response.status_code == 201, response.content
    assert not [sql for sql in sent if "SAVEPOINT" in sql], sent
    assert IdempotentRequest.objects.get(key="k1").result_ids == [response.json()["data"][0]["id"]]
