"""CORS for chat frontends on other origins (DESIGN.md, end of "Web pages"): exactly the
origins of MEMSVC_CORS_ALLOWED_ORIGINS, on every /v1 answer, errors included, never `*`,
never cookies; the local compatibility API and /mcp without CORS."""

import pytest
from django.core.exceptions import ImproperlyConfigured
from rest_framework.throttling import BaseThrottle

from memsvc.api.views import UserApiView
from memsvc.env import env_origins
from tests.memsvc.test_settings import run_python

FRONTEND = "http://localhost:5173"
STRANGER = "https://evil.example"
LIST = "/v1/user/conversations"

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def allowed_origins(settings):
    settings.CORS_ALLOWED_ORIGINS = [FRONTEND, "https://chat.example.com"]


def preflight(client, path, origin, method="POST", headers="authorization, content-type"):
    return client.options(
        path,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": headers,
        },
    )


def listed(header: str) -> set[str]:
    return {item.strip().lower() for item in header.split(",")}


def test_a_preflight_is_answered_without_credentials(client):
    response = preflight(
        client, LIST, FRONTEND, headers="authorization, content-type, idempotency-key"
    )
    assert response.status_code == 200
    assert len(response["X-Request-Id"]) == 32  # (every answer's, a preflight's too)
    assert response["Access-Control-Allow-Origin"] == FRONTEND
    assert listed(response["Access-Control-Allow-Headers"]) == {
        "authorization",
        "content-type",
        "idempotency-key",
        "x-on-behalf-of",
        "x-request-id",
    }
    assert {"GET", "POST", "PATCH", "DELETE"} <= set(
        response["Access-Control-Allow-Methods"].replace(" ", "").split(",")
    )
    assert "Access-Control-Allow-Credentials" not in response
    assert "origin" in listed(response["Vary"])


def test_a_preflight_for_a_path_that_does_not_exist_is_answered_too(client):
    response = preflight(client, "/v1/user/conversations/not-a-uuid/messages", FRONTEND)
    assert response.status_code == 200
    assert response["Access-Control-Allow-Origin"] == FRONTEND


def test_an_allowed_origin_is_granted_and_may_read_retry_after(client, api, alice):
    api.post(LIST, {"title": "Trip"}, as_=alice)
    response = client.get(LIST, headers={"Origin": FRONTEND}, **alice.auth_headers())
    assert response.status_code == 200
    assert [c["title"] for c in response.json()["data"]] == ["Trip"]
    assert response["Access-Control-Allow-Origin"] == FRONTEND
    assert listed(response["Access-Control-Expose-Headers"]) == {
        "retry-after",
        "idempotent-replayed",  # (a retry's mark: unread, a page could not tell one)
        "x-request-id",
    }
    assert "Access-Control-Allow-Credentials" not in response
    assert "origin" in listed(response["Vary"])


def test_a_write_from_an_allowed_origin(client, alice):
    response = client.post(
        LIST,
        {"title": "From the browser"},
        content_type="application/json",
        headers={"Origin": "https://chat.example.com"},
        **alice.auth_headers(),
    )
    assert response.status_code == 201
    assert response["Access-Control-Allow-Origin"] == "https://chat.example.com"


class RefuseEveryone(BaseThrottle):
    def allow_request(self, request, view):
        return False

    def wait(self):
        return 7


@pytest.mark.parametrize(
    ("path", "auth", "status", "code"),
    [
        (LIST, False, 401, "unauthorized"),
        ("/v1/user/conversations/00000000-0000-0000-0000-000000000000", True, 404, "not_found"),
        ("/v1/no-such-route", True, 404, "not_found"),
        (LIST, True, 429, "rate_limited"),
    ],
)
def test_errors_carry_the_grant_so_the_page_can_read_them(
    client, alice, monkeypatch, path, auth, status, code
):
    if status == 429:
        monkeypatch.setattr(UserApiView, "throttle_classes", [RefuseEveryone])
    credentials = alice.auth_headers() if auth else {}
    response = client.get(path, headers={"Origin": FRONTEND}, **credentials)
    assert response.status_code == status
    assert response.json()["code"] == code
    assert response["Access-Control-Allow-Origin"] == FRONTEND
    assert listed(response["Access-Control-Expose-Headers"]) == {
        "retry-after",
        "idempotent-replayed",
        "x-request-id",
    }
    if status == 429:
        assert response["Retry-After"] == "7"


def test_a_bad_token_from_an_allowed_origin_is_a_readable_401(client):
    response = client.get(LIST, headers={"Origin": FRONTEND, "Authorization": "Bearer not-a-jwt"})
    assert response.status_code == 401
    assert response["Access-Control-Allow-Origin"] == FRONTEND


def test_other_origins_get_no_grant(client, alice):
    answered = preflight(client, LIST, STRANGER)
    assert "Access-Control-Allow-Origin" not in answered
    assert "Access-Control-Allow-Headers" not in answered
    response = client.get(LIST, headers={"Origin": STRANGER}, **alice.auth_headers())
    assert response.status_code == 200  # the server answers; the browser keeps it from the page
    assert "Access-Control-Allow-Origin" not in response
    # The same host on another port or scheme is another origin.
    for near in ("http://localhost:5174", "https://localhost:5173", "http://127.0.0.1:5173"):
        assert "Access-Control-Allow-Origin" not in preflight(client, LIST, near)


def test_no_origin_is_allowed_by_default(client, settings, alice):
    settings.CORS_ALLOWED_ORIGINS = []
    assert "Access-Control-Allow-Origin" not in preflight(client, LIST, FRONTEND)
    response = client.get(LIST, headers={"Origin": FRONTEND}, **alice.auth_headers())
    assert "Access-Control-Allow-Origin" not in response


@pytest.mark.parametrize("path", ["/health", "/agents", "/messages/search", "/mcp"])
def test_the_local_compatibility_api_and_mcp_have_no_cors(client, path):
    assert "Access-Control-Allow-Origin" not in preflight(client, path, FRONTEND)
    assert "Access-Control-Allow-Origin" not in client.get(path, headers={"Origin": FRONTEND})


def test_the_setting_is_read_from_the_environment():
    result = run_python(
        {"MEMSVC_CORS_ALLOWED_ORIGINS": "http://localhost:5173, https://chat.example.com"},
        "-c",
        "import django; django.setup(); from corsheaders.conf import conf as c; "
        "print(c.CORS_ALLOWED_ORIGINS, c.CORS_ALLOW_ALL_ORIGINS, c.CORS_ALLOW_CREDENTIALS)",
    )
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.strip() == "['http://localhost:5173', 'https://chat.example.com'] False False"
    )


def test_a_malformed_origin_stops_start_up():
    result = run_python(
        {"MEMSVC_CORS_ALLOWED_ORIGINS": "http://localhost:5173,chat.example.com"},
        "manage.py",
        "check",
    )
    assert result.returncode != 0
    assert (
        "MEMSVC_CORS_ALLOWED_ORIGINS: 'chat.example.com' is not an origin: "
        "must start with http:// or https://"
    ) in result.stderr


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("*", "wildcard"),
        ("http://localhost:5173/", "nothing after"),
        ("https://chat.example.com/app", "nothing after"),
        ("ftp://files.example.com", "http:// or https://"),
        ("http://localhost:99999", "Port"),
        ("http://user@chat.example.com", "without user"),
        ("https://Chat.example.com", "lower case"),
        ("null", "http:// or https://"),
    ],
)
def test_malformed_origins(monkeypatch, value, problem):
    monkeypatch.setenv("X_ORIGINS", f"https://ok.example,{value}")
    with pytest.raises(ImproperlyConfigured, match=rf"X_ORIGINS: .* is not an origin: .*{problem}"):
        env_origins("X_ORIGINS")


def test_origins_that_are_fine(monkeypatch):
    monkeypatch.setenv(
        "X_ORIGINS", "http://localhost:5173, https://chat.example.com,http://[::1]:8080"
    )
    assert env_origins("X_ORIGINS") == [
        "http://localhost:5173",
        "https://chat.example.com",
        "http://[::1]:8080",
    ]
    assert env_origins("X_UNSET_ORIGINS") == []
