"""The schema states what the server refuses on its own rules, and the server refuses it:
a client (or a schema-driven test) that follows the schema meets no surprise 400."""

import pytest

from tests.agents_api.conftest import make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def served_schema(client):
    response = client.get("/v1/schema", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    return response.json()


def component(schema, name):
    return schema["components"]["schemas"][name]


def test_the_schema_states_what_the_server_refuses(served_schema, api, alice):
    """Each refusal the server makes on its own rules is in the schema, so a client (or a
    schema-driven test) that follows the schema is never surprised by a 400."""
    # An empty membership PATCH: accessLevel is required.
    assert component(served_schema, "UpdateMembershipRequest")["required"] == ["accessLevel"]
    conversation = api.post("/v1/user/conversations", {"title": "t"}, as_=alice).json()
    api.post(
        f"/v1/user/conversations/{conversation['id']}/memberships",
        {"userId": "bob", "accessLevel": "reader"},
        as_=alice,
    )
    empty = api.patch(f"/v1/user/conversations/{conversation['id']}/memberships/bob", {}, as_=alice)
    assert empty.status_code == 400

    # A block PATCH takes at most one of value, append, replace.
    rules = component(served_schema, "UpdateMemoryBlockRequest")["not"]["anyOf"]
    assert {"required": ["value", "append"]} in rules
    helper = make_agent("schema-helper")
    api.post("/v1/agent/memory-blocks", {"label": "notes"}, as_=helper)
    both = api.patch("/v1/agent/memory-blocks/notes", {"value": "a", "append": "b"}, as_=helper)
    assert both.status_code == 400

    # A bulk append holds 1..100 messages.
    messages = component(served_schema, "AppendAgentMessagesRequest")["properties"]["messages"]
    assert (messages["minItems"], messages["maxItems"]) == (1, 100)

    # An enum query value that is present but empty is not in the enum, and is refused.
    assert api.get("/v1/agent/memories", as_=helper, order="").status_code == 400
    assert api.get("/v1/agent/memories", as_=helper).status_code == 200
    assert api.get("/v1/user/ownership-transfers", as_=alice, status="").status_code == 400
    assert api.get("/v1/user/ownership-transfers", as_=alice).status_code == 200


def test_the_schema_states_the_idempotency_headers(served_schema, api):
    """An Idempotency-Key over 255 characters is refused; a retry is answered with
    ``Idempotent-Replayed: true``: both stated."""
    append = served_schema["paths"]["/v1/agent/conversations/{conversationId}/messages"]["post"]
    [key] = [p for p in append["parameters"] if p["name"] == "Idempotency-Key"]
    assert key["schema"]["maxLength"] == 255
    assert append["responses"]["201"]["headers"]["Idempotent-Replayed"]["schema"]["enum"] == [
        "true"
    ]
    helper = make_agent("schema-idempotent")
    conversation = api.post("/v1/agent/conversations", {"title": "t"}, as_=helper).json()
    path = f"/v1/agent/conversations/{conversation['id']}/messages"
    body = {"messages": [{"role": "user", "content": "hi"}]}

    def send(key: str):
        return api.call("POST", path, as_=helper, body=body, headers={"HTTP_IDEMPOTENCY_KEY": key})

    assert send("k" * 256).status_code == 400
    assert send("k").status_code == 201
    retry = send("k")
    assert retry.status_code == 201 and retry["Idempotent-Replayed"] == "true"


def test_every_v1_operation_knows_the_query_it_takes():
    """``ApiView.initial`` refuses a query parameter an operation's description does not
    name, for an operation made by ``memsvc.api.views.operation``; a handler described
    otherwise (plain ``extend_schema``) would take any again (code review)."""
    from django.urls import URLPattern, URLResolver, get_resolver

    from memsvc.api.views import ApiView

    def views(patterns):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from views(pattern.url_patterns)
            elif isinstance(pattern, URLPattern):
                yield getattr(pattern.callback, "view_class", None)

    handlers = [
        (view, method)
        for view in set(views(get_resolver().url_patterns))
        if view is not None and issubclass(view, ApiView)
        for method in view.http_method_names
        if method not in ("options", "head") and hasattr(view, method)
    ]
    assert len(handlers) > 40
    unknown = [
        f"{view.__name__}.{method}"
        for view, method in handlers
        if not isinstance(getattr(getattr(view, method), "query_parameters", None), frozenset)
    ]
    assert unknown == []
