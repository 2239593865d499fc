"""``learning(strategy="memory_bank")``: long tool-using agent tasks kept inside the context
window (seed: memory-bank-strategy).

At every chat completion of the task, the tool interaction the messages end with (the last
assistant message with ``tool_calls`` and the tool answers after it; parallel calls give one
record each) is stored in memsvc as tool records: the raw output kept whole (the fact store;
an input or output over memsvc's 1 MiB, or its share of a store's 32 MiB, is kept to its
start, ``kept_whole_or_cut``; a step of more than 100 calls is stored 100 at a time)
and a summary with its vector (the insight store, written by memsvc's observer). Then the
records most relevant to "how to proceed with the task" are retrieved and the model is sent
a compressed context instead of the whole history:

1. the anchor: the task's first user message (after any leading system messages);
2. a system message "## Retrieved Context from Previous Steps" with ``[RETRIEVED RECORD n]``
   blocks (``Summary:`` and ``Raw Data:``, cut at ``max_chars_per_record``): the ``top_k``
   most relevant records of the task's earlier steps (the seed's retrieval also returned
   the records just stored, copies of item 3: leaving them out saves their tokens, and at
   step 2 the model gets exactly the history);
3. the last tool interaction, and whatever follows it.

The first step (no tool interaction yet) passes through unchanged. A step's records whose
answer was lost (a timeout: memsvc may have stored them) are sent again, as they were and
with the same ``Idempotency-Key``, by the next step that holds them (the caller's retry of
the call): memsvc stores them once. A task is what the ``learning()`` block runs, with
``task_id`` or a fresh id; a new anchor message within the block starts a new task (a fresh
id unless ``task_id`` was given) and counts steps from 1.

The work of a step is written once (``MemoryBank._step``, a generator that yields the
requests it needs and gets their answers) and driven by a sync and an async shell. If memsvc
fails, a warning is logged and the model gets the messages unchanged. Only ``openai`` and
``httpx``: no Django here.
"""

import hashlib
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field

import httpx

from memsvc.client import hooks
from memsvc.client.core import (
    TRUNCATED,
    ChatCompletions,
    Recall,
    ServerRequest,
    json_bytes,
    json_depth,
    readable_json,
    text_cut_to,
)
from memsvc.client.sender import sender
from memsvc.text import (
    INVISIBLE_PROBLEM,
    has_bidi_controls,
    has_blank_ends,
    has_control_characters,
    has_line_separators,
    hidden_characters,
    shows_nothing,
)

logger = logging.getLogger("memsvc.client")

RETRIEVAL_QUERY = "how to proceed with the task"  # the seed's fixed, task-agnostic query
CONTEXT_HEADING = "## Retrieved Context from Previous Steps"
RECORD_SEPARATOR = "-------------------"
DEFAULT_TOP_K = 3
DEFAULT_MAX_CHARS_PER_RECORD = 2000
MAX_TOP_K = 20  # the most a tool record search returns (the server's limit)
# The longest task id memsvc keeps (``agents_api.api.serializers.TASK_ID_MAX_LENGTH``).
MAX_TASK_ID_CHARS = 255
# The most memsvc keeps of a tool's input or its output, as JSON in UTF-8 (the server's
# limit: ``agents_api.api.serializers.TOOL_JSON_MAX_BYTES``).
MAX_TOOL_JSON_BYTES = 1024 * 1024
# How deep a tool's input or output may nest: a request's body 64 levels
# (``memsvc.api.parsers.MAX_JSON_DEPTH``), less the three above a record's output.
MAX_TOOL_JSON_DEPTH = 61
# What the inputs and outputs of one store's records weigh at most in all, under memsvc's
# default body cap (``MEMSVC_MAX_BODY_BYTES``, 41 MiB): 42 parallel calls of 1 MB each
# were refused whole (review).
MAX_STORE_JSON_BYTES = 32 * 1024 * 1024
# A store holds at most this many records, and a tool's name this many characters (the
# server's limits: a step of 101 parallel calls, or one name of 250, was refused whole).
MAX_RECORDS_PER_STORE = 100
# The most interactions kept while memsvc cannot store them (an outage's oldest go first).
MAX_PENDING_INTERACTIONS = 1000
# How many steps try a store memsvc fails (a 5xx, no answer) before its records are dropped.
MAX_STORE_TRIES = 3
# A store's failures that sent memsvc nothing (no connection): they count no try, the
# records wait for it (``MAX_PENDING_INTERACTIONS`` of them at most).
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)
MAX_TOOL_NAME_CHARS = 200
_RAW_BYTES = json_bytes({"_raw": ""}) - 2  # (the text's own quotes are its JSON's)


@dataclass(frozen=True)
class ToolInteraction:
    """One tool call and its answer, as the seed's InteractionRecord holds it."""

    call_id: str
    tool_name: str
    raw_input: dict
    raw_output: object


def _text(content) -> str:
    """A message's content as text: a string, or the text parts of a list of blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
        )
    return "" if content is None else str(content)


def _json(text: str):
    """A tool's answer as JSON; anything else as ``{"_raw": text}`` (the seed), numbers JSON
    has no room for too (``NaN``, ``Infinity``, ``1e400``: Python reads them, but no JSON
    document can carry them to memsvc, and the step's record was lost)."""
    try:
        return json.loads(text, parse_constant=_no_number, parse_float=_finite)
    except ValueError:
        return {"_raw": text}


def _no_number(text: str):
    raise ValueError(f"{text} is no JSON number")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        _no_number(text)
    return number


def _arguments(text) -> dict:
    if isinstance(text, dict):
        return text
    value = _json(text or "{}")
    return value if isinstance(value, dict) else {"_raw": text}


def _get(obj, name: str, default=None):
    """A field of a message or tool call, whether a dict or an ``openai`` model object."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def last_tool_call_index(messages: list) -> int | None:
    """The index of the last assistant message with ``tool_calls``."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if _get(message, "role") == "assistant" and _get(message, "tool_calls"):
            return index
    return None


def tool_interactions(messages: list) -> list[ToolInteraction]:
    """The seed's ``extract_tool_outputs``: each call of the last assistant message with
    ``tool_calls`` that has its tool answer among the messages after it, in call order."""
    index = last_tool_call_index(messages)
    if index is None:
        return []
    # Each id's calls in order: the n-th answer of an id is its n-th call's (a server that
    # gives every call one id: review).
    calls: dict[str, list] = {}
    for call in _get(messages[index], "tool_calls") or []:
        function = _get(call, "function") or {}
        calls.setdefault(_get(call, "id"), []).append(
            (_get(function, "name") or "tool", _get(function, "arguments"))
        )
    found = []
    for message in messages[index + 1 :]:
        call_id = _get(message, "tool_call_id")
        if _get(message, "role") != "tool" or not calls.get(call_id):
            continue
        name, arguments = calls[call_id].pop(0)
        found.append(
            ToolInteraction(
                call_id, name, _arguments(arguments), _json(_text(_get(message, "content")))
            )
        )
    return found


def _tool_name(name: str) -> str:
    """A call's tool name as memsvc keeps one: a name (one line, no control or bidirectional
    character, nothing blank at its ends nor invisible inside: ``agents_api``'s
    ``GIVEN_NAME_RULES``; one a model made otherwise had the step's records refused: code
    review), at most ``MAX_TOOL_NAME_CHARS``, something to read, else "tool"."""
    # (Cut first: each pass below is the name's length, and a run of 4,000 joiners took
    # 2,000 passes; code review.)
    name = "".join(" " if _breaks_a_name(c) else c for c in name[:MAX_TOOL_NAME_CHARS])
    while hidden := set(hidden_characters(name)):  # (refused inside as well; one left out
        # may leave a joiner beside a Latin letter, hidden in its turn)
        name = "".join(c for place, c in enumerate(name) if place not in hidden)
    while has_blank_ends(name):
        name = name[1:] if has_blank_ends(name[0]) else name[:-1]
    return "tool" if shows_nothing(name) else name


def _breaks_a_name(character: str) -> bool:
    return (
        has_control_characters(character)
        or has_line_separators(character)
        or has_bidi_controls(character)
    )


def _task_id_problem(task_id: str) -> str | None:
    """Why memsvc would refuse ``task_id`` (and with it every store of the block), or None."""
    if len(task_id) > MAX_TASK_ID_CHARS:
        return f"at most {MAX_TASK_ID_CHARS} characters"
    if readable_json(task_id) != task_id:
        return "must not hold a NUL or a lone surrogate"
    if any(map(_breaks_a_name, task_id)) or has_blank_ends(task_id):
        # (a trailing newline, as read from a file: code review)
        return "must be one line, without control characters or blanks at either end"
    if hidden_characters(task_id):
        return INVISIBLE_PROBLEM
    return None


def _keyed(
    messages: list, interactions: list[ToolInteraction]
) -> list[tuple[tuple, ToolInteraction]]:
    """The last step's ``interactions``, each with what tells it from every other of the
    task: the place of its assistant message in the history, its call id, how many before
    it there had that id, and what it holds. Not the call id alone: a server that gives
    every call the id "call_0" had each step's records taken for the first one's, and none
    stored (review); nor its place alone, which a history that keeps only the last step
    gives every step."""
    index = last_tool_call_index(messages)
    seen: dict[str, int] = {}
    keyed = []
    for interaction in interactions:
        n = seen[interaction.call_id] = seen.get(interaction.call_id, -1) + 1
        held = json.dumps(
            [interaction.tool_name, interaction.raw_input, interaction.raw_output],
            sort_keys=True,
            default=str,
        )
        digest = hashlib.blake2b(held.encode(errors="replace"), digest_size=16).hexdigest()
        keyed.append(((index, interaction.call_id, n, digest), interaction))
    return keyed


def anchor_index(messages: list) -> int | None:
    """The index of the task's anchor: its first user message."""
    return next((i for i, m in enumerate(messages) if _get(m, "role") == "user"), None)


def format_records(records: list[dict], max_chars: int) -> str:
    """The seed's retrieved-context blocks, each record's raw data cut at ``max_chars``."""
    blocks = []
    for number, record in enumerate(records, start=1):
        raw = json.dumps(record["output"], ensure_ascii=False)
        if len(raw) > max_chars:
            raw = raw[:max_chars] + TRUNCATED
        blocks.append(f"[RETRIEVED RECORD {number}]\nSummary: {record['summary']}\nRaw Data: {raw}")
    return f"\n{RECORD_SEPARATOR}\n".join(blocks)


def kept_whole_or_cut(value, max_bytes: int = MAX_TOOL_JSON_BYTES):
    """A tool's input or output as memsvc can keep it: whole when its JSON is within
    ``max_bytes`` (at most the server's limit) and ``MAX_TOOL_JSON_DEPTH``, else the start
    of that JSON as ``{"_raw": ...}`` (the form of an answer that is no JSON), marked
    truncated when cut. (One output over a limit was refused by memsvc with the step's other
    records: review.)"""
    if json_bytes(value) <= max_bytes and json_depth(value) <= MAX_TOOL_JSON_DEPTH:
        return value
    return {"_raw": text_cut_to(json.dumps(value, ensure_ascii=False), max_bytes - _RAW_BYTES)}


def compressed(messages: list, records: list[dict], max_chars: int) -> list:
    """The seed's context: the leading system messages and the anchor user message (and
    any user message after it: what the user said mid-task is no tool interaction, and it
    was lost to the model for good; review), the retrieved records as a system message,
    then the last tool interaction onwards."""
    last = last_tool_call_index(messages)
    anchor = anchor_index(messages)
    if last is None or anchor is None or anchor > last:
        return messages
    leading = [m for m in messages[:anchor] if _get(m, "role") in ("system", "developer")]
    said = [m for m in messages[anchor:last] if _get(m, "role") == "user"]
    context = []
    if records:
        text = f"{CONTEXT_HEADING}\n\n{format_records(records, max_chars)}"
        context = [{"role": "system", "content": text}]
    return [*leading, *said, *context, *messages[last:]]


def estimated_tokens(messages: list) -> int:
    """A model-agnostic size: characters / 4 of the JSON of the messages."""
    return len(json.dumps([_dump(m) for m in messages], ensure_ascii=False, default=str)) // 4


def _dump(message):
    return message.model_dump() if hasattr(message, "model_dump") else message


@dataclass
class TaskState:
    """What the bank keeps between the steps of one task."""

    task_id: str
    anchor: str | None = None
    step: int = 0
    trace_ids: dict[tuple, str] = field(default_factory=dict)  # an interaction's key -> its record
    # The interactions seen and not stored yet (memsvc failed or was down at their step),
    # each with its step, in the order seen: stored with the next step memsvc answers (they
    # were lost, and a later step retrieved nothing of them; review)
    pending: dict[tuple, tuple[ToolInteraction, int]] = field(default_factory=dict)
    # The store of these interactions (keys) whose answer has not come (yet): sent again as it is
    unanswered: tuple[tuple[tuple, ...], ServerRequest] | None = None
    tries: dict[tuple, int] = field(default_factory=dict)  # failed stores of these keys


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class MemoryBank:
    """The strategy's state for one ``learning()`` block, and its steps."""

    def __init__(
        self,
        agent: str,
        *,
        task_id: str | None = None,
        top_k: int = DEFAULT_TOP_K,
        max_chars_per_record: int = DEFAULT_MAX_CHARS_PER_RECORD,
    ):
        # (Taken, and then every store of the block refused and its records lost: review.)
        if task_id is not None and (problem := _task_id_problem(task_id)):
            raise ValueError(f"task_id: {problem}")
        # (0 was taken for the default, -1 or 2.5 had every search refused, and the whole
        # history sent at every step; -5 cut 5 characters off every record: review.)
        if not _whole(top_k) or not 1 <= top_k <= MAX_TOP_K:
            raise ValueError(f"top_k: a whole number from 1 to {MAX_TOP_K}")
        if not _whole(max_chars_per_record) or max_chars_per_record < 1:
            raise ValueError("max_chars_per_record: a whole number of at least 1")
        self.agent = agent
        self.fixed_task_id = task_id
        self.top_k = top_k
        self.max_chars = max_chars_per_record
        self.task = TaskState(task_id or str(uuid.uuid4()))
        self.said: set = set()  # the kinds of failure warned of (``warn_once``)

    def _begin(self, messages: list) -> None:
        """Count the step; a new anchor message starts a new task (the seed's reset)."""
        anchor = anchor_index(messages)
        text = _text(_get(messages[anchor], "content")) if anchor is not None else None
        if self.task.anchor is not None and text != self.task.anchor:
            old = self.task
            self.task = TaskState(self.fixed_task_id or str(uuid.uuid4()))
            if self.fixed_task_id:  # (the same task's records: still to be stored)
                self.task.pending, self.task.unanswered = old.pending, old.unanswered
        self.task.anchor = text
        self.task.step += 1

    def _keep(self, messages: list) -> list[tuple[tuple, ToolInteraction]]:
        """The last step's interactions (``_keyed``); those not stored yet kept to store."""
        keyed = _keyed(messages, tool_interactions(messages))
        pending = self.task.pending
        for key, interaction in keyed:
            if key not in self.task.trace_ids and key not in pending:
                pending[key] = (interaction, self.task.step)
        while len(pending) > MAX_PENDING_INTERACTIONS:  # (a long outage: the oldest go)
            del pending[next(iter(pending))]
        return keyed

    def note(self, messages: list) -> None:
        """A step memsvc is not asked about (it is taken for down): counted, and its
        interactions kept, to be stored with the next step it answers."""
        self._begin(list(messages))
        if last_tool_call_index(messages) is not None:
            self._keep(messages)

    def _batches(self) -> list[list[tuple[tuple, tuple[ToolInteraction, int]]]]:
        """The pending interactions as stores: first the one whose answer did not come,
        as it was (memsvc may have stored it), then the rest, ``MAX_RECORDS_PER_STORE`` a
        store."""
        pending = self.task.pending
        batches, rest = [], list(pending.items())
        if self.task.unanswered is not None:
            keys = self.task.unanswered[0]
            if all(key in pending for key in keys):
                batches.append([(key, pending[key]) for key in keys])
                rest = [(key, kept) for key, kept in rest if key not in set(keys)]
            else:
                self.task.unanswered = None
        batches += [
            rest[start : start + MAX_RECORDS_PER_STORE]
            for start in range(0, len(rest), MAX_RECORDS_PER_STORE)
        ]
        return batches

    def _step(self, messages: list) -> Generator[ServerRequest, object, list]:
        """One step, free of I/O: yields the requests to memsvc and returns the messages to
        send the model."""
        self._begin(messages)
        if last_tool_call_index(messages) is None:
            return messages  # the first step: nothing to store or retrieve yet
        keyed = self._keep(messages)
        for batch in self._batches():
            try:
                stored = yield self._store(batch)
            except httpx.HTTPError as exc:
                if self._not_stored(batch, exc):
                    continue  # (refused, dropped: the step goes on to what is stored)
                raise
            self.task.unanswered = None
            for (key, _), record in zip(batch, stored, strict=True):
                self.task.trace_ids[key] = record["trace_id"]
                del self.task.pending[key]
        # The last interaction is sent whole after the records: the records retrieved are
        # the most relevant of the earlier ones, not copies of it.
        # (memsvc leaves them out: asked for 20 and filtering here, a step of 20 parallel
        # calls was given its own records only, and nothing was retrieved; review.)
        shown = sorted({self.task.trace_ids[key] for key, _ in keyed if key in self.task.trace_ids})
        found = yield ServerRequest(
            "POST",
            "/tool-records/search",
            {
                "agent_name": self.agent,
                "task_id": self.task.task_id,
                "query": RETRIEVAL_QUERY,
                "top_k": self.top_k,
                "exclude_trace_ids": shown,
            },
        )
        records = list(found or [])
        result = compressed(messages, records, self.max_chars)
        if logger.isEnabledFor(logging.DEBUG):  # sizing the history costs a JSON dump of it
            logger.debug(
                "memory bank step %d: %d records retrieved, ~%d -> ~%d tokens",
                self.task.step,
                len(records),
                estimated_tokens(messages),
                estimated_tokens(result),
            )
        return result

    def _not_stored(self, batch: list, exc: httpx.HTTPError) -> bool:
        """A store of ``batch`` failed with ``exc``: tried again with the next step, unless
        memsvc refused it (a 4xx but a timeout's or a rate limit's) or it failed
        ``MAX_STORE_TRIES`` times (a store that never reached it, ``NOT_SENT``, is no try):
        then its records are dropped, with a warning (once a kind: a key without the
        ``write`` scope warned at every step; review). Whether memsvc refused it. (Kept
        for good, one refused store failed every later step, each sent the whole history;
        review.)"""
        if isinstance(exc, NOT_SENT):
            # Nothing reached memsvc (stopped, restarting): no try. Counted, a fast loop
            # went through its tries in the seconds of a restart, and dropped the oldest
            # records while later ones were kept (review).
            return False
        keys = tuple(key for key, _ in batch)
        tries = self.task.tries[keys] = self.task.tries.get(keys, 0) + 1
        status = exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else None
        refused = status is not None and 400 <= status < 500 and status not in (408, 429)
        if refused or tries >= MAX_STORE_TRIES:
            for key in keys:
                self.task.pending.pop(key, None)
            self.task.tries.pop(keys, None)
            self.task.unanswered = None
            self.warn_once(
                (type(exc).__name__, status),
                f"memory bank: tool records not stored ({exc}); dropped (said once for "
                "this failure)",
            )
        return refused

    def warn_once(self, kind, message: str) -> None:
        """``message``, the first time a failure of ``kind`` happens in this block."""
        if kind not in self.said:
            self.said.add(kind)
            logger.warning(message)

    def unstored(self) -> tuple[int, list[ServerRequest]]:
        """The interactions not stored yet (memsvc failed, or was taken for down, at their
        steps), as stores, and how many: given up here, for the block's exit to send."""
        batches = self._batches()
        stores = [self._store(batch) for batch in batches]  # (the one unanswered, as it was)
        self.task.pending, self.task.tries, self.task.unanswered = {}, {}, None
        return sum(map(len, batches)), stores

    def _store(self, new: list[tuple[tuple, tuple[ToolInteraction, int]]]) -> ServerRequest:
        """The request that stores the ``new`` interactions (``_keyed``, each with its
        step), with a key of its own; the one sent before for them, unchanged (its key),
        when its answer did not come: memsvc may have stored them, and then answers the
        retry with those records."""
        keys = tuple(key for key, _ in new)
        if self.task.unanswered is not None and self.task.unanswered[0] == keys:
            return self.task.unanswered[1]
        new = [kept for _, kept in new]
        each = min(MAX_TOOL_JSON_BYTES, MAX_STORE_JSON_BYTES // (2 * len(new)))
        request = ServerRequest(
            "POST",
            "/tool-records",
            {
                "agent_name": self.agent,
                "task_id": self.task.task_id,
                # (A NUL in a tool's output, which memsvc refuses, lost the step: review.)
                "records": [
                    {
                        "step": step,
                        "tool_name": _tool_name(readable_json(i.tool_name)),
                        "input": kept_whole_or_cut(readable_json(i.raw_input), each),
                        "output": kept_whole_or_cut(readable_json(i.raw_output), each),
                    }
                    for i, step in new
                ],
            },
            idempotency_key=f"memory-bank:{uuid.uuid4().hex}",
        )
        self.task.unanswered = (keys, request)
        return request

    def prepare(self, messages: list, request: Callable[[ServerRequest], object]) -> list:
        """The messages to send the model at this step (sync): ``request(server_request)``
        answers memsvc's JSON (its ``httpx.HTTPError`` is the caller's to handle)."""
        step = self._step(list(messages))
        try:
            sent = next(step)
            while True:
                try:
                    answer = request(sent)
                except httpx.HTTPError as exc:
                    # The step hears of it (``_not_stored``): it raises it, or goes on to
                    # its next request (a store refused: dropped).
                    sent = step.throw(exc)
                    continue
                sent = step.send(answer)
        except StopIteration as done:
            return done.value

    async def aprepare(self, messages: list, arequest: Callable[..., Awaitable]) -> list:
        """``prepare``'s async twin: ``await arequest(server_request)``."""
        step = self._step(list(messages))
        try:
            sent = next(step)
            while True:
                try:
                    answer = await arequest(sent)
                except httpx.HTTPError as exc:
                    sent = step.throw(exc)
                    continue
                sent = step.send(answer)
        except StopIteration as done:
            return done.value


def _asked(sent: ServerRequest) -> tuple:
    return sent.method, sent.path, sent.json


def _options(sent: ServerRequest, deadline: float) -> dict:
    return {"deadline": deadline, "idempotency_key": sent.idempotency_key}


class MemoryBankStrategy:
    """``learning(strategy="memory_bank")`` as the client's strategy (``memsvc.client.core``):
    a chat completion is sent the compressed context (its tool records stored and the
    relevant ones retrieved by ``MemoryBank``, through the block's own connection to
    memsvc) and stores no messages; other calls (the Responses API, Anthropic) get the
    seed's recall. The requests are made while the body is prepared, so an async call waits
    for them in its event loop's thread (two short requests a step)."""

    def __init__(self, session, bank: MemoryBank):
        self.session = session
        self.bank = bank
        self.recall = Recall()

    @staticmethod
    def _is_chat(call) -> bool:
        return isinstance(call.api, ChatCompletions) and isinstance(call.body.get("messages"), list)

    def context_request(self, call):
        return None if self._is_chat(call) else self.recall.context_request(call)

    def prepare(self, call, context):
        if not self._is_chat(call):
            return self.recall.prepare(call, context)
        if sender.is_down(self.session.url):  # (hung: one call waited and warned; review)
            self.bank.note(call.body["messages"])
            return call.body
        deadline = self.session.deadline(call)  # the caller's timeout bounds these requests
        sent_at = time.monotonic()

        def request(sent: ServerRequest):
            return self.session.answer_of(
                self.session.request(*_asked(sent), **_options(sent, deadline))
            )

        try:
            messages = self.bank.prepare(call.body["messages"], request)
        except httpx.HTTPError as exc:
            return self._whole_history(call, exc, sent_at)
        return self._compressed(call, messages)

    async def aprepare(self, call, context):
        """``prepare`` in the caller's event loop: its requests awaited, not made in the
        loop's thread (a hung memsvc stalled every other task of the program; review)."""
        if not self._is_chat(call):
            return self.recall.prepare(call, context)
        if sender.is_down(self.session.url):
            self.bank.note(call.body["messages"])
            return call.body
        deadline = self.session.deadline(call)
        sent_at = time.monotonic()

        async def arequest(sent: ServerRequest):
            response = await self.session.arequest(*_asked(sent), **_options(sent, deadline))
            return self.session.answer_of(response)

        try:
            messages = await self.bank.aprepare(call.body["messages"], arequest)
        except httpx.HTTPError as exc:
            return self._whole_history(call, exc, sent_at)
        return self._compressed(call, messages)

    def _whole_history(self, call, exc: httpx.HTTPError, sent_at: float) -> dict:
        """The call as it was made, memsvc's failure said (``no_context``); a refusal of
        the key (403) in the bank's words, once: the recall's said the block stored the
        conversation, which the bank does not (review)."""
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 403:
            self.bank.warn_once(
                403,
                f"memsvc: the memory bank of {self.session.agent!r} is refused ({exc}); the "
                "model is sent the whole history",
            )
        else:
            self.session.no_context(call, exc, sent_at)
        return call.body

    def leaving(self) -> None:
        """The block ends: the tool records not stored yet (memsvc failed, or was taken for
        down, at their steps, and no later step asked it) go with the block's other stores,
        which its exit waits for; dropped with a warning while memsvc is taken for down
        (they were lost without a word: review)."""
        self.bank.said.clear()  # (the next block warns anew)
        count, stores = self.bank.unstored()
        if not count:
            return
        if sender.is_down(self.session.url):
            logger.warning(
                "memory bank: %d tool records not stored (memsvc did not answer); dropped",
                count,
            )
            return
        self.session.store(stores)

    @staticmethod
    def _compressed(call, messages: list) -> dict:
        hooks.forget_warnings()  # (the call has memory)
        return {**call.body, "messages": messages}

    def stores(self, call, reply):
        return [] if self._is_chat(call) else self.recall.stores(call, reply)
