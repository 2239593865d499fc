"""``learning()`` end to end: the real ``openai`` package, a local OpenAI-compatible test
server (tests/fake_openai.py) and a real memsvc (Django's live server, or ``memsvc serve``)."""

import asyncio
import logging
import re
import subprocess
import sys
import time

import openai
import pytest
from openai._base_client import AsyncAPIClient, SyncAPIClient

from agents_api.models import Agent, Memory
from agents_api.selectors import LOCAL_OWNER
from agents_api.services import agent_get_or_create, api_key_create, memory_save
from conversations.models import Message
from memsvc.client import (
    AgentRefused,
    MemoryServerUnavailable,
    format_context,
    inject,
    learning,
)
from tests.fake_openai import FakeOpenAI
from tests.web_server import WebServer, shared_database_env

pytestmark = pytest.mark.django_db(transaction=True)

ORIGINALS = [
    (cls, name, getattr(cls, name))
    for cls in (SyncAPIClient, AsyncAPIClient)
    for name in ("request", "_process_response")
]


def sdk_unpatched() -> bool:
    return all(getattr(cls, name) is original for cls, name, original in ORIGINALS)


@pytest.fixture(scope="module", autouse=True)
def embedding_model_loaded():
    """The first context search loads the embedding model (seconds, more on a loaded
    machine): load it first, as ``memsvc serve`` does when it starts, so that no test's first
    call outlasts the client's timeout and goes on without memory."""
    from search.embeddings import configured_backend

    configured_backend().embed(["warm up"])


@pytest.fixture
def llm():
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def client(llm):
    return openai.OpenAI(base_url=llm.base_url, api_key="test-key")


def ask(client, text, **kwargs):
    return client.chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": text}], **kwargs
    )


def stored(agent: str) -> list[tuple[str, str]]:
    return list(
        Message.objects.filter(conversation__local_agent__name=agent)
        .order_by("seq")
        .values_list("role", "content")
    )


def test_the_second_session_remembers_the_first(live_server, client, llm):
    with learning(agent="my_agent", server_url=live_server.url):
        first = ask(client, "My name is Alice and I prefer Python.")
    assert first.choices[0].message.content == "Use Python, Alice."
    assert stored("my_agent") == [
        ("user", "My name is Alice and I prefer Python."),
        ("assistant", "Use Python, Alice."),
    ]

    with learning(agent="my_agent", server_url=live_server.url):
        ask(client, "What programming language should I use?")

    [memory] = llm.system_messages()
    assert memory.startswith("The following is context from your memory:")
    assert "**User**: My name is Alice and I prefer Python." in memory
    assert len(stored("my_agent")) == 4


def test_the_agents_long_term_memories_reach_the_model(live_server, client, llm):
    # As the local API makes an agent for a keyless caller on this machine.
    agent, _ = agent_get_or_create(
        owner_principal=LOCAL_OWNER, name="rememberer", loopback_trusted=True
    )
    memory_save(agent.as_principal(), agent=agent, content="The user's favourite colour is green")
    memory_save(agent.as_principal(), agent=agent, content="The user's car is a red Fiat")
    with learning(agent="rememberer", server_url=live_server.url):
        ask(client, "What is my favourite colour?")
    [memory] = llm.system_messages()
    assert "## Memories\n\n- The user's favourite colour is green" in memory
    assert "Fiat" not in memory  # not relevant to the question
    assert Memory.objects.get(content__contains="green").access_count == 1


def test_the_seeds_integration_scenario(live_server, client, llm):
    """A fresh database; the user says their name; a new block asks for it."""
    assert not Agent.objects.exists()
    with learning(agent="assistant", server_url=live_server.url):
        ask(client, "Hi! My name is Zoltan.")
    with learning(agent="assistant", server_url=live_server.url):
        ask(client, "what's my name?")
    request = llm.requests[-1].body
    assert "Zoltan" in " ".join(m["content"] for m in request["messages"])


@pytest.mark.parametrize("name", ["what?", "notes #2", "a%2Fb"])
def test_an_agent_named_with_url_characters_gets_its_own_memory(
    live_server, client, llm, caplog, name
):
    """The name is one segment of the context path: its "?" began the URL's query (the
    context of another agent, "what", was asked for), its "#" a fragment, its "%" an
    escape (%2F: a "/"), and the agent's calls went without memory."""
    with learning(agent="what", server_url=live_server.url):
        ask(client, "My name is Mallory.")
    with learning(agent=name, server_url=live_server.url):
        ask(client, "My name is Zoltan.")
    with (
        caplog.at_level(logging.WARNING, logger="memsvc.client"),
        learning(agent=name, server_url=live_server.url),
    ):
        ask(client, "What's my name?")
    [memory] = llm.system_messages()
    assert "Zoltan" in memory and "Mallory" not in memory
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_memory_goes_after_an_existing_system_message(live_server, client, llm):
    with learning(agent="a", server_url=live_server.url):
        ask(client, "I live in Lisbon")
        client.chat.completions.create(
            model="gpt-test",
            messages=[
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": [{"type": "text", "text": "Where do I live?"}]},
            ],
        )
    messages = llm.requests[-1].body["messages"]
    assert [m["role"] for m in messages] == ["system", "system", "user"]
    assert messages[0]["content"] == "You are terse."
    assert "I live in Lisbon" in messages[1]["content"]
    assert ("user", "Where do I live?") in stored("a")


def test_capture_only_stores_and_never_injects(live_server, client, llm):
    with learning(agent="logger", server_url=live_server.url, capture_only=True):
        ask(client, "remember this")
        ask(client, "and this")
    assert all(llm.system_messages(i) == [] for i in range(len(llm.requests)))
    assert [content for _, content in stored("logger")] == [
        "remember this",
        "Use Python, Alice.",
        "and this",
        "Use Python, Alice.",
    ]


def test_a_write_only_key_enters_a_capture_only_block_and_stores(live_server, client, llm):
    """Entering asks ``POST /agents``, which needed ``read``: a key that may only write was
    refused a block that only writes (review)."""
    agent, _ = agent_get_or_create(owner_principal="ops", name="scribe")
    _, key = api_key_create(agent=agent, scopes=["write"])
    with learning(agent="scribe", server_url=live_server.url, api_key=key, capture_only=True):
        ask(client, "remember this")
    assert stored("scribe") == [("user", "remember this"), ("assistant", "Use Python, Alice.")]


def test_the_originals_are_restored_even_after_an_error(live_server):
    with pytest.raises(ZeroDivisionError), learning(agent="a", server_url=live_server.url):
        assert not sdk_unpatched()
        1 / 0  # noqa: B018
    assert sdk_unpatched()


def test_nested_blocks_use_the_innermost_agent_then_the_outer_again(live_server, client):
    with learning(agent="outer", server_url=live_server.url):
        ask(client, "outer one")
        with learning(agent="inner", server_url=live_server.url):
            ask(client, "inner one")
        ask(client, "outer two")
        assert not sdk_unpatched()
    assert sdk_unpatched()
    assert [c for r, c in stored("outer") if r == "user"] == ["outer one", "outer two"]
    assert [c for r, c in stored("inner") if r == "user"] == ["inner one"]


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_refusal_is_stored_as_the_assistants_turn(live_server, client, llm, api, streamed):
    """A model that declines answers no text but a refusal (``delta.refusal`` chunks, or
    ``response.refusal.delta`` events, when streamed): the turn is stored either way (the
    refusal was lost, but for a whole chat completion)."""
    llm.refuse("pick a lock", "I can't help with that.")
    question = "How do I pick a lock?"
    with learning(agent="declined", server_url=live_server.url):
        if api == "chat" and streamed:
            stream = ask(client, question, stream=True)
            said = "".join(chunk.choices[0].delta.refusal or "" for chunk in stream)
        elif api == "chat":
            said = ask(client, question).choices[0].message.refusal
        elif streamed:
            events = client.responses.create(model="gpt-test", input=question, stream=True)
            said = "".join(e.delta for e in events if e.type == "response.refusal.delta")
        else:
            [message] = client.responses.create(model="gpt-test", input=question).output
            said = message.content[0].refusal
    assert said == "I can't help with that."
    assert stored("declined") == [("user", question), ("assistant", "I can't help with that.")]


def test_streaming_passes_chunks_through_and_stores_the_whole_reply(live_server, client):
    with learning(agent="streamer", server_url=live_server.url):
        chunks = [
            chunk.choices[0].delta.content or ""
            for chunk in ask(client, "Tell me something", stream=True)
        ]
    assert "".join(chunks) == "Use Python, Alice."
    assert len(chunks) == 3
    assert stored("streamer") == [
        ("user", "Tell me something"),
        ("assistant", "Use Python, Alice."),
    ]


def test_async_calls_and_async_streams(live_server, llm):
    async def session():
        async with (
            openai.AsyncOpenAI(base_url=llm.base_url, api_key="test-key") as client,
            learning(agent="async", server_url=live_server.url),
        ):
            await client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "I like tea"}]
            )
            stream = await client.chat.completions.create(
                model="gpt-test",
                messages=[{"role": "user", "content": "What do I like?"}],
                stream=True,
            )
            return [chunk async for chunk in stream]

    chunks = asyncio.run(session())
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Use Python, Alice."
    assert "I like tea" in llm.system_messages()[0]
    assert [c for r, c in stored("async") if r == "user"] == ["I like tea", "What do I like?"]
    assert sdk_unpatched()


def test_the_responses_api_gets_memory_in_its_instructions(live_server, client, llm):
    with learning(agent="responder", server_url=live_server.url):
        client.responses.create(model="gpt-test", input="I have a cat named Tom")
        reply = client.responses.create(
            model="gpt-test", input="What is my cat called?", instructions="Be brief."
        )
    assert reply.output_text == "Use Python, Alice."
    instructions = llm.requests[-1].body["instructions"]
    assert instructions.startswith("Be brief.")
    assert "I have a cat named Tom" in instructions
    assert ("user", "What is my cat called?") in stored("responder")


def test_an_unreachable_server_is_a_clear_error_at_entry():
    with (
        pytest.raises(MemoryServerUnavailable, match="memsvc serve"),
        learning(agent="a", server_url="http://127.0.0.1:9"),
    ):
        pass
    assert sdk_unpatched()


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"agent": "x" * 300}, "422: body.name: "),
        ({"agent": "a", "api_key": "msk_wrong"}, "401: "),
    ],
    ids=["bad name", "bad key"],
)
def test_an_agent_memsvc_refuses_is_a_clear_error_with_its_reason(live_server, options, reason):
    """(It was httpx's HTTPStatusError, without memsvc's reason.)"""
    with (
        pytest.raises(AgentRefused, match=f"refused the agent .*\\({reason}") as refused,
        learning(server_url=live_server.url, **options),
    ):
        pass
    assert isinstance(refused.value, MemoryServerUnavailable)
    assert sdk_unpatched()


def test_a_memsvc_over_its_rate_limit_is_unavailable_not_a_refusal_of_the_agent(
    live_server, settings
):
    """A rate limit's 429 at the block's entry said "refused the agent" (review): the agent
    is not refused, memsvc cannot serve it now, and says when to try again."""
    settings.MEMSVC_RATE_LIMIT = 1  # (a minute: the agent's request counts, not the health check)
    with pytest.raises(MemoryServerUnavailable) as busy:  # (the second, or a third if a
        for _ in range(3):  # new minute began between them)
            with learning(agent="busy", server_url=live_server.url):
                pass
    assert re.search(r"cannot serve .*\(429: .*try again in \d+ s", str(busy.value)), busy.value
    assert not isinstance(busy.value, AgentRefused)
    assert sdk_unpatched()


def test_importing_the_client_needs_no_django():
    code = "import sys, memsvc.client; print('django' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PATH": ""}
    )
    assert result.stdout.strip() == "False"


@pytest.mark.django_db(transaction=True)
def test_a_memory_server_that_stops_mid_block_degrades_to_plain_calls(tmp_path, llm, caplog):
    served = WebServer(tmp_path, shared_database_env())  # memsvc's web server, on its own
    try:
        client = openai.OpenAI(base_url=llm.base_url, api_key="test-key")
        with learning(agent="fragile", server_url=served.url) as session:
            ask(client, "My name is Alice")
            assert session.flush()  # the turn reached memsvc before it stops
            served.stop()
            caplog.clear()  # (the first call may find the model still loading: a warning)
            with caplog.at_level(logging.WARNING, logger="memsvc.client"):
                replies = [ask(client, "What is my name?"), ask(client, "Still there?")]
                exit_started = time.monotonic()
        assert time.monotonic() - exit_started < 5  # the unsent turns are dropped, not awaited
        assert [r.choices[0].message.content for r in replies] == ["Use Python, Alice."] * 2
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        # One for the outage: the next call asks nothing of a server that did not answer;
        # none for the dropped stores.
        [warning] = warnings
        assert "going on without memory" in warning
        assert llm.system_messages() == []
    finally:
        served.stop()


# --- formatting -------------------------------------------------------------------------------


def test_the_context_format_and_long_messages_cut():
    text = format_context(
        {
            "memory_blocks": [{"label": "human", "value": "Name: Alice"}],
            "memories": [{"content": "Alice likes tea"}, {"content": "y" * 600}],
            "relevant_messages": [
                {"role": "assistant", "content": "Hi Alice", "created_at": "2026-01-02"},
                {"role": "user", "content": "x" * 600, "created_at": "2026-01-01"},
            ],
        }
    )
    assert text.startswith("The following is context from your memory:\n\n## Memory\n\n### human")
    memories = text.split("## Memories\n\n")[1].split("\n\n## Relevant Past Conversations")[0]
    assert memories == "- Alice likes tea\n- " + "y" * 499 + "…"
    user_line, assistant_line = text.split("## Relevant Past Conversations\n\n")[1].split("\n\n")
    assert user_line == "**User**: " + "x" * 499 + "…"
    assert assistant_line == "**Assistant**: Hi Alice"
    assert format_context({"memory_blocks": [], "relevant_messages": [], "memories": []}) is None
    only_memories = format_context({"memories": [{"content": "Alice likes tea"}]})
    assert only_memories.endswith("\n\n## Memories\n\n- Alice likes tea")
    # In time order, a whole second's time ("...:00Z", no fraction) too: as text it sorted
    # after a later one of the same second (code review).
    second_first = format_context(
        {
            "relevant_messages": [
                {"role": "assistant", "content": "second", "created_at": "2026-01-01T10:00:00.4Z"},
                {"role": "user", "content": "first", "created_at": "2026-01-01T10:00:00Z"},
                {"role": "user", "content": "third", "created_at": "2026-01-01T10:00:01"},
            ]
        }
    ).split("## Relevant Past Conversations\n\n")[1]
    assert second_first == "**User**: first\n\n**Assistant**: second\n\n**User**: third"


def test_injection_keeps_the_callers_list_unchanged():
    messages = [{"role": "user", "content": "hi"}]
    assert inject(messages, "ctx") == [{"role": "system", "content": "ctx"}, messages[0]]
    assert messages == [{"role": "user", "content": "hi"}]
