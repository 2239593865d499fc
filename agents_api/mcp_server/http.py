"""MCP over streamable HTTP at ``/mcp``: a Django view in front of the SDK's transport.

The view authenticates the API key as the agent API does (401 in the API's error shape;
``X-On-Behalf-Of`` as there), then hands the request to the SDK's
``StreamableHTTPSessionManager`` in stateless JSON-response mode: each POST carries one
JSON-RPC message and gets its whole answer as one JSON body. Nothing is kept between
requests, so any web process can answer any request, and no request holds a connection open
(no SSE stream, no session: GET and DELETE answer 405, as the transport allows).

The SDK is asynchronous and the view is not: each process runs one event loop on a thread of
its own (``ExchangeLoop``, started by the first call), with the session manager running for
the life of the process. The request's thread hands the exchange to that loop and waits for
the answer; the tool runs in the tool pool (``server``), as Django's ORM must not run on the
event loop. Making a loop and a session manager for every call cost about 2 ms of CPU a call.
"""

import asyncio
import concurrent.futures
import json
import os
import threading
from functools import partial
from typing import TYPE_CHECKING

import anyio
from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import UnsupportedMediaType
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_api.authentication import ApiKeyAuthentication
from agents_api.mcp_server.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    NOT_A_MESSAGE,
    refusal,
    request_refused,
)
from agents_api.mcp_server.tools import CALLER_SCOPE_KEY, Caller
from memsvc.api.errors import error_body, render_v1_error
from memsvc.api.ratelimit import CountedBeforePermissions

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

# Longer than any tool takes (a search is milliseconds, a save embeds one text), shorter
# than gunicorn's worker timeout (60 s), so a stuck call is answered, not killed.
EXCHANGE_TIMEOUT_SECONDS = 50


class ExchangeLoop:
    """The process's MCP exchanges: an event loop on a daemon thread, and the SDK's session
    manager running on it (``StreamableHTTPSessionManager.run`` may be entered once per
    manager: it is entered once, for good). Made by the first call of the process, and made
    again in a forked child, which does not inherit the thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pid = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._manager: StreamableHTTPSessionManager | None = None

    def exchange(self, scope: dict, body: bytes) -> tuple[int, list, bytes]:
        """One HTTP exchange through the SDK (``TimeoutError`` past the time limit)."""
        loop, manager = self._running()
        return asyncio.run_coroutine_threadsafe(
            _timed_exchange(manager, scope, body), loop
        ).result()

    def _running(self) -> tuple[asyncio.AbstractEventLoop, "StreamableHTTPSessionManager"]:
        with self._lock:
            if self._pid != os.getpid():
                self._loop, self._manager = self._start()
                self._pid = os.getpid()
            return self._loop, self._manager

    @staticmethod
    def _start() -> tuple[asyncio.AbstractEventLoop, "StreamableHTTPSessionManager"]:
        # The SDK is imported here, by the first call: its import takes a second or more of
        # every process that loads the URLs (each web process, each ``manage.py`` command),
        # most of which never see an MCP call.
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        from agents_api.mcp_server.server import build_server

        loop = asyncio.new_event_loop()
        manager = StreamableHTTPSessionManager(
            app=build_server(),
            stateless=True,
            json_response=True,
            # The service's one cap, enforced before the view in the API's error shape: the
            # SDK's own (4 MB) answered a plain-text 413 below it.
            max_request_body_size=settings.MEMSVC_MAX_BODY_BYTES,
        )
        started = concurrent.futures.Future()

        async def serve():
            try:
                async with manager.run():
                    started.set_result(None)
                    await asyncio.Event().wait()  # for as long as the process lives
            except BaseException as exc:
                if not started.done():
                    started.set_exception(exc)
                raise

        threading.Thread(
            target=loop.run_until_complete, args=(serve(),), name="mcp-http", daemon=True
        ).start()
        started.result(timeout=EXCHANGE_TIMEOUT_SECONDS)
        return loop, manager


_exchanges = ExchangeLoop()


def warm_up_in_background() -> None:
    """Start the process's MCP exchanges (the SDK's import, its session manager) in a thread
    of its own, as a web process starts: its first ``/mcp`` call does not pay for them."""
    threading.Thread(target=_exchanges._running, name="mcp-warm-up", daemon=True).start()


async def _timed_exchange(manager: "StreamableHTTPSessionManager", scope: dict, body: bytes):
    with anyio.fail_after(EXCHANGE_TIMEOUT_SECONDS):
        return await _exchange(manager, scope, body)


async def _exchange(manager: "StreamableHTTPSessionManager", scope: dict, body: bytes):
    status, headers, chunks = 500, [], []
    answered = asyncio.Event()
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()  # the client is still there until the answer is complete
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status, headers = message["status"], message.get("headers", [])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                answered.set()

    try:
        await manager.handle_request(scope, receive, send)
    finally:
        answered.set()
    return status, headers, b"".join(chunks)


def _asgi_scope(request, caller: Caller) -> dict:
    django_request = request._request
    # The media type as the view checked it (``post``): the SDK's own check is of the
    # header's case, and refused "Application/JSON" in its own shape (review).
    headers = [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in django_request.headers.items()
        if name.lower() != "content-type"
    ]
    headers.append((b"content-type", django_request.content_type.encode("latin-1")))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": django_request.method,
        "scheme": django_request.scheme,
        "path": django_request.path,
        "raw_path": django_request.path.encode(),
        "query_string": django_request.META.get("QUERY_STRING", "").encode("latin-1"),
        "root_path": "",
        "headers": headers,
        "client": (django_request.META.get("REMOTE_ADDR", ""), 0),
        "server": (django_request.get_host(), int(django_request.get_port())),
        CALLER_SCOPE_KEY: caller,
    }


def _invalid_request_said_plainly(status: int, body: bytes) -> bytes:
    """The SDK's answer, but for a body that is JSON and no JSON-RPC message (a batch,
    ``null``, an object without a method): the SDK calls that -32602 (invalid params) with
    pydantic's account of the validation, which quotes the values sent; JSON-RPC calls it
    -32600, and the caller is told what a message is instead."""
    if status != 400:
        return body
    try:
        answer = json.loads(body)
        error = answer["error"]
    except (ValueError, TypeError, KeyError):
        return body
    if answer.get("id") is not None or error.get("code") != INVALID_PARAMS:
        return body
    answer["error"] = {"code": INVALID_REQUEST, "message": NOT_A_MESSAGE}
    return json.dumps(answer).encode()


# Headers of the SDK's answer that the web server sets itself.
_HOP_BY_HOP = {b"content-length", b"connection", b"transfer-encoding"}


class McpView(CountedBeforePermissions, APIView):
    """``POST /mcp``: one JSON-RPC message of the Model Context Protocol, for an agent key.
    Other methods answer 405 (no SSE stream to GET, no session to DELETE)."""

    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated]
    parser_classes = []  # the SDK reads the body itself
    # Refusals before the view (failed authentications locking the address out, a body over
    # the cap, the database down, a NUL in the path) in the shape of the view's own 401s.
    render_error = staticmethod(partial(render_v1_error, shaped=refusal))

    def handle_exception(self, exc):
        """The view's own refusals (no key, ``X-On-Behalf-Of`` refused, not JSON, ...) as
        JSON-RPC errors (``jsonrpc.refusal``), at their HTTP status and with its headers."""
        response = super().handle_exception(exc)
        response.data = refusal(response.data)
        return response

    def perform_content_negotiation(self, request, force=False):
        # A client opens its stream with ``Accept: text/event-stream`` alone: it must be told
        # 405 (no stream, which the protocol reads as "none"), not 406 for the JSON of it.
        return super().perform_content_negotiation(request, force=True)

    @extend_schema(exclude=True)  # JSON-RPC, described by the MCP specification, not OpenAPI
    def post(self, request):
        if request._request.content_type != "application/json":  # (Django's: bare, lower case)
            # (The SDK refuses it too, with a plain-text 400; "application/jsonfoo" passed
            # a test of the start, and the SDK's refusal came in its own shape: review.)
            raise UnsupportedMediaType(request.content_type)
        refused = request_refused(request._request.body)
        if refused is not None:
            return HttpResponse(
                refused.answer, status=refused.status, content_type="application/json"
            )
        caller = Caller(principal=request.principal, agent=request.agent)
        try:
            status, headers, body = _exchanges.exchange(
                _asgi_scope(request, caller), request._request.body
            )
        except TimeoutError:
            took_too_long = error_body("the MCP call took too long", "timeout")
            return Response(refusal(took_too_long), status=504)
        # The SDK's body is JSON-RPC already: passed through as it is, not re-rendered.
        response = HttpResponse(_invalid_request_said_plainly(status, body), status=status)
        if not any(name.lower() == b"content-type" for name, _ in headers):
            del response["Content-Type"]  # (Django's default: an empty 202 said "text/html")
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP:
                response[name.decode("latin-1")] = value.decode("latin-1")
        return response
