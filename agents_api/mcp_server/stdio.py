"""MCP over stdio (``memsvc mcp``): one client, one agent, for the life of the process."""

import contextlib
import io
import json
import signal
import threading
from collections import Counter
from collections.abc import AsyncIterator
from typing import BinaryIO

import anyio
import anyio.from_thread
import anyio.lowlevel
import mcp_types as types
from mcp.server.stdio import stdio_server
from mcp_types import PROTOCOL_VERSION_META_KEY
from pydantic import ValidationError

from agents_api import selectors, services
from agents_api.mcp_server.jsonrpc import (
    INVALID_REQUEST,
    NOT_A_MESSAGE,
    error_answer,
    request_id_of,
    request_refused,
)
from agents_api.mcp_server.server import build_server
from agents_api.mcp_server.tools import Caller
from memsvc.api.errors import ApiError
from memsvc.api.parsers import too_many_digits


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


PARSE_ERROR = -32700  # JSON-RPC 2.0: "invalid JSON was received"


def line_read(line: str) -> tuple[str | None, object]:
    """The answer to a line the SDK would take in and never answer, else None: JSON the
    service cannot take or a request with an ``id`` MCP does not allow (``request_refused``,
    as on HTTP), a line that is not JSON, or JSON that is no JSON-RPC message (the SDK
    logged those and answered nothing: the client waited for good); and the message read
    (None when it is no JSON)."""
    if not _utf8(line):
        return _parse_error("a line is UTF-8 text"), None
    refused = request_refused(line)
    if refused is not None:
        return refused.answer.decode(), None
    try:
        message = json.loads(line)
    except ValueError as exc:
        return _parse_error(too_many_digits(exc) or "a line holds one JSON message"), None
    try:
        types.jsonrpc_message_adapter.validate_python(message, by_name=False)
        return None, message
    except ValidationError:
        return error_answer(
            request_id_of(message), INVALID_REQUEST, NOT_A_MESSAGE
        ).decode(), message


def _parse_error(problem: str) -> str:
    return error_answer(None, PARSE_ERROR, f"Parse error: {problem}").decode()


def _utf8(line: str) -> bool:
    """Whether the client's line was UTF-8 (read with ``surrogateescape``: a byte that is
    not is a lone surrogate here; replaced, it was stored as "\ufffd", where HTTP refuses
    the same bytes: review)."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Once the client has closed stdin, its requests still being served are answered before the
# session ends, waiting this long at most.
ANSWERS_AFTER_EOF_SECONDS = 120


class _Lines:
    """The client's lines (``wire``), but those ``line_read`` answers, which are answered
    on ``stdout`` here, and blank ones; and ``stdout`` one whole line a write, whoever
    writes (the SDK's answers, these).

    The end of the client's lines is passed on once its requests are answered: the SDK
    ends the session at once, and a call in flight was answered "Connection closed" and
    then done all the same (review)."""

    def __init__(self, wire: BinaryIO, stdout: BinaryIO):
        self._in = io.TextIOWrapper(wire, encoding="utf-8", errors="surrogateescape")
        self._out = anyio.wrap_file(io.TextIOWrapper(stdout, encoding="utf-8", newline="\n"))
        self._writing = anyio.Lock()
        self._asked = Counter()  # the ids of the client's requests not answered yet
        self._all_answered = anyio.Event()
        self._opened = False  # (by initialize, or by a request of the 2026-07-28 protocol)

    async def __aiter__(self) -> AsyncIterator[str]:
        async for line in self._client_lines():
            if not line.strip():
                continue
            answer, message = line_read(line)
            if answer is None:
                answer = self._before_initialize(message)
            if answer is None:
                self._note(message)
                yield line
            else:
                await self.write(answer + "\n")
                await self.flush()
        if self._asked:
            with anyio.move_on_after(ANSWERS_AFTER_EOF_SECONDS):
                await self._all_answered.wait()

    async def _client_lines(self) -> AsyncIterator[str]:
        """The lines of ``wire``, read on a daemon thread of their own: a read that waits for
        the client holds neither the event loop's end nor the process's exit (a Ctrl-C in
        the terminal ended the session only once stdin was closed; review)."""
        send, receive = anyio.create_memory_object_stream[str](1)
        token = anyio.lowlevel.current_token()

        def read() -> None:
            # (Once the session is over, the loop is gone: a line read then goes nowhere.)
            with contextlib.suppress(
                RuntimeError, anyio.ClosedResourceError, anyio.BrokenResourceError
            ):
                try:
                    for line in self._in:
                        anyio.from_thread.run(send.send, line, token=token)
                finally:
                    anyio.from_thread.run_sync(send.close, token=token)

        threading.Thread(target=read, name="mcp-stdin", daemon=True).start()
        async with receive:
            async for line in receive:
                yield line

    def _before_initialize(self, message) -> str | None:
        """The answer to a request of the handshake's protocol sent before ``initialize``
        (but a ``ping``), which the SDK refuses as "Invalid request parameters", though its
        params are right (review). A connection the 2026-07-28 protocol opens (a request
        carrying its version: no handshake) is the SDK's to serve."""
        if self._opened or not isinstance(message, dict) or "id" not in message:
            return None
        method, params = message.get("method"), message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        if method == "initialize" or (isinstance(meta, dict) and PROTOCOL_VERSION_META_KEY in meta):
            self._opened = True
        if self._opened or method in (None, "ping"):
            return None
        problem = "Invalid Request: the session is not initialized: send initialize first"
        return error_answer(request_id_of(message), INVALID_REQUEST, problem).decode()

    async def write(self, text: str) -> None:
        if self._asked:
            self._answered(text)
        async with self._writing:
            await self._out.write(text)

    def _note(self, message) -> None:
        """A request of the client's to be answered; or a request it cancelled, which is
        not (MCP: "SHOULD NOT send a response"; a cancelled call held the end 120 s)."""
        if not isinstance(message, dict) or "method" not in message:
            return
        if "id" in message:
            if not self._asked:
                self._all_answered = anyio.Event()  # (set when the last is answered)
            self._asked[request_id_of(message)] += 1
        elif message["method"] == "notifications/cancelled":
            params = message.get("params")
            self._settle(params.get("requestId") if isinstance(params, dict) else None)

    def _answered(self, text: str) -> None:
        try:
            message = json.loads(text)
        except ValueError:
            return
        if isinstance(message, dict) and "method" not in message:  # an answer
            self._settle(request_id_of(message))

    def _settle(self, request_id) -> None:
        self._asked[request_id] -= 1
        if self._asked[request_id] <= 0:
            self._asked.pop(request_id)
        if not self._asked:
            self._all_answered.set()

    async def flush(self) -> None:
        async with self._writing:
            await self._out.flush()


def serve(caller: Caller, stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Serve MCP on ``stdin`` and ``stdout`` (the process's original ones) until the client
    closes stdin, or stops reading stdout (the session is over: it ended in a traceback of
    a broken pipe; review).

    SIGTERM (an MCP client that ends its server so, stdin still open) ends it as Ctrl-C
    does: a ``KeyboardInterrupt`` once the session has ended. The signal is taken by the
    event loop: raised as the interrupt wherever the loop was, it could meet the SDK's task
    group as it ended, and its traceback was printed (a race, 1 run in 40). Once the loop
    has ended, SIGTERM is handled as before it began (the loop's end set the default
    action, which killed the process in the caller's flush of use counts: code review)."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        if anyio.run(_serve, caller, stdin, stdout):
            raise KeyboardInterrupt
    except* BrokenPipeError:
        pass
    finally:
        signal.signal(signal.SIGTERM, before)


async def _serve(caller: Caller, stdin: BinaryIO, stdout: BinaryIO) -> bool:
    """Serve the session; whether SIGTERM ended it."""
    server = build_server(caller)
    lines = _Lines(stdin, stdout)
    terminated = False

    async def end_on_sigterm(scope: anyio.CancelScope) -> None:
        nonlocal terminated
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                terminated = True
                scope.cancel()

    async with anyio.create_task_group() as group:
        group.start_soon(end_on_sigterm, group.cancel_scope)
        async with stdio_server(stdin=lines, stdout=lines) as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        group.cancel_scope.cancel()
    return terminated
