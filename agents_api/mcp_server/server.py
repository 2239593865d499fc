"""The ``mcp`` SDK's low-level server over the tool registry (``tools``), for every transport.

Who is calling comes with each request over HTTP (the ASGI scope the ``/mcp`` view fills in
after checking the API key) and is fixed for the whole process over stdio (the server's
lifespan state). Tools run in a small pool of long-lived threads: Django's ORM must not run
on the event loop, and a long-lived thread keeps its database connection between calls.
"""

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from agents_api.mcp_server.tools import CALLER_SCOPE_KEY, INSTRUCTIONS, TOOLS, Caller, call_tool
from memsvc.api.parsers import MAX_JSON_DEPTH, json_problem

SERVER_NAME = "memsvc"

INVALID_REQUEST = -32600  # JSON-RPC 2.0: "the JSON sent is not a valid Request object"
INVALID_PARAMS = -32602
NOT_A_MESSAGE = (
    'Invalid Request: a JSON-RPC 2.0 message is one JSON object with "jsonrpc": "2.0" '
    "and a method (a request or a notification) or a result or an error (a response); "
    "batches are not supported"
)


def request_refused(body: bytes | str) -> bytes | None:
    """The answer to a body the SDK must not be given, else None: JSON the service cannot
    take (nested deeper than ``MAX_JSON_DEPTH``, or holding a lone surrogate: ``json_problem``,
    as every other API refuses it; 1,000 levels were a 500 here, 65 went on to the tools), or
    a request (it has a method) whose ``id`` is neither a string nor an integer (MCP: "MUST
    be a string or integer", not null: the SDK took it for a notification, answered 202 and
    nothing, and the caller waited for an answer that never came)."""
    try:
        message = json.loads(body)
    except RecursionError:
        return invalid_request(f"nested more than {MAX_JSON_DEPTH} levels deep")
    except ValueError:
        return None  # (the SDK's parse error)
    problem = json_problem(message)
    if problem is not None:
        path, what = problem
        return invalid_request(f"{'.'.join(map(str, path)) or 'body'}: {what}")
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return None
    request_id = message["id"]
    if isinstance(request_id, str) or (
        isinstance(request_id, int) and not isinstance(request_id, bool)
    ):
        return None
    return invalid_request("id: a string or an integer")


def invalid_request(problem: str) -> bytes:
    error = {"code": INVALID_REQUEST, "message": f"Invalid Request: {problem}"}
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()


# Threads that run tools, per process: as many calls at once as a web process serves
# requests (gunicorn's threads), each thread with its own database connection.
TOOL_THREADS = 4

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _tool_pool() -> ThreadPoolExecutor:
    """The process's tool threads, made by its first call (shared by the process's MCP event
    loop, ``http.ExchangeLoop``, or the stdio server's)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=TOOL_THREADS, thread_name_prefix="mcp-tool")
        return _pool


def _tool_listing() -> types.ListToolsResult:
    return types.ListToolsResult(
        tools=[
            types.Tool(
                name=tool.name,
                title=tool.title,
                description=tool.description,
                input_schema=tool.input_schema,
                annotations=types.ToolAnnotations(
                    title=tool.title,
                    read_only_hint=tool.read_only,
                    destructive_hint=tool.destructive,
                    open_world_hint=False,
                ),
            )
            for tool in TOOLS.values()
        ]
    )


def _caller(ctx: ServerRequestContext) -> Caller:
    if ctx.request is not None:  # streamable HTTP: this request's API key
        return ctx.request.scope[CALLER_SCOPE_KEY]
    return ctx.lifespan_context["caller"]  # stdio: the process's agent


async def _list_tools(ctx: ServerRequestContext, params) -> types.ListToolsResult:
    return _tool_listing()


async def _call_tool(
    ctx: ServerRequestContext, params: types.CallToolRequestParams
) -> types.CallToolResult:
    if params.name not in TOOLS:
        raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name}")
    # The running loop's executor API: the loop is asyncio's under every transport here.
    outcome = await asyncio.get_running_loop().run_in_executor(
        _tool_pool(), call_tool, _caller(ctx), params.name, params.arguments or {}
    )
    return types.CallToolResult(
        content=[types.TextContent(text=outcome.text)],
        structured_content=outcome.data,
        is_error=outcome.is_error,
    )


def _input_schema(name: str) -> dict | None:
    tool = TOOLS.get(name)
    return tool.input_schema if tool else None


def build_server(caller: Caller | None = None) -> Server:
    """The MCP server: over stdio for ``caller``; over HTTP (``caller`` None) for whoever
    each request's API key names."""

    @asynccontextmanager
    async def lifespan(server: Server) -> AsyncIterator[dict]:
        yield {"caller": caller}

    return Server(
        SERVER_NAME,
        version=_version(),
        title="memsvc memory",
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        # The schema a call's Mcp-Param headers are checked against, without listing the
        # tools again for every call.
        get_tool_input_schema=_input_schema,
        on_list_tools=_list_tools,
        on_call_tool=_call_tool,
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("memsvc")
    except PackageNotFoundError:
        return "0"
