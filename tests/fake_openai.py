"""A local OpenAI-compatible server for tests: it records every request body and answers with
canned completions (streamed too). The LLM is outside memsvc, so it is faked at the HTTP
level; the real ``openai`` package talks to it."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeOpenAI:
    def __init__(self, reply: str = "Use Python, Alice."):
        self.reply = reply
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append({"path": self.path, "body": body})
                if self.path.endswith("/chat/completions"):
                    if body.get("stream"):
                        return self._stream(fake._chat_chunks(body))
                    return self._json(fake._chat(body))
                if self.path.endswith("/responses"):
                    return self._json(fake._response(body))
                self.send_error(404)

            def _json(self, payload):
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, chunks):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in [*(json.dumps(c) for c in chunks), "[DONE]"]:
                    data = f"data: {chunk}\n\n".encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    # canned answers

    def _chat(self, body):
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self.reply},
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

    def system_messages(self, index: int = -1) -> list[str]:
        body = self.requests[index]["body"]
        return [m["content"] for m in body.get("messages", []) if m["role"] == "system"]
