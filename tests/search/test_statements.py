"""How rare a query word is: counted among the rows the searcher may read, never the whole
corpus's (memories here; messages in tests/search/test_search.py)."""

from dataclasses import replace

import pytest
from django.db import connection

from agents_api.models import Memory, content_hash
from agents_api.selectors import MEMORIES, memory_scope
from conversations.models import Message, Role
from search import statements
from search.statements import query_terms, view_frequencies, view_words
from search.tuning import DEFAULT_TUNING
from tests.db import plans_of
from tests.factories import AgentFactory, ConversationFactory

pytestmark = pytest.mark.django_db


def memories(agent, texts, user_id=""):
    Memory.objects.bulk_create(
        Memory(agent=agent, user_id=user_id, content=text, content_hash=content_hash(text))
        for text in texts
    )


def terms(text, agent=None, user_id="", tags=(), **tuning):
    scope = memory_scope(agent.id if agent else None, user_id, tags)
    with connection.cursor() as cursor:
        return query_terms(cursor, MEMORIES, scope, text, replace(DEFAULT_TUNING, **tuning))


def test_a_rarer_word_weighs_more():
    agent = AgentFactory()
    memories(agent, [f"note {i} about the weather" for i in range(400)])
    memories(agent, ["the user keeps a capybara"])
    found = terms("capybara weather", agent)
    assert found.idf["capybara"] > 3 * found.idf["weather"]
    assert found.match_on[0] == "capybara"


def test_a_query_counts_its_first_words_only(monkeypatch):
    """Each query word is counted among the caller's rows: 500 distinct words held the
    database 3 s (review). The first ``query_words`` (as the query says them) are its
    terms."""
    agent = AgentFactory()
    memories(agent, ["the user keeps a capybara", "zebra notes"])
    counted = []
    counting = statements.view_frequencies

    def view_frequencies_counted(cursor, corpus, scope, lexemes, tuning, **options):
        counted.append(list(lexemes))
        return counting(cursor, corpus, scope, lexemes, tuning, **options)

    monkeypatch.setattr(statements, "view_frequencies", view_frequencies_counted)
    filler = " ".join(f"filler{i}" for i in range(40))
    assert "capybara" not in terms(f"{filler} capybara", agent, query_words=32).idf
    assert counted[-1] == [f"filler{i}" for i in range(32)]
    assert set(terms(f"zebra capybara {filler}", agent, query_words=3).idf) == {
        "zebra",
        "capybara",
        "filler0",
    }


def test_a_word_weighs_by_the_rows_of_the_scope_alone():
    """What other agents or users keep moves no weight and no choice of words: a weight
    from everyone's rows told a searcher how many rows of others hold a word (a stranger's
    30 private messages moved a score from 3.64 to 2.03, and BM25 worked backwards gave the
    count)."""
    agent, stranger = AgentFactory(), AgentFactory()
    memories(agent, [f"note {i} about the weather" for i in range(40)])
    memories(agent, [f"the user met a capybara, day {i}" for i in range(8)])
    before = terms("capybara weather", agent, keyword_match_cap=10)
    memories(stranger, [f"secret capybara plan {i}" for i in range(300)])
    memories(agent, [f"capybara {i}" for i in range(300)], user_id="someone else")
    statements.forget_scopes()  # (not a weight kept from before)
    assert terms("capybara weather", agent, keyword_match_cap=10) == before
    assert before.idf["capybara"] > before.idf["weather"]
    assert before.match_on == ["capybara"]  # (the commoner word is not matched on)
    everyone = terms("capybara weather", keyword_match_cap=10)  # (a scope of every agent)
    assert everyone.idf["capybara"] < everyone.idf["weather"]
    assert everyone.match_on == ["weather"]


def test_the_words_of_a_view_are_counted_once_a_while_whatever_narrows_it(monkeypatch):
    """One statement counts a view's words; the next queries of the view send none but for
    their own lexemes (a text not seen lately), whatever tags narrow them; another view is
    counted anew."""
    agent, other = AgentFactory(), AgentFactory()
    memories(agent, ["the user keeps a capybara", "a wombat"])
    memories(other, ["a wombat"])
    sent = []

    def record(execute, sql, params, many, context):
        sent.append("words" if "MATERIALIZED" in sql else "lexemes" if "to_tsvector" in sql else "")
        return execute(sql, params, many, context)

    statements._LEXEMES.clear()
    with connection.execute_wrapper(record):
        first = terms("capybara", agent)
        assert sent == ["lexemes", "words"]
        assert terms("capybara", agent) == first
        assert terms("capybara", agent, tags=["pets"]) == first
        assert terms("capybara", agent, tags=["pets", "junk"]) == first
        assert terms("wombat", agent).idf == {"wombat": first.idf["capybara"]}
        assert sent == ["lexemes", "words", "lexemes"]
        terms("wombat", other)
        assert sent[3:] == ["words"]
        monkeypatch.setattr(statements, "SCOPE_KEPT_SECONDS", 0)
        terms("capybara", agent)
    assert sent[4:] == ["words"]


def test_a_larger_view_is_counted_in_its_first_rows_and_scaled():
    agent = AgentFactory()
    memories(agent, [f"note {i} about the weather" for i in range(20)])
    memories(agent, [f"note {i} about the rain" for i in range(20, 40)])
    tuning = replace(DEFAULT_TUNING, scope_sample_rows=10, scope_rows_cap=30)
    with connection.cursor() as cursor:
        words = view_words(cursor, MEMORIES, memory_scope(agent.id, ""), tuning)
    assert (words.documents, words.sampled, words.complete) == (30, 10, False)
    assert words.frequency("note", 5) == 30
    assert words.frequency("capybara", 5) is None  # (to count: the sample cannot tell)
    held = {w: words.counts.get(w, 0) for w in ("weather", "rain")}
    assert sum(held.values()) == 10  # the sample's ten rows, each holding one of them
    for word, count in held.items():  # (scaled, or to count where the sample lacks it)
        assert words.frequency(word, 5) == (count * 3 if count >= 5 else None)


def test_a_word_the_first_rows_of_a_view_lack_is_counted_not_taken_for_a_rare_one():
    """An outside review: a view's first rows are its oldest. A word common in its newer
    rows only was taken for the rarest, matched on first, and its 500 arbitrary rows
    crowded out the one that held both words ("zebra project")."""
    agent = AgentFactory()
    memories(agent, [f"note {i} about the weather" for i in range(30)])
    memories(agent, [f"project status update {i}" for i in range(30)])
    memories(agent, ["the zebra project shipped"])
    tuning = replace(DEFAULT_TUNING, scope_sample_rows=20, keyword_match_cap=10)
    with connection.cursor() as cursor:
        scope = memory_scope(agent.id, "")
        view, frequencies = view_frequencies(cursor, MEMORIES, scope, ["project", "zebra"], tuning)
        found = query_terms(cursor, MEMORIES, scope, "zebra project", tuning)
        rows = statements.keyword_candidates(cursor, MEMORIES, scope, found, 5, tuning)
    # Counted up to the cap and one, or scaled from the rows read: common either way.
    assert frequencies["project"] >= 11 and frequencies["zebra"] == 1
    assert view.documents == 61
    assert found.match_on == ["zebra"]
    best = max(rows, key=rows.get)
    assert Memory.objects.get(pk=best).content == "the zebra project shipped"


def test_a_view_keeps_its_commonest_words_only():
    agent = AgentFactory()
    memories(
        agent, [f"note {i} about {'the weather' if i % 2 else 'a capybara'}" for i in range(40)]
    )
    tuning = replace(DEFAULT_TUNING, view_words_kept=2)
    with connection.cursor() as cursor:
        scope = memory_scope(agent.id, "")
        words = view_words(cursor, MEMORIES, scope, tuning)
        assert list(words.counts) == ["note", "capybara"]  # (the most held; ties by word)
        assert words.frequency("weather", 5) is None  # (as common as one kept: counted)
        assert view_frequencies(cursor, MEMORIES, scope, ["weather"], tuning)[1] == {"weather": 20}


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
    found = terms(word, agent)
    with connection.cursor() as cursor, plans_of("SELECT id, score") as plans:
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
        statements.forget_scopes()
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
