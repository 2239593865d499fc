"""``learning()``: memory for any script that uses the OpenAI client, in one ``with`` line.

    from memsvc.client import learning

    with learning(agent="my_agent"):
        client.chat.completions.create(model=..., messages=[...])

Inside the block, every chat completion (and Responses API call) of the ``openai`` package
first asks the memsvc local API (``POST /context/{agent}``) for the agent's memory blocks, and
the long-term memories and past messages most relevant to the user's last message, and
passes them to the model as a system message; afterwards the user's message and the reply are stored
(``POST /messages``). The response is returned unchanged. If memsvc fails during a call,
a warning is logged and the call goes on without memory.

This module needs only ``openai`` and ``httpx``: it never imports Django.
"""

import functools
import importlib
import logging
import os
import threading
from collections.abc import Callable

import httpx

from memsvc.memory_bank import DEFAULT_MAX_CHARS_PER_RECORD, DEFAULT_TOP_K, MemoryBank

logger = logging.getLogger("memsvc.client")

DEFAULT_SERVER_URL = "http://127.0.0.1:8283"
MAX_CONTEXT_MESSAGE_CHARS = 500
CONTEXT_HEADER = "The following is context from your memory:"
TIMEOUT_SECONDS = 10.0

# (module, class, is_async) of the methods patched while a learning() block is active.
PATCHED = (
    ("openai.resources.chat.completions", "Completions", False),
    ("openai.resources.chat.completions", "AsyncCompletions", True),
    ("openai.resources.responses", "Responses", False),
    ("openai.resources.responses", "AsyncResponses", True),
)


class MemoryServerUnavailable(RuntimeError):
    """memsvc did not answer when a ``learning()`` block began."""


# --- formatting -------------------------------------------------------------------------------


def text_of(content) -> str:
    """The text of a message's content: a string, or the text parts of a list of blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict) and block.get("type") in ("text", "input_text"):
                parts.append(str(block.get("text", "")))
            elif isinstance(block, str):
                parts.append(block)
        return "\n".join(part for part in parts if part)
    return ""


def last_user_text(messages) -> str:
    """The text of the last message with role ``user`` (chat messages or Responses input)."""
    if isinstance(messages, str):
        return messages
    for message in reversed(list(messages or [])):
        if isinstance(message, dict) and message.get("role") == "user":
            return text_of(message.get("content"))
    return ""


def _cut(text: str) -> str:
    if len(text) <= MAX_CONTEXT_MESSAGE_CHARS:
        return text
    return text[:MAX_CONTEXT_MESSAGE_CHARS].rstrip() + "…"


def format_context(context: dict) -> str | None:
    """The seed's format: memory blocks, then the relevant long-term memories (best first),
    then the relevant past messages in time order."""
    sections = []
    blocks = context.get("memory_blocks") or []
    if blocks:
        sections.append(
            "## Memory\n\n" + "\n\n".join(f"### {b['label']}\n{b['value']}" for b in blocks)
        )
    memories = context.get("memories") or []  # absent from older servers' answers
    if memories:
        sections.append("## Memories\n\n" + "\n".join(f"- {_cut(m['content'])}" for m in memories))
    messages = sorted(context.get("relevant_messages") or [], key=lambda m: m["created_at"])
    if messages:
        lines = [f"**{m['role'].capitalize()}**: {_cut(m['content'])}" for m in messages]
        sections.append("## Relevant Past Conversations\n\n" + "\n\n".join(lines))
    if not sections:
        return None
    return CONTEXT_HEADER + "\n\n" + "\n\n".join(sections)


def inject(messages: list, context_text: str) -> list:
    """A copy of ``messages`` with the context as a system message: right after a leading
    system message, else first."""
    injected = {"role": "system", "content": context_text}
    messages = list(messages)
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") in ("system", "developer"):
        return [first, injected, *messages[1:]]
    return [injected, *messages]


# --- talking to memsvc ------------------------------------------------------------------------


class _MemoryServer:
    def __init__(self, url: str, api_key: str | None):
        self.url = url.rstrip("/")
        self.headers = {"X-API-Key": api_key} if api_key else {}
        # Every model call makes two or three memory calls: one keep-alive connection for
        # the whole block, not a new one each time. (Async calls open a client per call: an
        # AsyncClient belongs to the event loop that made it.)
        self._client: httpx.Client | None = None

    def _request(self, method: str, path: str, body=None):
        if self._client is None:
            self._client = httpx.Client(
                base_url=self.url, headers=self.headers, timeout=TIMEOUT_SECONDS
            )
        response = self._client.request(method, path, json=body)
        response.raise_for_status()
        return response.json()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    async def _arequest(self, method: str, path: str, body=None):
        async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS, headers=self.headers) as client:
            response = await client.request(method, self.url + path, json=body)
        response.raise_for_status()
        return response.json()

    def check(self, agent: str) -> None:
        try:
            self._request("GET", "/health")
        except httpx.HTTPError as exc:
            raise MemoryServerUnavailable(
                f"memsvc is not reachable at {self.url} ({exc}). Start it with "
                "`./scripts/serve` in the memsvc checkout (or `memsvc serve`), or set "
                "MEMORY_SERVER_URL to where it runs."
            ) from exc
        self._request("POST", "/agents", {"name": agent})

    @staticmethod
    def _message(agent: str, role: str, content: str, metadata: dict | None) -> dict:
        return {"agent_name": agent, "role": role, "content": content, "metadata": metadata}

    def context(self, agent: str, query: str) -> dict:
        return self._request("POST", f"/context/{agent}", {"agent_name": agent, "query": query})

    async def acontext(self, agent: str, query: str) -> dict:
        return await self._arequest(
            "POST", f"/context/{agent}", {"agent_name": agent, "query": query}
        )

    def store(self, agent: str, role: str, content: str, metadata: dict | None = None) -> None:
        self._request("POST", "/messages", self._message(agent, role, content, metadata))

    async def astore(self, agent, role, content, metadata=None) -> None:
        await self._arequest("POST", "/messages", self._message(agent, role, content, metadata))


# --- what a model call said -------------------------------------------------------------------


def _dump(value):
    return value.model_dump() if hasattr(value, "model_dump") else value


def chat_reply(response) -> tuple[str, dict | None]:
    """The assistant's text and (as metadata) its tool calls, from a chat completion."""
    message = response.choices[0].message
    tool_calls = [_dump(call) for call in (message.tool_calls or [])]
    return message.content or "", ({"tool_calls": tool_calls} if tool_calls else None)


def responses_reply(response) -> tuple[str, dict | None]:
    return getattr(response, "output_text", "") or "", None


class _ChatStreamAssembler:
    """Builds the reply of a streamed chat completion from its chunks."""

    def __init__(self):
        self.text: list[str] = []
        self.calls: dict[int, dict] = {}

    def add(self, chunk) -> None:
        for choice in getattr(chunk, "choices", None) or []:
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta.content:
                self.text.append(delta.content)
            for call in delta.tool_calls or []:
                entry = self.calls.setdefault(
                    call.index,
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if call.id:
                    entry["id"] = call.id
                if call.function:
                    entry["function"]["name"] += call.function.name or ""
                    entry["function"]["arguments"] += call.function.arguments or ""

    def reply(self) -> tuple[str, dict | None]:
        calls = [self.calls[i] for i in sorted(self.calls)]
        return "".join(self.text), ({"tool_calls": calls} if calls else None)


class _ResponsesStreamAssembler:
    def __init__(self):
        self.text: list[str] = []

    def add(self, event) -> None:
        if getattr(event, "type", "") == "response.output_text.delta":
            self.text.append(event.delta)

    def reply(self) -> tuple[str, dict | None]:
        return "".join(self.text), None


class _RecordedStream:
    """Passes a stream's chunks through as they come; when it ends, stores the reply."""

    def __init__(self, stream, assembler, on_end: Callable):
        self._stream = stream
        self._assembler = assembler
        self._on_end = on_end
        self._ended = False

    def _end(self):
        if not self._ended:
            self._ended = True
            self._on_end(*self._assembler.reply())

    def __iter__(self):
        for chunk in self._stream:
            self._assembler.add(chunk)
            yield chunk
        self._end()

    async def __aiter__(self):
        async for chunk in self._stream:
            self._assembler.add(chunk)
            yield chunk
        if not self._ended:
            self._ended = True
            await self._on_end(*self._assembler.reply())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stream.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self._stream.close()

    def __getattr__(self, name):
        return getattr(self._stream, name)


# --- the context manager ----------------------------------------------------------------------

_lock = threading.Lock()
_active: list["learning"] = []
_originals: dict[tuple[str, str], Callable] = {}


def _current() -> "learning | None":
    return _active[-1] if _active else None


def _patch() -> None:
    for module_name, class_name, is_async in PATCHED:
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            continue  # an openai without that API
        original = cls.create
        _originals[(module_name, class_name)] = original
        kind = "responses" if "responses" in module_name else "chat"
        cls.create = (_async_wrapper if is_async else _sync_wrapper)(original, kind)


def _unpatch() -> None:
    for (module_name, class_name), original in _originals.items():
        getattr(importlib.import_module(module_name), class_name).create = original
    _originals.clear()


def _sync_wrapper(original, kind):
    @functools.wraps(original)
    def create(client_self, *args, **kwargs):
        session = _current()
        if session is None:
            return original(client_self, *args, **kwargs)
        return session._call(original, client_self, args, kwargs, kind)

    return create


def _async_wrapper(original, kind):
    @functools.wraps(original)
    async def create(client_self, *args, **kwargs):
        session = _current()
        if session is None:
            return await original(client_self, *args, **kwargs)
        return await session._acall(original, client_self, args, kwargs, kind)

    return create


class learning:
    """Give the OpenAI client memory while the block runs (``with`` or ``async with``).

    ``agent`` names the memory; ``server_url`` defaults to ``MEMORY_SERVER_URL`` or
    http://127.0.0.1:8283; ``capture_only`` stores conversations without injecting memory;
    ``api_key`` is needed when memsvc is not on this machine. Blocks nest: the innermost
    one's agent serves the calls made inside it.

    ``strategy="memory_bank"`` (chat completions) stores each tool interaction as a tool
    record and sends the model a compressed context instead of the whole history
    (``memsvc.memory_bank``): ``task_id`` (default: a fresh one per task), ``top_k``
    records retrieved, each record's raw data cut at ``max_chars_per_record``.
    """

    STRATEGIES = ("default", "memory_bank")

    def __init__(
        self,
        agent: str,
        server_url: str | None = None,
        capture_only: bool = False,
        api_key: str | None = None,
        strategy: str = "default",
        task_id: str | None = None,
        top_k: int = DEFAULT_TOP_K,
        max_chars_per_record: int = DEFAULT_MAX_CHARS_PER_RECORD,
    ):
        if strategy not in self.STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(self.STRATEGIES)}")
        self.agent = agent
        self.capture_only = capture_only
        self.bank = (
            MemoryBank(
                agent, task_id=task_id, top_k=top_k, max_chars_per_record=max_chars_per_record
            )
            if strategy == "memory_bank"
            else None
        )
        self.server = _MemoryServer(
            server_url or os.environ.get("MEMORY_SERVER_URL") or DEFAULT_SERVER_URL,
            api_key or os.environ.get("MEMSVC_API_KEY"),
        )

    # with / async with

    def __enter__(self):
        try:
            self.server.check(self.agent)
        except BaseException:
            self.server.close()
            raise
        with _lock:
            if not _active:
                _patch()
            _active.append(self)
        return self

    def __exit__(self, *exc):
        with _lock:
            if self in _active:
                _active.remove(self)
            if not _active:
                _unpatch()
        self.server.close()
        return False

    async def __aenter__(self):
        return self.__enter__()

    async def __aexit__(self, *exc):
        return self.__exit__(*exc)

    # one model call

    def _prepare(self, kwargs: dict, kind: str, context: dict | None) -> dict:
        text = format_context(context) if context else None
        if not text:
            return kwargs
        if kind == "chat":
            return {**kwargs, "messages": inject(kwargs["messages"], text)}
        instructions = kwargs.get("instructions")
        return {**kwargs, "instructions": f"{instructions}\n\n{text}" if instructions else text}

    def _query(self, kwargs: dict, kind: str) -> str:
        return last_user_text(kwargs.get("messages") if kind == "chat" else kwargs.get("input"))

    def _warn(self, action: str, exc: Exception) -> None:
        logger.warning("memsvc: could not %s (%s); going on without memory", action, exc)

    def _remember(self, query: str, reply: str, metadata: dict | None) -> None:
        try:
            if query:
                self.server.store(self.agent, "user", query)
            if reply or metadata:
                self.server.store(self.agent, "assistant", reply or "(tool calls)", metadata)
        except httpx.HTTPError as exc:
            self._warn("store the conversation", exc)

    async def _aremember(self, query: str, reply: str, metadata: dict | None) -> None:
        try:
            if query:
                await self.server.astore(self.agent, "user", query)
            if reply or metadata:
                await self.server.astore(self.agent, "assistant", reply or "(tool calls)", metadata)
        except httpx.HTTPError as exc:
            self._warn("store the conversation", exc)

    def _call(self, original, client_self, args, kwargs, kind):
        if self.bank is not None and kind == "chat":
            messages = self.bank.prepare(kwargs["messages"], self.server._request)
            return original(client_self, *args, **{**kwargs, "messages": messages})
        query = self._query(kwargs, kind)
        context = None
        if query and not self.capture_only:
            try:
                context = self.server.context(self.agent, query)
            except httpx.HTTPError as exc:
                self._warn("read memory", exc)
        response = original(client_self, *args, **self._prepare(kwargs, kind, context))
        if kwargs.get("stream"):
            assembler = _ChatStreamAssembler() if kind == "chat" else _ResponsesStreamAssembler()
            return _RecordedStream(response, assembler, functools.partial(self._remember, query))
        self._remember(query, *(chat_reply if kind == "chat" else responses_reply)(response))
        return response

    async def _acall(self, original, client_self, args, kwargs, kind):
        if self.bank is not None and kind == "chat":
            messages = await self.bank.aprepare(kwargs["messages"], self.server._arequest)
            return await original(client_self, *args, **{**kwargs, "messages": messages})
        query = self._query(kwargs, kind)
        context = None
        if query and not self.capture_only:
            try:
                context = await self.server.acontext(self.agent, query)
            except httpx.HTTPError as exc:
                self._warn("read memory", exc)
        response = await original(client_self, *args, **self._prepare(kwargs, kind, context))
        if kwargs.get("stream"):
            assembler = _ChatStreamAssembler() if kind == "chat" else _ResponsesStreamAssembler()
            return _RecordedStream(response, assembler, functools.partial(self._aremember, query))
        await self._aremember(query, *(chat_reply if kind == "chat" else responses_reply)(response))
        return response
