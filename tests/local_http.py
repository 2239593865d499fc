"""A small HTTP server on 127.0.0.1 for tests that stand in for outside services (an OIDC
key set, an embedding API, an LLM). It records every request and answers through a
``respond(method, path, body) -> Reply`` callback (``respond(method, path, body, headers)``
with ``pass_headers=True``)."""

import contextlib
import json
import socket
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    status: int = 200
    payload: object = None  # JSON-able, or bytes sent as they are
    # server-sent events, streamed in order: data, or (event name, data), or bytes as they are
    events: Iterable[str | tuple[str, str]] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> bytes:
        return (
            self.payload if isinstance(self.payload, bytes) else json.dumps(self.payload).encode()
        )


@dataclass
class Recorded:
    method: str
    path: str
    body: dict | None = field(default=None)
    headers: dict[str, str] = field(default_factory=dict)
    client_port: int = 0  # which connection of the client's it came on


class _Server(ThreadingHTTPServer):
    # Connections waiting to be accepted: the default 5 reset some of a hundred opened at
    # once (a client's whole pool).
    request_queue_size = 128

    def __init__(self, *args):
        super().__init__(*args)
        self.connections: set[socket.socket] = set()

    def process_request(self, request, client_address):
        self.connections.add(request)
        super().process_request(request, client_address)

    def server_close(self):
        """Stopped as a server stops: its kept-alive connections closed too (their threads
        went on answering on them)."""
        self.closed = True
        super().server_close()
        for connection in list(self.connections):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request, client_address):
        # A connection closed under its thread by ``server_close`` is no error of the test's:
        # its traceback went to whichever test ran next, into its captured output.
        if getattr(self, "closed", False) and isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class LocalHttpServer:
    def __init__(self, respond: Callable[..., Reply], *, pass_headers: bool = False, port: int = 0):
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # The headers and the body are two writes: with Nagle's algorithm the second
            # waits for the client's delayed ACK (~40 ms) on a kept-alive connection.
            disable_nagle_algorithm = True

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                headers = dict(self.headers.items())
                with server._lock:
                    server.requests.append(
                        Recorded(self.command, self.path, body, headers, self.client_address[1])
                    )
                reply = respond(self.command, self.path, body, *([headers] if pass_headers else []))
                if reply.events is not None:
                    return self._stream(reply.events)
                data = reply.body()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _handle

            def _stream(self, events):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in events:
                    if isinstance(event, bytes):  # sent as it is (an SSE comment, say)
                        data = event
                    else:
                        name, event = event if isinstance(event, tuple) else (None, event)
                        data = (f"event: {name}\n" if name else "").encode()
                        data += f"data: {event}\n\n".encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

            def log_message(self, *args):
                pass

        self.httpd = _Server(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)
