"""A local OpenAI-compatible server for tests: it records every request body and answers with
canned completions (streamed too), or with what a test set for requests that contain some
text (``answer``). The LLM is outside memsvc, so it is faked at the HTTP level; the real
``openai`` package talks to it."""

import json
import time
import uuid
from dataclasses import dataclass, field

from tests.local_http import LocalHttpServer, Reply


@dataclass
class ToolCall:
    """A tool call the stand-in model answers with (``FakeOpenAI.then``)."""

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
        self.script: list[str | list[ToolCall]] = []
        self.server = LocalHttpServer(self._respond)
        self.requests = self.server.requests
        self.base_url = f"{self.server.url}/v1"

    def __enter__(self):
        self.server.__enter__()
        return self

    def __exit__(self, *exc):
        self.server.__exit__(*exc)

    def answer(self, containing: str, reply: "str | Reply") -> None:
        """Answer chat completions whose messages contain ``containing`` with ``reply``: the
        model's text, or a whole HTTP reply (an error)."""
        self.answers[containing] = reply

    def then(self, *replies: "str | list[ToolCall]") -> None:
        """Answer the next chat completions (that no ``answer`` matches), in order: the
        model's text, or a list of tool calls (an agent loop's steps)."""
        self.script.extend(replies)

    def _answer_for(self, body) -> "str | list[ToolCall] | Reply | None":
        text = _chat_text(body)
        answer = next((a for marker, a in self.answers.items() if marker in text), None)
        if answer is None and self.script:
            answer = self.script.pop(0)
        return answer

    def _respond(self, method, path, body) -> Reply:
        if path.endswith("/chat/completions"):
            answer = self._answer_for(body)
            if isinstance(answer, Reply):
                return answer
            if body.get("stream") and not isinstance(answer, list):
                chunks = [json.dumps(chunk) for chunk in self._chat_chunks(body, answer)]
                return Reply(events=[*chunks, "[DONE]"])
            return Reply(payload=self._chat(body, answer))
        if path.endswith("/responses"):
            return Reply(payload=self._response(body))
        return Reply(status=404, payload={"error": {"message": f"no route {path}"}})

    # canned answers

    def _chat(self, body, reply: "str | list[ToolCall] | None" = None):
        if isinstance(reply, list):
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [call.as_json() for call in reply],
            }
            finish_reason = "tool_calls"
        else:
            message = {"role": "assistant", "content": self.reply if reply is None else reply}
            finish_reason = "stop"
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def _chat_chunks(self, body, reply: str | None = None):
        words = (self.reply if reply is None else reply).split(" ")
        for index, word in enumerate(words):
            yield {
                "id": "chatcmpl-test",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": word if index == 0 else f" {word}"},
                        "finish_reason": None if index < len(words) - 1 else "stop",
                    }
                ],
            }

    def _response(self, body):
        return {
            "id": "resp_test",
            "object": "response",
            "created_at": int(time.time()),
            "model": body["model"],
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "id": "msg_test",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": self.reply, "annotations": []}],
                }
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }

    # what the model was asked

    def requests_containing(self, text: str) -> list[dict]:
        """The bodies of the chat requests whose messages contain ``text``."""
        return [r.body for r in self.requests if r.body and text in _chat_text(r.body)]

    def system_messages(self, index: int = -1) -> list[str]:
        body = self.requests[index].body
        return [m["content"] for m in body.get("messages", []) if m["role"] == "system"]


def _chat_text(body: dict) -> str:
    return "\n".join(str(m.get("content")) for m in body.get("messages", []))
