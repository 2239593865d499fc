"""The OpenAPI document: committed, served, and the interactive docs served from local assets."""

import difflib
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from drf_spectacular.drainage import GENERATOR_STATS

from agents_api.models import MemorySource

COMMITTED_SCHEMA = Path(__file__).resolve().parents[2] / "openapi" / "schema.yaml"
REGENERATE = (
    "MEMSVC_DATA_DIR=$PWD/.data/dev .venv/bin/python manage.py spectacular "
    "--validate --fail-on-warn --file openapi/schema.yaml"
)
USER_PREFIX = "/v1/user/"
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def generate_schema(path: Path) -> bytes:
    # The warning counters are process-wide: start from zero so that --fail-on-warn judges
    # this generation only, not whatever an earlier test made drf-spectacular warn about.
    GENERATOR_STATS.reset()
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(path))
    return path.read_bytes()


def test_the_committed_schema_is_up_to_date(tmp_path):
    first = generate_schema(tmp_path / "first.yaml")
    second = generate_schema(tmp_path / "second.yaml")
    assert first == second, "schema generation is not deterministic: two runs differ"

    committed = COMMITTED_SCHEMA.read_bytes() if COMMITTED_SCHEMA.exists() else b""
    if first != committed:
        diff = difflib.unified_diff(
            committed.decode().splitlines(),
            first.decode().splitlines(),
            "openapi/schema.yaml (committed)",
            "openapi/schema.yaml (generated)",
            lineterm="",
        )
        shown = "\n".join(list(diff)[:80])
        pytest.fail(
            "openapi/schema.yaml does not match the schema the code generates.\n"
            f"Regenerate it from the project root with:\n\n    {REGENERATE}\n\n"
            f"and commit the result. Difference (first lines):\n{shown}",
            pytrace=False,
        )


# --- /v1/schema ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served_schema(django_test_environment):
    from django.test import Client

    response = Client().get("/v1/schema", HTTP_ACCEPT="application/json")
    assert response.status_code == 200, response.content[:500]
    return response.json()


def user_operations(schema):
    return [
        (method, path, operation)
        for path, item in schema["paths"].items()
        if path.startswith(USER_PREFIX)
        for method, operation in item.items()
        if method in HTTP_METHODS
    ]


def test_the_schema_is_served_without_credentials(client):
    response = client.get("/v1/schema")
    assert response.status_code == 200
    assert response.content.startswith(b"openapi: 3.1.0\n")


def test_the_schema_is_openapi_3_1(served_schema):
    assert served_schema["openapi"] == "3.1.0"


def test_the_user_operations_are_tagged_user(served_schema):
    operations = user_operations(served_schema)
    assert operations, "no /v1/user operation in the schema"
    untagged = [f"{m.upper()} {p}" for m, p, op in operations if "user" not in op.get("tags", [])]
    assert untagged == []
    tagged_elsewhere = [
        f"{method.upper()} {path}"
        for path, item in served_schema["paths"].items()
        if not path.startswith(USER_PREFIX)
        for method, operation in item.items()
        if method in HTTP_METHODS and "user" in operation.get("tags", [])
    ]
    assert tagged_elsewhere == []


def test_every_user_operation_declares_401(served_schema):
    missing = [
        f"{method.upper()} {path}"
        for method, path, operation in user_operations(served_schema)
        if "401" not in operation["responses"]
    ]
    assert missing == []
    for _, _, operation in user_operations(served_schema):
        error = operation["responses"]["401"]["content"]["application/json"]["schema"]
        assert error == {"$ref": "#/components/schemas/Error"}


def test_every_user_operation_needs_the_bearer_token(served_schema):
    schemes = served_schema["components"]["securitySchemes"]
    bearer = {
        name
        for name, scheme in schemes.items()
        if scheme.get("type") == "http" and scheme.get("scheme", "").lower() == "bearer"
    }
    assert bearer, "no bearer security scheme"
    wrong = [
        f"{method.upper()} {path}: {operation.get('security')}"
        for method, path, operation in user_operations(served_schema)
        # Every alternative must be a bearer scheme: an empty {} would make it optional.
        if not operation.get("security")
        or any(
            not requirement or set(requirement) - bearer for requirement in operation["security"]
        )
    ]
    assert wrong == []


# --- what the server enforces, stated ----------------------------------------------------------


def component(schema, name):
    return schema["components"]["schemas"][name]


def test_every_operation_declares_the_refusals_any_request_may_meet(served_schema):
    missing = []
    for path, item in served_schema["paths"].items():
        if not path.startswith("/v1/") or path == "/v1/health":
            continue
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            expected = {"429", "503"} | ({"413", "415"} if "requestBody" in operation else set())
            if expected - set(operation["responses"]):
                missing.append(f"{method.upper()} {path}")
    assert missing == []
    codes = component(served_schema, "Error")["properties"]["code"]
    assert {"payload_too_large", "rate_limited", "unavailable"} <= set(codes.get("enum", [])) or (
        "$ref" in codes
    )


# --- /v1/docs --------------------------------------------------------------------------------

ASSET = re.compile(r"""<(?:script|link|img)\b[^>]*?\b(?:src|href)\s*=\s*["']([^"']+)["']""", re.I)


# Closing a served file ends the request, and Django then checks the thread's database
# connection (``close_old_connections``): after any database test in the same process that
# connection exists, and without database access the check fails.
@pytest.mark.django_db
def test_the_docs_page_is_served_without_credentials_from_local_assets(client):
    response = client.get("/v1/docs")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    for cdn in ("cdn.jsdelivr.net", "unpkg.com", "cdnjs.cloudflare.com"):
        assert cdn not in page
    assets = ASSET.findall(page)
    assert any(asset.endswith(".js") for asset in assets), assets
    assert any(asset.endswith(".css") for asset in assets), assets
    for asset in assets:
        assert asset.startswith("/static/"), f"{asset} is not a local static file"
        # WhiteNoise (with finders) serves them, so the page works offline.
        served = client.get(asset)
        assert served.status_code == 200, asset
        served.close()
    assert '"/v1/schema"' in page


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["options", "post", "put", "delete"])
def test_the_docs_page_refuses_other_methods_in_the_apis_shape(client, method):
    """(Its OPTIONS was a 500: DRF's metadata written by the page's template renderer.)"""
    response = getattr(client, method)("/v1/docs")
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"
    assert response["Allow"] == "GET, HEAD"


def calls_counted(monkeypatch, cls, name: str) -> list:
    """A list that gets a 1 for each call of ``cls``'s method ``name`` (which still runs)."""
    calls, method = [], getattr(cls, name)
    monkeypatch.setattr(
        cls, name, lambda self, *args, **kwargs: calls.append(1) or method(self, *args, **kwargs)
    )
    return calls


@pytest.mark.parametrize(
    ("method", "query", "accept", "status"),
    [
        ("get", "?format=xml", "*/*", 404),
        ("get", "", "text/html", 406),
        ("post", "", "*/*", 405),
    ],
)
def test_a_refused_schema_request_is_the_apis_json_error(client, method, query, accept, status):
    """Refusals were written as the document's YAML (``error: not found``; review)."""
    response = getattr(client, method)(f"/v1/schema{query}", HTTP_ACCEPT=accept)
    assert response.status_code == status
    assert response["Content-Type"] == "application/json"
    assert set(response.json()) == {"error", "code", "details"}


def test_the_schema_is_made_once_and_served_again(client, monkeypatch):
    """Made afresh for each request, it cost 0.2 s of CPU a request, unlimited (review)."""
    from drf_spectacular.generators import SchemaGenerator

    from memsvc.api.schema import SchemaView

    monkeypatch.setattr(SchemaView, "made", {})
    made = calls_counted(monkeypatch, SchemaGenerator, "get_schema")
    answers = [
        client.get("/v1/schema", {"lang": lang}, HTTP_ACCEPT="application/json")
        for lang in ["", "", "xx-made-up", "en-us"]
    ]
    assert [answer.status_code for answer in answers] == [200] * 4
    assert len({answer.content for answer in answers}) == 1
    assert made == [1]  # (a made-up language is the default one, not a new entry)
    assert list(SchemaView.made) == ["en-us"]
    assert client.get("/v1/schema").content.startswith(b"openapi: 3.1.0\n")


def test_the_schema_is_written_out_once_per_format(client, monkeypatch):
    """Made once, the document was still written out for each request: YAML, the default,
    cost 0.09 s of CPU a request (review)."""
    from drf_spectacular.renderers import OpenApiYamlRenderer

    from memsvc.api.schema import SchemaView

    monkeypatch.setattr(SchemaView, "written", {}, raising=False)
    dumped = calls_counted(monkeypatch, OpenApiYamlRenderer, "render")
    answers = [client.get("/v1/schema") for _ in range(3)]
    assert dumped == [1]
    assert [answer.status_code for answer in answers] == [200] * 3
    assert len({answer.content for answer in answers}) == 1
    assert answers[0]["Content-Type"] == "application/vnd.oai.openapi; charset=utf-8"
    assert answers[0].content.startswith(b"openapi: 3.1.0\n")
    as_json = [
        client.get("/v1/schema", HTTP_ACCEPT=f"application/json; indent={n}") for n in (1, 2)
    ]
    assert as_json[0].content == as_json[1].content
    assert as_json[0]["Content-Type"] == "application/json"
    assert as_json[0].json()["openapi"] == "3.1.0"
    assert sorted(fmt for _, fmt in SchemaView.written) == ["json", "yaml"]


@pytest.mark.parametrize("schema_name", ["Memory", "MemorySearchResult"])
def test_a_memorys_source_is_one_of_those_the_server_writes(served_schema, schema_name):
    """The spec said any string, the server writes one of four (review)."""
    source = component(served_schema, schema_name)["properties"]["source"]
    enum = component(served_schema, source["$ref"].rsplit("/", 1)[-1])["enum"]
    assert sorted(enum) == sorted(MemorySource.values)


def test_every_code_an_error_answers_with_is_one_the_schema_names(served_schema):
    """A 500's ``internal_error`` was in neither the schema's codes nor the README's
    (review): each refusal's code is named, whichever raised it."""
    from memsvc.api.errors import ApiError

    def kinds(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from kinds(sub)

    codes = component(served_schema, "Error")["properties"]["code"]
    if "$ref" in codes:
        codes = served_schema["components"]["schemas"][codes["$ref"].rsplit("/", 1)[1]]
    # (Letta's routes answer their own shape: its 501 ``not_implemented`` is no /v1 code.)
    raised = {
        kind.code
        for kind in kinds(ApiError)
        if isinstance(kind.code, str) and not kind.__module__.startswith("agents_api.letta_api")
    }
    assert "internal_error" in raised
    assert raised <= set(codes["enum"]), raised - set(codes["enum"])
