"""The ASGI application of the web processes (``memsvc serve``: uvicorn workers).

Every view of memsvc is synchronous, and Django's own ASGI handler pays for that on each
request: a new thread, four hops between it and the event loop (request signal, middleware,
view, close) and a pool to lend it a database connection; about 2.5 ms of a web process's
CPU a request, as much as a keyword search costs in PostgreSQL (docs/benchmarks.md, "Where a
request's time goes"). Here the event loop reads the request, so a slow client holds a
socket and a coroutine, never a thread, as with Django's handler; then the whole request
runs in one hop on a fixed pool of threads (``settings.WEB_REQUEST_THREADS``), as a WSGI
server runs it, each thread keeping its database connection from one request to the next
(``CONN_MAX_AGE``). Requests beyond the pool wait their turn in the event loop, holding
nothing.
"""

import asyncio
import concurrent.futures
import io
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

import django
from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.core.signals import request_started
from django.http import FileResponse
from django.urls import set_script_prefix

from memsvc.api.errors import Unavailable
from memsvc.api.middleware import DISCARD_MAX_FACTOR, unavailable_response

logger = logging.getLogger(__name__)

# The health checks' paths (``/v1/health``, the local API's ``/health``): answered on a
# thread of their own, so that a probe is answered (503 within the probe's bound) while
# every request thread waits on a database that does not answer (review: 75 s unanswered).
PROBE_PATHS = frozenset({"/v1/health", "/health"})
PROBE_THREADS = 4


class ThreadPoolHandler(ASGIHandler):
    """Django's ASGI handler with the synchronous request path: the body read in the event
    loop, then middleware, view and response in one thread of a fixed pool (health probes:
    in a pool of their own, ``PROBE_PATHS``); at most ``streams`` of the threads sending a
    streamed response at once."""

    def __init__(self, threads: int, streams: int):
        BaseHandler.__init__(self)
        self.load_middleware(is_async=False)
        self.threads = ThreadPoolExecutor(threads, thread_name_prefix="request")
        self.streams = threading.BoundedSemaphore(streams)
        self.streams_at_once = streams
        # (Several: a probe may wait up to its bound, and those at once wait together for
        # one statement of the database's, on a thread of the health check's own.)
        self.probes = ThreadPoolExecutor(PROBE_THREADS, thread_name_prefix="probe")

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            # Nothing to start or stop, but said so (a server that probes the protocol
            # logged "ASGI 'lifespan' protocol appears unsupported" at every start).
            while True:
                message = await receive()
                await send({"type": f"{message['type']}.complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            raise ValueError(f"memsvc serves HTTP only, not {scope['type']}")
        try:
            scope, body_file = await self.read_capped_body(scope, receive)
        except RequestAborted:
            return
        loop = asyncio.get_running_loop()
        gone = threading.Event()
        watcher = asyncio.ensure_future(_until_disconnect(receive, gone))
        try:
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            threads = self.probes if path in PROBE_PATHS else self.threads
            response = await loop.run_in_executor(
                threads, self.respond, scope, body_file, send, loop, gone
            )
            if response is not None:
                await self.send_response(response, send)
        finally:
            watcher.cancel()
            body_file.close()

    async def read_capped_body(self, scope, receive) -> tuple[dict, BinaryIO]:
        """The body (Django's ``read_body``), never more than ``MEMSVC_MAX_BODY_BYTES`` of it
        kept. One declared larger is not kept at all: read and dropped up to
        ``DISCARD_MAX_FACTOR`` times the cap (so a keep-alive connection stays usable), not
        read past that (the server then closes the connection). One found larger while read
        (chunked) is read on and dropped the same way. Such a request goes on with an empty
        body and, as its ``Content-Length``, the size declared or seen: the middleware
        refuses it with 413 in the API's shape."""
        cap = settings.MEMSVC_MAX_BODY_BYTES
        declared = _declared_length(scope)
        seen = 0

        async def within_cap():
            nonlocal seen
            message = await receive()
            if message["type"] != "http.request":
                return message
            seen += len(message.get("body", b""))
            if seen <= cap and declared <= cap:
                return message
            more = message.get("more_body", False) and seen <= cap * DISCARD_MAX_FACTOR
            return {"type": "http.request", "body": b"", "more_body": more}

        if declared > cap * DISCARD_MAX_FACTOR:
            body_file = io.BytesIO()
        else:
            body_file = await self.read_body(within_cap)
        if seen <= cap and declared <= cap:
            # A body sent chunked, without a Content-Length, gets the length read: DRF reads
            # only as much as that header says, and took it for no body (a conversation made
            # without the title sent, a PATCH that changed nothing, both 2xx: review).
            return (_with_length(scope, seen) if seen > declared else scope), body_file
        body_file.close()
        return _with_length(scope, max(seen, declared)), io.BytesIO()

    def respond(self, scope, body_file, send, loop, gone: threading.Event):
        """In a request thread: the response, already closed (for Django the request ends
        there: ``request_finished``, the thread's connection kept or dropped); or None once
        a streaming response has been sent from here, where its iterator may read the
        database on the thread's connection (until the client is ``gone``); or, when
        ``streams`` are being sent already, a 503 instead of it."""
        set_script_prefix(get_script_prefix(scope))
        request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self.get_response(request)
        response._handler_class = self.__class__
        try:
            if not response.streaming:
                return response
            # (A file's response, a static file's, holds its thread no long time and is not
            # capped: an admin page's stylesheets and scripts were refused while two exports
            # ran; code review.)
            capped = not isinstance(response, FileResponse)
            if capped and not self.streams.acquire(blocking=False):
                return self.stream_refused(request, response)
            try:
                self.stream(response, send, loop, gone)
            finally:
                if capped:
                    self.streams.release()
            return None
        finally:
            response.close()

    def stream_refused(self, request, response):
        """The answer to a request whose streamed ``response`` would be one too many at
        once (it is closed unsent: an export's snapshot given back, a pages' answer's place,
        before its model is asked). It keeps what the middleware gave the response (the
        request's id, CORS, the security headers, cookies): a browser front end was told
        of a network error, not of the 503 and its ``Retry-After`` (code review)."""
        logger.warning(
            "a streamed response refused: %s are being sent at once (MEMSVC_WEB_STREAMS)",
            self.streams_at_once,
        )
        refusal = Unavailable(
            "too many streamed answers (exports, the assistant's answers) are being sent at once; "
            "try again shortly",
            headers={"Retry-After": str(STREAM_RETRY_SECONDS)},
        )
        refused = unavailable_response(request, refusal)
        for name, value in response.items():
            if name.lower() not in _THE_CONTENTS_OWN and not refused.has_header(name):
                refused[name] = value
        refused.cookies = response.cookies
        refused["Cache-Control"] = "no-store"
        return refused

    def stream(self, response, send, loop, gone: threading.Event) -> None:
        """Send a streaming response from the request thread, chunk by chunk. When the
        client has gone, its next chunk is the last one asked for: the response's close
        (``respond``) closes the iterator, and the thread serves others instead of making
        what no one reads (a model's answer, an export). A client that reads nothing for
        ``STALLED_SEND_SECONDS`` is given up the same way (the response unfinished: the
        server closes the connection once what it holds for it is taken, or the client
        goes; no thread and no snapshot wait for it meanwhile): eight stalled downloads of
        an export held every request thread of a server, and a database snapshot each, for
        as long as they stayed (review). So is a client that takes it slower than
        ``STREAM_MIN_BYTES_PER_SECOND`` once it has been waited for that long in all."""

        waited, taken = 0.0, 0  # (seconds waiting for the client, bytes it took)

        def emit(message: dict) -> None:
            nonlocal waited, taken
            allowed = STALLED_SEND_SECONDS + taken / STREAM_MIN_BYTES_PER_SECOND - waited
            started = time.monotonic()
            sending = asyncio.run_coroutine_threadsafe(send(message), loop)
            try:
                sending.result(
                    timeout=min(STALLED_SEND_SECONDS, SEND_BLOCKED_AFTER_SECONDS + max(allowed, 0))
                )
            except concurrent.futures.TimeoutError:
                sending.cancel()
                raise _Stalled from None
            finally:
                waited += max(time.monotonic() - started - SEND_BLOCKED_AFTER_SECONDS, 0)
            taken += len(message.get("body", b""))

        emit(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": response_headers(response),
            }
        )
        try:
            for part in response:
                if gone.is_set():
                    return
                for chunk, _ in self.chunk_bytes(part):
                    emit({"type": "http.response.body", "body": chunk, "more_body": True})
            emit({"type": "http.response.body"})
        except _Stalled:
            logger.info(
                "a client took %s bytes of a streamed response, kept it waiting %.1f s in "
                "all: too slowly, its response given up",
                taken,
                waited,
            )


class _Stalled(Exception):
    """The client read nothing of a streaming response for ``STALLED_SEND_SECONDS``, or took
    it too slowly (``STREAM_MIN_BYTES_PER_SECOND``)."""


# The headers of a response that say what it holds, not what the middleware added: a refusal
# sent instead of it keeps the others (``stream_refused``).
_THE_CONTENTS_OWN = frozenset(
    {"content-type", "content-length", "content-disposition", "content-encoding", "etag"}
    | {"last-modified", "expires", "cache-control"}
)
# How long a streaming response waits for its client to take the next chunk.
STALLED_SEND_SECONDS = 30.0
# How slowly a client may take a streaming response: past ``STALLED_SEND_SECONDS`` of waiting
# for it in all, each byte it took allows 1 / this many seconds more. A client that took a
# chunk every 29 s was never stalled, and held a thread, a place among the streams and an
# export's database snapshot (which holds back the vacuum of every table) for as long as it
# liked (review). A client reading at this rate takes an export of 16 MB in about 35 minutes.
STREAM_MIN_BYTES_PER_SECOND = 8 * 1024
# A send waits for its client only past this long, which is what the rule above counts: a
# shorter wait is the event loop's and the GIL's under load (45 ms a send with three busy
# request threads: code review), which cut a fast client's answer of a model's 4-byte
# pieces. A client reading slower than the rule's minimum holds each send longer than this
# (the server's buffers stay full until it takes a few KiB).
SEND_BLOCKED_AFTER_SECONDS = 1.0
# When a streamed response refused says to ask again.
STREAM_RETRY_SECONDS = 5


async def _until_disconnect(receive, gone: threading.Event) -> None:
    """Set ``gone`` when the client disconnects (once the body is read, the server's next
    message is that one)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


def _with_length(scope, size: int) -> dict:
    """``scope`` with ``size`` as its ``Content-Length``."""
    headers = [(name, value) for name, value in scope["headers"] if name != b"content-length"]
    return {**scope, "headers": [*headers, (b"content-length", str(size).encode())]}


def _declared_length(scope) -> int:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0  # the middleware refuses it
    return 0


def response_headers(response) -> list[tuple[bytes, bytes]]:
    """The response's headers and cookies as ASGI sends them (as ``send_response`` does)."""
    headers = [
        (
            name.encode("ascii") if isinstance(name, str) else bytes(name),
            value.encode("latin1") if isinstance(value, str) else bytes(value),
        )
        for name, value in response.items()
    ]
    headers += [
        (b"Set-Cookie", cookie.output(header="").encode("ascii").strip())
        for cookie in response.cookies.values()
    ]
    return headers


def get_asgi_application() -> ThreadPoolHandler:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memsvc.settings")
    django.setup(set_prefix=False)
    return ThreadPoolHandler(settings.WEB_REQUEST_THREADS, settings.WEB_STREAMS_AT_ONCE)


application = get_asgi_application()
