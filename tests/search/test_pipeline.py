"""The embedding pipeline: commit first, embed after; a broken queue loses nothing."""

import secrets
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from conversations.models import Conversation, Message
from memsvc import cli
from search.tasks import sweep_unembedded_task
from tests.agents_api.conftest import make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(api, alice):
    return api.post("/v1/user/conversations", {"title": "t"}, as_=alice).json()


def post_message(api, persona, conversation, content):
    response = api.post(
        f"/v1/user/conversations/{conversation['id']}/messages", {"content": content}, as_=persona
    )
    assert response.status_code == 201
    return Message.objects.get(id=response.json()["id"])


def test_a_message_is_embedded_once_its_transaction_commits(
    api, alice, conversation, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        message = post_message(api, alice, conversation, "I adopted a puppy")
    assert message.embedded_at is None  # nothing is sent before the commit
    assert len(callbacks) == 1

    callbacks[0]()  # the commit: the task runs (inline in tests)

    message.refresh_from_db()
    assert message.embedded_at is not None
    assert message.embedding_model == "all-MiniLM-L6-v2@int8"
    assert len(message.embedding) == 384


def test_with_the_broker_down_the_api_answers_and_the_sweep_embeds_later(
    api, alice, conversation, dead_broker, django_capture_on_commit_callbacks, caplog
):
    with django_capture_on_commit_callbacks(execute=True):
        message = post_message(api, alice, conversation, "the broker is down")
    assert "the sweep will" in caplog.text
    assert "Connection refused" in caplog.text
    message.refresh_from_db()
    assert message.embedded_at is None
    found = api.post(
        "/v1/user/search/messages", {"query": "broker down", "mode": "keyword"}, as_=alice
    )
    assert [r["message"]["id"] for r in found.json()["data"]] == [str(message.id)]

    # A minute later, the periodic sweep finds it.
    Message.objects.filter(pk=message.pk).update(created_at=timezone.now() - timedelta(minutes=1))
    assert sweep_unembedded_task.apply().get() == 1
    message.refresh_from_db()
    assert message.embedded_at is not None


def test_the_sweep_leaves_fresh_messages_to_their_own_task(api, alice, conversation):
    post_message(api, alice, conversation, "just arrived")
    assert sweep_unembedded_task.apply().get() == 0


def test_an_embedded_summary_marks_its_conversation_vectorized(
    api, django_capture_on_commit_callbacks
):
    agent = make_agent("summarizer")
    with django_capture_on_commit_callbacks(execute=True):
        conversation = api.post("/v1/agent/conversations", {}, as_=agent).json()
        [first] = api.post(
            f"/v1/agent/conversations/{conversation['id']}/messages",
            {"messages": [{"role": "user", "content": "hello"}]},
            as_=agent,
        ).json()["data"]
        assert Conversation.objects.get(id=conversation["id"]).vectorized_at is None
        summary = api.post(
            f"/v1/agent/conversations/{conversation['id']}/summaries",
            {
                "title": "Greeting",
                "summary": "The user said hello.",
                "untilMessageId": first["id"],
                "summarizedAt": "2026-11-01T00:00:00Z",
            },
            as_=agent,
        )
        assert summary.status_code == 201, summary.content
    assert Conversation.objects.get(id=conversation["id"]).vectorized_at is not None


def test_reindex_embeds_the_backlog_and_all_re_embeds_everything(api, alice, conversation, capsys):
    first = post_message(api, alice, conversation, "one")
    second = post_message(api, alice, conversation, "two")
    assert cli.main(["reindex"]) == 0
    assert "embedded 2 messages" in capsys.readouterr().err
    first.refresh_from_db()
    embedded_at = first.embedded_at
    assert embedded_at is not None

    assert cli.main(["reindex", "--all"]) == 0
    assert "embedded 2 messages" in capsys.readouterr().err
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.embedded_at > embedded_at
    assert second.embedded_at is not None


def toasted(message, *columns) -> list[bool]:
    """For each column: was its value compressed or moved out of the row?"""
    tests = [
        f"pg_column_toast_chunk_id({c}) IS NOT NULL OR pg_column_compression({c}) IS NOT NULL"
        for c in columns
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {', '.join(tests)} FROM message WHERE id = %s",  # noqa: S608 (our columns)
            [message.id],
        )
        return list(cursor.fetchone())


def test_search_reads_vectors_and_words_from_the_row_itself(api, alice, conversation):
    # A 2.5 kB row: PostgreSQL's default would have moved the vector out of line.
    turn = post_message(api, alice, conversation, "We hiked to the lake and camped. " * 12)
    # 3,000 characters that do not compress: something must go out; the text, not the vector.
    essay = post_message(
        api, alice, conversation, " ".join(secrets.token_hex(3) for _ in range(430))
    )
    assert cli.main(["reindex"]) == 0
    assert toasted(turn, "embedding", "search_vector", "content") == [False, False, False]
    assert toasted(essay, "embedding", "content") == [False, True]
