"""What only a real server shows (gunicorn, as `memsvc serve` runs it): a body over the cap
is a 413 in the error shape on a connection that stays usable; a database that is down is a
503 ``unavailable`` everywhere but the health checks, which say so without internals."""

import contextlib
import socket
import threading

import httpx
import pytest

from memsvc.tokens import mint_user_token
from tests.api import refusal_code
from tests.web_server import WebServer, raw_exchange

BODY_CAP = 100_000


@pytest.fixture(scope="module")
def no_database(tmp_path_factory):
    """One server for the module (each start costs about 2 s): no test changes it."""
    server = WebServer(
        tmp_path_factory.mktemp("no_database"),
        {
            "DATABASE_URL": "postgres://memsvc@127.0.0.1:1/memsvc",  # nobody listens there
            "MEMSVC_LOCAL_MODE": "1",
            "DJANGO_SECRET_KEY": "k" * 50,
            "MEMSVC_JWT_SECRET": "jwt-secret-for-this-test-of-32-bytes-or-more",
            "MEMSVC_MAX_BODY_BYTES": str(BODY_CAP),
        },
    )
    yield server
    server.stop()


def test_database_down_is_503_unavailable_but_for_health(no_database, settings):
    settings.MEMSVC_JWT_SECRET = "jwt-secret-for-this-test-of-32-bytes-or-more"
    user = {"Authorization": f"Bearer {mint_user_token('alice', ttl_seconds=600)}"}
    key = {"X-API-Key": "msk_abcdefabcdef_secretsecretsecret"}
    with httpx.Client(base_url=no_database.url, timeout=30) as client:
        for method, path, headers, body in [
            ("GET", "/v1/user/conversations", user, None),
            ("POST", "/v1/user/conversations", user, {"title": "t"}),
            ("POST", "/v1/user/search/messages", user, {"query": "x"}),
            ("GET", "/v1/agent/me", key, None),
            ("POST", "/v1/agent/conversations", key, {}),
            ("POST", "/mcp", key, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        ]:
            response = client.request(method, path, headers=headers, json=body)
            assert response.status_code == 503, (path, response.text)
            assert response.headers["content-type"] == "application/json"
            assert refusal_code(response, mcp=path == "/mcp") == "unavailable"

        for method, path, body in [
            ("GET", "/agents/a", None),
            ("POST", "/agents", {"name": "a"}),
            ("POST", "/messages", {"agent_name": "a", "role": "user", "content": "x"}),
            ("POST", "/context/a", {"query": "x"}),
        ]:
            response = client.request(method, path, json=body)
            assert response.status_code == 503, (path, response.text)
            assert set(response.json()) == {"detail"}

        # The web pages and the admin of a signed-in person (whose session is in the
        # database): an outage too, not their 500 page (review).
        for path in ["/app/", "/app/search/?q=fox", "/app/memory/", "/admin/"]:
            response = client.get(path, cookies={"sessionid": "a-session-of-before"})
            assert response.status_code == 503, (path, response.text)
            assert response.headers["retry-after"] == "5"
            assert response.text == "the service is unavailable, try again shortly"

        health = client.get("/v1/health")
        assert health.status_code == 503
        assert health.json()["status"] == "unavailable"
        assert health.json()["reason"] == "database unreachable"
        local_health = client.get("/health")
        assert local_health.status_code == 503
        assert local_health.json() == {"status": "unavailable", "detail": "database unreachable"}
        for text in (health.text, local_health.text):
            assert "127.0.0.1" not in text and "/" not in text.replace("\\/", "")


def test_an_outage_is_said_once_a_minute_not_by_every_request(no_database, settings):
    """Every refused request logged the traceback of what failed (some 115 lines each),
    Django's line of its 503, and a warning of failed authentications not counted where
    none had failed; every health probe its traceback (11,400 lines in 7 s: review)."""
    settings.MEMSVC_JWT_SECRET = "jwt-secret-for-this-test-of-32-bytes-or-more"
    user = {"Authorization": f"Bearer {mint_user_token('alice', ttl_seconds=600)}"}
    before = no_database.log.read_text().count("\n")
    with httpx.Client(base_url=no_database.url, timeout=30) as client:
        for _ in range(10):
            assert client.get("/v1/user/conversations", headers=user).status_code == 503
            assert client.get("/v1/health").status_code == 503
    logged = no_database.log.read_text().splitlines()[before:]
    assert sum("Traceback" in line for line in logged) <= 2  # (once a minute each, if not yet)
    assert not any("Service Unavailable" in line for line in logged), [
        line for line in logged if "Service Unavailable" in line
    ][:3]
    assert len(logged) < 200, "\n".join(logged[:50])


def test_a_body_over_the_cap_is_413_and_the_connection_stays_open(no_database):
    """Refused before any view (or the database) is reached; the unread body is discarded
    and the next request on the same connection is answered."""
    body = b'{"title": "' + b"x" * BODY_CAP + b'"}'
    with socket.create_connection(("127.0.0.1", no_database.port), timeout=30) as sock:
        for path in ("/v1/user/conversations", "/messages", "/mcp"):
            response = raw_exchange(
                sock,
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body,
            )
            head, _, payload = response.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 413"), response[:300]
            assert b"connection: close" not in head.lower()
            if path != "/messages":  # /v1 in its shape, /mcp that as a JSON-RPC error's data
                assert b'"code": "payload_too_large"' in payload
            else:
                assert payload.startswith(b'{"detail": "the body must be at most')
        again = raw_exchange(sock, b"GET /v1/nope HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert again.startswith(b"HTTP/1.1 404")


def test_a_chunked_body_over_the_cap_is_413_and_never_kept(no_database):
    """A body without a Content-Length is counted as it arrives: past the cap it is read and
    dropped, not kept (in memory or a temporary file) and not parsed."""
    piece = b"x" * 30_000
    chunks = [b'{"title": "'] + [piece] * 5 + [b'"}']  # 150 KB: over the 100 KB cap
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks) + b"0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", no_database.port), timeout=30) as sock:
        response = raw_exchange(
            sock,
            b"POST /v1/user/conversations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + body,
        )
        head, _, payload = response.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413"), response[:300]
        assert b'"code": "payload_too_large"' in payload
        again = raw_exchange(sock, b"GET /v1/nope HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert again.startswith(b"HTTP/1.1 404")


def test_a_huge_declared_body_is_refused_without_reading_it_all(no_database):
    """A client that announces a gigabyte is answered 413 once twice the cap has been read
    and dropped, not after the whole upload."""
    with socket.create_connection(("127.0.0.1", no_database.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/user/conversations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
        )
        sent = 0
        sock.settimeout(0.05)
        answer = b""
        while sent < 3 * BODY_CAP and not answer:
            sock.sendall(b"x" * 10_000)
            sent += 10_000
            with contextlib.suppress(TimeoutError):  # not answered yet: send more
                answer = sock.recv(65536)
        sock.settimeout(30)
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:300]


@pytest.fixture
def silent_database():
    """A database address that takes connections and never answers them (a server stopped
    by a signal, a frozen machine): (its port, the connections made to it)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    listener.settimeout(0.2)
    made, done = [], threading.Event()

    def take():
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                made.append(listener.accept()[0])

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    yield listener.getsockname()[1], made
    done.set()
    taker.join()
    for connection in made:
        connection.close()
    listener.close()


def test_a_request_waits_for_one_connection_to_a_database_that_does_not_answer(
    silent_database, tmp_path, settings
):
    """Credentials are checked against the failed authentications (in the database) first:
    that check's connection timed out, the request went on and waited for a second (review:
    a 503 after 20 s, twice the connection timeout). One connection, then 503; the outage
    said once a minute (each request logged its traceback: a connection's timeout was taken
    for a statement's)."""
    port, made = silent_database
    secret = "jwt-secret-for-this-test-of-32-bytes-or-more"
    server = WebServer(
        tmp_path,
        {
            "DATABASE_URL": f"postgres://memsvc@127.0.0.1:{port}/memsvc?connect_timeout=2",
            "MEMSVC_LOCAL_MODE": "1",
            "DJANGO_SECRET_KEY": "k" * 50,
            "MEMSVC_JWT_SECRET": secret,
        },
    )
    settings.MEMSVC_JWT_SECRET = secret
    user = {"Authorization": f"Bearer {mint_user_token('alice', ttl_seconds=600)}"}
    key = {"X-API-Key": "msk_abcdefabcdef_secretsecretsecret"}
    logged_before = server.log.read_text().count("\n")
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for path, headers in [("/v1/user/conversations", user), ("/v1/agent/me", key)]:
                before = len(made)
                response = client.get(path, headers=headers)
                assert response.status_code == 503, response.text
                assert refusal_code(response) == "unavailable"
                assert len(made) - before == 1, path
        logged = server.log.read_text().splitlines()[logged_before:]
        said = [line for line in logged if "the service is unavailable, try again" in line]
        assert len(said) == 1 and "said once a minute" in said[0], "\n".join(logged)
    finally:
        server.stop()
