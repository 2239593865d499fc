"""``learning()``, the context manager: where memsvc is, which agent and strategy serve the
calls of a block, and its two requests to memsvc that are not stores (the check at entry,
the context before each call)."""

import asyncio
import atexit
import logging
import os
import ssl
import threading
import time

import httpx

from memsvc.client import hooks
from memsvc.client.core import (
    KEY_HEADER,
    STRATEGIES,
    Call,
    ServerRequest,
    retry_after_seconds,
)
from memsvc.client.deadline import over_by, proxied, transport
from memsvc.client.sender import DEFERRED, RETRY_STATUSES, Destination, sender

logger = logging.getLogger("memsvc.client")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8283
TIMEOUT_SECONDS = 10.0
# A caller's timeout under this is in a hurry: memsvc not answering within it is not down.
HURRIED_SECONDS = 1.0
# A server bound to every address is reached on this machine's loopback.
ANY_ADDRESS = {"0.0.0.0", "::", "[::]", ""}  # noqa: S104 (compared with, never bound)


# learning(strategy="memory_bank"): long tool-using tasks kept inside the context window
# (memsvc.memory_bank; its options are task_id, top_k and max_chars_per_record).
MEMORY_BANK = "memory_bank"


def _at_exit() -> None:
    """The interpreter's exit: what a stream left half-read has shown is stored, then
    everything queued is sent (a block's exit only sends: a stream may be read after it)."""
    hooks.finish_reading()
    sender.flush()


atexit.register(_at_exit)


# What a memsvc answers when it cannot serve now, to try again later: a rate limit, a
# failure of its own, a proxy's or a gateway's (the answers the sender sends again).
NOT_NOW = frozenset({DEFERRED, *RETRY_STATUSES})


class MemoryServerUnavailable(RuntimeError):
    """memsvc did not answer when a ``learning()`` block began."""


class AgentRefused(MemoryServerUnavailable):
    """memsvc answered when a ``learning()`` block began, and refused its agent (a name it
    does not take, an API key for another agent or without the scope, ...): the message
    gives memsvc's reason. A ``MemoryServerUnavailable``: memsvc serves no memory to this
    block."""


def server_url_from_env(environ=None) -> str:
    """``MEMORY_SERVER_URL``, else ``http://MEMORY_SERVER_HOST:MEMORY_SERVER_PORT`` (the
    variables ``memsvc serve`` itself reads), else http://127.0.0.1:8283."""
    environ = os.environ if environ is None else environ
    url = environ.get("MEMORY_SERVER_URL", "").strip()
    if url:
        return url.rstrip("/")
    host = environ.get("MEMORY_SERVER_HOST", "").strip()
    host = DEFAULT_HOST if host in ANY_ADDRESS else host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    port = environ.get("MEMORY_SERVER_PORT", "").strip() or DEFAULT_PORT
    return f"http://{host}:{port}"


class learning:
    """Give the OpenAI and Anthropic clients memory while the block runs (``with`` or
    ``async with``).

    ``agent`` names the memory; ``server_url`` defaults to ``MEMORY_SERVER_URL``, else
    ``MEMORY_SERVER_HOST``/``MEMORY_SERVER_PORT``, else http://127.0.0.1:8283;
    ``capture_only`` stores conversations without injecting memory; ``api_key`` (or
    ``MEMSVC_API_KEY``) is needed when memsvc is not on this machine; ``strategy`` chooses
    what is injected and stored (``"recall"``: the seed's; ``"memory_bank"``: tool records
    and a compressed context for long tool-using tasks, with ``task_id``, ``top_k`` and
    ``max_chars_per_record``). Blocks nest: the innermost one's agent serves the calls made
    inside it.
    """

    def __init__(
        self,
        agent: str,
        server_url: str | None = None,
        capture_only: bool = False,
        api_key: str | None = None,
        strategy: str = "recall",
        task_id: str | None = None,
        top_k: int | None = None,
        max_chars_per_record: int | None = None,
    ):
        if strategy not in (*STRATEGIES, MEMORY_BANK):
            choices = ", ".join((*STRATEGIES, MEMORY_BANK))
            raise ValueError(f"unknown strategy {strategy!r}; one of {choices}")
        self.agent = agent
        self.capture_only = capture_only
        self.reads = True  # (False once memsvc refused its key the memory: 403)
        if strategy == MEMORY_BANK:
            from memsvc import memory_bank

            bank = memory_bank.MemoryBank(
                agent,
                task_id=task_id,
                top_k=memory_bank.DEFAULT_TOP_K if top_k is None else top_k,
                max_chars_per_record=memory_bank.DEFAULT_MAX_CHARS_PER_RECORD
                if max_chars_per_record is None
                else max_chars_per_record,
            )
            self.strategy = memory_bank.MemoryBankStrategy(self, bank)
        else:
            self.strategy = STRATEGIES[strategy]()
        self.url = (server_url or server_url_from_env()).rstrip("/")
        api_key = api_key or os.environ.get("MEMSVC_API_KEY")
        self.destination = Destination(self.url, (("X-API-Key", api_key),) if api_key else ())
        self._client: _KeptClient | None = None  # the ``with`` block's
        # One block object may be entered again while in it (nested, or in another thread):
        # it opens its client at the first entry and closes it at the last exit (an inner
        # exit closed the outer block's client, and its calls went without memory).
        self._entries = 0
        self._entries_lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None
        # ``async with``: the loop that entered the block and, once a call asked for
        # context, its client (kept alive: a call does not open a connection of its own).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kept: _KeptClient | None = None

    @property
    def serving(self) -> tuple:
        """What the block does with a call: blocks alike serve a call alike. A strategy that
        keeps a state of its block's (the memory bank's task) is its block's alone: another
        block's worker would have written into its task (review)."""
        strategy = self.strategy
        return (
            self.agent,
            self.destination,
            self.capture_only,
            type(strategy).__name__ if getattr(strategy, "stateless", False) else id(strategy),
        )

    # with / async with

    def __enter__(self):
        self._enter()
        hooks.activate(self)
        return self

    def __exit__(self, *exc):
        hooks.deactivate(self)
        last, client = self._leave()
        self._send_and_close(client, last=last)
        return False

    # The entry's checks and the exit's flush are blocking HTTP: off the event loop, which
    # the program's other tasks share. The block is (de)activated in the task itself (its
    # context says which blocks it is in, ``hooks.current_session``).

    async def __aenter__(self):
        await asyncio.to_thread(self._enter)
        self._loop = self._loop or asyncio.get_running_loop()
        hooks.activate(self)
        return self

    async def __aexit__(self, *exc):
        hooks.deactivate(self)
        # Counted off here, on the loop: two exits at once each read the count before
        # either thread had lowered it, and neither let go of the kept client (review).
        last, client = self._leave()
        try:
            if last:  # what the first entry kept goes
                kept, loop, self._kept, self._loop = self._kept, self._loop, None, None
                # Closed on the loop that made it; from another (the object entered on two
                # loops, the first one gone: "Event loop is closed", review) only dropped.
                if kept is not None and loop is asyncio.get_running_loop():
                    await kept.alet_go()
        except Exception as exc:  # (leaving the block never fails the program)
            logger.warning("memsvc: could not close a connection to memsvc (%s)", exc)
        finally:  # (the stores are sent, whatever closing the client raised)
            await asyncio.to_thread(self._send_and_close, client, last=last)
        return False

    def forked(self) -> None:
        """In a child process this block was forked inside (``hooks._forked``): a client of
        its own, made when it first asks memsvc (made at the fork, an SSL context for each
        block cost every fork 25 ms, one that execs at once too: review), and a lock no
        other thread of the parent may hold."""
        self._entries_lock = threading.Lock()
        self._kept, self._loop = None, None  # (an event loop does not survive a fork)
        self._client = None  # (the parent's connections are the parent's)

    @property
    def _http(self) -> "_KeptClient":
        """The block's client (a forked child's, made now); once the block has ended (a call
        of a worker it started, still asking), one of the request's own, closed as it ends
        (kept, it was never closed: review)."""
        with self._entries_lock:
            if self._client is not None:
                return self._client
            if not self._entries:
                return _KeptClient(self._new_client(), one_off=True)
            self._client = _KeptClient(self._new_client())
            return self._client

    def _enter(self) -> None:
        with self._entries_lock:
            if self._entries == 0:
                self._kept, self._loop = None, None  # (a loop of an earlier entry is gone)
                self._open()
            self._entries += 1

    def _leave(self) -> tuple[bool, "_KeptClient | None"]:
        """One entry ends: whether it was the last, and then the client to let go of."""
        with self._entries_lock:
            self._entries -= 1
            if self._entries:
                return False, None
            client, self._client = self._client, None
            return True, client

    def _send_and_close(self, client: "_KeptClient | None", *, last: bool) -> None:
        """What the entry stored is sent (and, at the ``last`` exit, what its strategy held
        back: ``leaving``; at an inner one, the outer block's steps go on with it: code
        review); ``client`` (the last exit's) let go of."""
        try:
            leaving = getattr(self.strategy, "leaving", None)
            if last and leaving is not None:
                leaving()
            self.flush()
        finally:
            if client is not None:
                client.let_go()

    def _new_client(self) -> httpx.Client:
        # Through a proxy of the environment's (which a transport given to httpx would
        # bypass: review), httpx's own, whose timeout holds for each read.
        return httpx.Client(
            base_url=self.url,
            headers=dict(self.destination.headers),
            timeout=TIMEOUT_SECONDS,
            verify=self._ssl_context(),
            transport=None if proxied(self.url) else transport(self._ssl_context()),
        )

    def _ssl_context(self) -> ssl.SSLContext:
        # Every client shares one TLS context: making that is what costs (~20 ms).
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _open(self) -> None:
        # (Without one, "localhost:8283" was "not reachable ... start it": review.)
        if not self.url.lower().startswith(("http://", "https://")):
            raise self._no_url("it starts with neither http:// nor https://")
        try:
            client = self._client = _KeptClient(self._new_client())
        except httpx.InvalidURL as exc:  # ("MEMORY_SERVER_PORT=abc": review)
            raise self._no_url(exc) from exc
        try:
            self._check()
        except BaseException:
            self._client = None
            client.let_go()
            raise

    def _no_url(self, why) -> "MemoryServerUnavailable":
        return MemoryServerUnavailable(
            f"memsvc's address {self.url!r} is no URL ({why}): see MEMORY_SERVER_URL, "
            "MEMORY_SERVER_HOST and MEMORY_SERVER_PORT"
        )

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until what the block stored so far has reached memsvc (or been dropped
        because memsvc does not answer); False if ``timeout`` seconds were not enough. (What
        blocks stored in another memsvc is not waited for.)"""
        if timeout is None:
            return sender.flush(destination=self.destination)
        return sender.flush(timeout, destination=self.destination)

    def _check(self) -> None:
        try:
            health = self._client.client.get("/health")
        # (A host name no resolver takes, "a" * 64 or "xn--zz": the IDNA codec's error.)
        except (httpx.HTTPError, UnicodeError) as exc:
            raise MemoryServerUnavailable(
                f"memsvc is not reachable at {self.url} ({exc}). Start it with "
                "`./scripts/serve` in the memsvc checkout (or `memsvc serve`), or set "
                "MEMORY_SERVER_URL (or MEMORY_SERVER_PORT) to where it runs."
            ) from exc
        if health.is_error:  # (a server answers there: "start it" would mislead)
            raise MemoryServerUnavailable(
                f"memsvc at {self.url} answered its health check with "
                f"{health.status_code}: {_reason(health)}"
            )
        try:
            response = self._client.client.post("/agents", json={"name": self.agent})
        except httpx.HTTPError as exc:
            raise MemoryServerUnavailable(f"memsvc at {self.url} did not answer ({exc})") from exc
        if response.status_code in NOT_NOW:
            # Busy, or unable to serve now (its database down): no refusal of the agent
            # (it said "refused the agent" of a rate limit's 429; review).
            retry = retry_after_seconds(response)
            raise MemoryServerUnavailable(
                f"memsvc at {self.url} cannot serve the agent {self.agent!r} now "
                f"({response.status_code}: {_reason(response)})"
                + (f"; try again in {retry:g} s" if retry is not None else "")
            )
        if response.is_error:
            raise AgentRefused(
                f"memsvc at {self.url} refused the agent {self.agent!r} "
                f"({response.status_code}: {_reason(response)})"
            )
        # It answers: a block entered as it came back gives memory and stores at once, not
        # after what is left of a down server's quiet time (review).
        sender.mark_answered(self.url)

    # what the hooks call

    # Before asking for context, what earlier calls stored must have arrived: the model
    # remembers the previous turn even when the next call follows at once (usually the
    # sender finished long before: a model call takes longer than two stores). Waiting for
    # them and the context request share one deadline: the caller's timeout when it is
    # shorter than ours (``Call.seconds_before``), so that a slow memsvc never makes the
    # call outlast the timeout its caller gave it.

    def fetch_context(self, call: Call) -> dict | None:
        request = self.strategy.context_request(call)
        if request is None or not self.reads or sender.is_down(self.url):
            return None
        deadline = self.deadline(call)
        if sender.busy(self.destination):
            sender.flush(
                time_left(deadline, quiet=True),
                quiet=True,
                destination=self.destination,
                until_held_back=True,
            )
        sent_at = time.monotonic()
        try:
            response = self.request(request.method, request.path, request.json, deadline=deadline)
            return self.answer_of(response)
        except httpx.HTTPError as exc:
            return self.no_context(call, exc, sent_at)

    async def afetch_context(self, call: Call) -> dict | None:
        request = self.strategy.context_request(call)
        if request is None or not self.reads or sender.is_down(self.url):
            return None
        deadline = self.deadline(call)
        if sender.busy(self.destination):
            await asyncio.to_thread(
                sender.flush,
                time_left(deadline, quiet=True),
                quiet=True,
                destination=self.destination,
                until_held_back=True,
            )
        sent_at = time.monotonic()
        try:
            response = await self.arequest(
                request.method, request.path, request.json, deadline=deadline
            )
            return self.answer_of(response)
        except httpx.HTTPError as exc:
            return self.no_context(call, exc, sent_at)

    async def arequest(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        *,
        deadline: float,
        idempotency_key: str | None = None,
    ) -> httpx.Response:
        """``request``'s async twin, over by ``deadline``: on the block's async connection in
        its event loop, else on one of its own."""
        headers = {KEY_HEADER: idempotency_key} if idempotency_key else None
        options = {"json": body, "headers": headers, "timeout": time_left(deadline)}
        if asyncio.get_running_loop() is self._loop:
            kept = self._kept = self._kept or _KeptClient(self._new_aclient())
            return await _by(deadline, kept.arequest(method, path, **options))
        # An AsyncClient belongs to the event loop that made it: a call from another loop (a
        # ``with`` block around ``asyncio.run``) opens one of its own.
        async with self._new_aclient() as client:
            return await _by(deadline, client.request(method, path, **options))

    def _new_aclient(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url,
            headers=dict(self.destination.headers),
            timeout=TIMEOUT_SECONDS,
            verify=self._ssl_context(),
        )

    @staticmethod
    def deadline(call: Call) -> float:
        """When memsvc's part before ``call`` must be over (``time.monotonic()``)."""
        return time.monotonic() + call.seconds_before(TIMEOUT_SECONDS)

    def answer_of(self, response: httpx.Response):
        """What memsvc answered (its JSON), or the ``HTTPStatusError`` of its refusal; an
        answer ends an outage."""
        response.raise_for_status()
        sender.mark_answered(self.url)  # (back: its stores are sent, its outage warned anew)
        return response.json()

    def no_context(self, call: Call, exc: httpx.HTTPError, sent_at: float) -> None:
        """A request for ``call``'s memory, sent at ``sent_at``, failed with ``exc``: said
        (once a kind, or an outage), and a memsvc that did not answer taken for down."""
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 403:
            # A key that may not read: the block stores the conversation and asks for no
            # more memory, said once (each call asked, was refused and warned: review).
            said, self.reads = self.reads, False
            if not said:
                return None
            logger.warning(
                "memsvc: memory of %r is not given to the model (%s); the block stores the "
                "conversation (capture_only=True says so at once)",
                self.agent,
                _reason(exc.response),
            )
            return None
        unreachable = isinstance(exc, httpx.TransportError)
        # A memsvc slower than one caller's timeout under a second is not down for the
        # others (but warned of once, as a refusal is: it warned at each call, each store
        # answered since ending the "outage"; review); one that left a caller's second or
        # more unanswered (it answers in milliseconds) is: each call of a 2 s timeout waited
        # its 2 s, and warned (review).
        hurried = call.seconds_before(TIMEOUT_SECONDS) < min(HURRIED_SECONDS, TIMEOUT_SECONDS)
        timed_out = isinstance(exc, httpx.TimeoutException)
        if unreachable and not (hurried and timed_out):  # an outage: warned once for each
            if not sender.warned(self.url):
                hooks.warn("read memory", exc, each_time=True)
        else:  # an error answer (a 500, a 429), a caller's short timeout: each kind once
            hooks.warn("read memory", exc)
        if unreachable:
            sender.mark_down(self.url, unanswered=timed_out and not hurried, sent_at=sent_at)
        return None

    def request(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        *,
        deadline: float | None = None,
        idempotency_key: str | None = None,
    ) -> httpx.Response:
        """One request to memsvc on the block's connection (a strategy's own requests), over
        by ``deadline`` (``deadline(call)``) when one is given; a store with its
        ``Idempotency-Key`` when it has one (as the sender sends them)."""
        headers = {KEY_HEADER: idempotency_key} if idempotency_key else None
        if deadline is None:
            return self._http.request(method, path, json=body, headers=headers)
        # ``over_by``: each read and write by the deadline; the timeout: the wait for a free
        # connection of the pool too (review).
        with over_by(deadline):
            return self._http.request(
                method, path, json=body, headers=headers, timeout=time_left(deadline)
            )

    def store(self, requests: list[ServerRequest]) -> None:
        sender.send(self.destination, requests)


async def _by(deadline: float, request):
    """``request`` (a coroutine) done by ``deadline``, else an ``httpx.ReadTimeout``. httpx's
    timeout holds for each read: a memsvc that sent a byte every half second held a call
    with a timeout of 1 s for 6 s (review). (The sync path: ``deadline.over_by``.)"""
    try:
        return await asyncio.wait_for(request, time_left(deadline))
    except TimeoutError:
        raise httpx.ReadTimeout("memsvc did not answer in time") from None


class _KeptClient:
    """A block's client, and how many requests are on it. The block's exit lets go of it:
    closed at once, or as the last request on it ends (a call of a task or thread the block
    started, still asking for context: closed under it, that call failed, went without its
    context, and memsvc was taken for down, ``sender.mark_down``; review). ``request`` and
    ``let_go`` for a ``with`` block's ``httpx.Client`` (from any thread), ``arequest`` and
    ``alet_go`` for an ``async with`` block's ``httpx.AsyncClient`` (on its loop)."""

    def __init__(self, client: httpx.Client | httpx.AsyncClient, *, one_off: bool = False):
        self.client = client
        self._lock = threading.Lock()
        self._calls = 0
        self._released = one_off  # (closed as its one request ends)

    def _on(self) -> None:
        with self._lock:
            self._calls += 1

    def _off(self) -> bool:
        """One request ends: whether the client is to be closed now."""
        with self._lock:
            self._calls -= 1
            return self._released and not self._calls

    def _release(self) -> bool:
        with self._lock:
            self._released = True
            return not self._calls

    def request(self, method: str, path: str, **options) -> httpx.Response:
        self._on()
        try:
            return self.client.request(method, path, **options)
        finally:
            if self._off():
                self.client.close()

    def let_go(self) -> None:
        if self._release():
            self.client.close()

    async def arequest(self, method: str, path: str, **options) -> httpx.Response:
        self._on()
        try:
            return await self.client.request(method, path, **options)
        finally:
            if self._off():
                await self.client.aclose()

    async def alet_go(self) -> None:
        if self._release():
            await self.client.aclose()


def _reason(response: httpx.Response) -> str:
    """What memsvc says of a refusal: the ``detail`` of its answer (the local API's, a
    field's problem when a list of them), else the answer's start."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, list):
        detail = "; ".join(
            f"{'.'.join(map(str, item.get('loc', ())))}: {item.get('msg')}"
            if isinstance(item, dict)
            else str(item)
            for item in detail
        )
    return str(detail) if detail else response.text[:200].strip() or response.reason_phrase


def time_left(deadline: float, *, quiet: bool = False) -> float:
    """Seconds until ``deadline``; once it is past, 0 when ``quiet``, else a timeout error
    (memsvc's part of the call goes without, with the call's one warning)."""
    left = deadline - time.monotonic()
    if left > 0 or quiet:
        return max(left, 0.0)
    raise httpx.ReadTimeout("memsvc did not answer within the call's timeout")
