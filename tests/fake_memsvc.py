"""A stand-in memsvc for tests of ``learning()``'s request pattern, and for the client's own
cost in ``bench.learning --stand-in``: it answers the local API's shapes at once (or slowly,
or with an error) and records when each request came. It remembers nothing: tests of what
is remembered use the real memsvc."""

import time

from tests.local_http import LocalHttpServer, Reply


class StandInMemsvc:
    """A memsvc that answers the local API's shapes, records when each request came, and
    takes ``store_seconds`` to store a message and ``context_seconds`` to answer a context
    request (or answers ``context_reply``): to watch what a call waits for, not to remember
    anything."""

    def __init__(
        self,
        store_seconds: float = 0.0,
        context_reply: Reply | None = None,
        context_seconds: float = 0.0,
        port: int = 0,
    ):
        self.store_seconds = store_seconds
        self.context_reply = context_reply
        self.context_seconds = context_seconds
        self.log: list[tuple[float, str]] = []
        self.server = LocalHttpServer(self._respond, port=port)
        self.url = self.server.url

    def _respond(self, method, path, body) -> Reply:
        self.log.append((time.monotonic(), path))
        if path == "/messages":
            time.sleep(self.store_seconds)
            return Reply(payload={"id": "m", **body})
        if path.startswith("/context/"):
            time.sleep(self.context_seconds)
            return self.context_reply or Reply(
                payload={
                    "memory_blocks": [{"label": "human", "value": "Name: Alice"}],
                    "relevant_messages": [],
                    "memories": [],
                }
            )
        return Reply(payload={"status": "ok", "name": (body or {}).get("name")})

    def paths(self, before: float = float("inf")) -> list[str]:
        return [path for at, path in self.log if at < before]

    def __enter__(self):
        self.server.__enter__()
        return self

    def __exit__(self, *exc):
        self.server.__exit__(*exc)
