"""MCP over streamable HTTP at ``/mcp``: a Django view in front of the SDK's transport.

The view authenticates the API key as the agent API does (401 in the API's error shape;
``X-On-Behalf-Of`` as there), then hands the request to the SDK's
``StreamableHTTPSessionManager`` in stateless JSON-response mode: each POST carries one
JSON-RPC message and gets its whole answer as one JSON body. Nothing is kept between
requests, so any web process can answer any request, and no request holds a connection open
(no SSE stream, no session: GET and DELETE answer 405, as the transport allows).

The SDK is asynchronous and the web server may be WSGI (gunicorn's threads): the request's
thread runs the exchange on an event loop of its own, and the tool in the tool pool
(``server``): two thread hops a call, the fewest an ORM call off the event loop allows.
Under ASGI the same view runs in Django's thread for synchronous views and does the same:
one code path for both servers.
"""

import asyncio
import functools

import anyio
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from mcp.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_api.authentication import ApiKeyAuthentication
from agents_api.mcp_server.server import CALLER_SCOPE_KEY, build_server
from agents_api.mcp_server.tools import Caller
from memsvc.api.errors import error_body

# Longer than any tool takes (a search is milliseconds, a save embeds one text), shorter
# than gunicorn's worker timeout (60 s), so a stuck call is answered, not killed.
EXCHANGE_TIMEOUT_SECONDS = 50


@functools.cache
def _server() -> Server:
    return build_server()


def _exchange_here(scope: dict, body: bytes) -> tuple[int, list, bytes]:
    """One HTTP exchange through the SDK, on an event loop of this thread's own."""

    async def main():
        manager = StreamableHTTPSessionManager(app=_server(), stateless=True, json_response=True)
        async with manager.run():
            with anyio.fail_after(EXCHANGE_TIMEOUT_SECONDS):
                return await _exchange(manager, scope, body)

    return anyio.run(main)


async def _exchange(manager: StreamableHTTPSessionManager, scope: dict, body: bytes):
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
    headers = [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in django_request.headers.items()
    ]
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


# Headers of the SDK's answer that the web server sets itself.
_HOP_BY_HOP = {b"content-length", b"connection", b"transfer-encoding"}


class McpView(APIView):
    """``POST /mcp``: one JSON-RPC message of the Model Context Protocol, for an agent key.
    Other methods answer 405 (no SSE stream to GET, no session to DELETE)."""

    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated]
    parser_classes = []  # the SDK reads the body itself

    @extend_schema(exclude=True)  # JSON-RPC, described by the MCP specification, not OpenAPI
    def post(self, request):
        caller = Caller(principal=request.principal, agent=request.agent)
        try:
            status, headers, body = _exchange_here(
                _asgi_scope(request, caller), request._request.body
            )
        except TimeoutError:
            return Response(error_body("the MCP call took too long", "timeout"), status=504)
        # The SDK's body is JSON-RPC already: passed through as it is, not re-rendered.
        response = HttpResponse(body, status=status)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP:
                response[name.decode("latin-1")] = value.decode("latin-1")
        return response
