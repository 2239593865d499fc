"""The I/O-free core of ``learning()``: which model calls it handles, what it asks memsvc
before a call, how it changes the request, how it reads the reply (whole or streamed) and
what it stores. No sockets, no threads, no SDK objects: JSON bodies and bytes in, JSON
bodies and ``ServerRequest``s out. The shells (``memsvc.client.hooks``) do the I/O, sync
and async alike.

What to inject and what to store is a *strategy*'s decision (``Recall``, the seed's: memory
blocks, memories and relevant messages in; the user's message and the reply out). Another
strategy plugs in beside it by answering the same three questions.
"""

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import quote

from memsvc.client.formatting import (
    answers_tools,
    append_text,
    format_context,
    has_user_message,
    inject,
    last_user_text,
    text_of,
)
from memsvc.text import shows_nothing

NO_TEXT_REPLY = "(tool calls)"
NO_TEXT_MESSAGE = "(no text)"  # a user's message of images, audio or files only
KEY_HEADER = "Idempotency-Key"  # what memsvc reads a store's key from
TRUNCATED = "...[truncated]"
# memsvc's limits of a message's metadata: its JSON's bytes (``METADATA_MAX_BYTES``) and
# its depth within a request's body (``FIELD_MAX_JSON_DEPTH``).
METADATA_MAX_BYTES = 16 * 1024
METADATA_MAX_DEPTH = 63


@dataclass(frozen=True)
class ServerRequest:
    """One request to memsvc: what the shells send. A store with an ``idempotency_key`` is
    sent with it (``Idempotency-Key``), so that one whose answer was lost can be sent again:
    memsvc stores it once."""

    method: str
    path: str
    json: dict | None = None
    idempotency_key: str | None = None


@dataclass(frozen=True)
class Reply:
    """What the model answered: its text, and its tool calls as message metadata."""

    text: str = ""
    tool_calls: tuple = ()

    @property
    def metadata(self) -> dict | None:
        return stored_tool_calls(self.tool_calls) if self.tool_calls else None


def json_bytes(value) -> int:
    """The bytes of ``value``'s JSON, as memsvc counts them (compact)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def json_depth(value) -> int:
    """How deep ``value``'s JSON nests (a text or a number: 0)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((sub, depth + 1) for sub in item.values())
        elif isinstance(item, list):
            stack.extend((sub, depth + 1) for sub in item)
    return deepest


def text_cut_to(text: str, max_bytes: int) -> str:
    """``text`` whole when its JSON is within ``max_bytes``, else its start, marked
    ``TRUNCATED``, whose JSON is (a control character is six bytes in JSON)."""
    if json_bytes(text) <= max_bytes:
        return text
    # The longest start that fits (halved, 2 MiB were kept as 512 KiB of the 1 MiB allowed;
    # shrunk once in proportion, 659 of 914 characters: review): a guess in proportion to
    # what its JSON is over, else halfway, between a length that fits and one that does not.
    head = text.encode()[:max_bytes].decode(errors="ignore")
    fits, over, n = 0, len(head) + 1, len(head)
    while over - fits > 1:
        size = json_bytes(head[:n] + TRUNCATED)
        if size <= max_bytes:
            fits = n
        else:
            over = n
        guess = n * max_bytes // size
        n = guess if fits < guess < over else (fits + over) // 2
    return head[:fits] + TRUNCATED


def stored_tool_calls(calls: tuple) -> dict:
    """A reply's tool calls as a message's metadata that memsvc keeps: whole when within its
    limits; else each call's arguments as text (an object's as its JSON), cut to an equal
    share, and the last calls left out if their names alone are too many. Over the limits
    the whole reply was refused, its text too (a coding agent's file written by a tool call
    is more than 16 KiB; review)."""
    metadata = readable_json({"tool_calls": list(calls)})
    if json_bytes(metadata) <= METADATA_MAX_BYTES and json_depth(metadata) <= METADATA_MAX_DEPTH:
        return metadata
    kept = metadata["tool_calls"]
    texts = [_arguments_text(call) for call in kept]
    share = METADATA_MAX_BYTES // len(kept)
    while True:
        cut = [
            {
                **call,
                "function": {**(call.get("function") or {}), "arguments": text_cut_to(text, share)},
            }
            for call, text in zip(kept, texts, strict=True)
        ]
        metadata = {"tool_calls": cut}
        if (
            json_bytes(metadata) <= METADATA_MAX_BYTES
            and json_depth(metadata) <= METADATA_MAX_DEPTH
        ):
            return metadata
        if share > 256:
            share //= 2
        else:
            kept, texts = kept[: len(kept) // 2], texts[: len(kept) // 2]


def _arguments_text(call: dict) -> str:
    arguments = (call.get("function") or {}).get("arguments")
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


# --- the model APIs ---------------------------------------------------------------------------


class ModelApi:
    """One kind of model call: where the user's text is, where memory goes, how the reply
    reads (a JSON body, or the events of a stream)."""

    name = ""
    conversation = "messages"  # the body's list of messages: the user's, the tools' results

    def query(self, body: dict) -> str:
        """The user's last message: what memory is asked about, and what is stored."""
        return last_user_text(body.get(self.conversation))

    def answers_tools(self, body: dict) -> bool:
        """Whether the call sends tool results back (its question was sent before)."""
        return answers_tools(body.get(self.conversation))

    def asks(self, body: dict) -> bool:
        """Whether the call holds a user's message, with text or without (an image)."""
        return has_user_message(body.get(self.conversation))

    def with_memory(self, body: dict, text: str) -> dict:
        raise NotImplementedError

    def reply(self, data: dict) -> Reply:
        raise NotImplementedError

    def prefilled(self, body: dict) -> str:
        """The start of the reply the call wrote itself (none, but for Anthropic's)."""
        return ""

    def assembler(self) -> "StreamAssembler":
        raise NotImplementedError


class StreamAssembler:
    """Builds a reply from the events of a stream (each a JSON object): its text, or (a
    model that declines streams no text) its refusal, as the API's ``reply`` reads a whole
    one."""

    def __init__(self):
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.calls: dict[int, dict] = {}
        self.whole: Reply | None = None  # a final event that carries the whole reply
        # The stream ended in an error event: the SDK raises it to the caller, who got no
        # reply, and nothing of the turn is stored, as when the model answers an error
        # status (review: a cut reply was stored as the answer).
        self.failed = False

    def add(self, event: str | None, data: dict) -> None:
        raise NotImplementedError

    def reply(self) -> Reply | None:
        if self.failed:
            return None
        if self.whole is not None:
            return self.whole
        text = "".join(self.text) or "".join(self.refusal)
        return Reply(text, tuple(self.calls[i] for i in sorted(self.calls)))


class ChatCompletions(ModelApi):
    """``POST .../chat/completions``: create, parse, the stream helper, raw and streamed
    responses all send this."""

    name = "chat"

    def with_memory(self, body, text):
        return {**body, "messages": inject(body.get("messages") or [], text)}

    def reply(self, data):
        choices = data.get("choices") or [{}]
        message = choices[0].get("message") or {}
        content = message.get("content")
        if content is None:
            content = message.get("refusal")
        calls = message.get("tool_calls") or ()
        if not calls and message.get("function_call"):  # (the API's older form of one)
            calls = ({"id": None, "type": "function", "function": message["function_call"]},)
        return Reply(content or "", tuple(calls))

    def assembler(self):
        return _ChatAssembler()


class _ChatAssembler(StreamAssembler):
    def add(self, event, data):
        if data.get("error") is not None:
            self.failed = True
        for choice in data.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.text.append(delta["content"])
            if delta.get("refusal"):
                self.refusal.append(delta["refusal"])
            calls = delta.get("tool_calls") or []
            if not calls and delta.get("function_call"):  # (the older form: one call)
                calls = [{"index": 0, "function": delta["function_call"]}]
            for call in calls:
                entry = self.calls.setdefault(
                    call.get("index", 0),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                entry["id"] = call.get("id") or entry["id"]
                function = call.get("function") or {}
                entry["function"]["name"] += function.get("name") or ""
                entry["function"]["arguments"] += function.get("arguments") or ""


class Responses(ModelApi):
    """``POST .../responses``: create, parse, stream; memory goes into ``instructions``."""

    name = "responses"
    conversation = "input"

    def with_memory(self, body, text):
        return {**body, "instructions": append_text(body.get("instructions"), text)}

    def reply(self, data):
        texts, refusals, calls = [], [], []
        for item in data.get("output") or []:
            if item.get("type") == "message":
                for part in item.get("content") or []:
                    if part.get("type") == "output_text":
                        texts.append(part.get("text", ""))
                    elif part.get("type") == "refusal":  # a model that declines
                        refusals.append(part.get("refusal") or "")
            elif item.get("type") == "function_call":
                calls.append(
                    {
                        "id": item.get("call_id"),
                        "type": "function",
                        "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                    }
                )
        return Reply("".join(texts) or "".join(refusals), tuple(calls))

    def assembler(self):
        return _ResponsesAssembler(self)


class _ResponsesAssembler(StreamAssembler):
    def __init__(self, api: Responses):
        super().__init__()
        self.api = api

    def add(self, event, data):
        kind = data.get("type") or event
        if kind == "response.output_text.delta":
            self.text.append(data.get("delta") or "")
        elif kind == "response.refusal.delta":
            self.refusal.append(data.get("delta") or "")
        elif kind == "response.completed" and isinstance(data.get("response"), dict):
            self.whole = self.api.reply(data["response"])
        elif kind in ("error", "response.failed"):
            self.failed = True


class AnthropicMessages(ModelApi):
    """Anthropic's ``POST /v1/messages``: create and the stream helper; memory goes into
    ``system``, the reply is read from its content blocks."""

    name = "anthropic"

    def with_memory(self, body, text):
        return {**body, "system": append_text(body.get("system"), text)}

    def prefilled(self, body):
        """An assistant message that ends the messages: the reply goes on from it (the model
        answers only the rest; review: the reply was stored without its start)."""
        messages = body.get("messages")
        last = messages[-1] if isinstance(messages, list) and messages else None
        if isinstance(last, dict) and last.get("role") == "assistant":
            return text_of(last.get("content"))
        return ""

    def reply(self, data):
        texts, calls = [], []
        for block in data.get("content") or []:
            if block.get("type") == "text":
                texts.append(block.get("text", ""))
            elif block.get("type") == "tool_use":
                calls.append(_tool_use(block, block.get("input")))
        return Reply("".join(texts), tuple(calls))

    def assembler(self):
        return _AnthropicAssembler()


def _tool_use(block: dict, arguments) -> dict:
    return {
        "id": block.get("id"),
        "type": "tool_use",
        "function": {"name": block.get("name"), "arguments": arguments},
    }


class _AnthropicAssembler(StreamAssembler):
    def __init__(self):
        super().__init__()
        self.json_parts: dict[int, list[str]] = {}

    def add(self, event, data):
        kind = data.get("type") or event
        index = data.get("index", 0)
        if kind == "error":
            self.failed = True
        elif kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "text" and block.get("text"):
                self.text.append(block["text"])
            elif block.get("type") == "tool_use":
                self.calls[index] = _tool_use(block, None)
                self.json_parts[index] = []
        elif kind == "content_block_delta":
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta":
                self.text.append(delta.get("text") or "")
            elif delta.get("type") == "input_json_delta" and index in self.json_parts:
                self.json_parts[index].append(delta.get("partial_json") or "")

    def reply(self):
        for index, parts in self.json_parts.items():
            text = "".join(parts)
            try:
                self.calls[index]["function"]["arguments"] = json.loads(text) if text else {}
            except ValueError:
                self.calls[index]["function"]["arguments"] = text
        return super().reply()


CHAT, RESPONSES, ANTHROPIC = ChatCompletions(), Responses(), AnthropicMessages()

# The calls learning() handles, by SDK: (path suffix, API). Paths end the URL, queries
# (Anthropic's ``?beta=true``) removed; other calls of these SDKs pass through untouched.
SURFACES = {
    "openai": (("/chat/completions", CHAT), ("/responses", RESPONSES)),
    "anthropic": (("/v1/messages", ANTHROPIC),),
}


def model_api(sdk: str, method: str, url: str, body) -> ModelApi | None:
    """The API of a request an SDK is about to send, or None when learning() leaves it alone."""
    if method.lower() != "post" or not isinstance(body, dict):
        return None
    path = url.split("?", 1)[0].rstrip("/")
    return next((api for suffix, api in SURFACES.get(sdk, ()) if path.endswith(suffix)), None)


# --- reading a reply --------------------------------------------------------------------------


class ServerSentEvents:
    """An incremental decoder of ``text/event-stream`` bytes into (event, data) pairs."""

    def __init__(self):
        self._unended: list[bytes] = []  # the pieces of a line not ended yet
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> Iterable[tuple[str | None, str]]:
        # (A line is joined once it ends: the whole buffer split again at every chunk was
        # quadratic in a long line, 800 KB of one in 64-byte chunks: 4.7 s; review.)
        if b"\n" not in chunk:
            self._unended.append(chunk)
            return
        first, *lines = chunk.split(b"\n")
        lines.insert(0, b"".join([*self._unended, first]))
        self._unended = [lines.pop()]
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8", "replace")
            if not line:
                if self._data:
                    yield self._event, "\n".join(self._data)
                self._event, self._data = None, []
            elif line.startswith("event:"):
                self._event = line[6:].strip()
            elif line.startswith("data:"):
                self._data.append(line[5:].removeprefix(" "))

    def close(self) -> Iterable[tuple[str | None, str]]:
        yield from self.feed(b"\n\n")


class ReplyReader:
    """Reads a model's reply from the bytes of its HTTP body as the caller consumes them: a
    JSON body, or server-sent events. ``feed`` every chunk, then ``finish`` once."""

    def __init__(self, api: ModelApi, *, streamed: bool):
        self.api = api
        self.streamed = streamed
        self._chunks: list[bytes] = []
        self._events = ServerSentEvents() if streamed else None
        self._assembler = api.assembler() if streamed else None

    def feed(self, chunk: bytes) -> None:
        if self._events is None:
            self._chunks.append(chunk)
            return
        for event, data in self._events.feed(chunk):
            self._add(event, data)

    def _add(self, event, data: str) -> None:
        if data.startswith("[DONE]"):
            return
        try:
            parsed = json.loads(data)
        except ValueError:
            return
        if isinstance(parsed, dict):
            self._assembler.add(event, parsed)

    def finish(self) -> Reply | None:
        """The reply; None when a stream ended in an error (``StreamAssembler.failed``)."""
        if self._events is None:
            data = json.loads(b"".join(self._chunks) or b"{}")
            return self.api.reply(data if isinstance(data, dict) else {})
        for event, data in self._events.close():
            self._add(event, data)
        return self._assembler.reply()


# --- strategies: what to inject, what to store ------------------------------------------------


@dataclass
class Call:
    """One model call as an SDK is about to send it, for the agent of the active block."""

    agent: str
    api: ModelApi
    body: dict
    capture_only: bool = False
    # The timeout the SDK gives the call (seconds, an httpx ``Timeout``, None: none): what
    # memsvc may cost it before it is sent is no longer (``seconds_before``).
    timeout: object = None
    # Names the call's stores, so that a store sent again is stored once.
    turn: str = field(default_factory=lambda: uuid.uuid4().hex)
    query: str = field(init=False)
    # A tool loop's next step: its question was stored with the step that asked it.
    answers_tools: bool = field(init=False)
    asks: bool = field(init=False)

    def __post_init__(self):
        # (A text of nothing to read, " " or a zero-width space: memsvc refuses it.)
        query = self.api.query(self.body)
        self.query = "" if shows_nothing(query) else query
        self.answers_tools = self.api.answers_tools(self.body)
        self.asks = self.api.asks(self.body)

    def seconds_before(self, most: float) -> float:
        """How long memsvc's part before the call may take: ``most``, or the caller's own
        timeout when that is shorter (an httpx ``Timeout``'s ``read``: how long the caller
        waits for an answer). A memsvc slower than that must not make the call outlast it."""
        timeout = getattr(self.timeout, "read", self.timeout)
        if isinstance(timeout, int | float) and not isinstance(timeout, bool):
            return max(min(most, float(timeout)), 0.0)
        return most


class Strategy(Protocol):
    """What ``learning()`` does around a model call. The shells send ``context_request``
    (if any) before the call, pass its answer to ``prepare`` for the body actually sent
    (None: nothing was asked, or memsvc failed), and send ``stores`` in the background once
    the reply is known. A strategy is made per block, from the block's options."""

    def context_request(self, call: Call) -> ServerRequest | None: ...

    def prepare(self, call: Call, context: dict | None) -> dict: ...

    def stores(self, call: Call, reply: Reply) -> list[ServerRequest]: ...


# The longest text memsvc takes as one message or one context query
# (``MEMSVC_MAX_MESSAGE_CHARS``, by default): a longer turn (a pasted document) is stored,
# and asked about, by its first that many characters. It was refused (422), and the turn was
# neither in memory nor given any.
STORED_MAX_CHARS = 100_000


def storable(text: str) -> str:
    """What memsvc takes of a text: its first ``STORED_MAX_CHARS`` characters, a NUL or a
    lone surrogate (which no text there may hold) as U+FFFD. Refused, the turn was lost."""
    return _readable(text[:STORED_MAX_CHARS])


def _readable(text: str) -> str:
    """``text`` with a NUL or a lone surrogate as U+FFFD."""
    text = text.replace("\x00", "\ufffd")
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def readable_json(value):
    """Every text of a JSON value (keys too) ``_readable``: a reply's tool calls, whose
    arguments may hold what memsvc refuses (the reply was not stored; review), a tool's
    input and output (``memory_bank``)."""
    if isinstance(value, str):
        return _readable(value)
    if isinstance(value, dict):
        return {_readable(str(key)): readable_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [readable_json(item) for item in value]
    return value


class Recall:
    """The seed's strategy: one ``POST /context/{agent}`` (memory blocks, the relevant
    long-term memories and past messages) injected as memory; the user's message and the
    reply stored with ``POST /messages``."""

    stateless = True  # (its blocks of one agent serve a call alike: ``learning.serving``)

    def context_request(self, call):
        if call.capture_only or not call.query:
            return None
        # The name is one path segment: a "?", "#" or "%" of it is not the URL's.
        return ServerRequest(
            "POST",
            f"/context/{quote(call.agent, safe='')}",
            {"agent_name": call.agent, "query": storable(call.query)},
        )

    def prepare(self, call, context):
        text = format_context(context or {})
        return call.api.with_memory(call.body, text) if text else call.body

    def stores(self, call, reply):
        messages = []
        if call.asks and not call.answers_tools:
            # (A message of images only is a turn too: the reply is not left answering none.)
            messages.append(_message(call, "user", call.query or NO_TEXT_MESSAGE, None))
        text = call.api.prefilled(call.body) + reply.text
        text = "" if shows_nothing(text) else text
        if text or reply.tool_calls:
            messages.append(_message(call, "assistant", text or NO_TEXT_REPLY, reply.metadata))
        return messages


def _message(call: Call, role: str, content: str, metadata: dict | None) -> ServerRequest:
    return ServerRequest(
        "POST",
        "/messages",
        {
            "agent_name": call.agent,
            "role": role,
            "content": storable(content),
            "metadata": readable_json(metadata),
        },
        idempotency_key=f"learning:{call.turn}:{role}",
    )


# learning(strategy=NAME): the class made for each block.
STRATEGIES: dict[str, type] = {"recall": Recall}


def retry_after_seconds(response) -> float | None:
    """The seconds an answer's ``Retry-After`` asks for (a number of them), None when it
    asks none (or there is no answer): what memsvc's deferrals and a model's refusals say."""
    try:
        return max(float(response.headers["Retry-After"]), 0.0)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
