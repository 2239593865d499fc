"""How rare a query word is, in a corpus without kept statistics (memories): PostgreSQL's
own statistics of the column for common words, a capped count for the rest."""

from dataclasses import replace

import pytest
from django.db import connection

from agents_api.models import Memory, content_hash
from agents_api.selectors import MEMORIES
from search import statements
from search.statements import query_terms
from search.tuning import DEFAULT_TUNING
from tests.factories import AgentFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_statistics():
    """Each test reads the statistics of its own rows (a process keeps what it read)."""
    statements._COLUMN_STATISTICS.clear()
    yield
    statements._COLUMN_STATISTICS.clear()


def memories(agent, texts):
    Memory.objects.bulk_create(
        Memory(agent=agent, content=text, content_hash=content_hash(text)) for text in texts
    )


def terms(text, **tuning):
    with connection.cursor() as cursor:
        return query_terms(cursor, MEMORIES, text, replace(DEFAULT_TUNING, **tuning))


@pytest.mark.parametrize("analysed", [False, True])
def test_a_rarer_word_weighs_more_with_or_without_statistics(analysed):
    agent = AgentFactory()
    memories(agent, [f"note {i} about the weather" for i in range(400)])
    memories(agent, ["the user keeps a capybara"])
    if analysed:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE memory")
            cursor.execute(
                "SELECT 'weather' = ANY(most_common_elems::text::text[]) FROM pg_stats "
                "WHERE tablename = 'memory' AND attname = 'search_vector'"
            )
            assert cursor.fetchone() == (True,)  # the common word comes from the statistics
    found = terms("capybara weather")
    assert found.idf["capybara"] > 3 * found.idf["weather"]
    assert found.match_on[0] == "capybara"


def test_a_table_not_analysed_yet_is_read_once_per_while():
    """No statistics (a table not analysed, or too small for common words) is known too:
    the next searches count words without asking again."""
    agent = AgentFactory()
    memories(agent, ["the user keeps a capybara"])  # too few rows for any common word
    reads = []

    def count(execute, sql, params, many, context):
        reads.append("pg_stats" in sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        for _ in range(3):
            assert terms("capybara").match_on == ["capybara"]
    assert sum(reads) == 1


def test_a_search_of_an_empty_store_is_one_probe(settings):
    """An agent with no memories of this user: one statement, no query embedding."""
    from agents_api.selectors import memory_search
    from search import engine

    agent = AgentFactory()
    memories(AgentFactory(), ["the user keeps a capybara"])  # another agent's
    engine.query_vector.cache_clear()
    sent = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        assert memory_search(agent, user_id="", query="capybara", limit=5) == []
    assert len(sent) == 1 and "EXISTS" in sent[0]
    assert engine.query_vector.cache_info().currsize == 0
