"""The memory bank's observer (seed: memory-bank-strategy): the summary of a tool's output
that a tool record is searched by.

Every record gets a deterministic summary when it is written (``fallback_summary``: the
tool, the identifiers and the sizes found in its output), so it is searchable at once, by
vector and by keyword. With an LLM configured (``memsvc.llm``), a task then asks the model
for the seed's summary (``observe``) and the record is re-embedded; an empty or failed
answer keeps the deterministic one.
"""

import json
import re

from memsvc.llm import LLMError, chat
from memsvc.text import shortened, shows_nothing

# The seed's observer: the raw output is cut here before it is sent to the model.
OBSERVER_INPUT_CHARS = 10_000
# A model that ignores "under 200 words" is cut here (about 200 words of prose, with room).
MAX_SUMMARY_CHARS = 2_000

OBSERVER_INSTRUCTIONS = """\
You are the observer of an AI agent that calls tools. Summarise one tool call's output for \
the agent's memory, so that a later step can find it and know what it holds.

- Say what was achieved: what the tool did or found, or the error it returned.
- Keep every key identifier exactly as written: ids, codes, names, coordinates, dates, \
amounts, status codes. A later step may need to refer to them.
- Give counts (how many results) rather than listing long collections in full.
- Stay under 200 words. Answer with the summary only, no preamble."""

# Keys whose values are identifiers whatever they look like.
_ID_KEY = re.compile(r"(^|_|-)(id|uuid|key|code|ref|reference|number|sku|slug)s?$|Ids?$", re.I)
# A value that looks like an identifier: one token holding a digit (htl-001, A1B2, 2024-05-01).
_ID_VALUE = re.compile(r"^(?=.*\d)[A-Za-z0-9][A-Za-z0-9_\-.:/#]{1,63}$")
MAX_IDENTIFIERS = 25
MAX_SIZES = 5
MAX_INPUT_CHARS = 300


def _walk(value, key: str = "", path: str = ""):
    """(key, path, value) of every scalar and collection in a JSON value, depth first."""
    yield key, path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, str(k), f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item, key, f"{path}[]")


def identifiers(output) -> list[str]:
    """The identifiers in a tool's output, in order of appearance, each once: the values of
    id-like keys (``id``, ``hotel_id``, ``orderId``, ``code``...) and strings that look
    like one (a single token with a digit in it)."""
    found: dict[str, None] = {}
    for key, _, value in _walk(output):
        if isinstance(value, bool) or not isinstance(value, str | int):
            continue
        text = str(value)
        if (key and _ID_KEY.search(key) and len(text) <= 64) or (
            isinstance(value, str) and _ID_VALUE.match(text)
        ):
            found.setdefault(text, None)
        if len(found) >= MAX_IDENTIFIERS:
            break
    return list(found)


def _sizes(output) -> list[str]:
    """The sizes of the output's lists, largest first: "results: 5 items"."""
    sizes: dict[str, int] = {}
    for _, path, value in _walk(output):
        if isinstance(value, list):
            name = path.replace("[]", "") or "output"
            sizes[name] = max(sizes.get(name, 0), len(value))
    ranked = sorted(sizes.items(), key=lambda item: -item[1])[:MAX_SIZES]
    return [f"{name}: {count} item{'s' if count != 1 else ''}" for name, count in ranked]


def _text_of(output) -> str | None:
    """The text a tool answered: its output when that is a JSON string, or what it answered
    that is no JSON (``{"_raw": ...}``); None for other JSON."""
    if isinstance(output, str):
        return output
    if isinstance(output, dict) and set(output) == {"_raw"}:
        return str(output["_raw"])
    return None


def _shape(output) -> str:
    text = _text_of(output)
    if text is not None:
        return f"text of {len(text)} characters"
    if isinstance(output, dict):
        keys = list(output)
        shown = ", ".join(keys[:10]) + (", ..." if len(keys) > 10 else "")
        return f"an object with {len(keys)} field{'s' if len(keys) != 1 else ''} ({shown})"
    if isinstance(output, list):
        return f"a list of {len(output)} item{'s' if len(output) != 1 else ''}"
    if output is None:
        return "nothing"
    return f"the value {json.dumps(output, ensure_ascii=False)[:200]}"


def fallback_summary(tool_name: str, raw_input, raw_output) -> str:
    """A summary without a model, the same for the same call: the tool and its input, the
    shape of the output, the sizes of its lists and the identifiers in it."""
    parts = [f"Tool {tool_name} returned {_shape(raw_output)}."]
    if raw_input:
        arguments = json.dumps(raw_input, ensure_ascii=False, sort_keys=True)
        parts.append(f"Input: {shortened(arguments, MAX_INPUT_CHARS)}.")
    error = raw_output.get("error") if isinstance(raw_output, dict) else None
    if error:
        parts.append(f"Error: {shortened(str(error), MAX_INPUT_CHARS)}.")
    text = _text_of(raw_output)
    if text is not None and not shows_nothing(text):
        # Its words: each text answer of a tool said the same, the error that was in one
        # found by nothing of it (review; a JSON string's were escaped, "\u6771...": review).
        parts.append(f"Text: {shortened(text, MAX_INPUT_CHARS)}.")
    sizes = _sizes(raw_output)
    if sizes:
        parts.append("Sizes: " + "; ".join(sizes) + ".")
    found = identifiers(raw_output)
    if found:
        parts.append("Identifiers: " + ", ".join(found) + ".")
    return shortened(" ".join(parts), MAX_SUMMARY_CHARS)


def observer_messages(tool_name: str, raw_input, raw_output) -> list[dict]:
    """The seed's observer prompt: the tool, its input, and its output cut at
    ``OBSERVER_INPUT_CHARS``."""
    output = json.dumps(raw_output, ensure_ascii=False)
    if len(output) > OBSERVER_INPUT_CHARS:
        output = output[:OBSERVER_INPUT_CHARS] + "\n[... output truncated]"
    arguments = json.dumps(raw_input, ensure_ascii=False)[:OBSERVER_INPUT_CHARS]
    return [
        {"role": "system", "content": OBSERVER_INSTRUCTIONS},
        {
            "role": "user",
            "content": f"Tool: {tool_name}\nInput: {arguments}\nOutput:\n{output}",
        },
    ]


def observe(tool_name: str, raw_input, raw_output) -> str:
    """The model's summary of a tool's output; ``LLMError`` when it answers nothing."""
    answer = chat(observer_messages(tool_name, raw_input, raw_output)).strip()
    if shows_nothing(answer):  # (a zero-width space too: as a caller's summary, code review)
        raise LLMError("the model answered nothing to read")
    return shortened(answer, MAX_SUMMARY_CHARS)
