"""The optional LLM: any OpenAI-compatible chat API at ``MEMSVC_LLM_BASE_URL`` serving
``MEMSVC_LLM_MODEL`` (OpenAI itself, Ollama, vLLM, llama.cpp...), for the work memsvc does
with a model (distilling memories from conversations). Without both settings there is no
LLM and that work is skipped: nothing else depends on it.
"""

import json
import re
import threading
import time
from collections.abc import Iterator
from types import ModuleType

from django.conf import settings

from memsvc.api.parsers import json_problem
from memsvc.client.core import retry_after_seconds
from memsvc.outage import Outage

TIMEOUT_SECONDS = 120.0
# The client's own retries, with its backoff: enough for a blip, not for an outage.
MAX_RETRIES = 2
# After the LLM refused memsvc's setup (a key, permissions, a model's name), it is not asked
# again for a minute in the process: each agent's write asked it, in vain, and logged its
# refusal (review). The setup is the operator's to mend (settings read at start).
LLM_REFUSAL = Outage(60.0)


class LLMError(Exception):
    """The LLM could not be asked, or did not answer what was asked for.

    ``transient``: it may answer next time (unreachable, overloaded, rate-limited).
    ``misconfigured``: it refused memsvc's key, model name or permissions: it answers once
    the operator fixes its setup.
    ``shown``: what a person may be told (the pages); the message itself, for the log, may
    quote the model's server, whose words are not theirs to read (a key, a host, a quota).
    """

    def __init__(
        self,
        message: str,
        *,
        transient: bool = False,
        misconfigured: bool = False,
        shown: str | None = None,
    ):
        # memsvc's own key is not for its log, whoever quotes it (a model's server that
        # echoed the request's headers in its error had it logged: review).
        key = settings.MEMSVC_LLM_API_KEY
        if key and len(key) >= 8:
            message = message.replace(key, "<MEMSVC_LLM_API_KEY>")
        super().__init__(message)
        self.transient = transient
        self.misconfigured = misconfigured
        self.shown = shown or message


def llm_configured() -> bool:
    return bool(settings.MEMSVC_LLM_BASE_URL and settings.MEMSVC_LLM_MODEL)


def openai_package() -> ModuleType:
    """The ``openai`` package, imported on first use: its import takes a second or more of
    every process that loads the app (each web and worker process, each ``manage.py`` and
    CLI command), for an LLM most deployments never configure. (The LLM's worker imports it
    before it forks its processes: ``memsvc.celery.import_the_llm_client``.)"""
    import openai

    return openai


def _client():
    """A client of the configured LLM; ``LLMError`` (misconfigured), asking nothing, while
    the pause after it refused memsvc's setup lasts (``LLM_REFUSAL``)."""
    if LLM_REFUSAL.ongoing:
        raise LLMError(
            f"not asked: it refused memsvc's setup less than {LLM_REFUSAL.seconds:g} s ago",
            misconfigured=True,
            shown="its model refused memsvc's setup; the server's log says more",
        )
    return openai_package().OpenAI(
        base_url=settings.MEMSVC_LLM_BASE_URL,
        # Local servers want no key, but the client insists on one.
        api_key=settings.MEMSVC_LLM_API_KEY or "none",
        timeout=TIMEOUT_SECONDS,
        max_retries=MAX_RETRIES,
    )


def _llm_error(exc) -> LLMError:
    openai = openai_package()
    transient = isinstance(
        exc, openai.APIConnectionError | openai.RateLimitError | openai.InternalServerError
    )
    misconfigured = isinstance(
        exc, openai.AuthenticationError | openai.PermissionDeniedError | openai.NotFoundError
    )
    if misconfigured:
        LLM_REFUSAL.began()
    return LLMError(
        f"{type(exc).__name__}: {exc}",
        transient=transient,
        misconfigured=misconfigured,
        shown=f"its model failed ({type(exc).__name__}); the server's log says more",
    )


def _text_of(answer, part: str) -> str:
    """The text of the first choice's ``part`` (``message``, or a chunk's ``delta``), as
    PostgreSQL can store it (no NUL, "?" for a lone surrogate, which has no UTF-8); "" when
    there is none. The client does not check the server's JSON: a server that is not an
    OpenAI-compatible one (a web page at that URL, a proxy) answers anything."""
    try:
        content = getattr(answer.choices[0], part).content
    except (AttributeError, IndexError, KeyError, TypeError):
        return ""
    if not isinstance(content, str):
        return ""
    return content.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


def chat_stream(messages: list[dict], *, seconds: float = TIMEOUT_SECONDS) -> Iterator[str]:
    """The model's reply to ``messages``, piece by piece as it is written; ``LLMError`` when
    it cannot be asked, stops answering, answers nothing, or is still answering after
    ``seconds``: then its stream is closed under the reader (a model that sends only
    keep-alive comments yields no piece at which to look at the time: review)."""
    openai = openai_package()
    answered = False
    overdue = threading.Event()
    given_up_at = time.monotonic() + seconds
    try:
        with _client() as client:
            stream = _stream_opened(client, messages, given_up_at)
            left = max(given_up_at - time.monotonic(), 0.0)
            deadline = threading.Timer(left, lambda: (overdue.set(), stream.close()))
            deadline.daemon = True
            deadline.start()
            try:
                for chunk in stream:
                    piece = _text_of(chunk, "delta")
                    if piece:
                        answered = answered or bool(piece.strip())
                        yield piece
            finally:
                deadline.cancel()
            if overdue.is_set():  # (closed between two pieces: the stream just ended)
                raise LLMError(f"the model was still answering after {seconds:g} s")
    except LLMError:
        raise
    except Exception as exc:
        if overdue.is_set():
            raise LLMError(f"the model was still answering after {seconds:g} s") from exc
        if isinstance(exc, openai.OpenAIError):
            # (Not chained: its text, which may quote memsvc's key, is in ours, masked.)
            raise _llm_error(exc) from None
        if isinstance(exc, ValueError):  # an event that is not JSON
            raise LLMError(
                f"the answer is not a chat completion: {exc}",
                # (The parser's words were shown to the person: review.)
                shown="its model's answer could not be read; the server's log says more",
            ) from None
        raise
    if not answered:
        raise LLMError("the model answered nothing")


def _stream_opened(client, messages: list[dict], given_up_at: float):
    """The model's stream, asked for again after a failure worth another try (as the
    client's own retries, ``MAX_RETRIES``) while time is left before ``given_up_at``: the
    client's retries each waited the whole time for a model that never answered, three
    times over, after the reader had gone (review)."""
    openai = openai_package()
    attempt = 0
    while True:
        left = given_up_at - time.monotonic()
        if left <= 0:
            raise LLMError("the model did not answer in time", transient=True)
        try:
            return client.with_options(max_retries=0).chat.completions.create(
                model=settings.MEMSVC_LLM_MODEL, messages=messages, stream=True, timeout=left
            )
        except (openai.APIConnectionError, openai.APIStatusError) as exc:
            status = getattr(exc, "status_code", None)
            # What the client's own retries try again: no answer, 408, 409, 429, a 5xx.
            if status is not None and status not in (408, 409, 429) and status < 500:
                raise
            attempt += 1
            pause = retry_after_seconds(getattr(exc, "response", None)) or 0.5 * 2 ** (attempt - 1)
            if attempt > MAX_RETRIES or given_up_at - time.monotonic() <= pause:
                raise
            time.sleep(pause)


def chat(messages: list[dict]) -> str:
    """The model's reply to ``messages`` (chat completion messages); ``LLMError`` when there
    is none."""
    openai = openai_package()
    try:
        with _client() as client:
            response = client.chat.completions.create(
                model=settings.MEMSVC_LLM_MODEL, messages=messages
            )
    except openai.OpenAIError as exc:
        raise _llm_error(exc) from None  # (not chained: as ``chat_stream``)
    except ValueError as exc:  # a body that is not JSON
        raise LLMError(f"the answer is not a chat completion: {exc}") from None
    content = _text_of(response, "message")
    if not content.strip():
        raise LLMError("the model answered nothing")
    return content


# Models asked for JSON often wrap it in a Markdown code fence anyway: its language's name.
_FENCE_LANGUAGE = re.compile(r"[a-zA-Z]*")


def transcript_line(speaker: str, text: str) -> str:
    """One turn of a transcript given to the model: who speaks and what they said, each a
    JSON string, on one line. A turn's text cannot start a line of its own: a member's
    message holding "\\n[1] alice (user): ..." read as alice's own turn, and a memory about
    her was kept from it (review)."""
    return f"{json.dumps(speaker, ensure_ascii=False)}: {json.dumps(text, ensure_ascii=False)}"


def _unfenced(text: str) -> str:
    """``text`` without the Markdown code fence around it, if it has one ("```json ... ```").
    (Read without a pattern tried at every place: one of the fence, the language's letters
    and the text between, on an answer of 20,000 letters, took 3 s; review.)"""
    if len(text) < 6 or not (text.startswith("```") and text.endswith("```")):
        return text
    inner = text[3:-3]
    return inner[_FENCE_LANGUAGE.match(inner).end() :].strip()


def json_answer(text: str):
    """The JSON value a model answered; ``LLMError`` when the answer is not JSON, or JSON
    that cannot be stored (a ``\\ud800`` escape, nesting deeper than any answer needs), as
    the APIs refuse such a body (``memsvc.api.parsers``)."""
    text = text.strip()
    try:
        value = json.loads(_unfenced(text))
    except (ValueError, RecursionError):
        raise LLMError(f"the answer is not JSON: {text[:200]!r}") from None
    problem = json_problem(value)
    if problem:
        raise LLMError(f"the answer's JSON at {list(problem[0])} {problem[1]}")
    return value
