"""``learning(strategy="memory_bank")``: the real ``openai`` client in an agent loop against
the stand-in LLM (tests/fake_openai.py, answering tool calls), and a real memsvc (Django's
live server) keeping the tool records."""

import asyncio
import json
import logging
import time
import uuid

import httpx
import openai
import pytest

from agents_api.api.serializers import TASK_ID_MAX_LENGTH
from agents_api.models import ToolRecord
from bench.tool_task import FINAL_ANSWER, first_messages, run_agent, script, tool_output
from memsvc.client import learning
from memsvc.client.core import json_bytes
from memsvc.client.sender import sender
from memsvc.client.session import _KeptClient
from memsvc.memory_bank import (
    CONTEXT_HEADING,
    MAX_TASK_ID_CHARS,
    MAX_TOOL_JSON_BYTES,
    TRUNCATED,
    MemoryBank,
    compressed,
    format_records,
    tool_interactions,
)
from search.embeddings import configured_backend
from tests.fake_openai import FakeOpenAI, ToolCall
from tests.local_http import LocalHttpServer, Reply
from tests.memsvc.test_client_delivery import late_first_store

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = "planner"


def scripted(fake: FakeOpenAI, steps: int, *, final: str = FINAL_ANSWER) -> None:
    """The model calls tools for ``steps`` steps (bench.tool_task's plan), then answers."""
    fake.then(*([ToolCall(name, args) for name, args in calls] for calls in script(steps)), final)


@pytest.fixture(autouse=True)
def embedding_model_loaded():
    """The live server runs in this process: its first store would load the model, which
    can outlast the client's timeout on a busy machine."""
    configured_backend().embed(["warm up"])


@pytest.fixture
def llm():
    with FakeOpenAI() as fake:
        yield fake


def sent(llm) -> list[list[dict]]:
    """The messages of each chat completion the model received, in order."""
    return [r.body["messages"] for r in llm.requests if r.path.endswith("/chat/completions")]


def roles(messages) -> list[str]:
    return [m["role"] for m in messages]


def is_slice_of(part: list, whole: list) -> bool:
    return any(whole[i : i + len(part)] == part for i in range(len(whole) - len(part) + 1))


def one_tool_step() -> list[dict]:
    """A task's history after its first tool call and the tool's answer."""
    call = ToolCall("search_flights", {"to": "Lisbon"})
    return [
        {"role": "user", "content": "Plan a trip to Lisbon."},
        {"role": "assistant", "content": None, "tool_calls": [call.as_json()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"flights": 3}'},
    ]


def two_tool_steps() -> list[dict]:
    """``one_tool_step`` and a second tool call with its answer."""
    call = ToolCall("book_flight", {"flight": "TP123"})
    return [
        *one_tool_step(),
        {"role": "assistant", "content": None, "tool_calls": [call.as_json()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"booked": true}'},
    ]


def test_each_step_sends_anchor_retrieved_records_and_the_last_interaction(live_server, llm):
    scripted(llm, 6)
    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    with learning(agent=AGENT, server_url=live_server.url, strategy="memory_bank", task_id="trip"):
        history = run_agent(client, model="gpt-test")
    assert history[-1] == {"role": "assistant", "content": FINAL_ANSWER}
    requests = sent(llm)
    assert len(requests) == 7
    # The first step passes through unchanged.
    assert requests[0] == first_messages()
    # Every later step: the system prompt, the anchor, the most relevant records of the
    # earlier steps (none yet at step 2), the last tool interaction (step 5 called two
    # tools in parallel: two tool answers at step 6).
    for step, messages in enumerate(requests[1:], start=2):
        earlier = step - 2 + (step == 7)  # records stored before the last interaction's
        context = ["system"] if earlier else []
        assert roles(messages) == [
            "system",
            "user",
            *context,
            "assistant",
            "tool",
            *(["tool"] if step == 6 else []),
        ], step
        assert messages[:2] == first_messages()
        if earlier:
            text = messages[2]["content"]
            assert text.startswith(CONTEXT_HEADING + "\n\n[RETRIEVED RECORD 1]\nSummary: ")
            assert text.count("[RETRIEVED RECORD") == min(3, earlier)  # topK 3
        tail = messages[2 + len(context) :]
        assert tail[0]["tool_calls"] and is_slice_of(tail, history)
        # The last interaction is not repeated among the records.
        if earlier:
            for answer in tail[1:]:
                assert answer["content"] not in messages[2]["content"]
    # The history grows with every step; what the model receives is bounded (3 records of
    # at most 2,000 characters of raw data, and one interaction).
    assert len(json.dumps(requests[-1])) < len(json.dumps(history[:-1]))
    records = ToolRecord.objects.filter(agent__name=AGENT).order_by("step", "tool_name")
    assert [(r.task_id, r.step, r.tool_name) for r in records] == [
        ("trip", 2, "search_hotels"),
        ("trip", 3, "get_hotel_details"),
        ("trip", 4, "check_availability"),
        ("trip", 5, "get_weather"),
        ("trip", 6, "get_weather"),  # parallel calls: one record each
        ("trip", 6, "search_trains"),
        ("trip", 7, "search_hotels"),
    ]
    hotels = records.get(step=2)
    assert hotels.raw_input == {"city": "Lisbon"}
    assert hotels.raw_output == tool_output("search_hotels", {"city": "Lisbon"})  # whole


def test_a_model_server_that_gives_every_call_one_id_gets_a_record_of_each(live_server, llm):
    """Some servers give every tool call the id "call_0": each step's records were taken for
    the first one's, none stored, and nothing retrieved (review)."""
    llm.then(*([ToolCall(n, a, id="call_0") for n, a in calls] for calls in script(6)), "Done.")
    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    with learning(agent=AGENT, server_url=live_server.url, strategy="memory_bank", task_id="t"):
        run_agent(client, model="gpt-test")
    records = ToolRecord.objects.filter(agent__name=AGENT).order_by("step", "tool_name")
    assert [(r.step, r.tool_name) for r in records] == [
        (2, "search_hotels"),
        (3, "get_hotel_details"),
        (4, "check_availability"),
        (5, "get_weather"),
        (6, "get_weather"),  # (parallel calls of one id: one record each)
        (6, "search_trains"),
        (7, "search_hotels"),
    ]
    assert CONTEXT_HEADING in sent(llm)[-1][2]["content"]  # records retrieved


def test_a_history_that_keeps_only_the_last_step_of_reused_ids_gets_a_record_of_each(
    live_server, llm
):
    """The task, then only the last interaction, its call always "call_0": every step's
    interaction has the same place and id (review)."""
    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    with learning(agent=AGENT, server_url=live_server.url, strategy="memory_bank", task_id="w"):
        for step, city in enumerate(["Lisbon", "Porto", "Faro"]):
            call = ToolCall("weather", {"city": city}, id="call_0")
            llm.then("Noted.")
            client.chat.completions.create(
                model="gpt-test",
                messages=[
                    {"role": "user", "content": "Plan the trip."},
                    {"role": "assistant", "content": None, "tool_calls": [call.as_json()]},
                    {"role": "tool", "tool_call_id": "call_0", "content": f'{{"n": {step}}}'},
                ],
            )
    records = ToolRecord.objects.filter(agent__name=AGENT).order_by("created_at")
    assert [r.raw_input["city"] for r in records] == ["Lisbon", "Porto", "Faro"]


def test_the_compressed_context_is_exactly_the_seeds():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Find a hotel."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "s", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": '{"old": true}'},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "b", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                {"id": "c", "type": "function", "function": {"name": "g", "arguments": "not json"}},
            ],
        },
        {"role": "tool", "tool_call_id": "b", "content": '{"id": "htl-001"}'},
        {"role": "tool", "tool_call_id": "c", "content": "plain text answer"},
    ]
    interactions = tool_interactions(messages)
    assert [(i.call_id, i.tool_name, i.raw_input, i.raw_output) for i in interactions] == [
        ("b", "f", {"x": 1}, {"id": "htl-001"}),
        ("c", "g", {"_raw": "not json"}, {"_raw": "plain text answer"}),
    ]
    records = [
        {"summary": "Found one hotel.", "output": {"id": "htl-001"}},
        {"summary": "Long.", "output": "x" * 50},
    ]
    text = format_records(records, max_chars=20)
    assert text == (
        '[RETRIEVED RECORD 1]\nSummary: Found one hotel.\nRaw Data: {"id": "htl-001"}\n'
        "-------------------\n"
        f'[RETRIEVED RECORD 2]\nSummary: Long.\nRaw Data: "{"x" * 19}...[truncated]'
    )
    assert compressed(messages, records, 20) == [
        messages[0],
        messages[1],
        {"role": "system", "content": f"{CONTEXT_HEADING}\n\n{text}"},
        *messages[4:],
    ]
    assert compressed(messages[:2], records, 20) == messages[:2]  # no tool call yet
    # What the user said mid-task is kept, in order (it was dropped, with the middle).
    said = {"role": "user", "content": "Near the sea, please."}
    mid_task = [*messages[:4], said, *messages[4:]]
    assert compressed(mid_task, records, 20) == [
        messages[0],
        messages[1],
        said,
        {"role": "system", "content": f"{CONTEXT_HEADING}\n\n{text}"},
        *messages[4:],
    ]


@pytest.mark.parametrize("answer", ['{"score": NaN}', "[Infinity]", '{"big": 1e400}'])
def test_a_tool_answer_json_cannot_carry_is_kept_as_text(answer):
    """(Read as a float no JSON document holds, the step's record could not be sent.)"""
    call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "a", "content": answer},
    ]
    [interaction] = tool_interactions(messages)
    assert interaction.raw_output == {"_raw": answer}
    json.dumps(interaction.raw_output, allow_nan=False)  # httpx's json=, which raised


def one_step_stored(live_server, llm, caplog, messages: list) -> None:
    """One model call of ``messages`` inside a memory bank block, its step stored without
    a warning."""
    llm.then("Done.")
    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    with (
        caplog.at_level(logging.WARNING, logger="memsvc.client"),
        learning(agent=AGENT, server_url=live_server.url, strategy="memory_bank"),
    ):
        client.chat.completions.create(model="gpt-test", messages=messages)
    assert "going on without memory" not in caplog.text


def test_a_tool_step_holding_a_nul_is_stored_with_the_replacement_character(
    live_server, llm, caplog
):
    """memsvc refuses a NUL in a text: a tool's output holding one was refused (422), the
    step never stored, and memory bank unavailable for it (outside review). As the default
    strategy stores a turn: the NUL as U+FFFD."""
    call = ToolCall("read_file", {"path": "a\x00b"})
    messages = [
        {"role": "user", "content": "Read the file."},
        {"role": "assistant", "content": None, "tool_calls": [call.as_json()]},
        {"role": "tool", "tool_call_id": call.id, "content": "file header \x00\x00 id htl-555"},
    ]
    one_step_stored(live_server, llm, caplog, messages)
    record = ToolRecord.objects.get(agent__name=AGENT)
    assert record.raw_input == {"path": "a\ufffdb"}
    assert record.raw_output == {"_raw": "file header \ufffd\ufffd id htl-555"}


def test_a_tool_output_over_memsvcs_limit_is_kept_to_its_start_beside_the_others(
    live_server, llm, caplog
):
    """memsvc keeps at most 1 MiB of a tool's output: one larger output was refused (422)
    with every other record of its step (review). It is kept to its start, marked; the
    other parallel call's record whole."""
    big, small = ToolCall("dump_log", {}), ToolCall("lookup", {"id": 7})
    huge = json.dumps({"lines": ["\u0001 log line éé " + str(i) for i in range(80_000)]})
    messages = [
        {"role": "user", "content": "Look into it."},
        {"role": "assistant", "content": None, "tool_calls": [big.as_json(), small.as_json()]},
        {"role": "tool", "tool_call_id": big.id, "content": huge},
        {"role": "tool", "tool_call_id": small.id, "content": '{"status": "ok"}'},
    ]
    assert len(huge.encode()) > MAX_TOOL_JSON_BYTES
    one_step_stored(live_server, llm, caplog, messages)
    records = {r.tool_name: r for r in ToolRecord.objects.filter(agent__name=AGENT)}
    assert records["lookup"].raw_output == {"status": "ok"}
    kept = records["dump_log"].raw_output["_raw"]
    assert kept.endswith(TRUNCATED) and '"lines": ["\\u0001 log line éé 0"' in kept
    kept_bytes = json_bytes({"_raw": kept})  # (as memsvc counts it: compact)
    assert 0.95 * MAX_TOOL_JSON_BYTES < kept_bytes <= MAX_TOOL_JSON_BYTES  # (half was kept)


def test_a_tool_output_deeper_than_memsvc_takes_is_kept_as_text_beside_the_others(
    live_server, llm, caplog
):
    """An output nested 70 levels deep was refused (422) with the step's other records
    (review). As deep as memsvc takes it is kept whole; deeper, as its JSON text."""

    def nested(levels):
        value = "leaf"
        for _ in range(levels):
            value = {"n": value}
        return value

    deep, deepest, small = ToolCall("ast", {}), ToolCall("parse", {}), ToolCall("price", {})
    calls = [deep.as_json(), deepest.as_json(), small.as_json()]
    messages = [
        {"role": "user", "content": "Parse it."},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": deep.id, "content": json.dumps(nested(61))},
        {"role": "tool", "tool_call_id": deepest.id, "content": json.dumps(nested(70))},
        {"role": "tool", "tool_call_id": small.id, "content": '{"id": "htl-777"}'},
    ]
    one_step_stored(live_server, llm, caplog, messages)
    records = {r.tool_name: r for r in ToolRecord.objects.filter(agent__name=AGENT)}
    assert records["price"].raw_output == {"id": "htl-777"}
    assert records["ast"].raw_output == nested(61)
    assert records["parse"].raw_output == {"_raw": json.dumps(nested(70), ensure_ascii=False)}


def test_a_tool_of_a_blank_name_is_recorded_as_a_tool(live_server, llm, caplog):
    """memsvc refuses a tool name of nothing to read: the step would be lost with it."""
    blank, named = ToolCall("   ", {}), ToolCall("price", {})
    messages = [
        {"role": "user", "content": "Price it."},
        {"role": "assistant", "content": None, "tool_calls": [blank.as_json(), named.as_json()]},
        {"role": "tool", "tool_call_id": blank.id, "content": '{"a": 1}'},
        {"role": "tool", "tool_call_id": named.id, "content": '{"b": 2}'},
    ]
    one_step_stored(live_server, llm, caplog, messages)
    records = ToolRecord.objects.filter(agent__name=AGENT).order_by("tool_name")
    assert [(r.tool_name, r.raw_output) for r in records] == [
        ("price", {"b": 2}),
        ("tool", {"a": 1}),
    ]


def test_a_step_of_many_large_parallel_calls_is_one_request_memsvc_takes(settings):
    """42 parallel calls each answering 1 MB (under the 1 MiB a record may keep) made one
    store of 43.7 MB: refused (413) by memsvc's default body cap, every record of the step
    lost (review). Each keeps its share of the step's budget."""
    calls = [ToolCall("read_file", {"path": f"f{n}"}) for n in range(42)]
    messages = [
        {"role": "user", "content": "Read them all."},
        {"role": "assistant", "content": None, "tool_calls": [c.as_json() for c in calls]},
        *({"role": "tool", "tool_call_id": c.id, "content": "x" * 1_040_000} for c in calls),
    ]
    store = next(MemoryBank(AGENT)._step(messages))
    assert store.path == "/tool-records" and len(store.json["records"]) == 42
    assert len(json.dumps(store.json).encode()) < settings.MEMSVC_MAX_BODY_BYTES
    for record in store.json["records"]:  # (the start of its JSON: {"_raw": "xxx...)
        kept = record["output"]["_raw"]
        assert kept.startswith('{"_raw": "xxx') and kept.endswith(TRUNCATED)
    one = ToolCall("read_file", {"path": "f"})
    alone = [*messages[:1], {**messages[1], "tool_calls": [one.as_json()]}]
    alone.append({"role": "tool", "tool_call_id": one.id, "content": "x" * 1_040_000})
    [record] = next(MemoryBank(AGENT)._step(alone)).json["records"]
    assert record["output"] == {"_raw": "x" * 1_040_000}  # (alone, kept whole)


def test_a_step_of_more_calls_than_a_store_takes_is_stored_whole(live_server, llm, caplog):
    """A step of 101 parallel calls (memsvc takes 100 records a request), one of them a
    tool whose name is longer than memsvc keeps (200): each was refused whole, and the
    step's records lost (review). Stored 100 at a time; the name kept to its start."""
    calls = [ToolCall("t" * 250 if n == 0 else f"tool_{n}", {"n": n}) for n in range(101)]
    messages = [
        {"role": "user", "content": "Do it all."},
        {"role": "assistant", "content": None, "tool_calls": [c.as_json() for c in calls]},
        *(
            {"role": "tool", "tool_call_id": c.id, "content": f"done {n}"}
            for n, c in enumerate(calls)
        ),
    ]
    one_step_stored(live_server, llm, caplog, messages)
    names = set(ToolRecord.objects.filter(agent__name=AGENT).values_list("tool_name", flat=True))
    assert len(names) == 101 and "t" * 200 in names


def test_a_step_of_twenty_parallel_calls_still_retrieves_the_earlier_records(live_server, llm):
    """The search asked for 20 records (the most) and left out the last step's here: a
    step of 20 parallel calls was given its own records only, and nothing was retrieved
    (review). memsvc leaves them out, and the earlier steps' are found."""
    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    first = ToolCall("search_flights", {"to": "Lisbon"})
    history = [
        {"role": "user", "content": "Plan a trip to Lisbon."},
        {"role": "assistant", "content": None, "tool_calls": [first.as_json()]},
        {"role": "tool", "tool_call_id": first.id, "content": '{"flights": 3}'},
    ]
    parallel = [ToolCall("hotel_price", {"hotel": n}) for n in range(20)]
    with learning(agent=AGENT, server_url=live_server.url, strategy="memory_bank", task_id="p"):
        llm.then("Noted.")
        client.chat.completions.create(model="gpt-test", messages=history)
        history += [
            {"role": "assistant", "content": None, "tool_calls": [c.as_json() for c in parallel]},
            *(
                {"role": "tool", "tool_call_id": c.id, "content": f'{{"price": {n}}}'}
                for n, c in enumerate(parallel)
            ),
        ]
        llm.then("Done.")
        client.chat.completions.create(model="gpt-test", messages=history)
    assert ToolRecord.objects.filter(agent__name=AGENT, task_id="p").count() == 21
    messages = sent(llm)[-1]
    assert roles(messages) == ["user", "system", "assistant", *["tool"] * 20]
    retrieved = messages[1]["content"]
    assert retrieved.count("[RETRIEVED RECORD") == 1
    assert '{"flights": 3}' in retrieved


def test_async_and_streamed_calls_are_compressed_too(live_server, llm):
    scripted(llm, 3)

    async def loop():
        async with (
            openai.AsyncOpenAI(base_url=llm.base_url, api_key="test") as client,
            learning(agent=AGENT, server_url=live_server.url, strategy="memory_bank"),
        ):
            messages = first_messages()
            while True:
                response = await client.chat.completions.create(model="gpt-test", messages=messages)
                message = response.choices[0].message
                if not message.tool_calls:
                    return messages, message.content
                messages.append(message.model_dump(exclude_none=True))
                for call in message.tool_calls:
                    out = tool_output(call.function.name, json.loads(call.function.arguments))
                    messages.append(
                        {"role": "tool", "tool_call_id": call.id, "content": json.dumps(out)}
                    )

    history, answer = asyncio.run(loop())
    assert answer == FINAL_ANSWER
    requests = sent(llm)
    assert requests[0] == first_messages()
    assert requests[1] == history[:4]  # step 2: nothing earlier to retrieve
    assert CONTEXT_HEADING in requests[2][2]["content"]
    [task_id] = set(ToolRecord.objects.values_list("task_id", flat=True))
    assert task_id  # a fresh id for the block's task
    assert ToolRecord.objects.count() == 3

    # A streamed call gets the same compressed context, and streams unchanged.
    llm.then("Streamed itinerary.")
    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    with learning(agent=AGENT, server_url=live_server.url, strategy="memory_bank"):
        stream = client.chat.completions.create(model="gpt-test", messages=history, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert text == "Streamed itinerary."
    streamed = sent(llm)[-1]
    assert roles(streamed) == ["system", "user", "assistant", "tool"]
    # Its own task: the last interaction was stored again under a new id, nothing else.
    assert ToolRecord.objects.count() == 4
    assert len(set(ToolRecord.objects.values_list("task_id", flat=True))) == 2


def test_a_new_anchor_starts_a_new_task_counting_steps_from_one(live_server, llm):
    scripted(llm, 2)
    scripted(llm, 2)
    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    with learning(agent=AGENT, server_url=live_server.url, strategy="memory_bank"):
        run_agent(client, model="gpt-test", task="First task: Lisbon.")
        run_agent(client, model="gpt-test", task="Second task: Madrid.")
    tasks = {}
    for task_id, step in ToolRecord.objects.order_by("created_at").values_list("task_id", "step"):
        tasks.setdefault(task_id, []).append(step)
    assert list(tasks.values()) == [[2, 3], [2, 3]]
    # Retrieval stays inside the task: at its step 3 the second task retrieves its own one
    # earlier record, none of the first task's two.
    second_task_step_3 = sent(llm)[5]
    assert second_task_step_3[1]["content"] == "Second task: Madrid."
    assert second_task_step_3[2]["content"].count("[RETRIEVED RECORD") == 1


def test_with_memsvc_gone_the_call_gets_the_whole_history(live_server, llm, caplog):
    scripted(llm, 2)
    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    session = learning(agent=AGENT, server_url=live_server.url, strategy="memory_bank")
    with session, caplog.at_level(logging.WARNING, logger="memsvc.client"):
        session._client.let_go()  # memsvc stops answering mid-block
        session._client = _KeptClient(httpx.Client(base_url="http://127.0.0.1:1"))
        history = run_agent(client, model="gpt-test")
    assert sent(llm)[-1] == history[:-1]  # unchanged: the whole history
    assert "going on without memory" in caplog.text


def test_a_step_while_memsvc_is_down_is_stored_with_the_next_step_it_answers(live_server, llm):
    """A step's records were lost when memsvc was taken for down at it (the call went out
    whole, nothing kept): the next step memsvc answers stores them, under their own step,
    and retrieves them (review)."""
    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    history = one_tool_step()
    later = ToolCall("search_hotels", {"city": "Lisbon"})
    with learning(agent=AGENT, server_url=live_server.url, strategy="memory_bank", task_id="o"):
        sender.mark_down(live_server.url, unanswered=True, sent_at=time.monotonic())
        llm.then("Noted.")
        client.chat.completions.create(model="gpt-test", messages=history)
        assert sent(llm)[-1] == history and not ToolRecord.objects.exists()
        sender.mark_answered(live_server.url)  # back
        history += [
            {"role": "assistant", "content": None, "tool_calls": [later.as_json()]},
            {"role": "tool", "tool_call_id": later.id, "content": '{"hotels": 2}'},
        ]
        llm.then("Done.")
        client.chat.completions.create(model="gpt-test", messages=history)
    records = ToolRecord.objects.filter(task_id="o").order_by("step")
    assert [(r.step, r.tool_name) for r in records] == [
        (1, "search_flights"),
        (2, "search_hotels"),
    ]
    retrieved = sent(llm)[-1][1]["content"]
    assert retrieved.startswith(CONTEXT_HEADING) and '{"flights": 3}' in retrieved


def test_steps_while_memsvc_is_stopped_are_all_stored_once_it_is_back(live_server, llm, caplog):
    """A store that could not connect counted a try: five quick steps while memsvc
    restarted dropped the oldest records after three, and kept the later ones (review).
    Nothing reached memsvc: no try; every step is stored once it is back."""
    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    history = [{"role": "user", "content": "Plan a trip."}]
    session = learning(agent=AGENT, server_url=live_server.url, strategy="memory_bank", task_id="r")
    with session, caplog.at_level(logging.WARNING, logger="memsvc.client"):
        up = session._client
        for step in range(8):
            if step == 1:  # stopped: nothing listens
                session._client = _KeptClient(httpx.Client(base_url="http://127.0.0.1:1"))
            if step == 6:  # back
                session._client = up
            call = ToolCall(f"lookup_{step}", {"step": step})
            history += [
                {"role": "assistant", "content": None, "tool_calls": [call.as_json()]},
                {"role": "tool", "tool_call_id": call.id, "content": f'{{"found": {step}}}'},
            ]
            llm.then("Noted.")
            client.chat.completions.create(model="gpt-test", messages=history)
    stored = ToolRecord.objects.filter(task_id="r").order_by("step")
    assert [r.tool_name for r in stored] == [f"lookup_{step}" for step in range(8)]
    assert "dropped" not in caplog.text


def test_a_store_memsvc_refuses_is_dropped_and_the_next_steps_are_compressed(llm, caplog):
    """Kept to be sent again, a store memsvc refused for good (a 413 of one large output)
    failed every later step, each sent the whole history (code review). Dropped, with a
    warning; the next steps store and compress as before."""
    stores = []

    def refusing_one(method, path, body):
        if path in ("/health", "/agents"):
            return Reply(payload={"status": "ok", "name": AGENT})
        if path == "/tool-records":
            stores.append(json.dumps(body))
            if "poison" in stores[-1]:
                return Reply(status=413, payload={"detail": "too large"})
            return Reply(payload=[{"trace_id": str(uuid.uuid4())} for _ in body["records"]])
        return Reply(payload=[])

    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    history = [{"role": "user", "content": "Plan a trip."}]
    with (
        LocalHttpServer(refusing_one) as memsvc,
        caplog.at_level(logging.WARNING, logger="memsvc.client"),
        learning(agent=AGENT, server_url=memsvc.url, strategy="memory_bank"),
    ):
        for step, output in enumerate(['{"poison": 1}', '{"ok": 2}', '{"ok": 3}']):
            call = ToolCall("lookup", {"step": step})
            history += [
                {"role": "assistant", "content": None, "tool_calls": [call.as_json()]},
                {"role": "tool", "tool_call_id": call.id, "content": output},
            ]
            llm.then("Noted.")
            client.chat.completions.create(model="gpt-test", messages=history)
    assert [("poison" in store) for store in stores] == [True, False, False]
    assert sent(llm)[0] == history[:3]  # the refused step: the whole history
    assert len(sent(llm)[2]) < len(history)  # compressed again
    assert "tool records not stored" in caplog.text


def test_records_whose_answer_was_lost_are_sent_again_and_stored_once(live_server, llm, caplog):
    """The step's store times out after memsvc stored its records (the call goes on with
    the whole history); the caller's retry of the call sends that store again, unchanged
    and with its key: memsvc stores the records once, under the step that first sent them
    (the retry was a new store, of a new step: the records were stored twice)."""
    messages = one_tool_step()
    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    with (
        late_first_store(live_server.url, forwarded=True, store="/tool-records") as proxy,
        caplog.at_level(logging.WARNING, logger="memsvc.client"),
        learning(agent=AGENT, server_url=proxy.url, strategy="memory_bank"),
    ):
        # (A caller's timeout under a second: memsvc is not taken for down, and the retry
        # asks it again.)
        client.chat.completions.create(model="gpt-test", messages=messages, timeout=0.5)
        assert "going on without memory" in caplog.text  # the answer was lost
        client.chat.completions.create(model="gpt-test", messages=messages)
        stores = [r for r in proxy.requests if r.path == "/tool-records"]
    keys = [{k.lower(): v for k, v in r.headers.items()}.get("idempotency-key") for r in stores]
    assert len(stores) == 2 and keys[0] and keys[0] == keys[1]
    assert stores[0].body == stores[1].body
    records = ToolRecord.objects.values_list("tool_name", "step", "raw_output")
    assert list(records) == [("search_flights", 1, {"flights": 3})]


def answering_in(seconds: float):
    """A memsvc that answers its health and agent checks at once, and the rest (storing
    and finding records) in ``seconds``."""

    def respond(method, path, body):
        if path in ("/health", "/agents"):
            return Reply(payload={"status": "ok", "name": AGENT})
        time.sleep(seconds)
        return Reply(payload=[])

    return respond


hung_after_its_checks = answering_in(3.0)  # (nothing in any caller's time)


def test_a_hung_memsvc_costs_one_step_its_timeout_not_every_step(llm, caplog):
    """Each step of a memory bank waited its whole timeout for a hung memsvc (the default
    strategy waits once, then takes memsvc for down 30 s; review)."""
    messages = one_tool_step()
    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    with (
        LocalHttpServer(hung_after_its_checks) as memsvc,
        caplog.at_level(logging.WARNING, logger="memsvc.client"),
        learning(agent=AGENT, server_url=memsvc.url, strategy="memory_bank"),
    ):
        took = []
        for _ in range(3):
            started = time.monotonic()
            client.chat.completions.create(model="gpt-test", messages=messages, timeout=1.2)
            took.append(time.monotonic() - started)
    assert took[0] >= 1.0 and max(took[1:]) < 0.5, took
    assert sent(llm) == [messages] * 3  # the whole history each time
    # The outage said once; and at the block's end, that its record was not stored.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "memsvc: could not read memory (timed out); going on without memory",
        "memory bank: 1 tool records not stored (memsvc did not answer); dropped",
    ]


def test_a_block_ends_by_storing_the_records_no_later_step_asked_memsvc_to(llm, caplog):
    """memsvc did not answer a step and was taken for down; it answered again before the
    block ended, but no step asked it: the records of the steps meanwhile were lost without
    a word (review). The block's exit sends them with its other stores."""
    stored = []
    state = {"hung": True}

    def respond(method, path, body):
        if path in ("/health", "/agents"):
            return Reply(payload={"status": "ok", "name": AGENT})
        if state["hung"]:
            time.sleep(1.5)
            return Reply(payload=[])
        if path == "/tool-records":
            stored.extend(record["tool_name"] for record in body["records"])
            return Reply(payload=[{"trace_id": str(n)} for n, _ in enumerate(body["records"])])
        return Reply(payload=[])

    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    with LocalHttpServer(respond) as memsvc:
        block = learning(agent=AGENT, server_url=memsvc.url, strategy="memory_bank")
        with block:
            # Each call in the block entered again (a helper's own ``with``): an inner exit
            # is not the block's end (it dropped the records held: code review).
            with block:
                client.chat.completions.create(
                    model="gpt-test", messages=one_tool_step(), timeout=1.0
                )
            with block:
                client.chat.completions.create(model="gpt-test", messages=two_tool_steps())
            state["hung"] = False
            sender.mark_answered(memsvc.url)  # (what an answer to another block says)
            assert stored == []
        assert stored == ["search_flights", "book_flight"]


def refusing_stores(method, path, body):
    """A memsvc that refuses the key the storing of records (no ``write`` scope)."""
    if path in ("/health", "/agents"):
        return Reply(payload={"status": "ok", "name": AGENT})
    if path == "/tool-records":
        return Reply(status=403, payload={"detail": "this API key lacks the 'write' scope"})
    return Reply(payload=[])


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_key_refused_the_bank_is_said_once_and_its_steps_go_on(llm, caplog, asynchronous):
    """A key without the ``write`` scope: every step's store refused, each warned, and the
    first said the block stored the conversation, which the bank does not (review). The
    steps go on to the records stored (a search): the model is sent the compressed
    history."""
    steps = (one_tool_step(), two_tool_steps(), two_tool_steps())

    async def run_async(url):
        client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="test")
        async with learning(agent=AGENT, server_url=url, strategy="memory_bank"):
            for messages in steps:
                await client.chat.completions.create(model="gpt-test", messages=messages)

    with (
        LocalHttpServer(refusing_stores) as memsvc,
        caplog.at_level(logging.WARNING, logger="memsvc.client"),
    ):
        if asynchronous:
            asyncio.run(run_async(memsvc.url))
        else:
            client = openai.OpenAI(base_url=llm.base_url, api_key="test")
            with learning(agent=AGENT, server_url=memsvc.url, strategy="memory_bank"):
                for messages in steps:
                    client.chat.completions.create(model="gpt-test", messages=messages)
        searched = [r for r in memsvc.requests if r.path == "/tool-records/search"]
    assert len(searched) == 3
    assert sent(llm)[2] != two_tool_steps()  # (compressed: the anchor, no first interaction)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1, said
    assert said[0].startswith("memory bank: tool records not stored (Client error '403")
    assert "stores the conversation" not in said[0]


def test_an_async_step_waits_for_memsvc_without_holding_its_event_loop(llm):
    """An async call's memory bank asked memsvc in the event loop's thread: a hung memsvc
    stalled every other task of the program for the call's timeout (review)."""
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="test")

    async def main():
        stalls, ticking = [], True

        async def ticker():
            last = time.monotonic()
            while ticking:
                await asyncio.sleep(0.05)
                stalls.append(time.monotonic() - last)
                last = time.monotonic()

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.1)  # (ticking before the call begins)
        await client.chat.completions.create(
            model="gpt-test", messages=one_tool_step(), timeout=1.2
        )
        ticking = False
        await task
        return max(stalls)

    with (
        LocalHttpServer(hung_after_its_checks) as memsvc,
        learning(agent=AGENT, server_url=memsvc.url, strategy="memory_bank"),
    ):
        longest = asyncio.run(main())
    assert longest < 0.5, longest


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"top_k": 0}, "top_k: a whole number from 1 to 20"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": 21}, "top_k"),
        ({"max_chars_per_record": 0}, "max_chars_per_record: a whole number of at least 1"),
        ({"max_chars_per_record": -5}, "max_chars_per_record"),
    ],
)
def test_options_out_of_range_are_refused_when_the_block_is_made(options, said):
    """(0 was taken for the default; -1 or 2.5 had every search refused and the whole
    history sent at every step; -5 cut 5 characters off every record: review.)"""
    with pytest.raises(ValueError, match=said):
        learning(agent=AGENT, strategy="memory_bank", **options)


def test_an_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="memory_bank"):
        learning(agent=AGENT, strategy="summarise")


def test_a_task_id_longer_than_memsvc_keeps_is_refused_when_the_block_is_made():
    """(Taken, and then every store of the block refused: its records lost; review.)"""
    assert MAX_TASK_ID_CHARS == TASK_ID_MAX_LENGTH
    learning(agent=AGENT, strategy="memory_bank", task_id="t" * MAX_TASK_ID_CHARS)
    with pytest.raises(ValueError, match="task_id: at most 255 characters"):
        learning(agent=AGENT, strategy="memory_bank", task_id="t" * (MAX_TASK_ID_CHARS + 1))
    for unstorable in ("a\x00b", "a\ud800b"):
        with pytest.raises(ValueError, match="task_id: must not hold a NUL or a lone surrogate"):
            learning(agent=AGENT, strategy="memory_bank", task_id=unstorable)
    # A name, as memsvc takes one (a trailing newline, as read from a file: code review).
    for unstorable in ("task-7\n", " task-7", "a\u2028b", "a\u202eb"):
        with pytest.raises(ValueError, match="task_id: must be one line"):
            learning(agent=AGENT, strategy="memory_bank", task_id=unstorable)


def test_a_tool_name_a_model_made_is_kept_as_a_name_memsvc_takes(live_server, llm, caplog):
    """One name with a newline, or a blank left at the end of its first 200 characters,
    had memsvc refuse the step's records (code review)."""
    odd = [
        ToolCall("look\nup", {}),
        ToolCall("t" * 199 + " tail", {}),
        ToolCall("\u202e", {}),
        ToolCall("look\u200bup", {}),  # (invisible inside: refused as well; review)
        ToolCall("\U0001f468\u200d\U0001f469", {}),  # (a joiner that is part of it)
    ]
    messages = [
        {"role": "user", "content": "Look."},
        {"role": "assistant", "content": None, "tool_calls": [c.as_json() for c in odd]},
        *({"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in odd),
    ]
    names = [r["tool_name"] for r in next(MemoryBank(AGENT)._step(messages)).json["records"]]
    assert names == ["look up", "t" * 199, "tool", "lookup", "\U0001f468\u200d\U0001f469"]


def test_the_bench_measures_the_tokens_of_an_agent_with_a_key(live_server):
    """`python -m bench.tool_records` gives its private server's agent a key, which ends
    keyless loopback access to it; the token measure then went without the key: 403 at
    POST /agents, and the bench ended in a traceback."""
    from bench.tool_records import AGENT, measure_tokens
    from tests.agents_api.conftest import make_agent

    key = make_agent(AGENT).key
    rows = measure_tokens(live_server.url, 2, api_key=key)
    assert [row["step"] for row in rows] == [1, 2, 3]  # two tool steps, then the answer
    assert ToolRecord.objects.filter(agent__name=AGENT).count() == 2


def test_a_slow_memsvc_costs_a_step_no_more_than_the_callers_timeout(llm, caplog):
    """The step's requests to memsvc (store the records, find the relevant ones) share the
    call's timeout (0.3 s; memsvc takes 1 s): past it the model gets the whole history, with
    one warning (the step waited the client's 10 s a request)."""

    messages = one_tool_step()
    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    with (
        LocalHttpServer(answering_in(1.0)) as memsvc,
        caplog.at_level(logging.WARNING, logger="memsvc.client"),
        learning(agent=AGENT, server_url=memsvc.url, strategy="memory_bank"),
    ):
        started = time.monotonic()
        client.chat.completions.create(model="gpt-test", messages=messages, timeout=0.3)
        elapsed = time.monotonic() - started
    assert elapsed < 0.9
    assert sent(llm) == [messages]
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "going on without memory" in warning
