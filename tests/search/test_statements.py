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
