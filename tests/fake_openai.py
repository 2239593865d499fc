"""A local stand-in LLM for tests: it speaks OpenAI's chat completions and Responses API
and Anthropic's Messages API, records every request body and answers with canned replies
(streamed too, as each API streams), or with what a test set for requests that contain
some text (``answer``). A request for structured output (a JSON schema) is answered with
JSON that fits the schema. The LLM is outside memsvc, so it is faked at the HTTP level; the
real ``openai`` and ``anthropic`` packages talk to it (``base_url`` and
``anthropic_base_url``)."""

import json
import time
import uuid
from dataclasses import dataclass, field

from tests.local_http import LocalHttpServer, Reply


@dataclass
class ToolCall:
    """A tool call the stand-in model answers with (``FakeOpenAI.then``, ``call_tool``)."""

    name: str
    arguments: dict = field(default_factory=dict)
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:12]}")

    def as_json(self) -> dict:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }


class FakeOpenAI:
    def __init__(self, reply: str = "Use Python, Alice."):
        self.reply = reply
        self.answers: dict[str, str | Reply] = {}
        self.tool_calls: dict[str, tuple[str, dict]] = {}
        self.refusals: dict[str, str] = {}
        self.script: list[str | list[ToolCall]] = []
        self.server = LocalHttpServer(self._respond)
        self.requests = self.server.requests
        self.base_url = f"{self.server.url}/v1"
        self.anthropic_base_url = self.server.url

    def __enter__(self):
        self.server.__enter__()
        return self

    def __exit__(self, *exc):
        self.server.__exit__(*exc)

    def answer(self, containing: str, reply: "str | Reply") -> None:
        """Answer requests whose messages contain ``containing`` with ``reply``: the model's
        text, or a whole HTTP reply (an error)."""
        self.answers[containing] = reply

    def refuse(self, containing: str, refusal: str) -> None:
        """Decline chat completions and responses that contain ``containing``: no content
        but ``refusal`` (streamed as ``delta.refusal`` chunks, or ``response.refusal.delta``
        events, when asked)."""
        self.refusals[containing] = refusal

    def call_tool(self, containing: str, name: str, arguments: dict) -> None:
        """Answer requests that contain ``containing`` with a call of the tool ``name``."""
        self.tool_calls[containing] = (name, arguments)

    def then(self, *replies: "str | list[ToolCall]") -> None:
        """Answer the next chat completions that no ``answer`` matches, in order: the model's
        text (streamed when asked), or a list of tool calls (an agent loop's steps)."""
        self.script.extend(replies)

    def _answer_for(self, body) -> "str | Reply | None":
        text = _chat_text(body)
        return next((a for marker, a in self.answers.items() if marker in text), None)

    def _scripted(self, body) -> "str | list[ToolCall] | None":
        return self.script.pop(0) if self.script else None

    def _tool_call_for(self, body) -> tuple[str, dict] | None:
        text = _chat_text(body)
        return next((c for marker, c in self.tool_calls.items() if marker in text), None)

    def _respond(self, method, path, body) -> Reply:
        path = path.split("?", 1)[0]
        answer = self._answer_for(body or {})
        if isinstance(answer, Reply):
            return answer
        if path.endswith("/chat/completions"):
            text = _chat_text(body)
            refusal = next((r for marker, r in self.refusals.items() if marker in text), None)
            if refusal is not None:
                if body.get("stream"):
                    chunks = self._chat_chunks(body, refusal, field="refusal")
                    return _sse(json.dumps(chunk) for chunk in chunks)
                payload = self._chat(body, None)
                payload["choices"][0]["message"]["refusal"] = refusal
                return Reply(payload=payload)
            if answer is not None:  # a test's answer, never streamed (as before)
                return Reply(payload=self._chat(body, answer))
            scripted = self._scripted(body)
            if isinstance(scripted, list):
                return Reply(payload=self._chat(body, None, scripted))
            text = scripted if scripted is not None else self._text(body, _chat_schema(body))
            if body.get("stream"):
                return _sse(json.dumps(chunk) for chunk in self._chat_chunks(body, text))
            call = self._tool_call_for(body)
            calls = [ToolCall(*call, id="call_test")] if call is not None else None
            return Reply(payload=self._chat(body, text, calls))
        if path.endswith("/responses"):
            text = answer if answer is not None else self._text(body, _responses_schema(body))
            part = "output_text"
            refusal = next((r for m, r in self.refusals.items() if m in _chat_text(body)), None)
            if refusal is not None:
                text, part = refusal, "refusal"
            if body.get("stream"):
                events = self._response_events(body, text, part)
                return _sse((e["type"], json.dumps(e)) for e in events)
            return Reply(payload=self._response(body, text, part=part))
        if path.endswith("/v1/messages"):
            text = answer if answer is not None else self._text(body, _anthropic_schema(body))
            call = self._tool_call_for(body)
            if body.get("stream"):
                return _sse((e["type"], json.dumps(e)) for e in self._message_events(body, text))
            return Reply(payload=self._message(body, text, call))
        return Reply(status=404, payload={"error": {"message": f"no route {path}"}})

    def _text(self, body, schema: dict | None) -> str:
        """The canned reply, or JSON fitting the requested schema."""
        if schema is None:
            return self.reply
        return json.dumps(_instance_of(schema, schema.get("$defs") or {}, self.reply))

    # OpenAI chat completions

    def _chat(self, body, reply: str | None, tool_calls: list[ToolCall] | None = None):
        message = {"role": "assistant", "content": reply}
        if tool_calls:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [call.as_json() for call in tool_calls],
            }
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if tool_calls else "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def _chat_chunks(self, body, text: str, field: str = "content"):
        words = text.split(" ")
        for index, word in enumerate(words):
            yield {
                "id": "chatcmpl-test",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "delta": {field: word if index == 0 else f" {word}"},
                        "finish_reason": None if index < len(words) - 1 else "stop",
                    }
                ],
            }
        if (body.get("stream_options") or {}).get("include_usage"):
            yield {
                "id": "chatcmpl-test",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }

    # OpenAI Responses

    def _response(self, body, text: str, status: str = "completed", part: str = "output_text"):
        return {
            "id": "resp_test",
            "object": "response",
            "created_at": int(time.time()),
            "model": body["model"],
            "status": status,
            "output": [self._output_message(text, part=part)] if status == "completed" else [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }

    def _output_message(self, text: str, status: str = "completed", part: str = "output_text"):
        return {
            "type": "message",
            "id": "msg_test",
            "role": "assistant",
            "status": status,
            "content": [_part(part, text)] if status == "completed" else [],
        }

    def _response_events(self, body, text: str, part: str = "output_text"):
        """The events of a streamed response: its text (``part`` "output_text"), or a
        refusal ("refusal")."""
        where = {"item_id": "msg_test", "output_index": 0, "content_index": 0}
        done, logprobs = ("refusal", {}) if part == "refusal" else ("text", {"logprobs": []})
        events = [
            {"type": "response.created", "response": self._response(body, "", "in_progress")},
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": self._output_message("", "in_progress"),
            },
            {"type": "response.content_part.added", **where, "part": _part(part, "")},
            *(
                {"type": f"response.{part}.delta", **where, "delta": delta, **logprobs}
                for delta in _deltas(text)
            ),
            {"type": f"response.{part}.done", **where, done: text, **logprobs},
            {"type": "response.content_part.done", **where, "part": _part(part, text)},
            {
                "type": "response.output_item.done",
                "output_index": 0,
                "item": self._output_message(text, part=part),
            },
            {"type": "response.completed", "response": self._response(body, text, part=part)},
        ]
        return [{**event, "sequence_number": n} for n, event in enumerate(events)]

    # Anthropic Messages

    def _message(self, body, text: str, tool_call: tuple[str, dict] | None = None, content=None):
        if content is None:
            content = [{"type": "text", "text": text}]
            if tool_call is not None:
                name, arguments = tool_call
                content = [
                    {"type": "tool_use", "id": "toolu_test", "name": name, "input": arguments}
                ]
        return {
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": "end_turn" if tool_call is None else "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }

    def _message_events(self, body, text: str):
        yield {"type": "message_start", "message": {**self._message(body, "", content=[])}}
        yield {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        }
        yield {"type": "ping"}
        for delta in _deltas(text):
            yield {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": delta},
            }
        yield {"type": "content_block_stop", "index": 0}
        yield {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 1},
        }
        yield {"type": "message_stop"}

    # what the model was asked

    def requests_containing(self, text: str) -> list[dict]:
        """The bodies of the requests whose messages contain ``text``."""
        return [r.body for r in self.requests if r.body and text in _chat_text(r.body)]

    def system_messages(self, index: int = -1) -> list[str]:
        body = self.requests[index].body
        return [m["content"] for m in body.get("messages", []) if m["role"] == "system"]


def _sse(events) -> Reply:
    """Server-sent events; OpenAI's chat stream ends with ``[DONE]``, the others do not."""
    events = list(events)
    if events and isinstance(events[0], str):
        events.append("[DONE]")
    return Reply(events=events)


def _part(kind: str, text: str) -> dict:
    """A Responses message's content part: text, or a refusal."""
    if kind == "refusal":
        return {"type": "refusal", "refusal": text}
    return {"type": "output_text", "text": text, "annotations": []}


def _deltas(text: str) -> list[str]:
    words = text.split(" ")
    return [word if index == 0 else f" {word}" for index, word in enumerate(words)]


def _chat_text(body: dict) -> str:
    """Everything the model is told: messages, and the Responses ``input`` and
    ``instructions`` and Anthropic's ``system``."""
    parts = [str(m.get("content")) for m in body.get("messages", []) if isinstance(m, dict)]
    for key in ("system", "instructions", "input"):
        if body.get(key):
            parts.append(str(body[key]))
    return "\n".join(parts)


# structured outputs


def _chat_schema(body) -> dict | None:
    response_format = body.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        return (response_format.get("json_schema") or {}).get("schema")
    return None


def _responses_schema(body) -> dict | None:
    text_format = (body.get("text") or {}).get("format") or {}
    return text_format.get("schema") if text_format.get("type") == "json_schema" else None


def _anthropic_schema(body) -> dict | None:
    output_format = (body.get("output_config") or {}).get("format") or {}
    return output_format.get("schema") if output_format.get("type") == "json_schema" else None


def _instance_of(schema: dict, defs: dict, text: str):
    """A value that fits a JSON schema (as Pydantic writes them); strings are ``text``."""
    if "$ref" in schema:
        return _instance_of(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, text)
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            choices = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return _instance_of(choices[0], defs, text)
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: _instance_of(sub, defs, text) for name, sub in properties.items()}
    if kind == "array":
        return [_instance_of(schema.get("items") or {"type": "string"}, defs, text)]
    return {"integer": 1, "number": 1.5, "boolean": True, "null": None}.get(kind, text)


def down_for_one_call(monkeypatch, module, name: str = "chat") -> list:
    """``module.<name>`` (a reader's way to the LLM) fails its next call as a model that is
    down for a moment (a transient ``LLMError``), then asks the stand-in as before. The list
    is empty once that call has come."""
    from memsvc.llm import LLMError

    model, down = getattr(module, name), [True]

    def down_once(messages):
        if down:
            down.pop()
            raise LLMError("overloaded", transient=True)
        return model(messages)

    monkeypatch.setattr(module, name, down_once)
    return down
