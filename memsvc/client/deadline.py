"""A sync request to memsvc over by a deadline as a whole. httpx's timeout holds for each read
and write: a memsvc sending a byte every 0.3 s held a call with a timeout of 1 s for 25 s
(review). Inside ``over_by(deadline)``, every read and write of the thread's request waits
at most until the deadline, and one past it fails as a timeout. (The async path bounds its
request with ``asyncio.wait_for``, ``session._by``.)"""

import contextlib
import ssl
import threading
import time
import urllib.request

import httpcore
import httpx

_local = threading.local()


@contextlib.contextmanager
def over_by(deadline: float):
    """The current thread's requests in the block end by ``deadline`` (``time.monotonic()``)."""
    outer = getattr(_local, "deadline", None)
    _local.deadline = deadline if outer is None else min(deadline, outer)
    try:
        yield
    finally:
        _local.deadline = outer


def _within(timeout: float | None, error: type[Exception]) -> float | None:
    """``timeout``, shortened to what is left before the thread's deadline (if any)."""
    deadline = getattr(_local, "deadline", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise error("memsvc did not answer within the call's timeout")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream):
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _within(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _within(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> "_Stream":
        timeout = _within(timeout, httpcore.ConnectTimeout)
        return _Stream(self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str):
        return self._stream.get_extra_info(info)


class _Backend(httpcore.SyncBackend):
    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        timeout = _within(timeout, httpcore.ConnectTimeout)
        return _Stream(super().connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        timeout = _within(timeout, httpcore.ConnectTimeout)
        return _Stream(super().connect_unix_socket(path, timeout, socket_options))


def transport(ssl_context: ssl.SSLContext) -> httpx.HTTPTransport:
    """httpx's transport, its connections on the deadline-keeping backend (httpx takes no
    backend of its own: its pool is made again with one, httpx's default limits kept)."""
    made = httpx.HTTPTransport(verify=ssl_context)
    made._pool = httpcore.ConnectionPool(
        ssl_context=ssl_context,
        max_connections=100,
        max_keepalive_connections=20,
        keepalive_expiry=5.0,
        network_backend=_Backend(),
    )
    return made


def proxied(url: str) -> bool:
    """Whether httpx sends requests to ``url`` through a proxy the environment names
    (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, not ``NO_PROXY``'s)."""
    parsed = httpx.URL(url)
    proxies = urllib.request.getproxies_environment()
    if not (proxies.get(parsed.scheme) or proxies.get("all")):
        return False  # (a NO_PROXY alone, another scheme's proxy: review)
    return not urllib.request.proxy_bypass_environment(parsed.host, proxies)
