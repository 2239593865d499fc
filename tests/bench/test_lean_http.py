"""bench.load's lean HTTP client, against a real HTTP server: what it sends, how it reads
each kind of body, and that a failed connection is reported and replaced."""

import asyncio
import json

import pytest

from bench.lean_http import Connection, ConnectionLost
from tests.local_http import LocalHttpServer, Reply


def exchanges(connection: Connection, *requests):
    """The answers to ``requests``, sent one after another; the connection closed after."""

    async def run():
        try:
            return [await connection.post(*request) for request in requests]
        finally:
            connection.close()

    return asyncio.run(run())


def test_it_sends_its_headers_and_body_and_reads_a_sized_answer_on_one_connection():
    def respond(method, path, body, headers):
        return Reply(201 if path == "/create" else 200, {"seen": body, "key": headers.get("K")})

    with LocalHttpServer(respond, pass_headers=True) as server:
        connection = Connection(server.url, {"Authorization": "Bearer s3cret"}, timeout=5)
        answers = exchanges(
            connection,
            ("/create", b'{"a": 1}', {"K": "one"}),
            ("/read", json.dumps({"b": [2]}).encode()),
        )

    assert [status for status, _ in answers] == [201, 200]
    assert [json.loads(body) for _, body in answers] == [
        {"seen": {"a": 1}, "key": "one"},
        {"seen": {"b": [2]}, "key": None},
    ]
    assert [(r.method, r.path, r.headers["Authorization"]) for r in server.requests] == [
        ("POST", "/create", "Bearer s3cret"),
        ("POST", "/read", "Bearer s3cret"),
    ]
    assert len({r.client_port for r in server.requests}) == 1  # kept alive


def test_it_reads_a_chunked_answer_whole():
    with LocalHttpServer(lambda *_: Reply(events=["one", ("named", "two")])) as server:
        connection = Connection(server.url, {}, timeout=5)
        [(status, body)] = exchanges(connection, ("/stream", b"{}"))

    assert status == 200
    assert body == b"data: one\n\nevent: named\ndata: two\n\n"


def test_a_connection_the_server_closes_is_opened_again_for_the_next_request():
    with LocalHttpServer(lambda *_: Reply(200, {}, headers={"Connection": "close"})) as server:
        connection = Connection(server.url, {}, timeout=5)
        exchanges(connection, ("/one", b"{}"), ("/two", b"{}"))

    assert len({r.client_port for r in server.requests}) == 2


def test_a_refused_connection_is_connection_lost_and_leaves_nothing_open():
    with LocalHttpServer(lambda *_: Reply(200, {})) as server:
        url = server.url
    connection = Connection(url, {}, timeout=5)  # nothing listens there now

    async def refused():
        await connection.post("/gone", b"{}")  # (not closed after, as ``exchanges`` would)

    with pytest.raises(ConnectionLost, match="ConnectionRefusedError"):
        asyncio.run(refused())
    assert (connection._reader, connection._writer) == (None, None)


def test_an_answer_without_a_length_is_read_to_the_connections_end():
    """HTTP/1.1 delimits such a body by the end of the connection: read whole, and the
    connection not used again."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve_once():
        accepted, _ = listener.accept()
        with accepted:
            accepted.recv(65536)
            accepted.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")

    thread = threading.Thread(target=serve_once)
    thread.start()
    connection = Connection(f"http://127.0.0.1:{port}", {}, timeout=5)
    [(status, body)] = exchanges(connection, ("/x", b"{}"))
    thread.join(5)
    listener.close()
    assert (status, body) == (200, b"all of it")


def test_only_plain_http_is_spoken():
    with pytest.raises(ValueError, match="plain HTTP"):
        Connection("https://127.0.0.1:8443", {}, timeout=5)


def test_a_server_under_a_path_is_asked_there():
    with LocalHttpServer(lambda *_: Reply(200, {})) as server:
        exchanges(Connection(f"{server.url}/base/", {}, timeout=5), ("/x", b"{}"))
    assert [r.path for r in server.requests] == ["/base/x"]
