"""The ``mcp`` SDK's low-level server over the tool registry (``tools``), for every transport.

Who is calling comes with each request over HTTP (the ASGI scope the ``/mcp`` view fills in
after checking the API key) and is fixed for the whole process over stdio (the server's
lifespan state). Tools run in a small pool of long-lived threads: Django's ORM must not run
on the event loop, and a long-lived thread keeps its database connection between calls.
"""

import asyncio
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from agents_api.mcp_server.tools import CALLER_SCOPE_KEY, INSTRUCTIONS, TOOLS, Caller, call_tool
from memsvc.text import named

SERVER_NAME = "memsvc"

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
    # One page, which no cursor continues: one given was taken as none (review; the spec's
    # pagination: an invalid cursor SHOULD be -32602).
    if params is not None and getattr(params, "cursor", None) is not None:
        raise MCPError(code=types.INVALID_PARAMS, message="no such cursor: the tools fit one page")
    return _tool_listing()


async def _call_tool(
    ctx: ServerRequestContext, params: types.CallToolRequestParams
) -> types.CallToolResult:
    if params.name not in TOOLS:
        # (The name cut short, as every refusal names what was sent: review, a 20 MB name
        # came back whole.)
        raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {named(params.name)}")
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
