"""Rate limits (memsvc/api/ratelimit.py): requests per principal, failed authentications
per address, 429 ``rate_limited`` with ``Retry-After`` in each API's shape, counted where
every process sees the same count."""

import functools
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest
import redis
from django.contrib.auth import get_user_model
from django.db import connection
from django.http import JsonResponse
from django.test import Client, RequestFactory
from django.urls import reverse

from conversations import services
from memsvc.api import ratelimit
from memsvc.api.principals import Principal
from memsvc.api.ratelimit import rate_limited
from memsvc.outage import Reminder
from tests.agents_api.conftest import make_agent
from tests.api import refusal_code
from tests.conftest import Persona
from tests.db import database_url
from tests.hashers import CountedPasswordHasher
from tests.waiting import wait_until
from tests.web_server import WebServer, shared_database_env

pytestmark = pytest.mark.django_db

REDIS_URL = "redis://127.0.0.1:6379/15"


@pytest.fixture(params=["database", "redis"])
def backend(request, settings):
    """Each test runs with the counts in the database (local mode) and in Redis."""
    settings.MEMSVC_REDIS_URL = REDIS_URL if request.param == "redis" else None
    return request.param


@pytest.fixture(autouse=True)
def one_window(monkeypatch):
    """Every count of a test in the window it started in: the windows are fixed minutes,
    and a test that crossed into the next one would see its counts start again (a flaky
    failure, seen once in CI). Other processes (servers a test starts) keep the clock."""
    start, _ = ratelimit._window()
    monkeypatch.setattr(ratelimit, "_window", lambda: (start, 30))


def wait_unless_the_window_has(seconds: float) -> None:
    """Servers a test starts keep the real clock (``one_window`` holds this process's
    alone): a burst they must count in one window waits for the next when fewer seconds
    are left in this one."""
    left = ratelimit.WINDOW_SECONDS - time.time() % ratelimit.WINDOW_SECONDS
    if left < seconds:
        time.sleep(left)


def someone() -> Persona:
    # Redis keeps its counts between runs: a fresh principal each time.
    return Persona(f"user-{uuid.uuid4()}")


def assert_rate_limited(response):
    assert response.status_code == 429, response.content
    assert 1 <= int(response["Retry-After"]) <= 60


def test_requests_per_user_past_the_limit_are_429(client, settings, backend):
    settings.MEMSVC_RATE_LIMIT = 5
    user, other = someone(), someone()
    for _ in range(5):
        assert client.get("/v1/user/conversations", **user.auth_headers()).status_code == 200
    refused = client.get("/v1/user/conversations", **user.auth_headers())
    assert_rate_limited(refused)
    assert refused.json() == {
        "error": "rate limit of 5 requests a minute exceeded",
        "code": "rate_limited",
        "details": {},
    }
    # Another principal has its own count; health checks are never limited.
    assert client.get("/v1/user/conversations", **other.auth_headers()).status_code == 200
    assert client.get("/v1/health").status_code == 200
    assert client.get("/health").status_code == 200


def test_requests_per_api_key_are_limited_on_both_apis(client, settings, backend):
    settings.MEMSVC_RATE_LIMIT = 3
    agent = make_agent(f"agent-{uuid.uuid4()}")
    key = {"HTTP_X_API_KEY": agent.key}
    assert client.get("/v1/agent/me", **key).status_code == 200
    assert client.get(f"/agents/{agent.agent.name}", **key).status_code == 200
    assert client.get("/v1/agent/me", **key).status_code == 200
    assert_rate_limited(client.get("/v1/agent/me", **key))
    local = client.get(f"/agents/{agent.agent.name}", **key)
    assert_rate_limited(local)
    assert local.json() == {"detail": "rate limit of 3 requests a minute exceeded"}


def test_requests_their_permissions_refuse_count_and_are_429_past_the_limit(
    client, settings, backend
):
    """DRF checks a view's permissions before its limits: a key without the scope, one
    acting for a user without ``impersonate``, or no credentials at all, was answered 403
    or 401 however many came, and counted nowhere (review)."""
    settings.MEMSVC_RATE_LIMIT = 3
    reader = {"HTTP_X_API_KEY": make_agent(f"agent-{uuid.uuid4()}", scopes=("read",)).key}

    def write(**headers):
        return client.post("/v1/agent/conversations", {}, "application/json", **headers)

    for _ in range(3):
        assert write(**reader).status_code == 403
    assert_rate_limited(write(**reader))
    assert_rate_limited(client.get("/v1/agent/me", **reader))  # (one count, the key's)

    acting = {"HTTP_X_API_KEY": make_agent(f"agent-{uuid.uuid4()}").key}
    for _ in range(3):
        response = client.get("/v1/agent/me", HTTP_X_ON_BEHALF_OF="alice", **acting)
        assert response.status_code == 403
    assert_rate_limited(client.get("/v1/agent/me", HTTP_X_ON_BEHALF_OF="alice", **acting))
    assert_rate_limited(client.get("/v1/agent/me", **acting))

    address = f"203.0.113.{uuid.uuid4().int % 250 + 1}"
    if backend == "redis":
        redis.Redis.from_url(REDIS_URL).delete(
            *redis.Redis.from_url(REDIS_URL).keys(f"*{address}*") or ["-"]
        )
    for path in ("/v1/agent/me", "/v1/user/conversations", "/v1/agent/me"):
        assert client.get(path, REMOTE_ADDR=address).status_code == 401
    assert_rate_limited(client.get("/v1/user/conversations", REMOTE_ADDR=address))


def test_keyless_loopback_callers_are_limited_by_address(client, settings, backend):
    settings.MEMSVC_RATE_LIMIT = 2
    address = {"REMOTE_ADDR": "127.0.0.1" if backend == "database" else "::1"}
    if backend == "redis":
        redis.Redis.from_url(REDIS_URL).delete(
            *redis.Redis.from_url(REDIS_URL).keys("*::/64*") or ["-"]
        )
    assert client.post("/agents", {"name": "a"}, "application/json", **address).status_code == 200
    assert client.get("/agents/a", **address).status_code == 200
    assert_rate_limited(client.get("/agents/a", **address))


@pytest.mark.parametrize("bad", ["key", "jwt", "mcp"])
def test_failed_authentications_lock_the_address_out(client, settings, backend, bad):
    """Past the limit of 401s, every request with credentials from that address is refused,
    the right ones too (a guessed secret gets no 200); other addresses are not affected."""
    settings.MEMSVC_AUTH_FAILURE_LIMIT = 4
    address = f"192.0.2.{uuid.uuid4().int % 250 + 1}"
    if backend == "redis":
        redis.Redis.from_url(REDIS_URL).delete(
            *redis.Redis.from_url(REDIS_URL).keys(f"*{address}:*") or ["-"]
        )
    agent, user = make_agent(f"agent-{uuid.uuid4()}"), someone()
    wrong = (
        {"HTTP_AUTHORIZATION": "Bearer eyJhbGciOiJIUzI1NiJ9.e30.bad"}
        if bad == "jwt"
        else {"HTTP_X_API_KEY": agent.key[:-4] + "AAAA"}
    )
    path = {"key": "/v1/agent/me", "jwt": "/v1/user/conversations", "mcp": "/mcp"}[bad]

    def call(**headers):
        if path == "/mcp":  # a JSON-RPC POST, as an MCP client sends it
            message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
            return client.post(path, message, "application/json", REMOTE_ADDR=address, **headers)
        return client.get(path, REMOTE_ADDR=address, **headers)

    for _ in range(4):
        assert call(**wrong).status_code == 401
    locked = call(**wrong)
    assert_rate_limited(locked)
    assert refusal_code(locked, mcp=path == "/mcp") == "rate_limited"
    assert_rate_limited(call(**agent.auth_headers()))  # the right key too
    assert_rate_limited(client.get("/v1/agent/me", REMOTE_ADDR=address, **agent.auth_headers()))
    assert_rate_limited(
        client.get("/v1/user/conversations", REMOTE_ADDR=address, **user.auth_headers())
    )
    assert (
        client.get("/v1/agent/me", REMOTE_ADDR="192.0.2.251", **agent.auth_headers()).status_code
        == 200
    )
    # Health checks are never limited, whatever headers they carry (``learning()`` sends its
    # key with its probe, and was told to start a memsvc that ran: review).
    for probe in ("/v1/health", "/health"):
        for headers in (agent.auth_headers(), wrong):
            assert client.get(probe, REMOTE_ADDR=address, **headers).status_code == 200


def test_requests_without_credentials_lock_nobody_out(client, settings, backend):
    """Any web page its visitor opens may send them, unasked and by the hundred (a browser
    adds no credential across origins without a preflight): each 401 was counted, and the
    visitor's address was locked out of every API, their own right token refused (review)."""
    settings.MEMSVC_AUTH_FAILURE_LIMIT = 4
    address = f"198.51.100.{uuid.uuid4().int % 250 + 1}"
    if backend == "redis":
        redis.Redis.from_url(REDIS_URL).delete(
            *redis.Redis.from_url(REDIS_URL).keys(f"*{address}:*") or ["-"]
        )
    user = someone()
    for _ in range(10):
        assert client.get("/v1/user/conversations", REMOTE_ADDR=address).status_code == 401
    mine = client.get("/v1/user/conversations", REMOTE_ADDR=address, **user.auth_headers())
    assert mine.status_code == 200


def test_an_ipv6_client_counts_as_its_64_network(client, settings, backend):
    """A new address of the same /64 for every guess gets no more guesses; another /64
    is not affected."""
    settings.MEMSVC_AUTH_FAILURE_LIMIT = 3
    network = f"2001:db8:{uuid.uuid4().int % 65000:x}:{uuid.uuid4().int % 65000:x}"
    agent = make_agent(f"agent-{uuid.uuid4()}")
    wrong = {"HTTP_X_API_KEY": agent.key[:-4] + "AAAA"}
    for host in range(1, 4):
        response = client.get("/v1/agent/me", REMOTE_ADDR=f"{network}::{host}", **wrong)
        assert response.status_code == 401
    assert_rate_limited(
        client.get("/v1/agent/me", REMOTE_ADDR=f"{network}::99", **agent.auth_headers())
    )
    assert (
        client.get(
            "/v1/agent/me", REMOTE_ADDR="2001:db8:ffff:1::1", **agent.auth_headers()
        ).status_code
        == 200
    )


@pytest.mark.parametrize("page", ["/app/login/", "/admin/login/"])
def test_wrong_passwords_lock_the_address_out_of_the_logins(settings, backend, page):
    """The web pages' and the admin's password logins count like 401s: past the limit the
    right password from that address gets no session either; other addresses log in."""
    settings.MEMSVC_AUTH_FAILURE_LIMIT = 3
    address = f"198.51.100.{uuid.uuid4().int % 250 + 1}"
    if backend == "redis":  # counts of an earlier run in this minute
        redis.Redis.from_url(REDIS_URL).delete(
            *redis.Redis.from_url(REDIS_URL).keys("*198.51.100.*") or ["-"]
        )
    name = f"staff-{uuid.uuid4()}"
    get_user_model().objects.create_superuser(name, password="the right password")

    def log_in(password, remote=address):
        browser = Client(REMOTE_ADDR=remote)
        browser.post(page, {"username": name, "password": password, "next": "/app/"})
        return "_auth_user_id" in browser.session

    assert not any(log_in("a guess") for _ in range(3))
    assert not log_in("the right password")  # locked out: refused the right one too
    assert log_in("the right password", remote="198.51.100.251")
    # The page says why, instead of "did not match" / "enter the correct username".
    refused = Client(REMOTE_ADDR=address).post(
        page, {"username": name, "password": "the right password"}
    )
    assert b"Too many failed logins from this address" in refused.content
    # Answered as the APIs answer a locked-out address: a script is told to stop.
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    # The wait the page says is the header's (it said "a minute": review).
    wait = int(refused["Retry-After"])
    assert f"try again in {wait} second".encode() in refused.content
    assert b"did not match" not in refused.content
    assert b"correct username" not in refused.content


@pytest.mark.parametrize("page", ["/app/login/", "/admin/login/"])
def test_password_checks_past_those_a_process_runs_at_once_are_refused_unchecked(page, monkeypatch):
    """Each check is about 0.25 s of CPU: a flood of wrong passwords from many addresses
    took both cores from every other request (review). Past ``PASSWORD_CHECKS_AT_ONCE``
    running, a login is a 429 saying so, its password not checked; then it logs in."""
    from django.contrib.auth import base_user

    name = f"staff-{uuid.uuid4()}"
    get_user_model().objects.create_superuser(name, password="the right password")
    checked = []
    check = base_user.check_password
    monkeypatch.setattr(
        base_user, "check_password", lambda *a, **k: checked.append(1) or check(*a, **k)
    )
    for _ in range(ratelimit.PASSWORD_CHECKS_AT_ONCE):  # (as many as run at once)
        assert ratelimit._password_checks.acquire(blocking=False)
    browser = Client(REMOTE_ADDR="198.51.100.77")
    try:
        busy = browser.post(page, {"username": name, "password": "the right password"})
    finally:
        for _ in range(ratelimit.PASSWORD_CHECKS_AT_ONCE):
            ratelimit._password_checks.release()
    assert busy.status_code == 429 and int(busy["Retry-After"]) >= 1
    assert ratelimit.LOGINS_BUSY.encode() in busy.content and not checked
    assert "_auth_user_id" not in browser.session
    browser.post(page, {"username": name, "password": "the right password", "next": "/app/"})
    assert "_auth_user_id" in browser.session and checked


@pytest.mark.parametrize("page", ["/app/login/", "/admin/login/"])
def test_a_right_password_sent_with_a_credential_header_near_the_limit_logs_in(
    settings, backend, page
):
    """A proxy's ``Authorization: Basic`` on every request: the middleware counted it as a
    check running, the login counted its password again, and the right password, one
    failure short of the limit, waited 5 s for itself and was refused (review). The pages
    and the admin, whose credential is the session, end that count before their views."""
    settings.MEMSVC_AUTH_FAILURE_LIMIT = 5
    part = uuid.uuid4().hex
    address = f"2001:db8:{part[:4]}:{part[4:8]}::1"
    name = f"staff-{uuid.uuid4()}"
    get_user_model().objects.create_superuser(name, password="the right password")
    for _ in range(4):
        ratelimit.note_auth_failure(address)
    browser = Client(REMOTE_ADDR=address, HTTP_AUTHORIZATION="Basic YTpi")
    started = time.monotonic()
    response = browser.post(page, {"username": name, "password": "the right password"})
    assert response.status_code == 302
    assert "_auth_user_id" in browser.session
    for shown in ["/app/", "/admin/"]:
        assert browser.get(shown).status_code == 200
    assert time.monotonic() - started < ratelimit.CHECK_WAIT_SECONDS
    assert (
        ratelimit._counted(
            "count", f"auth-checking:{ratelimit.counted_as(address)}", ratelimit._window()
        )[0]
        == 0
    )


def test_a_session_made_before_the_lockout_backend_stays_logged_in(client):
    user = get_user_model().objects.create_user(f"old-{uuid.uuid4()}", password="pw")
    client.force_login(user, backend="django.contrib.auth.backends.ModelBackend")
    assert client.get("/app/").status_code == 200


def test_a_zero_limit_is_no_limit(client, settings):
    settings.MEMSVC_RATE_LIMIT = 0
    settings.MEMSVC_AUTH_FAILURE_LIMIT = 0
    user = someone()
    for _ in range(3):
        assert client.get("/v1/user/conversations", **user.auth_headers()).status_code == 200
        assert client.get("/v1/agent/me", HTTP_X_API_KEY="msk_x_y").status_code == 401


def test_redis_unreachable_lets_requests_through_and_is_not_asked_again_at_once(
    client, settings, caplog
):
    """Each request of an outage waited for Redis's timeout (1 s) again (review): the
    requests after a failure, within ``REDIS_OUTAGE.seconds``, do not ask it."""
    settings.MEMSVC_REDIS_URL = "redis://127.0.0.1:1/0"
    settings.MEMSVC_RATE_LIMIT = 1
    user = someone()
    for _ in range(3):
        assert client.get("/v1/user/conversations", **user.auth_headers()).status_code == 200
    assert caplog.text.count("Redis unreachable") == 1


def test_the_decorator_limits_a_plain_django_view(settings, backend):
    settings.MEMSVC_RATE_LIMIT = 1
    identity = f"mcp:{uuid.uuid4()}"

    @rate_limited(lambda request: identity)
    def view(request):
        return JsonResponse({"ok": True})

    assert view(RequestFactory().get("/v1/anything")).status_code == 200
    refused = view(RequestFactory().get("/v1/anything"))
    assert_rate_limited(refused)
    assert json.loads(refused.content)["code"] == "rate_limited"


@pytest.mark.django_db(transaction=True)
def test_the_count_is_shared_by_separate_server_processes(tmp_path, settings):
    """Two web servers on one database (local mode: the counts are in the database): the
    limit holds for their requests together."""
    env = {
        **shared_database_env(),
        "MEMSVC_RATE_LIMIT": "6",
        "MEMSVC_JWT_SECRET": str(settings.MEMSVC_JWT_SECRET),
    }
    servers = [WebServer(tmp_path / name, env) for name in ("a", "b")]
    try:
        wait_unless_the_window_has(seconds=10)  # (a count across a minute's end starts again)
        headers = {"Authorization": someone().auth_headers()["HTTP_AUTHORIZATION"]}
        statuses = [
            httpx.get(
                f"{servers[i % 2].url}/v1/user/conversations", headers=headers, timeout=30
            ).status_code
            for i in range(9)
        ]
        assert statuses == [200] * 6 + [429] * 3
    finally:
        for server in servers:
            server.stop()


@pytest.mark.django_db(transaction=True)
def test_the_served_app_takes_no_client_address_from_an_unnamed_proxy_header(tmp_path):
    """The web server (uvicorn under gunicorn) replaced a loopback peer's address with its
    X-Forwarded-For: with a new one each time, a caller on the machine was never locked out
    of failed authentications. Only MEMSVC_TRUSTED_PROXIES names proxies."""
    env = {**shared_database_env(), "MEMSVC_AUTH_FAILURE_LIMIT": "3"}
    server = WebServer(tmp_path, env)
    try:
        statuses = [
            httpx.get(
                f"{server.url}/v1/agent/me",
                headers={"X-API-Key": "msk_wrong", "X-Forwarded-For": f"203.0.113.{n}"},
                timeout=30,
            ).status_code
            for n in range(5)
        ]
        assert statuses == [401] * 3 + [429] * 2
    finally:
        server.stop()


def test_a_proxy_nobody_named_is_warned_of_at_most_once_a_minute(rf, settings, caplog, monkeypatch):
    """Behind a proxy not in MEMSVC_TRUSTED_PROXIES every client is the proxy's address: one
    client's failed logins would lock everyone out. The log says so, but a client sending
    X-Forwarded-For from ever new addresses cannot flood it."""
    from memsvc.api.ratelimit import client_address

    monkeypatch.setattr(ratelimit, "_UNNAMED_PROXY_SAID", Reminder())
    settings.MEMSVC_TRUSTED_PROXIES = []
    with caplog.at_level("WARNING", logger="memsvc.api.ratelimit"):
        for n in range(20):
            proxied = rf.get("/", REMOTE_ADDR=f"10.0.0.{n}", HTTP_X_FORWARDED_FOR="203.0.113.7")
            assert client_address(proxied) == f"10.0.0.{n}"
        assert client_address(rf.get("/", REMOTE_ADDR="10.0.0.8")) == "10.0.0.8"
    [warning] = caplog.records
    assert "proxy at 10.0.0.0" in warning.getMessage()
    assert "MEMSVC_TRUSTED_PROXIES" in warning.getMessage()


@pytest.mark.parametrize(
    ("trusted", "remote", "forwarded", "client"),
    [
        (["10.0.0.9/32"], "10.0.0.9", "203.0.113.7", "203.0.113.7"),
        (["10.0.0.0/8"], "10.0.0.9", "203.0.113.7", "203.0.113.7"),
        # Two proxies of ours: the client is the nearest address that is not ours.
        (["10.0.0.0/8"], "10.0.0.6", "203.0.113.7, 10.0.0.5", "203.0.113.7"),
        # Whatever a client writes first is not believed past the first foreign address.
        (["10.0.0.0/8"], "10.0.0.6", "1.2.3.4, 203.0.113.7", "203.0.113.7"),
        # An IPv4 proxy seen through an IPv6 socket.
        (["10.0.0.0/8"], "::ffff:10.0.0.6", "203.0.113.7", "203.0.113.7"),
        (["10.0.0.0/8"], "10.0.0.6", "not an address", "10.0.0.6"),
        # Proxies that write the client's port too (Azure's).
        (["10.0.0.0/8"], "10.0.0.6", "203.0.113.7:5123", "203.0.113.7"),
        (["10.0.0.0/8"], "10.0.0.6", "[2001:db8::1]:5123, 10.0.0.5:80", "2001:db8::1"),
        (["10.0.0.0/8"], "10.0.0.6", "2001:db8::1", "2001:db8::1"),
        (["10.0.0.0/8"], "192.0.2.1", "203.0.113.7", "192.0.2.1"),  # not our proxy
    ],
)
def test_the_client_behind_trusted_proxies(rf, settings, trusted, remote, forwarded, client):
    from memsvc.api.ratelimit import client_address

    settings.MEMSVC_TRUSTED_PROXIES = trusted
    request = rf.get("/", REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded)
    assert client_address(request) == client


@pytest.mark.django_db(transaction=True)
def test_concurrent_wrong_keys_get_no_more_checks_than_the_limit(tmp_path):
    """Wrong keys sent all at once from one address, to two web processes with threads each:
    no more than the limit of them reach the key check (401); the rest are 429. The 401s
    were counted only once answered, so every request that came in before the first answer
    was checked: a burst had as many guesses as the server runs requests at once."""
    limit, burst = 3, 24
    env = {
        **shared_database_env(),
        "MEMSVC_AUTH_FAILURE_LIMIT": str(limit),
        "MEMSVC_TRUSTED_PROXIES": "127.0.0.1",
        "MEMSVC_WEB_THREADS": "8",
    }
    server = WebServer(tmp_path, env, workers=2)
    try:
        # (a burst across a minute's end would get the next window's guesses too)
        wait_unless_the_window_has(seconds=10)
        # (an address no other run of this minute used: its count starts at 0)
        part = uuid.uuid4().hex
        address = f"2001:db8:{part[:4]}:{part[4:8]}::1"
        headers = {"X-API-Key": "msk_wrong_secret", "X-Forwarded-For": address}
        with httpx.Client(timeout=30) as http, ThreadPoolExecutor(burst) as pool:
            statuses = list(
                pool.map(
                    lambda _: http.get(f"{server.url}/v1/agent/me", headers=headers).status_code,
                    range(burst),
                )
            )
        assert sorted(statuses) == [401] * limit + [429] * (burst - limit)
    finally:
        server.stop()


@pytest.fixture
def failure_counting(monkeypatch):
    """What the requests do to the counts of failed authentications and of the checks
    running, in order: ("count" | "hit" | "take_back", "failures" | "checking")."""
    operations = []
    counted = ratelimit._counted

    def recording(operation, bucket, *args):
        kind = bucket.split(":")[0].removeprefix("auth-")
        if kind in ("failures", "checking"):
            operations.append((operation, kind))
        return counted(operation, bucket, *args)

    monkeypatch.setattr(ratelimit, "_counted", recording)
    return operations


# Near the limit: the check counted, the failures read again, the check's count taken back.
CHECK_COUNTED = [("hit", "checking"), ("count", "failures"), ("take_back", "checking")]


@pytest.mark.parametrize(("failures", "writes"), [(0, []), (9, CHECK_COUNTED)])
def test_only_near_the_limit_are_credentials_counted_before_the_check(
    client, settings, failures, writes, failure_counting
):
    """Counting the check costs two writes: only an address within ``CHECKS_AT_ONCE`` of
    its limit pays them; a right key far from it is one read, as before."""
    settings.MEMSVC_AUTH_FAILURE_LIMIT = ratelimit.CHECKS_AT_ONCE + 5
    settings.MEMSVC_REDIS_URL = None
    agent = make_agent(f"agent-{uuid.uuid4()}")
    address = f"192.0.2.{uuid.uuid4().int % 250 + 1}"
    for _ in range(failures):
        ratelimit.note_auth_failure(address)
    failure_counting.clear()  # (the failures above)
    response = client.get("/v1/agent/me", REMOTE_ADDR=address, **agent.auth_headers())
    assert response.status_code == 200
    assert failure_counting == [("count", "failures"), *writes]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("failures", [0, 4])
def test_right_keys_at_once_near_the_limit_are_all_answered(settings, backend, failures):
    """Right keys at once from one address near its limit: each was counted as a failure
    until answered, so the others in flight pushed it past the limit and they were refused
    (6 of 24 at a limit of 5: review). Now they wait for the checks running, and pass."""
    settings.MEMSVC_AUTH_FAILURE_LIMIT = 5
    agent = make_agent(f"agent-{uuid.uuid4()}")
    part = uuid.uuid4().hex
    address = f"2001:db8:{part[:4]}:{part[4:8]}::1"
    for _ in range(failures):
        ratelimit.note_auth_failure(address)

    def ask(_):
        try:
            return Client(REMOTE_ADDR=address).get("/v1/agent/me", **agent.auth_headers())
        finally:
            connection.close()  # (this thread's: the test database is dropped at the end)

    with ThreadPoolExecutor(24) as pool:
        statuses = [response.status_code for response in pool.map(ask, range(24))]
    assert statuses == [200] * 24
    # And the checks' count is back to nothing: a wrong key is still checked, the limit's
    # last one refused.
    wrong = {"HTTP_X_API_KEY": agent.key[:-4] + "AAAA"}
    browser = Client(REMOTE_ADDR=address)
    answers = [browser.get("/v1/agent/me", **wrong).status_code for _ in range(6 - failures)]
    assert answers == [401] * (5 - failures) + [429]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("door", ["api", "pages", "admin"])
def test_a_right_request_that_waits_in_its_view_holds_back_no_other_near_the_limit(
    settings, backend, door
):
    """Near the limit a check is counted as running until it ends: it ended only with the
    answer, so a right request waiting on a lock in its view (a rename of a conversation
    another transaction holds) made every other right request of its address wait 5 s and
    refused it (review). It ends once the credentials are accepted: the API's token, or on
    the pages the session (a proxy's ``Authorization: Basic`` on every request is a header
    nothing there checks; review)."""
    settings.MEMSVC_AUTH_FAILURE_LIMIT = 5
    user = someone()
    conversation = services.conversation_create(Principal.user(user.id), title="Held")
    part = uuid.uuid4().hex
    address = f"2001:db8:{part[:4]}:{part[4:8]}::1"
    for _ in range(4):
        ratelimit.note_auth_failure(address)
    if door == "api":
        browser = Client(REMOTE_ADDR=address, **user.auth_headers())
        rename = functools.partial(
            browser.patch,
            f"/v1/user/conversations/{conversation.id}",
            {"title": "Renamed"},
            content_type="application/json",
        )
        listing = "/v1/user/conversations"
    elif door == "pages":
        browser = Client(REMOTE_ADDR=address, HTTP_AUTHORIZATION="Basic YTpi")
        browser.force_login(get_user_model().objects.create_user(user.id))
        rename = functools.partial(
            browser.post, reverse("pages:rename", args=[conversation.id]), {"title": "Renamed"}
        )
        listing = "/app/"
    else:  # (the admin's deletion waits on the held row as a rename does)
        browser = Client(REMOTE_ADDR=address, HTTP_AUTHORIZATION="Basic YTpi")
        browser.force_login(get_user_model().objects.create_superuser(user.id))
        rename = functools.partial(
            browser.post,
            reverse("admin:conversations_conversation_delete", args=[conversation.id]),
            {"post": "yes"},
        )
        listing = "/admin/"

    def renamed():
        try:
            return rename().status_code
        finally:
            connection.close()  # (this thread's: the test database is dropped at the end)

    holder = psycopg.connect(database_url())  # (another connection, in a transaction)
    with ThreadPoolExecutor(1) as pool:
        try:
            holder.execute("SELECT 1 FROM conversation WHERE id = %s FOR UPDATE", [conversation.id])
            renaming = pool.submit(renamed)
            wait_until(_a_lock_awaited, "the rename waits for the held row")
            started = time.monotonic()
            lists = [browser.get(listing).status_code for _ in range(3)]
            elapsed = time.monotonic() - started
        finally:
            holder.commit()
            holder.close()
        assert renaming.result(10) in (200, 302)
    assert lists == [200] * 3
    assert elapsed < ratelimit.CHECK_WAIT_SECONDS
    # And the failures still count: the limit's last wrong token, then the lockout.
    wrong = Client(REMOTE_ADDR=address, HTTP_AUTHORIZATION="Bearer nope")
    assert [wrong.get("/v1/user/conversations").status_code for _ in range(2)] == [401, 429]


def _a_lock_awaited() -> bool:
    with connection.cursor() as cursor:  # (pg_locks: live, unlike the statistics views)
        cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted)")
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_concurrent_wrong_passwords_get_no_more_checks_than_the_limit(
    settings, backend, monkeypatch
):
    """Wrong passwords sent all at once from one address to the login: no more than the
    limit of them are checked. They counted only once checked (``user_login_failed``), so
    every login that came in before the first check ended was checked: a burst had as many
    guesses as the server checks passwords at once (12 at once, a limit of 3: 12 checked).
    (As many checks at once as the burst: the process's own cap is another test's.)"""
    limit, burst = 3, 12
    monkeypatch.setattr(ratelimit, "_password_checks", threading.BoundedSemaphore(burst))
    settings.MEMSVC_AUTH_FAILURE_LIMIT = limit
    settings.PASSWORD_HASHERS = ["tests.hashers.CountedPasswordHasher"]
    name = f"someone-{uuid.uuid4()}"
    get_user_model().objects.create_user(name, password="the right password")
    CountedPasswordHasher.checked.clear()
    # (an address no other run of this minute used: Redis keeps its counts)
    part = uuid.uuid4().hex
    address = f"2001:db8:{part[:4]}:{part[4:8]}::1"

    def log_in(password):
        try:
            browser = Client(REMOTE_ADDR=address)
            browser.post("/app/login/", {"username": name, "password": password})
            return "_auth_user_id" in browser.session
        finally:
            connection.close()  # (this thread's: the test database is dropped at the end)

    with ThreadPoolExecutor(burst) as pool:
        assert not any(pool.map(log_in, [f"guess {n}" for n in range(burst)]))
    assert len(CountedPasswordHasher.checked) == limit
    assert not log_in("the right password")  # locked out, unchecked
    assert len(CountedPasswordHasher.checked) == limit


@pytest.mark.parametrize(
    ("failures", "password", "writes"),
    [
        (0, "the right password", []),
        (9, "the right password", CHECK_COUNTED),
        (0, "a guess", [("hit", "failures")]),
        (9, "a guess", [*CHECK_COUNTED[:2], ("hit", "failures"), CHECK_COUNTED[2]]),
    ],
)
def test_only_near_the_limit_is_a_password_counted_before_the_check(
    client, settings, failures, password, writes, failure_counting
):
    """As a key: a right password far from the limit costs one read (the backend's; the
    login form no longer reads the count itself), no write; near the limit it is counted
    before its check and taken back. A wrong one counts once, before its check or after."""
    settings.MEMSVC_AUTH_FAILURE_LIMIT = ratelimit.CHECKS_AT_ONCE + 5
    settings.MEMSVC_REDIS_URL = None
    name = f"someone-{uuid.uuid4()}"
    get_user_model().objects.create_user(name, password="the right password")
    address = f"192.0.2.{uuid.uuid4().int % 250 + 1}"
    for _ in range(failures):
        ratelimit.note_auth_failure(address)
    failure_counting.clear()  # (the failures above)
    client.post("/app/login/", {"username": name, "password": password}, REMOTE_ADDR=address)
    assert ("_auth_user_id" in client.session) == (password == "the right password")
    assert failure_counting == [("count", "failures"), *writes]


@pytest.mark.parametrize("page", ["/app/login/", "/admin/login/"])
def test_a_login_refused_in_a_burst_is_told_it_is_locked_out(client, settings, monkeypatch, page):
    """In a burst of logins at once, the count the form read was under the limit for some
    whose check the backend then refused (the others in flight had reached it): they were
    answered 200, "did not match", the right password too (review). The backend's refusal
    is the answer."""
    settings.MEMSVC_AUTH_FAILURE_LIMIT = 3
    name = f"staff-{uuid.uuid4()}"
    get_user_model().objects.create_superuser(name, password="the right password")
    refusal = ratelimit.RateLimited(42, "too many failed authentications")
    monkeypatch.setattr(ratelimit, "auth_attempt", lambda address: (refusal, None))
    response = client.post(page, {"username": name, "password": "the right password"})
    assert response.status_code == 429
    assert response["Retry-After"] == "42"
    assert b"Too many failed logins from this address" in response.content
    assert "_auth_user_id" not in client.session


def test_a_successful_request_with_credentials_never_counts_as_a_failure(client, settings, backend):
    """Only refused credentials count against their address."""
    settings.MEMSVC_AUTH_FAILURE_LIMIT = 2
    address = f"192.0.2.{uuid.uuid4().int % 250 + 1}"
    if backend == "redis":
        redis.Redis.from_url(REDIS_URL).delete(
            *redis.Redis.from_url(REDIS_URL).keys(f"*{address}:*") or ["-"]
        )
    agent = make_agent(f"agent-{uuid.uuid4()}")
    for _ in range(5):
        assert (
            client.get("/v1/agent/me", REMOTE_ADDR=address, **agent.auth_headers()).status_code
            == 200
        )
    wrong = {"HTTP_X_API_KEY": agent.key[:-4] + "AAAA"}
    assert [
        client.get("/v1/agent/me", REMOTE_ADDR=address, **wrong).status_code for _ in range(3)
    ] == [401, 401, 429]


def test_counts_of_windows_past_are_deleted(settings, monkeypatch):
    """One row per address or key ever seen would grow the table without end: the rows of
    windows past go once a window."""
    from memsvc.models import RateLimitCounter

    settings.MEMSVC_REDIS_URL = None
    monkeypatch.setattr(ratelimit, "_pruned_before", [0])
    start, _ = ratelimit._window()
    ratelimit.DatabaseCounter().hit("principal:old", start)
    ratelimit.DatabaseCounter().hit("principal:new", start + ratelimit.WINDOW_SECONDS)
    assert list(RateLimitCounter.objects.values_list("bucket", flat=True)) == ["principal:new"]


def test_a_hit_read_at_the_minutes_end_counts_in_the_newer_window(settings):
    """Two processes at the minute's end, one reading the clock just before it: its hit
    counted from 1 again, in the window past, and the next one's from 1 again too."""
    settings.MEMSVC_REDIS_URL = None
    start, _ = ratelimit._window()
    counter, bucket = ratelimit.DatabaseCounter(), f"principal:{uuid.uuid4()}"
    assert counter.hit(bucket, start + ratelimit.WINDOW_SECONDS) == 1
    assert counter.hit(bucket, start) == 2
    assert counter.hit(bucket, start + ratelimit.WINDOW_SECONDS) == 3
