"""memsvc.asgi: the web processes' ASGI application reads a request in the event loop and
runs it in one thread of a fixed pool, which keeps its database connection; requests beyond
the pool wait their turn; a streaming response is iterated on the thread of its view."""

import asyncio
import io
import json
import threading
import time
from collections.abc import Coroutine

import pytest
from django.db import connection, connections
from django.http import FileResponse, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.response import Response

from memsvc.asgi import PROBE_PATHS, ThreadPoolHandler

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]

at_work = {"now": 0, "most": 0}
at_work_lock = threading.Lock()


def slow(request):
    with at_work_lock:
        at_work["now"] += 1
        at_work["most"] = max(at_work["most"], at_work["now"])
    time.sleep(0.05)
    with at_work_lock:
        at_work["now"] -= 1
    return HttpResponse("done")


def backend(request):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    return JsonResponse({"pid": pid, "thread": threading.get_ident()})


@csrf_exempt
def echo(request):
    response = JsonResponse({"body": json.loads(request.body)})
    response.set_cookie("seen", "yes")
    return response


@api_view(["POST"])
@authentication_classes([])
@permission_classes([])
def data_echo(request):
    """What DRF reads of a body (every API view's ``request.data``)."""
    return Response({"data": request.data})


def streamed(request):
    view_thread = threading.get_ident()

    def parts():
        for index in range(3):
            yield f"{index}:{threading.get_ident() == view_thread};"

    return StreamingHttpResponse(parts(), content_type="text/plain")


made = []


def endless(request):
    def parts():
        try:
            for index in range(500):
                made.append(index)
                time.sleep(0.01)
                yield f"{index};"
        finally:
            made.append("closed")

    return StreamingHttpResponse(parts(), content_type="text/plain")


def pieces(request):
    """A model's answer: 200 pieces of a few bytes, at once."""
    return StreamingHttpResponse((f"{index};" for index in range(200)), content_type="text/plain")


def a_file(request):
    return FileResponse(io.BytesIO(b"a static file"), content_type="text/css")


urlpatterns = [
    path("file", a_file),
    path("slow", slow),
    path("backend", backend),
    path("echo", echo),
    path("data-echo", data_echo),
    path("streamed", streamed),
    path("endless", endless),
    path("v1/endless", endless),
    path("pieces", pieces),
]


@pytest.fixture
def handler():
    made = []

    def make(threads, streams=None):
        made.append(ThreadPoolHandler(threads, streams or threads))
        return made[-1]

    yield make
    for each in made:
        # Each request thread keeps its connection open: close them all (a barrier makes
        # every thread of the pool take one) before the test database goes.
        threads = each.threads._max_workers
        barrier = threading.Barrier(threads)

        def close(barrier=barrier):
            barrier.wait(timeout=10)
            connections.close_all()

        for done in [each.threads.submit(close) for _ in range(threads)]:
            done.result()
        each.threads.shutdown()
        each.probes.shutdown()


def http_scope(path: str, method: str = "GET") -> dict:
    """An HTTP request's ASGI scope, as the server makes one."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }


async def call(app, path, body=b"", chunks=1, leave_after=None):
    """One request through the ASGI application: (status, headers, body). ``leave_after``:
    the client disconnects once it has had that many chunks of the body."""
    sent = []
    had_enough = asyncio.Event()
    scope = http_scope(path, "POST" if body else "GET")
    size = max(1, -(-len(body) // chunks))
    incoming = [
        {"type": "http.request", "body": body[i : i + size], "more_body": i + size < len(body)}
        for i in range(0, len(body), size)
    ] or [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive():
        if incoming:
            return incoming.pop(0)
        if leave_after is None:
            await asyncio.sleep(3600)
        await had_enough.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        if leave_after is not None and len(sent) > leave_after:
            had_enough.set()

    await app(scope, receive, send)
    start = sent[0]
    headers = {}
    for name, value in start["headers"]:
        headers.setdefault(name.decode().lower(), []).append(value.decode())
    body = b"".join(m.get("body", b"") for m in sent[1:])
    if leave_after is None:
        assert sent[-1].get("more_body", False) is False
    return start["status"], headers, body


def test_a_request_is_read_whole_then_answered_with_its_headers_and_cookies(handler):
    app = handler(2)
    body = json.dumps({"text": "x" * 10_000}).encode()
    status, headers, answer = asyncio.run(call(app, "/echo", body, chunks=7))
    assert status == 200
    assert json.loads(answer) == {"body": {"text": "x" * 10_000}}
    assert headers["content-type"] == ["application/json"]
    assert any(cookie.startswith("seen=yes") for cookie in headers["set-cookie"])


def test_a_chunked_body_is_read_by_the_api_views_too(handler):
    """A body sent without a Content-Length (chunked) was no body at all to DRF, which reads
    only as much as that header says: a conversation made with the title sent chunked had
    none, a PATCH changed nothing, with 2xx answers (review)."""
    body = json.dumps({"title": "chunked"}).encode()
    status, _, answer = asyncio.run(call(handler(1), "/data-echo", body, chunks=3))
    assert (status, json.loads(answer)) == (200, {"data": {"title": "chunked"}})


def test_requests_beyond_the_pool_wait_their_turn_and_none_is_refused(handler):
    app = handler(2)
    at_work.update(now=0, most=0)

    async def many():
        return await asyncio.gather(*(call(app, "/slow") for _ in range(7)))

    answers = asyncio.run(many())
    assert [status for status, _, _ in answers] == [200] * 7
    assert at_work["most"] == 2


def test_a_request_thread_keeps_its_database_connection(handler):
    """One thread, three requests: one connection (Django's persistent connections), where
    Django's own ASGI handler gives each request a new thread."""
    app = handler(1)
    answers = [json.loads(asyncio.run(call(app, "/backend"))[2]) for _ in range(3)]
    assert len({answer["thread"] for answer in answers}) == 1
    assert len({answer["pid"] for answer in answers}) == 1


def test_a_streaming_response_is_iterated_on_its_views_thread(handler):
    app = handler(2)
    status, headers, answer = asyncio.run(call(app, "/streamed"))
    assert status == 200
    assert headers["content-type"] == ["text/plain"]
    assert answer == b"0:True;1:True;2:True;"


def test_a_streaming_response_ends_when_its_client_has_gone(handler):
    """A client that leaves frees the request thread at the next chunk: the iterator is
    closed, not run on to its end (a model's answer no one reads)."""
    app = handler(1)
    made.clear()
    status, _, answer = asyncio.run(call(app, "/endless", leave_after=3))
    assert status == 200
    assert answer.startswith(b"0;1;2;")
    assert made[-1] == "closed"
    assert len(made) < 20
    # The thread serves the next request.
    assert asyncio.run(call(app, "/streamed"))[0] == 200


@pytest.mark.urls("memsvc.urls")
@pytest.mark.parametrize("path", sorted(PROBE_PATHS))
def test_a_probe_is_answered_while_every_request_thread_is_held(handler, path):
    """Health is answered on a thread of its own: with every request thread held (on a
    database that does not answer, review: a probe unanswered for 75 s), a probe is answered,
    and its thread reads no database itself (the health check's probe has a thread of its
    own, waited for within a bound: test_health)."""
    app = handler(1)
    held = threading.Event()
    app.threads.submit(held.wait, 30)
    try:
        status, _, answer = asyncio.run(asyncio.wait_for(call(app, path), 10))
    finally:
        held.set()
    assert (status, json.loads(answer)["status"]) == (200, "ok")
    assert app.probes.submit(lambda: connection.connection).result() is None


def test_the_web_processes_application_is_this_handler(settings):
    from memsvc.asgi import application

    assert isinstance(application, ThreadPoolHandler)
    assert application.threads._max_workers == settings.WEB_REQUEST_THREADS
    assert application.streams_at_once == settings.WEB_STREAMS_AT_ONCE


def test_the_lifespan_protocol_is_answered_and_websockets_refused(handler):
    """(uvicorn logged "ASGI 'lifespan' protocol appears unsupported" at every start.)"""
    app = handler(1)
    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent = []

    async def receive():
        return incoming.pop(0)

    async def send(message):
        sent.append(message)

    asyncio.run(app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send))
    assert sent == [{"type": "lifespan.startup.complete"}, {"type": "lifespan.shutdown.complete"}]
    with pytest.raises(ValueError, match="HTTP only"):
        asyncio.run(app({"type": "websocket"}, receive, send))


def test_a_client_that_reads_nothing_is_given_up(handler, monkeypatch):
    """Eight stalled downloads of an export held every request thread of a server, and a
    database snapshot each, for as long as they stayed (review): a client that takes no
    chunk for ``STALLED_SEND_SECONDS`` is given up, its response's iterator closed, and the
    thread serves the next request."""
    from memsvc import asgi

    monkeypatch.setattr(asgi, "STALLED_SEND_SECONDS", 0.3)
    app = handler(1)
    made.clear()
    sent = []
    started = time.monotonic()
    asyncio.run(stalled_call(app, "/endless", sent))
    assert time.monotonic() - started < 5
    assert made[-1] == "closed" and len(made) < 20
    assert sent[-1].get("more_body") is True  # (unfinished: the server closes the connection)
    assert asyncio.run(call(app, "/streamed"))[0] == 200


def test_a_client_that_takes_a_stream_too_slowly_is_given_up(handler, monkeypatch):
    """A client that took a chunk every 29 s was never stalled for 30, and held a thread and
    an export's snapshot as long as it liked (review): past ``STALLED_SEND_SECONDS`` of
    waiting for it in all, it must take ``STREAM_MIN_BYTES_PER_SECOND``. Here it takes each
    chunk of 3-4 bytes after 0.2 s (about 17 bytes a second, never stalled for the 1 s
    allowed), against a minimum of 100: given up after a few seconds, not the 100 s the 500
    chunks would take."""
    from memsvc import asgi

    monkeypatch.setattr(asgi, "STALLED_SEND_SECONDS", 1.0)
    monkeypatch.setattr(asgi, "STREAM_MIN_BYTES_PER_SECOND", 100)
    monkeypatch.setattr(asgi, "SEND_BLOCKED_AFTER_SECONDS", 0.05)
    app = handler(1)
    made.clear()
    sent = []

    async def send(message):
        await asyncio.sleep(0.2)
        sent.append(message)

    asyncio.run(asyncio.wait_for(staying_call(app, "/endless", send), 20))
    assert made[-1] == "closed" and len(made) < 30
    assert sent[-1].get("more_body") is True  # (unfinished: the server closes the connection)
    assert asyncio.run(call(app, "/streamed"))[0] == 200


def test_a_fast_client_kept_waiting_by_a_busy_server_gets_the_whole_answer(handler, monkeypatch):
    """Each send of a busy server's answer waits on its event loop and the GIL (45 ms with
    three busy request threads: code review), not on its client: counted as the client's,
    a model's answer of 4-byte pieces was cut past some 670 of them. Here each send takes
    20 ms, and 200 pieces of 4 bytes earn 0.8 s at the minimum rate: counted, the 4 s
    waited would cut the answer."""
    from memsvc import asgi

    monkeypatch.setattr(asgi, "STALLED_SEND_SECONDS", 1.0)
    monkeypatch.setattr(asgi, "STREAM_MIN_BYTES_PER_SECOND", 1000)
    monkeypatch.setattr(asgi, "SEND_BLOCKED_AFTER_SECONDS", 0.1)
    app = handler(1)
    sent = []

    async def send(message):
        await asyncio.sleep(0.02)
        sent.append(message)

    asyncio.run(asyncio.wait_for(staying_call(app, "/pieces", send), 20))
    assert sent[-1] == {"type": "http.response.body"}  # (the answer's end)
    assert b"".join(message.get("body", b"") for message in sent[1:]).endswith(b"199;")


def staying_call(app, path: str, send) -> Coroutine:
    """A request for ``path`` whose client takes the answer's messages by ``send`` and never
    leaves."""
    requested = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive():
        if requested:
            return requested.pop(0)
        await asyncio.sleep(3600)

    return app(http_scope(path), receive, send)


def stalled_call(app, path: str, sent: list) -> Coroutine:
    """A request for ``path`` whose client takes two messages of the answer, then no more
    (its socket's buffers full) and never leaves."""

    async def send(message):
        sent.append(message)
        if len(sent) > 2:
            await asyncio.sleep(3600)

    return staying_call(app, path, send)


@pytest.mark.parametrize(
    ("path", "content_type"), [("/endless", "text/plain"), ("/v1/endless", "application/json")]
)
def test_streams_beyond_the_cap_are_refused_while_other_requests_are_served(
    handler, monkeypatch, path, content_type
):
    """At most ``streams`` threads send a streamed response at once (stalled downloads of an
    export held every request thread, again every 30 s: review): one more is 503 at once,
    its response closed unsent; other requests are served meanwhile, and a stream is sent
    again once one has ended."""
    from memsvc import asgi

    monkeypatch.setattr(asgi, "STALLED_SEND_SECONDS", 1.0)
    app = handler(2, streams=1)
    made.clear()

    async def one_held_then_others():
        held = asyncio.ensure_future(stalled_call(app, path, []))
        while not made:
            await asyncio.sleep(0.01)
        refused = await call(app, path)
        made_when_refused = len(made)
        served = [await call(app, "/slow"), await call(app, "/file")]
        await held
        return refused, made_when_refused, served

    refused, made_when_refused, served = asyncio.run(asyncio.wait_for(one_held_then_others(), 20))
    status, headers, body = refused
    assert (status, headers["retry-after"], headers["content-type"]) == (503, ["5"], [content_type])
    assert headers["cache-control"] == ["no-store"]
    # What the middleware gave the response it replaces (CORS, the security headers too).
    assert headers["x-request-id"] and headers["x-content-type-options"] == ["nosniff"]
    assert b"too many streamed answers" in body
    assert made.count(0) == 1  # (the refused response's iterator never started)
    assert made_when_refused < 50
    # Other requests are served, a file's response too (a static file's is not capped).
    assert [status for status, _, _ in served] == [200, 200]
    assert served[1][2] == b"a static file"
    assert made[-1] == "closed"
    assert asyncio.run(call(app, "/streamed"))[0] == 200
