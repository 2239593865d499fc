"""A load client's HTTP/1.1 connection that costs the machine as little as it can.

``bench.load`` runs its clients on the machine it measures, so every millisecond of CPU a
client spends on a request is taken from the service under test. httpx's ``AsyncClient``
spent 2.0-4.1 ms of CPU a request (its pool, its models of requests and responses, header
normalisation): at the 80-140 requests/s of two cores, a tenth to a fifth of the machine.
This one spends 0.6 ms (both measured by ``bench.load`` itself). A connection here writes one prepared block of bytes and reads the status line, the headers
and a ``Content-Length`` or chunked body: what a load generator needs, and nothing else
(no redirects, no cookies, no compression, no TLS).

One ``Connection`` is one kept-alive TCP connection, used by one client at a time. A
transport failure closes it, raises ``ConnectionLost``, and the next request opens a new one.
"""

import asyncio
from urllib.parse import urlsplit


class ConnectionLost(Exception):
    """The request's connection failed before its whole response was read."""


class Connection:
    def __init__(self, url: str, headers: dict[str, str], timeout: float):
        parts = urlsplit(url)
        if parts.scheme != "http":
            raise ValueError(f"a lean connection speaks plain HTTP only, not {url}")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")  # (a server mounted under a path)
        self.timeout = timeout
        fixed = {"Host": f"{self.host}:{self.port}", "Content-Type": "application/json", **headers}
        self._fixed = "".join(f"{name}: {value}\r\n" for name, value in fixed.items()).encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(
        self, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """(status, body) of ``POST path``; ``ConnectionLost`` when the transport fails."""
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        request = b"".join(
            (
                f"POST {self.prefix}{path} HTTP/1.1\r\n".encode(),
                self._fixed,
                extra.encode(),
                f"Content-Length: {len(body)}\r\n\r\n".encode(),
                body,
            )
        )
        try:
            return await asyncio.wait_for(self._exchange(request), self.timeout)
        except (OSError, EOFError, ValueError, asyncio.IncompleteReadError, TimeoutError) as exc:
            self.close()
            raise ConnectionLost(type(exc).__name__) from exc

    async def _exchange(self, request: bytes) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self._writer.write(request)
        reader = self._reader
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        if "chunked" in fields.get("transfer-encoding", "").lower():
            body = await self._chunked(reader)
        elif "content-length" in fields:
            body = await reader.readexactly(int(fields["content-length"]))
        else:  # (delimited by the end of the connection)
            body = await reader.read()
            fields["connection"] = "close"
        if fields.get("connection", "").lower() == "close":
            self.close()
        return status, body

    @staticmethod
    async def _chunked(reader: asyncio.StreamReader) -> bytes:
        chunks = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers are sent to a load client
                return b"".join(chunks)
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
