"""The I/O-free core of ``learning()`` and the memsvc address, without a server."""

import json
import time
from types import SimpleNamespace

import httpx
import pytest

from memsvc.client import hooks, learning, server_url_from_env
from memsvc.client.core import (
    ANTHROPIC,
    CHAT,
    METADATA_MAX_BYTES,
    METADATA_MAX_DEPTH,
    RESPONSES,
    STORED_MAX_CHARS,
    TRUNCATED,
    Call,
    Recall,
    Reply,
    ReplyReader,
    ServerSentEvents,
    json_bytes,
    model_api,
    text_cut_to,
)
from tests.local_http import LocalHttpServer
from tests.local_http import Reply as Answer


def sse(*events) -> bytes:
    out = b""
    for event in events:
        name, data = event if isinstance(event, tuple) else (None, event)
        out += (f"event: {name}\n" if name else "").encode() + f"data: {data}\n\n".encode()
    return out


def read_in_pieces(api, body: bytes, size: int, *, streamed=True) -> Reply:
    reader = ReplyReader(api, streamed=streamed)
    for start in range(0, len(body), size):
        reader.feed(body[start : start + size])
    return reader.finish()


@pytest.mark.parametrize("size", [1, 7, 10_000])
def test_a_streamed_chat_reply_is_assembled_whatever_the_chunking(size):
    chunks = [
        {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {"choices": [{"index": 0, "delta": {"content": "lo é"}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a"'}}
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]},
                }
            ]
        },
        {"choices": [{"index": 1, "delta": {"content": "another choice"}}]},
        {"choices": [], "usage": {"total_tokens": 3}},
    ]
    body = sse(*(json.dumps(c) for c in chunks), "[DONE]").replace(b"\n", b"\r\n")
    reply = read_in_pieces(CHAT, body, size)
    assert reply.text == "Hello é"
    assert reply.metadata == {
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
        ]
    }


def test_a_streamed_anthropic_reply_with_a_tool_use():
    events = [
        {"type": "message_start", "message": {"content": []}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "t1", "name": "look", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"q": '},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '"x"}'},
        },
        {"type": "message_stop"},
    ]
    reply = read_in_pieces(ANTHROPIC, sse(*((e["type"], json.dumps(e)) for e in events)), 5)
    assert reply.text == "Hi"
    assert reply.tool_calls == (
        {"id": "t1", "type": "tool_use", "function": {"name": "look", "arguments": {"q": "x"}}},
    )


def test_a_streamed_responses_reply_prefers_the_completed_response():
    deltas = [{"type": "response.output_text.delta", "delta": d} for d in ("a", "b")]
    completed = {
        "type": "response.completed",
        "response": {
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "ab!"}]}]
        },
    }
    assert read_in_pieces(RESPONSES, sse(*map(json.dumps, deltas)), 3).text == "ab"
    assert read_in_pieces(RESPONSES, sse(*map(json.dumps, [*deltas, completed])), 3).text == "ab!"


def test_a_stream_that_ends_in_an_error_is_no_reply():
    """The SDK raises the error to the caller, who got no answer: a cut reply was stored as
    the answer (review). Nothing of the turn is stored, as for an error status."""
    text = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "Hel"},
    }
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    anthropic = sse(*((e["type"], json.dumps(e)) for e in [text, error]))
    assert read_in_pieces(ANTHROPIC, anthropic, 5) is None
    chat = [{"choices": [{"index": 0, "delta": {"content": "Hel"}}]}, {"error": {"message": "x"}}]
    assert read_in_pieces(CHAT, sse(*map(json.dumps, chat)), 5) is None
    for failure in ({"type": "error", "message": "x"}, {"type": "response.failed"}):
        events = [{"type": "response.output_text.delta", "delta": "Hel"}, failure]
        assert read_in_pieces(RESPONSES, sse(*map(json.dumps, events)), 5) is None
    # (Without the error, the reply so far: a stream the caller breaks off.)
    assert read_in_pieces(ANTHROPIC, sse((text["type"], json.dumps(text))), 5).text == "Hel"


def test_a_streamed_refusal_is_the_reply_when_no_text_comes():
    """A declining model streams its refusal instead of text: chat's ``delta.refusal``, the
    Responses API's ``response.refusal.delta`` (here cut before ``response.completed``)."""
    chat = [{"choices": [{"index": 0, "delta": {"refusal": part}}]} for part in ("I can", "'t.")]
    assert read_in_pieces(CHAT, sse(*map(json.dumps, chat), "[DONE]"), 5) == Reply("I can't.")
    deltas = [{"type": "response.refusal.delta", "delta": d} for d in ("No", ", sorry.")]
    assert read_in_pieces(RESPONSES, sse(*map(json.dumps, deltas)), 5).text == "No, sorry."
    # Text, when a model streams both, is the reply.
    both = [{"choices": [{"index": 0, "delta": {"content": "Yes.", "refusal": "No."}}]}]
    assert read_in_pieces(CHAT, sse(*map(json.dumps, both)), 5).text == "Yes."


def test_a_whole_json_reply():
    body = json.dumps({"choices": [{"message": {"content": None, "refusal": "no"}}]}).encode()
    assert read_in_pieces(CHAT, body, 4, streamed=False) == Reply("no")


def test_server_sent_events_keep_names_and_join_data_lines():
    decoder = ServerSentEvents()
    events = list(decoder.feed(b"event: a\ndata: 1\ndata: 2\n\n: comment\ndata: 3"))
    assert events == [("a", "1\n2")]
    assert list(decoder.close()) == [(None, "3")]


def in_chunks(decoder: ServerSentEvents, stream: bytes, size: int) -> list:
    return [
        event
        for start in range(0, len(stream), size)
        for event in decoder.feed(stream[start : start + size])
    ]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_server_sent_events_are_the_same_in_chunks_of_any_size(size):
    """A line ends in any chunk, a CRLF split between two too."""
    decoder = ServerSentEvents()
    stream = b"event: a\r\ndata: 1\r\ndata: 2\r\n\r\n: comment\ndata: 3\n\ndata: 4"
    assert in_chunks(decoder, stream, size) == [("a", "1\n2"), (None, "3")]
    assert list(decoder.close()) == [(None, "4")]


def test_a_long_line_in_small_chunks_is_read_in_time():
    """Joined once it ends: the whole buffer split again at every chunk was quadratic, a line
    of 800 KB in chunks of 64 bytes took 4.7 s (review). (Milliseconds now; the bound only
    tells linear from quadratic.)"""
    started = time.monotonic()
    events = in_chunks(ServerSentEvents(), b"data: " + b"x" * 800_000 + b"\n\n", 64)
    assert time.monotonic() - started < 2
    assert events == [(None, "x" * 800_000)]


def test_which_calls_are_model_calls():
    assert model_api("openai", "post", "/chat/completions", {}) is CHAT
    assert model_api("openai", "post", "/deployments/x/chat/completions", {}) is CHAT
    assert model_api("openai", "post", "/responses", {}) is RESPONSES
    assert model_api("anthropic", "post", "/v1/messages?beta=true", {}) is ANTHROPIC
    assert model_api("openai", "post", "/threads/t/messages", {}) is None  # Assistants
    assert model_api("anthropic", "post", "/v1/messages/count_tokens", {}) is None
    assert model_api("openai", "get", "/responses", None) is None
    assert model_api("openai", "post", "/embeddings", {}) is None


def test_the_recall_strategy_decides_what_is_asked_injected_and_stored():
    strategy = Recall()
    call = Call("a", RESPONSES, {"input": [{"role": "user", "content": "hi"}], "instructions": "x"})
    request = strategy.context_request(call)
    assert (request.method, request.path, request.json) == (
        "POST",
        "/context/a",
        {"agent_name": "a", "query": "hi"},
    )
    prepared = strategy.prepare(call, {"memory_blocks": [{"label": "human", "value": "Bo"}]})
    assert prepared["instructions"].startswith("x\n\nThe following is context from your memory:")
    assert call.body["instructions"] == "x"  # the caller's body is not changed
    assert strategy.prepare(call, {"memory_blocks": []}) is call.body
    assert strategy.prepare(call, None) is call.body  # memsvc failed: the body as it was
    stores = strategy.stores(call, Reply("hello"))
    assert [s.json["role"] for s in stores] == ["user", "assistant"]
    assert strategy.context_request(Call("a", CHAT, {"messages": []})) is None  # no user text
    assert strategy.context_request(Call("a", CHAT, call.body, capture_only=True)) is None


def test_an_anthropic_reply_that_goes_on_from_a_prefill_is_stored_whole():
    """The model answers only the rest of an assistant message that ends the messages: the
    reply was stored without its start (review)."""
    messages = [
        {"role": "user", "content": "List two colours."},
        {"role": "assistant", "content": [{"type": "text", "text": "Sure:"}]},
    ]
    stores = Recall().stores(Call("a", ANTHROPIC, {"messages": messages}), Reply(" red, blue"))
    assert [(s.json["role"], s.json["content"]) for s in stores] == [
        ("user", "List two colours."),
        ("assistant", "Sure: red, blue"),
    ]
    # Not another API's (an assistant message last is no prefill there).
    chat = Call("a", CHAT, {"messages": messages})
    assert Recall().stores(chat, Reply(" red, blue"))[-1].json["content"] == " red, blue"


@pytest.mark.parametrize(
    ("text", "max_bytes"),
    [
        ("a" * 900 + "\x01" * 200, 1000),  # (a control character is six bytes in JSON)
        ("é" * 3000, 1001),
        ("x" * 3_000_000, 1024 * 1024),
        ("a\x01" * 700_000, 1024 * 1024),
    ],
)
def test_a_text_cut_to_fit_keeps_the_longest_start_that_fits(text, max_bytes):
    """(Halved, 2 MiB were kept as 512 KiB of 1 MiB; shrunk once in proportion, 659 of the
    914 characters that fit: review.)"""
    cut = text_cut_to(text, max_bytes)
    kept = cut.removesuffix(TRUNCATED)
    assert cut.endswith(TRUNCATED) and text.startswith(kept)
    assert json_bytes(cut) <= max_bytes < json_bytes(text[: len(kept) + 1] + TRUNCATED)


def test_a_turn_longer_than_memsvc_takes_is_stored_and_asked_about_by_its_start():
    """(A pasted document of 150,000 characters: memsvc refused the store and the context
    request, 422, and the turn was neither remembered nor given memory.)"""
    long = "a" * STORED_MAX_CHARS + "b" * 50_000
    call = Call("a", CHAT, {"messages": [{"role": "user", "content": long}]})
    assert Recall().context_request(call).json["query"] == "a" * STORED_MAX_CHARS
    user, assistant = Recall().stores(call, Reply(long))
    assert user.json["content"] == assistant.json["content"] == "a" * STORED_MAX_CHARS


def test_a_turn_with_a_nul_or_a_lone_surrogate_is_stored_and_asked_about_readably():
    """memsvc takes no NUL nor lone surrogate in a text: the turn was refused (422, two
    warnings) and only the reply was kept (review)."""
    text = "id=7\x00 end \ud800!"
    call = Call("a", CHAT, {"messages": [{"role": "user", "content": text}]})
    assert Recall().context_request(call).json["query"] == "id=7\ufffd end \ufffd!"
    user, assistant = Recall().stores(call, Reply("ok\x00"))
    assert (user.json["content"], assistant.json["content"]) == (
        "id=7\ufffd end \ufffd!",
        "ok\ufffd",
    )
    json.dumps(user.json).encode()  # (sent as UTF-8: a lone surrogate could not be)
    # So are a reply's tool calls (its metadata): the reply was not stored.
    calls = ({"id": "c\x00", "type": "function", "function": {"arguments": '{"t": "a\ud800"}'}},)
    [_, assistant] = Recall().stores(call, Reply("", calls))
    assert json.dumps(assistant.json, ensure_ascii=False).encode().count("\ufffd".encode()) == 2


def test_a_message_without_text_is_a_turn_that_the_reply_answers():
    """An image alone: the reply was stored answering no user turn (review)."""
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]
    call = Call("a", CHAT, {"messages": [{"role": "user", "content": image}]})
    assert Recall().context_request(call) is None  # nothing to search by
    user, assistant = Recall().stores(call, Reply("A red bicycle."))
    assert (user.json["role"], user.json["content"]) == ("user", "(no text)")
    assert assistant.json["content"] == "A red bicycle."
    # A call without a user's message (a system prompt alone) has no user turn to store.
    for api, body in [
        (CHAT, {"messages": [{"role": "system", "content": "Write a haiku."}]}),
        (RESPONSES, {"instructions": "Write a haiku.", "input": []}),
    ]:
        [assistant] = Recall().stores(Call("a", api, body), Reply("Leaves fall"))
        assert assistant.json["role"] == "assistant"


def test_a_reply_in_the_older_function_call_form_is_stored_as_its_tool_call():
    """(``functions=`` and ``function_call``: only the user's turn was stored; review.)"""
    call_ = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    whole = CHAT.reply({"choices": [{"message": {"content": None, "function_call": call_}}]})
    expected = ({"id": None, "type": "function", "function": call_},)
    assert whole.tool_calls == expected
    pieces = [{"name": "get_weather"}, {"arguments": '{"city": '}, {"arguments": '"Paris"}'}]
    body = sse(
        *(json.dumps({"choices": [{"index": 0, "delta": {"function_call": p}}]}) for p in pieces)
    )
    assert read_in_pieces(CHAT, body, 7).tool_calls == expected


def test_the_client_cuts_turns_where_memsvc_does_by_default():
    from django.conf import settings

    from memsvc.api import fields, parsers

    assert STORED_MAX_CHARS == settings.MEMSVC_MAX_MESSAGE_CHARS
    assert METADATA_MAX_BYTES == fields.METADATA_MAX_BYTES
    assert METADATA_MAX_DEPTH == parsers.FIELD_MAX_JSON_DEPTH


def test_a_turns_stores_carry_keys_that_name_it():
    """memsvc stores a store sent again with its key once: a turn's two stores have keys of
    their own, the same whenever they are made, and another call's are others."""
    call = Call("a", CHAT, {"messages": [{"role": "user", "content": "hi"}]})
    user, assistant = Recall().stores(call, Reply("hello"))
    assert user.idempotency_key and assistant.idempotency_key
    assert user.idempotency_key != assistant.idempotency_key
    again = Recall().stores(call, Reply("hello"))
    assert [s.idempotency_key for s in again] == [user.idempotency_key, assistant.idempotency_key]
    other = Recall().stores(Call("a", CHAT, call.body), Reply("hello"))
    assert other[0].idempotency_key != user.idempotency_key


def test_the_agents_name_is_one_segment_of_the_context_path():
    call = Call("what? #1 50%", CHAT, {"messages": [{"role": "user", "content": "hi"}]})
    assert Recall().context_request(call).path == "/context/what%3F%20%231%2050%25"


@pytest.mark.parametrize(
    ("timeout", "seconds"),
    [
        (None, 10),  # none: ours
        (2, 2),
        (30.0, 10),
        (httpx.Timeout(600, connect=5.0), 10),  # the SDKs' default: the read is what counts
        (httpx.Timeout(5.0, read=0.5), 0.5),
        (httpx.Timeout(None), 10),
    ],
)
def test_memsvc_may_cost_a_call_no_more_than_its_timeout(timeout, seconds):
    assert Call("a", CHAT, {}, timeout=timeout).seconds_before(10.0) == seconds


TOOL_LOOP_NEXT_STEPS = {
    "chat": (
        CHAT,
        "messages",
        [
            {"role": "user", "content": "Q"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function"}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ],
    ),
    "responses": (
        RESPONSES,
        "input",
        [
            {"role": "user", "content": "Q"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
        ],
    ),
    "anthropic": (
        ANTHROPIC,
        "messages",
        [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
        ],
    ),
}


@pytest.mark.parametrize(
    ("api", "key", "messages"), TOOL_LOOP_NEXT_STEPS.values(), ids=TOOL_LOOP_NEXT_STEPS
)
def test_a_tool_loops_next_step_recalls_for_its_question_and_stores_only_the_reply(
    api, key, messages
):
    """The call that sends the tool results back asks memory for the user's question (the
    one before the results) and does not store it again: the step that asked it did."""
    strategy = Recall()
    step = Call("a", api, {key: messages})
    assert strategy.context_request(step).json["query"] == "Q"
    assert [s.json["role"] for s in strategy.stores(step, Reply("done"))] == ["assistant"]
    follow_up = [*messages, {"role": "assistant", "content": "done"}]
    follow_up.append({"role": "user", "content": "Q2"})
    stores = strategy.stores(Call("a", api, {key: follow_up}), Reply("ok"))
    assert [(s.json["role"], s.json["content"]) for s in stores] == [
        ("user", "Q2"),
        ("assistant", "ok"),
    ]


@pytest.mark.parametrize(
    ("environ", "url"),
    [
        ({}, "http://127.0.0.1:8283"),
        ({"MEMORY_SERVER_PORT": "9000"}, "http://127.0.0.1:9000"),
        ({"MEMORY_SERVER_HOST": "0.0.0.0", "MEMORY_SERVER_PORT": "9000"}, "http://127.0.0.1:9000"),  # noqa: S104
        ({"MEMORY_SERVER_HOST": "memsvc.lan"}, "http://memsvc.lan:8283"),
        ({"MEMORY_SERVER_HOST": "::1"}, "http://[::1]:8283"),
        (
            {"MEMORY_SERVER_URL": "https://m.example/", "MEMORY_SERVER_PORT": "1"},
            "https://m.example",
        ),
    ],
)
def test_where_memsvc_is(environ, url):
    assert server_url_from_env(environ) == url


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:abc",
        "http://[::1",
        f"http://{'a' * 64}.example",
        "http://xn--zz.example",
        "localhost:8283",  # (said "not reachable ... start it": review)
        "127.0.0.1:8283",
    ],
)
def test_an_address_that_is_no_url_is_memsvc_unavailable(url):
    """The block's entry raises one of its two exceptions, not httpx's ``InvalidURL``."""
    from memsvc.client import MemoryServerUnavailable

    said = r"is no URL|is not reachable" if url.startswith("http://") else r"is no URL \(it"
    with (
        pytest.raises(MemoryServerUnavailable, match=said),
        learning(agent="a", server_url=url),
    ):
        pass


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            Answer(503, {"status": "unavailable", "detail": "database unreachable"}),
            "503: database unreachable",
        ),
        (Answer(404, b""), "404: Not Found"),  # (nothing said: its status's words; review)
    ],
)
def test_a_memsvc_whose_health_check_fails_is_said_to_answer_not_to_be_started(answer, reason):
    """A server answers there (a 503 of a database down, a 429): "start it" misled."""
    from memsvc.client import MemoryServerUnavailable

    with (
        LocalHttpServer(lambda method, path, body: answer) as server,
        pytest.raises(MemoryServerUnavailable) as refused,
        learning(agent="a", server_url=server.url),
    ):
        pass
    assert str(refused.value) == f"memsvc at {server.url} answered its health check with {reason}"


def test_a_block_names_its_strategy():
    assert isinstance(learning(agent="a").strategy, Recall)
    with pytest.raises(ValueError, match="unknown strategy 'nope'; one of recall"):
        learning(agent="a", strategy="nope")


def test_blocks_serve_a_worker_alike_only_without_a_state_of_their_own():
    """A worker thread in no block is served by the blocks running when they serve alike
    (``hooks.current_session``): two memory-bank blocks of one agent keep two tasks, and a
    worker of one wrote its tool steps into the other's (review)."""
    recall = [learning(agent="a", server_url="http://127.0.0.1:9") for _ in range(2)]
    assert recall[0].serving == recall[1].serving
    banks = [
        learning(agent="a", server_url="http://127.0.0.1:9", strategy="memory_bank", task_id=t)
        for t in ("task-A", "task-B")
    ]
    assert banks[0].serving != banks[1].serving


def test_a_call_is_prepared_once_and_sent_as_made_when_preparing_it_fails(caplog):
    """A context answer not of our shape: the call goes as the caller made it, with one
    warning, and the strategy's ``prepare`` ran once (a second, without memory, counted the
    memory bank's step twice: review)."""
    prepared = []

    class Failing:
        def prepare(self, call, context):
            prepared.append(context)
            raise KeyError("label")

    turn = hooks.Turn(SimpleNamespace(strategy=Failing()), call=None)
    options = SimpleNamespace(json_data={"messages": []})
    with caplog.at_level("WARNING", logger="memsvc.client"):
        assert hooks._prepared(turn, options, {"memory_blocks": [{"x": 1}]}) is options
    assert prepared == [{"memory_blocks": [{"x": 1}]}]
    assert len(caplog.records) == 1
