"""Where ``learning()`` meets the SDKs: the thin sync and async shells around the core.

Every call of the ``openai`` and ``anthropic`` packages goes through their client's
``request`` (the body about to be sent) and ``_process_response`` (the HTTP response before
the SDK reads it), whatever the surface: ``create``, ``parse``, the ``stream`` helpers,
``with_raw_response``, ``with_streaming_response``, sync or async. Both are wrapped while a
block is active:

- ``request``: the core says whether this is a model call and what to ask memsvc; the
  shell asks (sync or async) and sends the body the strategy prepared.
- ``_process_response``: the reply is read from the response's bytes as the caller (or the
  SDK) consumes them: nothing is read ahead and the caller gets exactly what the plain call
  returns. Once the reply is known its stores go to the background sender.

Anything failing in memsvc's part leaves the call as it would have been, with one warning.
"""

import contextvars
import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
import weakref

import httpx

from memsvc.client.core import Call, ReplyReader, model_api

logger = logging.getLogger("memsvc.client")

SDKS = ("openai", "anthropic")

# The model call being made in this thread or task: set by ``request``, read by
# ``_process_response`` inside it.
_current_turn: contextvars.ContextVar["Turn | None"] = contextvars.ContextVar(
    "memsvc_learning_turn", default=None
)


# The failures warned of since the model last had memory: (action, kind, words).
_warned: set[tuple[str, str, str]] = set()
_warned_lock = threading.Lock()


def warn(action: str, exc: BaseException, *, each_time: bool = False) -> None:
    """One warning for each kind of failure (its action, type and words) until a call has
    memory again, not one for every call (a context answered with a 500, or not in JSON,
    warned at each call; review); ``each_time``: the caller decides (an outage's, warned
    once for each outage)."""
    # (httpx's timeouts of an async client say nothing of themselves: their kind does)
    said = str(exc) or type(exc).__name__
    # (A timeout is one kind, however it is said: a read's, or the call's deadline's.)
    kind = (action, "timeout", "") if isinstance(exc, httpx.TimeoutException) else None
    kind = kind or (action, type(exc).__name__, said)
    with _warned_lock:
        new = kind not in _warned
        _warned.add(kind)
    if new or each_time:
        logger.warning("memsvc: could not %s (%s); going on without memory", action, said)


def forget_warnings() -> None:
    """A call has memory: a failure from now on is warned of again."""
    if _warned:
        with _warned_lock:
            _warned.clear()


class Turn:
    """One model call inside a block: its session, its ``Call``, the reply once read."""

    def __init__(self, session, call: Call):
        self.session = session
        self.call = call
        self.reader: ReplyReader | None = None
        self.done = False

    def prepare_body(self, context: dict | None) -> dict:
        return self.session.strategy.prepare(self.call, context)

    def observe(self, response) -> bool:
        """Start reading the reply from ``response``; True when its body is already read
        (``finish`` after the SDK has processed it), False when the reply is read as the
        body is consumed."""
        # As the SDK reads it: streamed when the call asked for a stream, whatever type the
        # server names (a stream said to be JSON lost the turn; review).
        streamed = self.call.body.get("stream") is True or response.headers.get(
            "content-type", ""
        ).startswith("text/event-stream")
        self.reader = ReplyReader(self.call.api, streamed=streamed)
        try:
            content = response.content
        except (httpx.ResponseNotRead, _not_read_error(response)):
            _reading.add(self)
            return False
        self.reader.feed(content)
        return True

    def feed(self, chunk: bytes) -> None:
        if self.reader is None:
            return
        try:
            self.reader.feed(chunk)
        except Exception as exc:
            self.reader = None
            warn("read the reply", exc)

    def finish(self) -> None:
        """Once: the reply is known; its stores go to the background sender."""
        if self.done or self.reader is None:
            return
        self.done = True
        try:
            reply = self.reader.finish()
            if reply is not None:
                self.session.store(self.session.strategy.stores(self.call, reply))
        except Exception as exc:
            warn("store the conversation", exc)


# The turns whose reply is read as the caller consumes it. One the program leaves half-read
# (it breaks out of a stream it keeps) is finished when the stream is closed or collected:
# maybe only in the interpreter's teardown, when nothing can be sent any more.
_reading: "weakref.WeakSet[Turn]" = weakref.WeakSet()


def finish_reading() -> None:
    """Store the turns whose reply is still being read, with what was read so far (at the
    interpreter's exit)."""
    for turn in list(_reading):
        turn.finish()


def _not_read_error(response) -> type[Exception]:
    """The ``ResponseNotRead`` of the HTTP package the SDK uses (httpx or a fork of it)."""
    module = importlib.import_module(type(response).__module__.split(".")[0])
    return getattr(module, "ResponseNotRead", httpx.ResponseNotRead)


_lock = threading.Lock()
_active: list = []  # the learning() blocks running, in any thread, innermost last
# The model calls a block began that are not back yet: the SDKs stay wrapped for them (one
# the last block's end unwrapped under it met the plain ``_process_response``, and its turn
# was never stored, without a word; review).
_in_flight = 0
# The blocks this thread or task entered, innermost last (one it exits elsewhere stays
# listed: only the active ones count).
_entered: contextvars.ContextVar[tuple] = contextvars.ContextVar(
    "memsvc_learning_blocks", default=()
)


def _forked() -> None:
    """In a forked child: its own lock, and each block it is in its own connections to
    memsvc (two processes on one connection read each other's answers and mixed their
    requests' bytes: a store was lost, calls stalled; review)."""
    global _lock
    _lock = threading.Lock()
    for session in dict.fromkeys(_active):  # (one entered twice is listed twice)
        session.forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def activate(session) -> None:
    """A ``learning()`` block begins: the SDKs are patched while any block runs, or a call
    one began is not back."""
    with _lock:
        if not _active and not _in_flight:
            patch()
        _active.append(session)
    _entered.set((*_entered.get(), session))


def deactivate(session) -> None:
    entered = list(_entered.get())
    if session in entered:  # (its innermost entry: the block may be entered again inside)
        del entered[len(entered) - 1 - entered[::-1].index(session)]
    _entered.set(tuple(entered))
    with _lock:
        if session in _active:
            _active.remove(session)
        if not _active and not _in_flight:
            unpatch()


def _call_begins() -> None:
    global _in_flight
    with _lock:
        _in_flight += 1


def _call_ends() -> None:
    global _in_flight
    with _lock:
        _in_flight -= 1
        if not _active and not _in_flight:
            unpatch()


def current_session():
    """The innermost active block this thread or task is in (blocks nest; another thread's
    block, begun meanwhile, serves not its calls); for a thread or task in none (a worker
    the program started inside a block), the last one active, if all that are serve alike
    (one agent, one memsvc: two requests of one web app, say). With blocks of several
    agents active in other threads, which one the worker's call belongs to is unknown (a
    thread does not inherit its maker's context): it goes without memory, with one
    warning, rather than into another agent's (review). A thread or task whose own blocks
    have all ended (a job given ``contextvars.copy_context()`` that outlived its block) is
    served by none: another agent's block, running elsewhere, is not its (review)."""
    active = list(_active)
    entered = _entered.get()
    mine = [session for session in entered if session in active]
    if mine:
        return mine[-1]
    if entered:
        return None
    if len({session.serving for session in active}) > 1:
        _warn_once(
            "a call from a thread in no learning() block while blocks of several agents run "
            "in other threads goes without memory: which block it belongs to is unknown "
            "(enter the block in that thread, or pass contextvars.copy_context() to it)"
        )
        return None
    return active[-1] if active else None


# What a process says once in its life (not a failure's warning, which ``forget_warnings``
# lets be said again: sharing its set, this was said at each call; review).
_said_once: set[str] = set()


def _warn_once(message: str) -> None:
    with _warned_lock:
        new = message not in _said_once
        _said_once.add(message)
    if new:
        logger.warning("memsvc: %s", message)


def _begin(sdk: str, client, options) -> Turn | None:
    """The turn for a request about to be sent, or None when learning() leaves it alone."""
    session = current_session()
    if session is None:
        return None
    api = model_api(sdk, options.method, options.url, options.json_data)
    if api is None:
        return None
    call = Call(
        session.agent,
        api,
        options.json_data,
        session.capture_only,
        timeout=_timeout(client, options),
    )
    return Turn(session, call)


def _timeout(client, options):
    """The timeout the SDK sends the request with: the call's own (``timeout=``: seconds, a
    ``Timeout``, None for none), else the client's (the SDKs mark "not given" with a
    ``NotGiven`` of their own)."""
    timeout = options.timeout
    if timeout is None or isinstance(timeout, int | float) or hasattr(timeout, "read"):
        return timeout
    return getattr(client, "timeout", None)


def _with_body(options, body: dict):
    return options if body is options.json_data else options.model_copy(update={"json_data": body})


# --- the shells -------------------------------------------------------------------------------


def _begun(sdk: str, client, options) -> Turn | None:
    """``_begin``, counted in flight until ``_call_ends``; None (the plain call) when it
    fails, with one warning."""
    try:
        turn = _begin(sdk, client, options)
    except Exception as exc:
        warn("prepare the call", exc)
        return None
    if turn is not None:
        _call_begins()
    return turn


def _prepared(turn: Turn, options, context: dict | None):
    """The options with the body prepared with ``context``; as the caller made them when
    that fails (a context answer not of our shape), with one warning. Never raises: the
    turn is stored all the same (review: a context answer that was not our JSON lost the
    call's stores too). Prepared once: a strategy's ``prepare`` may count the call (the
    memory bank's steps)."""
    return _prepared_with(options, context, lambda: turn.prepare_body(context))


async def _aprepared(turn: Turn, options, context: dict | None):
    """``_prepared`` for an async call: a strategy that asks memsvc while it prepares the
    body (``aprepare``) is awaited, not run in the event loop's thread."""
    aprepare = getattr(turn.session.strategy, "aprepare", None)
    if aprepare is None:
        return _prepared(turn, options, context)
    try:
        body = await aprepare(turn.call, context)
    except Exception as exc:
        warn("prepare the call", exc)
        return options
    return _prepared_with(options, context, lambda: body)


def _prepared_with(options, context: dict | None, body):
    """The options with the body ``body()`` gives; as they were when that fails."""
    try:
        prepared = _with_body(options, body())
    except Exception as exc:
        warn("prepare the call", exc)
        return options
    if context is not None:
        forget_warnings()
    return prepared


def _sync_request(sdk, original):
    def request(client, cast_to, options, *args, **kwargs):
        # The user's request is sent once, outside what may fail of ours: a request that is
        # no model call (embeddings, files), sent inside a ``try``, was sent again when it
        # failed, as if preparing it had.
        turn = _begun(sdk, client, options)
        if turn is None:
            return original(client, cast_to, options, *args, **kwargs)
        try:
            try:
                context = turn.session.fetch_context(turn.call)
            except Exception as exc:  # (an answer not of JSON: ``fetch_context`` warns of others)
                warn("read memory", exc)
                context = None
            token = _current_turn.set(turn)
            try:
                return original(client, cast_to, _prepared(turn, options, context), *args, **kwargs)
            finally:
                _current_turn.reset(token)
        finally:
            _call_ends()

    return request


def _async_request(sdk, original):
    async def request(client, cast_to, options, *args, **kwargs):
        turn = _begun(sdk, client, options)  # (as ``_sync_request``'s)
        if turn is None:
            return await original(client, cast_to, options, *args, **kwargs)
        try:
            try:
                context = await turn.session.afetch_context(turn.call)
            except Exception as exc:  # (an answer not of JSON: ``fetch_context`` warns of others)
                warn("read memory", exc)
                context = None
            token = _current_turn.set(turn)
            try:
                prepared = await _aprepared(turn, options, context)
                return await original(client, cast_to, prepared, *args, **kwargs)
            finally:
                _current_turn.reset(token)
        finally:
            _call_ends()

    return request


def _claim(response) -> Turn | None:
    """The current turn, once, for a successful response."""
    turn = _current_turn.get()
    if turn is None or turn.reader is not None or not getattr(response, "is_success", False):
        return None
    return turn


def _sync_process_response(original):
    def process_response(client, *args, **kwargs):
        turn, read = _claim(kwargs.get("response")), False
        if turn is not None:
            try:
                read = turn.observe(kwargs["response"])
                if not read:
                    _tee(kwargs["response"], turn)
            except Exception as exc:
                turn.reader = None
                warn("read the reply", exc)
        result = original(client, *args, **kwargs)
        if read:
            turn.finish()
        return result

    return process_response


def _async_process_response(original):
    async def process_response(client, *args, **kwargs):
        turn, read = _claim(kwargs.get("response")), False
        if turn is not None:
            try:
                read = turn.observe(kwargs["response"])
                if not read:
                    _atee(kwargs["response"], turn)
            except Exception as exc:
                turn.reader = None
                warn("read the reply", exc)
        result = await original(client, *args, **kwargs)
        if read:
            turn.finish()
        return result

    return process_response


def _tee(response, turn: Turn) -> None:
    """The caller reads the body through ``iter_bytes`` (``read``, ``iter_lines``, SSE
    decoding all do) and ends it with ``close``: see the bytes, finish at the end."""
    iter_bytes, close = response.iter_bytes, response.close

    def observed_iter_bytes(*args, **kwargs):
        try:
            for chunk in iter_bytes(*args, **kwargs):
                turn.feed(chunk)
                yield chunk
        finally:
            turn.finish()

    def observed_close():
        try:
            close()
        finally:
            turn.finish()

    response.iter_bytes, response.close = observed_iter_bytes, observed_close
    _finished_when_collected(response, turn)


def _finished_when_collected(response, turn: Turn) -> None:
    """A reply the program drops unread, or half-read, without closing it: its turn is
    stored with what was read (the question at least) when the response is collected (it
    was never stored; review). In the interpreter's teardown nothing is sent any more
    (``sender.send``): the exit stores what is still being read first (``finish_reading``)."""
    weakref.finalize(response, turn.finish).atexit = False


def _atee(response, turn: Turn) -> None:
    aiter_bytes, aclose = response.aiter_bytes, response.aclose

    async def observed_aiter_bytes(*args, **kwargs):
        try:
            async for chunk in aiter_bytes(*args, **kwargs):
                turn.feed(chunk)
                yield chunk
        finally:
            turn.finish()

    async def observed_aclose():
        try:
            await aclose()
        finally:
            turn.finish()

    response.aiter_bytes, response.aclose = observed_aiter_bytes, observed_aclose
    _finished_when_collected(response, turn)


# --- installing -------------------------------------------------------------------------------

# (class, method name) -> the class's own attribute before wrapping (None: inherited).
_originals: dict[tuple[type, str], object] = {}


def patch() -> None:
    """Wrap the SDKs already imported; one imported later (inside the block) is wrapped as
    its import ends. Importing an SDK the program may never use would cost seconds."""
    for sdk in SDKS:
        if f"{sdk}._base_client" in sys.modules:
            _patch_sdk(sdk, sys.modules[f"{sdk}._base_client"])
        else:
            _watcher.waiting.add(f"{sdk}._base_client")
    if _watcher not in sys.meta_path:
        sys.meta_path.insert(0, _watcher)


def unpatch() -> None:
    if _watcher in sys.meta_path:
        sys.meta_path.remove(_watcher)
    _watcher.waiting.clear()
    for (cls, name), original in _originals.items():
        if original is None:
            delattr(cls, name)
        else:
            setattr(cls, name, original)
    _originals.clear()


def _patch_sdk(sdk: str, base) -> None:
    try:
        classes = (base.SyncAPIClient, base.AsyncAPIClient)
        for cls in classes:
            cls.request, cls._process_response  # noqa: B018 (both there, or neither wrapped)
    except AttributeError as exc:
        logger.warning("memsvc: learning() does not know this %s package (%s)", sdk, exc)
        return
    for cls, is_async in zip(classes, (False, True), strict=True):
        for name in ("request", "_process_response"):
            _originals[(cls, name)] = cls.__dict__.get(name)
        if is_async:
            cls.request = _async_request(sdk, cls.request)
            cls._process_response = _async_process_response(cls._process_response)
        else:
            cls.request = _sync_request(sdk, cls.request)
            cls._process_response = _sync_process_response(cls._process_response)


class _PatchWhenImported(importlib.abc.MetaPathFinder):
    """Wraps an SDK imported while a block is active, once its module has run."""

    def __init__(self):
        self.waiting: set[str] = set()

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.waiting:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        self.waiting.discard(fullname)
        exec_module = spec.loader.exec_module
        sdk = fullname.split(".", 1)[0]

        def exec_and_patch(module):
            exec_module(module)
            if _watcher in sys.meta_path:  # the block may have ended meanwhile
                _patch_sdk(sdk, module)

        spec.loader = _Loader(spec.loader, exec_and_patch)
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, exec_module):
        self._loader = loader
        self.exec_module = exec_module

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def __getattr__(self, name):
        return getattr(self._loader, name)


_watcher = _PatchWhenImported()
