"""A query searched twice in a row is embedded once (``search.engine.query_vector``): the
local API's context searches the agent's memories and its messages with one text."""

import json
import threading

import pytest

from agents_api.selectors import LOCAL_OWNER
from agents_api.services import agent_get_or_create, local_message_append, memory_save
from search import engine
from search.embeddings import configured_backend
from search.services import embed_pending
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db


@pytest.fixture
def embedded_texts(monkeypatch):
    """Every text the backend embeds from here on."""
    backend = configured_backend()
    texts = []
    embed = backend.embed

    def counting_embed(batch):
        texts.extend(batch)
        return embed(batch)

    monkeypatch.setattr(backend, "embed", counting_embed)
    engine.query_vector.cache_clear()
    yield texts
    engine.query_vector.cache_clear()


def test_a_context_request_embeds_its_query_once(client, embedded_texts):
    agent, _ = agent_get_or_create(owner_principal=LOCAL_OWNER, name="once", loopback_trusted=True)
    memory_save(agent.as_principal(), agent=agent, content="The user's cat is called Tom")
    local_message_append(agent, role="user", content="My cat Tom hates the vet", metadata=None)
    embed_pending()
    embedded_texts.clear()

    response = client.post(
        "/context/once",
        data=json.dumps({"agent_name": "once", "query": "What is my cat called?"}),
        content_type="application/json",
    )

    assert response.status_code == 200
    body = response.json()
    assert "Tom" in body["memories"][0]["content"]
    assert "Tom" in body["relevant_messages"][0]["content"]
    assert embedded_texts == ["What is my cat called?"]


def test_the_vector_is_the_models_and_a_new_model_embeds_again(embedded_texts):
    vector = engine.query_vector("model-a", "hello there")
    assert engine.query_vector("model-a", "hello there") == vector
    assert embedded_texts == ["hello there"]
    engine.query_vector("model-b", "hello there")
    assert embedded_texts == ["hello there", "hello there"]
    expected = configured_backend().embed(["hello there"])[0]
    assert vector == engine.vector_literal(expected)


def test_an_embedding_started_ahead_is_the_one_the_search_waits_for(embedded_texts, monkeypatch):
    # The context request starts embedding its query before it reads memories and blocks
    # (``search.selectors.embed_query_ahead``); the search that then needs the vector shares that embedding
    # instead of starting its own.
    backend = configured_backend()
    release = threading.Event()
    embed = backend.embed

    def slow_embed(batch):
        release.wait(10)
        return embed(batch)

    monkeypatch.setattr(backend, "embed", slow_embed)
    ahead = engine.query_embedding("model-a", "where is the cat?")
    needed = engine.query_embedding("model-a", "where is the cat?")
    assert needed is ahead and not ahead.done()
    release.set()
    vector = needed.result(10)
    assert engine.query_embedding("model-a", "where is the cat?").result(10) == vector
    assert embedded_texts == ["where is the cat?"]
    # (a done future's callback runs just after its result)
    wait_until(lambda: not engine._ON_THEIR_WAY, "the embedding left the ones on their way")
