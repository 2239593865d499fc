"""The background sender: what ``learning()`` stores leaves the caller's path.

One daemon thread per memsvc sends the requests queued for it in order, over one keep-alive
connection. A block's exit and the interpreter's exit (``memsvc.client.session``
registers it) wait for the queue (``flush``). A request memsvc defers (429: a rate limit) is
sent again when its ``Retry-After`` says (else after a growing wait), for as long as memsvc
keeps deferring it and the program runs: a server that answers loses no turn, and the model
calls meanwhile do not wait for it (``busy``). One it fails (5xx) is tried ``MAX_ATTEMPTS``
times, then dropped with a warning (a broken server must not hold every later store back,
nor the model calls meanwhile), and the next ones once each until memsvc answers one
otherwise; one that timed out, or whose connection broke before the
answer, is sent once more (``MAX_UNANSWERED_ATTEMPTS``) when it carries an idempotency key
(memsvc stores it once however often it is sent; one without a key is never sent twice). When memsvc does not answer at all the
request is dropped with one warning per outage, so a stopped server never stalls the
program. One that took the request and gave no answer in time is taken for down: for
``DOWN_SECONDS`` the calls ask it for no context and their stores are dropped unsent
(``is_down``): a server that takes connections and never answers cost every call, and every
store, the whole timeout. One that refused the connection (stopped, or restarting) is
tried by every request still, at the cost of that refusal, so that the first turn after it
is back is stored.
"""

import logging
import multiprocessing.util
import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

import httpx

from memsvc.client.core import KEY_HEADER, ServerRequest, retry_after_seconds

logger = logging.getLogger("memsvc.client")

TIMEOUT_SECONDS = 10.0
FLUSH_TIMEOUT_SECONDS = 30.0
DEFERRED = 429  # sent again, however often, when Retry-After says
RETRY_STATUSES = {500, 502, 503, 504}  # tried again up to MAX_ATTEMPTS times in all
MAX_ATTEMPTS = 6
# Of which lost answers (a timeout): each costs TIMEOUT_SECONDS, and a server that took the
# request and never answered is more likely hung than slow once.
MAX_UNANSWERED_ATTEMPTS = 2
MAX_RETRY_WAIT_SECONDS = 5.0
MAX_DEFERRED_WAIT_SECONDS = 60.0  # a rate limit's window
# How long a memsvc that did not answer is taken for down (then asked again).
DOWN_SECONDS = 30.0
# A memsvc's sending thread ends once it has had nothing to send this long (one per key and
# URL: a program that served many keys kept a thread for each; review).
LANE_IDLE_SECONDS = 60.0


@dataclass(frozen=True)
class Destination:
    """A memsvc and the headers (API key) its requests carry."""

    url: str
    headers: tuple[tuple[str, str], ...] = ()


class _Lane:
    """One memsvc's queue and the thread that sends it: a memsvc that defers or fails its
    stores holds back only its own (one queue for all held another memsvc's stores behind a
    429 for as long as it lasted, and a block's exit waited for them; review)."""

    def __init__(self):
        self.queue: deque[ServerRequest] = deque()
        self.queued = 0  # requests ever queued; ``done`` of them are sent or dropped
        self.done = 0
        self.thread: threading.Thread | None = None
        # The request being sent waits to be sent again (a 429's Retry-After, a 5xx's backoff)
        self.waiting = False
        # memsvc failed (5xx) a request every time it was tried: the next ones are tried once
        # each until it answers one otherwise (each was tried 6 times, 6 s, one after the
        # other: a block of five calls waited 30 s at its exit, and the program 30 s more at
        # its own; review)
        self.failing = False


class Sender:
    def __init__(self):
        self._reset()

    def _reset(self) -> None:
        """Empty (a new sender; a forked child's, whose parent sends what it queued: the
        child shared its connections, its queues and its counts, but not its threads)."""
        self._condition = threading.Condition()
        self._lanes: dict[Destination, _Lane] = {}
        self._clients: dict[Destination, httpx.Client] = {}
        # memsvc URLs that did not answer (warned once per outage): since when, and whether
        # they left a request unanswered (``mark_down``); and when each last answered
        self._down: dict[str, tuple[float, bool]] = {}
        self._answered: dict[str, float] = {}
        # The refusals warned of, (destination, status, answer): each once (a key that may
        # not write warned twice for every call; review).
        self._refusals: set[tuple] = set()

    def send(self, destination: Destination, requests: list[ServerRequest]) -> None:
        """Queue ``requests`` (kept in order); returns at once."""
        if not requests:
            return
        if sys.is_finalizing():  # a thread started now never runs: Python 3.11 waits forever
            logger.warning(
                "memsvc: %d messages stored at the interpreter's teardown are dropped",
                len(requests),
            )
            return
        with self._condition:
            lane = self._lanes.get(destination) or self._lanes.setdefault(destination, _Lane())
            lane.queue.extend(requests)
            lane.queued += len(requests)
            if lane.thread is None or not lane.thread.is_alive():
                lane.thread = threading.Thread(
                    target=self._run,
                    args=(destination, lane),
                    name="memsvc-learning-sender",
                    daemon=True,
                )
                lane.thread.start()
            self._condition.notify_all()

    def flush(
        self,
        timeout: float = FLUSH_TIMEOUT_SECONDS,
        *,
        quiet: bool = False,
        destination: Destination | None = None,
        until_held_back: bool = False,
    ) -> bool:
        """Wait until everything queued so far (for ``destination``; None: for every memsvc)
        is sent or dropped; False on timeout (with a warning unless ``quiet``: the rest is
        still being sent). ``until_held_back``: False too as soon as memsvc holds back what
        is left (a 429, a 5xx: ``busy``), which would hold the caller back as long (a call
        waited its whole timeout for stores memsvc failed; review)."""
        deadline = time.monotonic() + timeout
        with self._condition:
            targets = [(lane, lane.queued) for lane in self._lanes_of(destination)]

            def unsent() -> int:
                return sum(target - lane.done for lane, target in targets if lane.done < target)

            def held_back() -> bool:
                return all(lane.waiting for lane, target in targets if lane.done < target)

            while unsent():
                if until_held_back and held_back():
                    return False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if quiet:
                        return False
                    logger.warning(
                        "memsvc: %d stored messages still unsent after %.0f s", unsent(), timeout
                    )
                    return False
                self._condition.wait(remaining)
        return True

    def busy(self, destination: Destination | None = None) -> bool:
        """Whether something queued (for ``destination``) is not yet sent, and memsvc is not
        holding it back (a 429, a 5xx: waiting for it would only hold the caller's next call
        back too)."""
        return any(
            lane.done < lane.queued and not lane.waiting for lane in self._lanes_of(destination)
        )

    def _lanes_of(self, destination: Destination | None) -> list[_Lane]:
        if destination is None:
            return list(self._lanes.values())
        lane = self._lanes.get(destination)
        return [lane] if lane is not None else []

    def mark_down(self, url: str, *, unanswered: bool, sent_at: float) -> None:
        """``url`` failed a request sent at ``sent_at`` (``time.monotonic()``) and the caller
        has warned (once an outage: ``warned``), unless it answered another since (a late
        failure took a memsvc back for down 30 s, and every turn of them was dropped:
        review). ``unanswered``: it gave no answer in time (hung, or overloaded): its stores
        are dropped quietly, and the calls ask it for nothing, until it answers again or
        ``DOWN_SECONDS`` have passed. Else (a connection refused or broken, which costs
        nothing to try again; a caller's short timeout) every request still tries it: taken
        for down for 30 s, a memsvc back after two had the turns of those 30 s dropped
        unsent (review)."""
        with self._condition:
            if self._answered.get(url, float("-inf")) >= sent_at:
                return
            # A refusal, or a caller's short timeout, ends no quiet time of a hang: a hurried
            # call in flight as the sender took memsvc for down undid it, and every call
            # waited its timeout again (review).
            if not unanswered and self.is_down(url):
                return
            self._down[url] = (time.monotonic(), unanswered)

    def mark_answered(self, url: str) -> None:
        """``url`` answered a request: its stores are sent again, and a later failure of a
        request sent before is not an outage."""
        with self._condition:
            self._answered[url] = time.monotonic()
            self._down.pop(url, None)

    def is_down(self, url: str) -> bool:
        """Whether ``url`` left a request unanswered within the last ``DOWN_SECONDS``."""
        since, unanswered = self._down.get(url, (0.0, False))
        return unanswered and time.monotonic() - since < DOWN_SECONDS

    def warned(self, url: str) -> bool:
        """Whether the caller has warned that ``url`` fails (it has not answered since)."""
        return url in self._down

    def _run(self, destination: Destination, lane: _Lane) -> None:
        while True:
            with self._condition:
                if not lane.queue:
                    self._condition.wait_for(lambda: lane.queue, LANE_IDLE_SECONDS)
                if not lane.queue:  # idle: ends (``send`` starts another when needed)
                    lane.thread = None
                    return
                request = lane.queue[0]
            try:
                self._deliver(destination, request, lane)
            except Exception as exc:  # never let the thread die: the queue would stall
                logger.warning("memsvc: could not store a message (%s); dropped", exc)
            with self._condition:
                lane.queue.popleft()
                lane.done += 1
                lane.waiting = False
                self._condition.notify_all()

    def _client(self, destination: Destination) -> httpx.Client:
        client = self._clients.get(destination)
        if client is None:
            client = httpx.Client(
                base_url=destination.url, headers=dict(destination.headers), timeout=TIMEOUT_SECONDS
            )
            self._clients[destination] = client
        return client

    def _deliver(self, destination: Destination, request: ServerRequest, lane: _Lane) -> None:
        if self.is_down(destination.url):
            # Dropped quietly (the outage's warning is given): each waited out the timeout
            # in turn, and a block's exit for all of them (review). Sent again once
            # ``DOWN_SECONDS`` have passed.
            return
        client = self._client(destination)
        headers = {KEY_HEADER: request.idempotency_key} if request.idempotency_key else {}
        failures = deferrals = unanswered = 0
        attempts = 1 if lane.failing else MAX_ATTEMPTS
        while True:
            sent_at = time.monotonic()
            try:
                response = client.request(
                    request.method, request.path, json=request.json, headers=headers
                )
            except httpx.TransportError as exc:
                # Sent again only when memsvc may have stored it and its answer was lost (a
                # timeout): then with its key, so that it is stored once.
                unanswered += 1
                if (
                    not (request.idempotency_key and _may_have_arrived(exc))
                    or failures >= attempts - 1
                    or unanswered == MAX_UNANSWERED_ATTEMPTS
                    or self.is_down(destination.url)
                ):
                    self._not_answered(destination, exc, sent_at)
                    return
                response = None
            else:
                self.mark_answered(destination.url)
                if response.status_code == DEFERRED:
                    self._held_back(lane)
                    time.sleep(_retry_wait(response, deferrals, most=MAX_DEFERRED_WAIT_SECONDS))
                    deferrals += 1
                    continue
                failed = response.status_code in RETRY_STATUSES
                if not failed or failures >= attempts - 1:
                    lane.failing = failed  # (failed every time it was tried)
                    break
            self._held_back(lane)
            time.sleep(_retry_wait(response, failures))
            failures += 1
        if response.is_error:
            refusal = (destination, response.status_code, response.text[:200])
            if refusal not in self._refusals:
                self._refusals.add(refusal)
                logger.warning(
                    "memsvc: %s %s answered %d (%s); not stored (said once: the same answer "
                    "to later stores is not repeated)",
                    request.method,
                    request.path,
                    response.status_code,
                    response.text[:200],
                )

    def _held_back(self, lane: _Lane) -> None:
        """The request being sent waits to be sent again: said to a ``flush`` that waits
        ``until_held_back``."""
        with self._condition:
            lane.waiting = True
            self._condition.notify_all()

    def _not_answered(
        self, destination: Destination, exc: httpx.TransportError, sent_at: float
    ) -> None:
        """A request sent at ``sent_at`` is dropped: memsvc did not answer (one warning per
        outage)."""
        url = destination.url
        if self._answered.get(url, float("-inf")) >= sent_at:  # (it answers others)
            logger.warning("memsvc at %s did not answer a store (%s): dropped", url, exc)
            return
        if not self.warned(url):
            logger.warning(
                "memsvc at %s does not answer (%s): the conversation is not stored "
                "until it is back",
                url,
                exc,
            )
        self.mark_down(url, unanswered=isinstance(exc, httpx.TimeoutException), sent_at=sent_at)


def _may_have_arrived(exc: httpx.TransportError) -> bool:
    """Whether memsvc may have received the request that failed with ``exc``: it was sent
    and no answer came in time (a connection refused or never made carried nothing)."""
    return isinstance(
        exc, httpx.ReadTimeout | httpx.WriteTimeout | httpx.ReadError | httpx.RemoteProtocolError
    )


def _retry_wait(
    response: httpx.Response | None, attempt: int, *, most: float = MAX_RETRY_WAIT_SECONDS
) -> float:
    """Seconds to wait: the answer's ``Retry-After``, else a backoff by ``attempt``."""
    wait = retry_after_seconds(response)
    return min(0.2 * 2**attempt if wait is None else wait, most)


sender = Sender()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=sender._reset)


def _flush_when_the_child_ends(sender: Sender) -> None:
    """A ``multiprocessing`` child ends with ``os._exit``: no interpreter exit sends what
    it stored (its stores were lost; review), but its finalizers run. (Not a pool's
    ``terminate()``, which ``with Pool()`` calls: it stops the workers with SIGTERM, before
    any of that. Sending each call's stores before it returned, to outlive it, made every
    call of a forked web or Celery worker wait for its stores, 30 s when memsvc deferred
    them, and stalled an event loop: reverted, review 6.)"""
    multiprocessing.util.Finalize(sender, sender.flush, exitpriority=10)


multiprocessing.util.register_after_fork(sender, _flush_when_the_child_ends)
