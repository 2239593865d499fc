"""MCP over stdio (``memsvc mcp``): one client, one agent, for the life of the process."""

import io
from typing import BinaryIO

import anyio
from mcp.server.stdio import stdio_server

from agents_api import selectors, services
from agents_api.mcp_server.server import build_server
from agents_api.mcp_server.tools import Caller
from memsvc.api.errors import ApiError


class CallerError(Exception):
    """Why ``memsvc mcp`` cannot tell which agent it serves (a message for its user)."""


def stdio_caller(*, agent_name: str | None, api_key: str | None, local_mode: bool) -> Caller:
    """The agent a stdio server acts as: the agent of ``api_key`` with that key's scopes (in
    any mode), else the local agent ``agent_name``, created if missing (local mode only:
    there this machine's user may act as any local agent, as on the local API)."""
    if api_key:
        try:
            caller = Caller.of_key(api_key.strip())
        except ApiError as exc:
            raise CallerError(f"MEMSVC_API_KEY: {exc.message}") from None
        if agent_name and agent_name != caller.agent.name:
            raise CallerError(
                f"MEMSVC_API_KEY belongs to agent {caller.agent.name!r}, not {agent_name!r}"
            )
        return caller
    if not agent_name:
        raise CallerError("name the agent (--agent NAME) or set MEMSVC_API_KEY=msk_...")
    if not local_mode:
        raise CallerError("outside local mode an agent needs its key: set MEMSVC_API_KEY=msk_...")
    agent, _ = services.agent_get_or_create(owner_principal=selectors.LOCAL_OWNER, name=agent_name)
    return Caller(principal=agent.as_principal(), agent=agent)


def serve(caller: Caller, wire: BinaryIO) -> None:
    """Serve MCP on stdin and ``wire`` (the process's original stdout) until the client
    closes stdin."""
    anyio.run(_serve, caller, wire)


async def _serve(caller: Caller, wire: BinaryIO) -> None:
    server = build_server(caller)
    stdout = anyio.wrap_file(io.TextIOWrapper(wire, encoding="utf-8", newline="\n"))
    async with stdio_server(stdout=stdout) as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
