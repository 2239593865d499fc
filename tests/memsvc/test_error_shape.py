"""Refusals of client input that reach no view's own validation, in each API's error shape:
never Django's HTML pages, never a 500 (issue 15, "No 500s, one error shape")."""

import json
import tracemalloc
import uuid

import pytest
from django.db import connection

from conversations.models import Conversation
from memsvc.api.errors import InvalidInput, RateLimited
from memsvc.api.parsers import MAX_JSON_DEPTH, json_problem
from tests.agents_api.conftest import make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(client):
    # A 500 must show as a 500 here, not as the view's exception re-raised into the test.
    client.raise_request_exception = False
    return client


def assert_v1_error(response, status, code="validation_error"):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"error", "code", "details"} and body["code"] == code
    return body


def assert_local_422(response):
    assert response.status_code == 422, response.content
    assert response["Content-Type"] == "application/json"
    return response.json()["detail"]


def deep(depth: int):
    return json.loads("[" * depth + "]" * depth)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/user/conversations?query=a%00b",
        "/v1/user/conversations/a%00b",
        "/v1/user/conversations/a%00b/memberships/x",
        "/v1/user/conversations/00000000-0000-0000-0000-000000000000/memberships/a%00b",
        "/v1/user/conversations?a%00=b",
    ],
)
def test_nul_in_a_user_api_path_or_query_is_a_400(client, alice, path):
    body = assert_v1_error(client.get(path, **alice.auth_headers()), 400)
    assert "NUL" in body["error"]


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("query=a%FFb", "query"),  # not UTF-8
        ("limit=5&query=%ED%A0%80", "query"),  # a lone surrogate's bytes
        ("a%FF=b", "a\ufffd"),
    ],
)
def test_a_query_parameter_that_is_no_utf8_is_a_400_naming_it(client, alice, query, parameter):
    """(Read with U+FFFD in the bad bytes' place: a list filtered by a value no one sent.)"""
    body = assert_v1_error(
        client.get(f"/v1/user/conversations?{query}", **alice.auth_headers()), 400
    )
    assert body["details"] == {parameter: ["must be UTF-8 text"]}


def test_a_percent_encoded_utf8_query_is_read_as_its_text(client, alice):
    response = client.get(
        "/v1/user/conversations?query=zo%C3%AB+%F0%9F%98%80", **alice.auth_headers()
    )
    assert response.status_code == 200, response.content


def test_nul_in_an_agent_api_path_names_the_parameter(client):
    helper = make_agent("nul-helper")
    body = assert_v1_error(
        client.get("/v1/agent/memory-blocks/a%00b", **helper.auth_headers()), 400
    )
    assert body["details"] == {"label": ["must not contain NUL characters"]}


def test_nul_in_a_path_names_the_parameter_as_the_api_documents_it(client, alice):
    """(It said ``user_id``, the route's name; the schema and every other error say
    ``userId``: review.)"""
    path = f"/v1/user/conversations/{uuid.uuid4()}/memberships/a%00b"
    body = assert_v1_error(client.get(path, **alice.auth_headers()), 400)
    assert body["details"] == {"userId": ["must not contain NUL characters"]}


def test_a_host_the_server_does_not_answer_for_is_refused_in_each_apis_shape(client, alice, caplog):
    """Django's refusal of a ``Host`` not in ``DJANGO_ALLOWED_HOSTS`` was its HTML page on
    every API, with a traceback logged (outside review); logged as Django logs it."""
    helper = make_agent("host-helper")
    elsewhere = {"HTTP_HOST": "evil.example"}
    for path, headers in [
        ("/v1/user/conversations", alice.auth_headers()),
        ("/v1/agent/me", helper.auth_headers()),
        ("/v1/health", {}),
    ]:
        body = assert_v1_error(client.get(path, **headers, **elsewhere), 400)
        assert list(body["details"]) == ["Host"]
    assert "Invalid HTTP_HOST header: 'evil.example'" in caplog.text
    [problem] = assert_local_422(client.get("/agents/someone", **elsewhere))
    assert problem["loc"] == ["header", "Host"]
    assert client.get("/v1/health").status_code == 200  # (the allowed hosts: answered)
    for page in ("/admin/login/", "/app/"):  # Django's own page (it said text/plain: review)
        refused = client.get(page, **elsewhere)
        assert refused.status_code == 400 and refused["Content-Type"].startswith("text/html")


def test_a_local_refusal_names_where_the_bad_input_is(client):
    """A body that is no object was at ``body.body``; a user id too long in
    ``X-On-Behalf-Of`` at ``body.X-On-Behalf-Of`` (outside review)."""
    for body in ("[]", "5", "not json", "null"):
        response = client.post("/agents", body, content_type="application/json")
        assert [problem["loc"] for problem in assert_local_422(response)] == [["body"]]
    helper = make_agent("on-behalf-helper", scopes=("read", "write", "impersonate"))
    response = client.post(
        "/agents",
        {"name": "x"},
        content_type="application/json",
        HTTP_X_API_KEY=helper.key,
        HTTP_X_ON_BEHALF_OF="u" * 300,
    )
    assert [problem["loc"] for problem in assert_local_422(response)] == [
        ["header", "X-On-Behalf-Of"]
    ]


def test_options_tells_no_docstring(client):
    """An OPTIONS request is answered without the view's docstring (code, not API)."""
    helper = make_agent("options-helper")
    response = client.options("/v1/agent/me", **helper.auth_headers())
    assert response.status_code == 200
    assert "description" not in response.json()
    assert response.json()["renders"] == ["application/json"]


def test_nul_in_a_body_is_said_once(client, alice):
    """(DRF's own check would say it a second time, in other words.)"""
    response = client.post(
        "/v1/user/conversations",
        {"title": "a\x00b"},
        content_type="application/json",
        **alice.auth_headers(),
    )
    body = assert_v1_error(response, 400)
    assert body["details"] == {"title": ["must not contain NUL characters"]}


LONG = "x" * 100_000  # a value or a name a refusal must not quote back


@pytest.mark.parametrize(
    ("path", "body", "details"),
    [
        (
            "/v1/agent/memories/search",
            {"query": "q", "mode": LONG},
            {"mode": ["must be one of hybrid, semantic, keyword"]},
        ),
        (
            "/v1/agent/memories",
            {"content": "c", LONG: 1},
            {"x" * 63 + "…": ["unknown field"]},
        ),
    ],
)
def test_a_refusal_quotes_no_long_value_or_name(client, path, body, details):
    """DRF's refusal of a choice quoted the value, and of an unknown field its name, in the
    message and again in the details: 100,000 characters sent, 200,000 answered."""
    helper = make_agent("echo-helper")
    response = client.post(
        path, json.dumps(body), content_type="application/json", **helper.auth_headers()
    )
    assert assert_v1_error(response, 400)["details"] == details
    assert len(response.content) < 500


def test_a_local_api_refusal_of_a_choice_quotes_no_value(client):
    response = client.post(
        "/messages",
        json.dumps({"agent_name": "a", "role": LONG, "content": "x"}),
        content_type="application/json",
    )
    [problem] = assert_local_422(response)
    assert problem["loc"] == ["body", "role"]
    assert problem["msg"].startswith("must be one of ")
    assert len(response.content) < 500


@pytest.mark.parametrize(
    "method,path,parameter",
    [
        ("get", "/agents/a%00b", "name"),
        ("post", "/context/a%00b", "agent_name"),
        ("get", "/messages/a%00b", "agent_name"),
        ("get", "/memory-blocks/x/a%00b", "label"),
        # Letta's routes are under /v1/ too, named as Letta names them (not camelCase).
        ("get", "/v1/blocks/a%00b", "block_id"),
        ("get", "/v1/agents/a%00b/messages", "agent_id"),
    ],
)
def test_nul_in_a_local_api_or_letta_path_is_a_422(client, method, path, parameter):
    detail = assert_local_422(getattr(client, method)(path, content_type="application/json"))
    assert detail == [
        {
            "type": "value_error",
            "loc": ["path", parameter],
            "msg": "must not contain NUL characters",
        }
    ]


def test_a_lone_surrogate_in_metadata_is_a_400_naming_it(client, alice):
    response = client.post(
        "/v1/user/conversations",
        data='{"title": "t", "metadata": {"note": "\\ud800"}}',
        content_type="application/json",
        **alice.auth_headers(),
    )
    body = assert_v1_error(response, 400)
    assert body["details"] == {"metadata.note": ["must not contain lone surrogate characters"]}


def test_a_lone_surrogate_reaches_no_local_api_store(client):
    response = client.post(
        "/messages",
        data='{"agent_name": "a", "role": "user", "content": "x", "metadata": {"k": "\\udfff"}}',
        content_type="application/json",
    )
    assert assert_local_422(response)[0]["loc"] == ["body", "metadata", "k"]


@pytest.mark.parametrize(
    "body",
    [
        "[" * 60 + "0," * 2_000_000 + "0" + "]" * 60,  # 4 MB of numbers, 60 levels deep
        json.dumps({f"k{i}": ["x" * 3] for i in range(200_000)}),
        json.dumps(["é"] * 1_000_000 + [{"a": "\ud800"}]),
    ],
)
def test_the_check_of_a_bodys_json_needs_about_what_the_body_holds(body):
    """The check held each item with a path of its own: 4 MB of numbers 60 levels deep took
    1.2 GB (2.5 GB for 8 MB) and seconds of CPU beyond the parse (review). It needs no
    more than a small part of what the parsed body itself takes."""
    value = json.loads(body)
    tracemalloc.start()
    try:
        problem = json_problem(value)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20_000_000, peak
    if "\\ud800" in body:
        assert problem == ((1_000_000, "a"), "must not contain lone surrogate characters")
    else:
        assert problem is None


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 5, 950, 5000])
def test_json_nested_too_deep_is_a_400(client, alice, depth):
    response = client.post(
        "/v1/user/conversations",
        data='{"title": "t", "metadata": {"a": ' + "[" * depth + "]" * depth + "}}",
        content_type="application/json",
        **alice.auth_headers(),
    )
    assert "nested more than" in assert_v1_error(response, 400)["error"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM conversation")
        assert cursor.fetchone() == (0,)


def test_json_nested_too_deep_is_a_local_422(client):
    depth = 950
    response = client.post(
        "/messages",
        data='{"agent_name": "a", "role": "user", "content": "x", "metadata": {"a": '
        + "[" * depth
        + "]" * depth
        + "}}",
        content_type="application/json",
    )
    assert "nested more than" in assert_local_422(response)[0]["msg"]


def test_a_number_of_too_many_digits_is_said_in_our_words(client, alice):
    """(Python's: "... use sys.set_int_max_str_digits() to increase the limit"; review.)"""
    response = client.post(
        "/v1/user/conversations",
        data='{"title": "t", "metadata": {"n": ' + "7" * 5000 + "}}",
        content_type="application/json",
        **alice.auth_headers(),
    )
    error = assert_v1_error(response, 400)["error"]
    assert error == "body: JSON parse error - a number has more than 4300 digits"
    local = client.post(
        "/messages",
        data='{"agent_name": "a", "role": "user", "content": "x", "metadata": {"n": '
        + "7" * 5000
        + "}}",
        content_type="application/json",
    )
    assert "sys." not in json.dumps(assert_local_422(local))


def test_json_as_deep_as_allowed_is_stored(client, alice):
    value = {"a": deep(MAX_JSON_DEPTH - 2)}
    response = client.post(
        "/v1/user/conversations",
        data=json.dumps({"title": "t", "metadata": value}),
        content_type="application/json",
        **alice.auth_headers(),
    )
    assert response.status_code == 201, response.content
    assert Conversation.objects.get(pk=response.json()["id"]).metadata == value


def test_more_query_parameters_than_django_reads_is_a_400(client, settings):
    """Django refuses a query of more than ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` parameters
    (``TooManyFieldsSent``) when a view reads it: it was answered as a 500 (a Letta list's
    ``?tags=`` repeated, any /v1 list)."""
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 10
    key = make_agent("helper", scopes=("read",)).key
    query = "&".join(["tags=a"] * 11)
    letta = client.get(f"/v1/agents/?{query}", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert letta.status_code == 422, letta.content
    assert letta.json() == {
        "detail": [
            {"type": "value_error", "loc": ["query", "query"], "msg": "at most 10 parameters"}
        ]
    }
    body = assert_v1_error(
        client.get(f"/v1/agent/memories?{query}", HTTP_AUTHORIZATION=f"Bearer {key}"), 400
    )
    assert body["details"] == {"query": ["at most 10 parameters"]}


def test_an_accept_that_takes_no_json_is_406_as_the_schema_says(client, alice):
    """Every /v1 operation may answer it; the schema said so of none (review)."""
    import yaml
    from django.conf import settings

    response = client.get("/v1/user/conversations", HTTP_ACCEPT="text/html", **alice.auth_headers())
    assert_v1_error(response, 406, code="not_acceptable")
    schema = yaml.safe_load((settings.BASE_DIR / "openapi" / "schema.yaml").read_text())
    operations = [
        operation
        for path, methods in schema["paths"].items()
        if path.startswith("/v1/") and path != "/v1/health"
        for operation in methods.values()
    ]
    assert operations and all("406" in operation["responses"] for operation in operations)


# --- ApiError.named: a refusal with its fields named as the caller named them ---------------


def test_a_refusal_names_the_callers_field_and_keeps_the_rest():
    refused = InvalidInput.for_field("query", "too long", location="query").named({"query": "q"})
    assert (refused.message, refused.details, refused.location) == (
        "q: too long",
        {"q": ["too long"]},
        "query",
    )
    assert str(refused) == "q: too long"


def test_a_refusal_of_a_class_with_its_own_arguments_is_named_too():
    """(Copied by calling the class with its message: ``RateLimited`` takes a number first,
    and the copy raised TypeError; review.)"""
    limited = RateLimited(5, "slow down").named({"x": "y"})
    assert isinstance(limited, RateLimited)
    assert (limited.message, limited.headers) == ("slow down", {"Retry-After": "5"})


def test_a_path_is_logged_escaped_with_a_failure_it_met(rf, caplog):
    """A 500 or 503 logs the path it met: a newline or an escape sequence in the path wrote
    the client's own line into the log (review). Escaped, as Django logs a path."""
    from memsvc.api.middleware import exception_response

    request = rf.get("/v1/agent/memories/a%0a2026-12-07 06:00:00 ADMIN LOGIN OK%1b[31m")
    response = exception_response(request, RuntimeError("boom"))
    assert response.status_code == 500
    [record] = [r for r in caplog.records if r.name == "django.request"]
    logged = record.getMessage()
    assert "\n" not in logged and "\x1b" not in logged
    assert logged.endswith("/v1/agent/memories/a\\n2026-12-07 06:00:00 ADMIN LOGIN OK\\x1b[31m")


def test_every_answer_names_its_request_and_the_log_lines_about_it_do_too(client, caplog):
    """A refused request could not be traced from its answer to its log lines (review)."""
    import logging

    from memsvc.request_ids import RequestIdFilter

    refused = client.get("/v1/agent/me")
    assert refused.status_code == 401
    request_id = refused["X-Request-Id"]
    assert len(request_id) == 32 and int(request_id, 16) >= 0  # (a new one: uuid4's hex)
    assert client.get("/v1/agent/me")["X-Request-Id"] != request_id
    [line] = [r for r in caplog.records if r.name == "django.request"][:1]
    RequestIdFilter().filter(line)
    assert line.getMessage() == f"Unauthorized: /v1/agent/me [request {request_id}]"
    # A proxy's plain id is kept; another is replaced (no newline into the log).
    given = client.get("/v1/health", headers={"X-Request-Id": "lb-7f3a:9"})
    assert given["X-Request-Id"] == "lb-7f3a:9"
    for forged in ["a\nb", "x" * 129, "a b", "%s"]:
        answer = client.get("/v1/health", headers={"X-Request-Id": forged})
        assert len(answer["X-Request-Id"]) == 32
    # The service's console handler names it (settings.LOGGING).
    handlers = logging.getLogger().handlers
    assert any(isinstance(f, RequestIdFilter) for h in handlers for f in h.filters), handlers


def test_an_apis_answers_are_kept_by_no_cache(client, alice):
    """A user's conversations, an agent's memories, the local API's blocks, and refusals
    too: ``Cache-Control: no-store``, as the pages and the export say (review: the API's
    answers said nothing, so a browser or a careless proxy could keep them). The OpenAPI
    document, public, is left as its view says."""
    agent = make_agent("keeper")
    answers = [
        client.get("/v1/user/conversations", **alice.auth_headers()),
        client.get("/v1/user/conversations/notauuid", **alice.auth_headers()),
        client.get("/v1/agent/memories", **agent.auth_headers()),
        client.get("/v1/user/conversations"),
        client.get("/memory-blocks/nobody"),
    ]
    assert [response.status_code for response in answers] == [200, 404, 200, 401, 404]
    for response in answers:
        assert response["Cache-Control"] == "no-store", response.content
    schema = client.get("/v1/schema")
    assert schema.status_code == 200 and "no-store" not in schema.get("Cache-Control", "")
