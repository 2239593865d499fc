"""How rare a query word is, in a corpus without kept statistics (memories): PostgreSQL's
own statistics of the column for common words, a capped count for the rest."""

import time
from dataclasses import replace

import pytest
from django.db import connection

from agents_api.models import Memory, content_hash
from agents_api.selectors import MEMORIES
from conversations.models import Message, Role
from search import statements
from search.statements import query_terms
from search.tuning import DEFAULT_TUNING
from tests.factories import AgentFactory, ConversationFactory

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


def test_statistics_made_after_a_table_was_read_without_them_are_read_within_seconds(
    monkeypatch,
):
    """A store filled faster than autovacuum's first ANALYZE was read without statistics,
    and a process then kept that for 5 minutes, each search counting all of its words
    (30 ms a search, not 13): a table without them is read again after seconds."""
    agent = AgentFactory()
    memories(agent, [f"note {i} about the weather" for i in range(400)])
    now = [1000.0]
    monkeypatch.setattr(statements.time, "monotonic", lambda: now[0])
    with connection.cursor() as cursor:
        # Not analysed yet: whatever autovacuum made of an earlier test's rows goes (a test
        # of this process before this one had left statistics).
        cursor.execute(
            "SELECT pg_clear_relation_stats(current_schema(), 'memory'),"
            " pg_clear_attribute_stats(current_schema(), 'memory', 'search_vector', false)"
        )
        assert statements._column_statistics(cursor, MEMORIES) is None  # not analysed yet
        cursor.execute("ANALYZE memory")
        now[0] += statements.MISSING_STATISTICS_SECONDS - 1
        assert statements._column_statistics(cursor, MEMORIES) is None  # (kept a while)
        now[0] += 2
        read = statements._column_statistics(cursor, MEMORIES)
        assert read is not None and "weather" in read.shares
        cursor.execute("DELETE FROM memory")
        cursor.execute("ANALYZE memory")
        now[0] += statements.MISSING_STATISTICS_SECONDS + 1
        assert statements._column_statistics(cursor, MEMORIES) is read  # (kept minutes)


def test_a_less_common_word_is_counted_once_while_the_statistics_are_kept():
    agent = AgentFactory()
    memories(agent, [f"note {i} about the weather" for i in range(400)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memory")
    memories(agent, ["the user keeps a capybara", "a wombat"])  # words ANALYZE did not see
    counted = []

    def count(execute, sql, params, many, context):
        if "unnest(%s::text[])" in sql:
            counted.append(params[-1])
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        first = terms("capybara weather")
        assert terms("the weather of a capybara") == first
        terms("a wombat and a capybara")
        assert counted == [["capybara"], ["wombat"]]
        statements._COLUMN_STATISTICS["memory"] = replace(
            statements._COLUMN_STATISTICS["memory"],
            read_at=time.monotonic() - statements.COLUMN_STATISTICS_SECONDS - 1,
        )  # statistics as old as a process keeps them: read again, words counted again
        # (not ``read_at=0``: a machine up for less than those seconds counts from there)
        assert terms("capybara weather") == first
    assert counted[2:] == [["capybara"]]


class EmptiedMeanwhile(dict):
    """Counts that another request thread empties (their cap reached) just after this one
    found a word among them."""

    def __contains__(self, lexeme):
        found = super().__contains__(lexeme)
        self.clear()
        return found


def test_a_count_kept_is_read_once_while_other_threads_may_empty_them():
    agent = AgentFactory()
    memories(agent, [f"note {i} about the weather" for i in range(400)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memory")
    memories(agent, ["the user keeps a capybara"])
    first = terms("capybara weather")
    kept = statements._COLUMN_STATISTICS["memory"]
    statements._COLUMN_STATISTICS["memory"] = replace(kept, counted=EmptiedMeanwhile(kept.counted))
    assert terms("capybara weather") == first


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


@pytest.fixture
def two_stores():
    """Two agents' stores of 20,000 memories each, the first's written first: every
    memory says ``note`` and its number, one in 50 ``rain``, the others ``sun``."""
    store, other = AgentFactory(), AgentFactory()
    memories(store, ["note"])
    columns = ", ".join(
        f.column for f in Memory._meta.concrete_fields if f.column not in ("id", "search_vector")
    )
    copied = columns.replace("agent_id", "%s").replace("content_hash", "md5(i::text)")
    copied = copied.replace(
        "content", "'note ' || i || CASE WHEN i %% 50 = 0 THEN ' rain' ELSE ' sun' END"
    )
    with connection.cursor() as cursor:
        for agent in (store, other):
            cursor.execute(
                f"INSERT INTO memory (id, {columns}) "  # noqa: S608 (the model's own columns)
                f"SELECT gen_random_uuid(), {copied} FROM memory, generate_series(1, 20000) i "
                "WHERE id = (SELECT id FROM memory LIMIT 1)",
                [agent.id],
            )
        cursor.execute("ANALYZE memory")
    return store, other


def planned_keyword_candidates(agent, word):
    """The keyword candidates of ``word`` in the agent's memories of no user, and the plan
    of their statement, as it is sent."""
    from agents_api.selectors import memory_scope

    found = terms(word)
    plans = []

    def explain(execute, sql, params, many, context):
        if "score DESC" in sql and "EXPLAIN" not in sql:
            cursor = context["cursor"]
            cursor.execute(sql.replace("SELECT id, score", "EXPLAIN SELECT id, score", 1), params)
            while cursor.description is None and cursor.nextset():
                pass  # past the settings, as the statement is sent
            plans.append("\n".join(line for (line,) in cursor.fetchall()))
        return execute(sql, params, many, context)

    with connection.cursor() as cursor, connection.execute_wrapper(explain):
        rows = statements.keyword_candidates(
            cursor, MEMORIES, memory_scope(agent.id, ""), found, 30, DEFAULT_TUNING
        )
    return rows, plans[0]


def test_a_keyword_search_of_a_large_store_reads_its_words_within_the_scope(two_stores):
    """The rows of an agent's store holding the query's rarest word are found inside one
    index (``memory_scope_words``). With the words indexed alone, PostgreSQL intersected the
    word's entries with a bitmap of every memory of the scope (``memory_recent``): for a
    store of 100,000, 6.5 of a search's 7 ms. Whatever rows ANALYZE samples: walking the
    store's rows in another index until enough hold the word (9.5 ms against 1.3 here) is
    as cheap in PostgreSQL's estimate, and a fresh sample chose it now and then. So did a
    full pending list of the words index (the next test), which every plan of the index
    counts as read: in CI, after earlier tests' writes."""
    store, _other = two_stores
    for _sample in range(5):
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE memory")
        statements._COLUMN_STATISTICS.clear()
        rows, plan = planned_keyword_candidates(store, "rain")
        assert len(rows) == 30
        held = Memory.objects.filter(pk__in=rows, agent=store, content__endswith="rain")
        assert held.count() == 30
        assert "memory_scope_words" in plan, plan
        assert "memory_recent" not in plan and "memory_scope " not in plan, plan
        assert "Index Scan using" not in plan, plan


@pytest.mark.parametrize("index", ["memory_scope_words", "message_search_vector"])
def test_written_words_wait_in_no_pending_list(index):
    """The words indexes keep no GIN pending list (``fastupdate`` off): each keyword search
    read all of it, up to 4 MB of the newest entries (10,000 messages: 1.7 ms a search),
    and its pages weighed in the plan's cost until the store's walk looked cheaper."""
    memories(AgentFactory(), [f"note {i} about the weather in town" for i in range(500)])
    conversation = ConversationFactory()
    Message.objects.bulk_create(
        Message(conversation=conversation, role=Role.USER, content=f"turn {i} about rain")
        for i in range(500)
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT gin_clean_pending_list(%s::regclass)", [index])
        assert cursor.fetchone()[0] == 0  # pages that waited in the list


def test_a_keyword_search_of_a_common_word_reads_no_other_agents_memories(two_stores):
    """A word most memories hold, searched in a store written after another's: the scope's
    rows read from an index until enough hold it. PostgreSQL may expect enough of them at
    the table's start and read it from there, every other agent's memories first: on a
    table of 150,000 memories, 27 to 50 ms against 1."""
    _store, other = two_stores
    rows, plan = planned_keyword_candidates(other, "sun")
    assert len(rows) == 30
    assert Memory.objects.filter(pk__in=rows, agent=other, content__endswith="sun").count() == 30
    assert "Seq Scan" not in plan, plan
