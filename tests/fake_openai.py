"""A local OpenAI-compatible server for tests: it records every request body and answers with
canned completions (streamed too), or with what a test set for requests that contain some
text (``answer``). The LLM is outside memsvc, so it is faked at the HTTP level; the real
``openai`` package talks to it."""

import json
import time

from tests.local_http import LocalHttpServer, Reply


class FakeOpenAI:
    def __init__(self, reply: str = "Use Python, Alice."):
        self.reply = reply
        self.answers: dict[str, str | Reply] = {}
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

    def _answer_for(self, body) -> "str | Reply | None":
        text = _chat_text(body)
        return next((a for marker, a in self.answers.items() if marker in text), None)

    def _respond(self, method, path, body) -> Reply:
        if path.endswith("/chat/completions"):
            answer = self._answer_for(body)
            if isinstance(answer, Reply):
                return answer
            if answer is not None:
                return Reply(payload=self._chat(body, answer))
            if body.get("stream"):
                chunks = [json.dumps(chunk) for chunk in self._chat_chunks(body)]
                return Reply(events=[*chunks, "[DONE]"])
            return Reply(payload=self._chat(body))
        if path.endswith("/responses"):
            return Reply(payload=self._response(body))
        return Reply(status=404, payload={"error": {"message": f"no route {path}"}})

    # canned answers

    def _chat(self, body, reply: str | None = None):
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": self.reply if reply is None else reply,
                    },
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def _chat_chunks(self, body):
        words = self.reply.split(" ")
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
