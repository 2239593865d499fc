"""``learning()`` around every call surface of the real ``openai`` and ``anthropic``
packages, sync and async, streamed and not, against the stand-in LLM (tests/fake_openai.py)
and a real memsvc (Django's live server): each surface gets the memory where its API takes
it, its turn is stored, and it returns exactly what the plain call returns."""

import asyncio

import openai
import pytest
from pydantic import BaseModel

from agents_api.selectors import LOCAL_OWNER
from agents_api.services import agent_get_or_create, memory_block_create
from memsvc.client import learning
from tests.fake_openai import FakeOpenAI
from tests.memsvc.test_client import embedding_model_loaded, stored

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["embedding_model_loaded"]  # a fixture: every test here needs the model loaded

QUESTION = "Where do I live?"
REPLY = "Use Python, Alice."
PARSED_REPLY = '{"city": "Use Python, Alice."}'


class City(BaseModel):
    city: str


@pytest.fixture(scope="session")
def anthropic_sdk():
    """The ``anthropic`` package, imported by the tests that call it: its import took 5 s
    of every test process's collection on a slow host."""
    import anthropic

    return anthropic


@pytest.fixture
def llm():
    with FakeOpenAI(reply=REPLY) as fake:
        yield fake


@pytest.fixture
def remembered():
    """An agent whose memory block every context carries, whatever the search finds."""
    agent, _ = agent_get_or_create(
        owner_principal=LOCAL_OWNER, name="surfer", loopback_trusted=True
    )
    memory_block_create(agent.as_principal(), agent=agent, label="human", value="Lives in Lisbon")
    return "surfer"


def chat_messages():
    return [{"role": "user", "content": QUESTION}]


# --- the surfaces: each makes one call as a user would and returns (result, text seen) -------


def chat_create(client):
    result = client.chat.completions.create(model="m", messages=chat_messages())
    return result, result.choices[0].message.content


def chat_create_stream(client):
    stream = client.chat.completions.create(model="m", messages=chat_messages(), stream=True)
    chunks = list(stream)
    return (stream, chunks), "".join(c.choices[0].delta.content or "" for c in chunks)


def chat_parse(client):
    result = client.chat.completions.parse(
        model="m", messages=chat_messages(), response_format=City
    )
    assert result.choices[0].message.parsed == City(city=REPLY)
    return result, result.choices[0].message.content


def chat_stream_helper(client):
    with client.chat.completions.stream(
        model="m", messages=chat_messages(), response_format=City
    ) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == City(city=REPLY)
    return (stream, events, final), final.choices[0].message.content


def chat_raw(client):
    raw = client.chat.completions.with_raw_response.create(model="m", messages=chat_messages())
    assert raw.headers["content-type"] == "application/json"
    return raw, raw.parse().choices[0].message.content


def chat_raw_stream(client):
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=chat_messages(), stream=True
    )
    chunks = list(raw.parse())
    return (raw, chunks), "".join(c.choices[0].delta.content or "" for c in chunks)


def chat_streaming_response(client):
    with client.chat.completions.with_streaming_response.create(
        model="m", messages=chat_messages()
    ) as response:
        result = response.parse()
    return (response, result), result.choices[0].message.content


def chat_streaming_response_lines(client):
    """The caller reads the server-sent events' lines itself."""
    with client.chat.completions.with_streaming_response.create(
        model="m", messages=chat_messages(), stream=True
    ) as response:
        lines = list(response.iter_lines())
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: {")]
    import json

    text = "".join(json.loads(d)["choices"][0]["delta"].get("content") or "" for d in data)
    return (response, lines), text


def responses_create(client):
    result = client.responses.create(model="m", input=QUESTION)
    return result, result.output_text


def responses_create_stream(client):
    events = list(client.responses.create(model="m", input=QUESTION, stream=True))
    return events, "".join(e.delta for e in events if e.type == "response.output_text.delta")


def responses_parse(client):
    result = client.responses.parse(model="m", input=QUESTION, text_format=City)
    assert result.output_parsed == City(city=REPLY)
    return result, result.output_text


def responses_stream_helper(client):
    with client.responses.stream(model="m", input=QUESTION) as stream:
        events = list(stream)
        final = stream.get_final_response()
    return (stream, events, final), final.output_text


def responses_raw(client):
    raw = client.responses.with_raw_response.create(model="m", input=QUESTION)
    return raw, raw.parse().output_text


OPENAI_SURFACES = [
    (chat_create, REPLY),
    (chat_create_stream, REPLY),
    (chat_parse, PARSED_REPLY),
    (chat_stream_helper, PARSED_REPLY),
    (chat_raw, REPLY),
    (chat_raw_stream, REPLY),
    (chat_streaming_response, REPLY),
    (chat_streaming_response_lines, REPLY),
    (responses_create, REPLY),
    (responses_create_stream, REPLY),
    (responses_parse, PARSED_REPLY),
    (responses_stream_helper, REPLY),
    (responses_raw, REPLY),
]


def anthropic_messages():
    return {"model": "claude-test", "max_tokens": 100, "messages": chat_messages()}


def messages_create(client):
    result = client.messages.create(**anthropic_messages())
    return result, result.content[0].text


def messages_create_stream(client):
    events = list(client.messages.create(**anthropic_messages(), stream=True))
    return events, "".join(e.delta.text for e in events if e.type == "content_block_delta")


def messages_stream_helper(client):
    with client.messages.stream(**anthropic_messages()) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].text == text
    return (stream, final), text


def messages_raw(client):
    raw = client.messages.with_raw_response.create(**anthropic_messages())
    return raw, raw.parse().content[0].text


ANTHROPIC_SURFACES = [
    (messages_create, REPLY),
    (messages_create_stream, REPLY),
    (messages_stream_helper, REPLY),
    (messages_raw, REPLY),
]


# --- the same surfaces, async ----------------------------------------------------------------


async def achat_create(client):
    result = await client.chat.completions.create(model="m", messages=chat_messages())
    return result, result.choices[0].message.content


async def achat_create_stream(client):
    stream = await client.chat.completions.create(model="m", messages=chat_messages(), stream=True)
    chunks = [chunk async for chunk in stream]
    return (stream, chunks), "".join(c.choices[0].delta.content or "" for c in chunks)


async def achat_parse(client):
    result = await client.chat.completions.parse(
        model="m", messages=chat_messages(), response_format=City
    )
    assert result.choices[0].message.parsed == City(city=REPLY)
    return result, result.choices[0].message.content


async def achat_stream_helper(client):
    async with client.chat.completions.stream(
        model="m", messages=chat_messages(), response_format=City
    ) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_completion()
    return (stream, events, final), final.choices[0].message.content


async def achat_raw(client):
    raw = await client.chat.completions.with_raw_response.create(
        model="m", messages=chat_messages()
    )
    return raw, raw.parse().choices[0].message.content


async def achat_raw_stream(client):
    raw = await client.chat.completions.with_raw_response.create(
        model="m", messages=chat_messages(), stream=True
    )
    chunks = [chunk async for chunk in raw.parse()]
    return (raw, chunks), "".join(c.choices[0].delta.content or "" for c in chunks)


async def achat_streaming_response(client):
    async with client.chat.completions.with_streaming_response.create(
        model="m", messages=chat_messages()
    ) as response:
        result = await response.parse()
    return (response, result), result.choices[0].message.content


async def aresponses_create(client):
    result = await client.responses.create(model="m", input=QUESTION)
    return result, result.output_text


async def aresponses_create_stream(client):
    stream = await client.responses.create(model="m", input=QUESTION, stream=True)
    events = [event async for event in stream]
    return events, "".join(e.delta for e in events if e.type == "response.output_text.delta")


async def aresponses_parse(client):
    result = await client.responses.parse(model="m", input=QUESTION, text_format=City)
    return result, result.output_text


async def aresponses_stream_helper(client):
    async with client.responses.stream(model="m", input=QUESTION) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    return (stream, events, final), final.output_text


ASYNC_OPENAI_SURFACES = [
    (achat_create, REPLY),
    (achat_create_stream, REPLY),
    (achat_parse, PARSED_REPLY),
    (achat_stream_helper, PARSED_REPLY),
    (achat_raw, REPLY),
    (achat_raw_stream, REPLY),
    (achat_streaming_response, REPLY),
    (aresponses_create, REPLY),
    (aresponses_create_stream, REPLY),
    (aresponses_parse, PARSED_REPLY),
    (aresponses_stream_helper, REPLY),
]


async def amessages_create(client):
    result = await client.messages.create(**anthropic_messages())
    return result, result.content[0].text


async def amessages_create_stream(client):
    stream = await client.messages.create(**anthropic_messages(), stream=True)
    events = [event async for event in stream]
    return events, "".join(e.delta.text for e in events if e.type == "content_block_delta")


async def amessages_stream_helper(client):
    async with client.messages.stream(**anthropic_messages()) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    return (stream, final), text


ASYNC_ANTHROPIC_SURFACES = [
    (amessages_create, REPLY),
    (amessages_create_stream, REPLY),
    (amessages_stream_helper, REPLY),
]


# --- checks -----------------------------------------------------------------------------------


def shape(result):
    """What a caller can tell about a result: its types, all the way into tuples and lists."""
    if isinstance(result, tuple | list):
        return [shape(item) for item in result]
    return type(result)


def where_memory_went(llm) -> str:
    body = llm.requests[-1].body
    if "instructions" in body:
        return body["instructions"]
    if "system" in body:
        return body["system"]
    return "\n".join(m["content"] for m in body["messages"] if m["role"] == "system")


def check(llm, agent, plain, inside, expected_text):
    (plain_result, plain_text), (result, text) = plain, inside
    assert plain_text == text == expected_text
    assert shape(result) == shape(plain_result)
    memory = where_memory_went(llm)
    assert memory.startswith("The following is context from your memory:")
    assert "Lives in Lisbon" in memory
    assert stored(agent) == [("user", QUESTION), ("assistant", expected_text)]


def names(surfaces):
    return [surface.__name__ for surface, _ in surfaces]


@pytest.mark.parametrize(("surface", "expected"), OPENAI_SURFACES, ids=names(OPENAI_SURFACES))
def test_every_openai_surface(live_server, llm, remembered, surface, expected):
    client = openai.OpenAI(base_url=llm.base_url, api_key="k")
    plain = surface(client)
    with learning(agent=remembered, server_url=live_server.url):
        inside = surface(client)
    check(llm, remembered, plain, inside, expected)


@pytest.mark.parametrize(
    ("surface", "expected"), ASYNC_OPENAI_SURFACES, ids=names(ASYNC_OPENAI_SURFACES)
)
def test_every_async_openai_surface(live_server, llm, remembered, surface, expected):
    async def run():
        async with openai.AsyncOpenAI(base_url=llm.base_url, api_key="k") as client:
            plain = await surface(client)
            async with learning(agent=remembered, server_url=live_server.url):
                inside = await surface(client)
        return plain, inside

    check(llm, remembered, *asyncio.run(run()), expected)


@pytest.mark.parametrize(("surface", "expected"), ANTHROPIC_SURFACES, ids=names(ANTHROPIC_SURFACES))
def test_every_anthropic_surface(live_server, llm, remembered, surface, expected, anthropic_sdk):
    client = anthropic_sdk.Anthropic(base_url=llm.anthropic_base_url, api_key="k")
    plain = surface(client)
    with learning(agent=remembered, server_url=live_server.url):
        inside = surface(client)
    check(llm, remembered, plain, inside, expected)


@pytest.mark.parametrize(
    ("surface", "expected"), ASYNC_ANTHROPIC_SURFACES, ids=names(ASYNC_ANTHROPIC_SURFACES)
)
def test_every_async_anthropic_surface(
    live_server, llm, remembered, surface, expected, anthropic_sdk
):
    async def run():
        async with anthropic_sdk.AsyncAnthropic(
            base_url=llm.anthropic_base_url, api_key="k"
        ) as client:
            plain = await surface(client)
            async with learning(agent=remembered, server_url=live_server.url):
                inside = await surface(client)
        return plain, inside

    check(llm, remembered, *asyncio.run(run()), expected)


def test_anthropic_memory_joins_an_existing_system_prompt(
    live_server, llm, remembered, anthropic_sdk
):
    client = anthropic_sdk.Anthropic(base_url=llm.anthropic_base_url, api_key="k")
    with learning(agent=remembered, server_url=live_server.url):
        client.messages.create(**anthropic_messages(), system="Be terse.")
        client.messages.create(
            **anthropic_messages(), system=[{"type": "text", "text": "Be kind."}]
        )
    first, second = (r.body["system"] for r in llm.requests[-2:])
    assert first.startswith("Be terse.\n\nThe following is context from your memory:")
    assert second[0] == {"type": "text", "text": "Be kind."}
    assert "Lives in Lisbon" in second[1]["text"]


def test_tool_calls_are_stored_as_the_replys_metadata(live_server, llm, remembered, anthropic_sdk):
    llm.call_tool(QUESTION, "lookup_city", {"person": "Alice"})
    tools = [{"type": "function", "function": {"name": "lookup_city", "parameters": {}}}]
    with learning(agent=remembered, server_url=live_server.url):
        openai.OpenAI(base_url=llm.base_url, api_key="k").chat.completions.create(
            model="m", messages=chat_messages(), tools=tools
        )
        anthropic_sdk.Anthropic(base_url=llm.anthropic_base_url, api_key="k").messages.create(
            **anthropic_messages(), tools=[{"name": "lookup_city", "input_schema": {}}]
        )
    from conversations.models import Message

    replies = Message.objects.filter(role="assistant").order_by("seq")
    assert [m.content for m in replies] == ["(tool calls)", "(tool calls)"]
    chat_call, anthropic_call = (m.metadata["tool_calls"][0] for m in replies)
    assert chat_call["function"] == {"name": "lookup_city", "arguments": '{"person": "Alice"}'}
    assert anthropic_call["function"] == {"name": "lookup_city", "arguments": {"person": "Alice"}}


def test_a_failing_request_that_is_no_model_call_is_sent_once(live_server, llm, remembered):
    """``learning()`` leaves a request that is no model call (here embeddings, which the
    stand-in does not serve: a 404) as it is: sent once, its error the caller's. It was sent
    inside the memory layer's ``try``, and sent again when it failed, with a warning about
    preparing the call."""

    def embeddings_asked():
        return [r for r in llm.requests if r.path.endswith("/embeddings")]

    client = openai.OpenAI(base_url=llm.base_url, api_key="k", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="m", input="plain")
    assert len(embeddings_asked()) == 1
    with learning(agent=remembered, server_url=live_server.url):
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="m", input="inside")

        async def inside_async():
            async with openai.AsyncOpenAI(
                base_url=llm.base_url, api_key="k", max_retries=0
            ) as aclient:
                await aclient.embeddings.create(model="m", input="inside, async")

        with pytest.raises(openai.NotFoundError):
            asyncio.run(inside_async())
    assert len(embeddings_asked()) == 3
