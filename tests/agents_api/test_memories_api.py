"""Long-term memories through the agent API and the user API: dedup, search, ranking,
paging, who reaches what, and bad input refused with nothing written."""

import json
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents_api import selectors
from agents_api.models import (
    MEMORY_LISTINGS_PER_SCOPE,
    Memory,
    MemoryBlock,
    MemoryListing,
    ToolRecord,
)
from conversations.models import Message, Visibility
from conversations.services import messages_delete
from memsvc.api.principals import Principal
from search import statements as search_statements
from search.embeddings import EmbeddingError
from tests.agents_api.conftest import make_agent
from tests.agents_api.test_api import append
from tests.api import another_list, items_after, rekeyed
from tests.db import recorded_statements
from tests.factories import ConversationFactory, MembershipFactory, MessageFactory

pytestmark = pytest.mark.django_db

MEMORIES = "/v1/agent/memories"
MINE = "/v1/user/memories"


def save(api, credential, content, **body):
    response = api.post(MEMORIES, {"content": content, **body}, as_=credential)
    assert response.status_code in (200, 201), response.content
    return response.json()


def search(api, credential, query, **body):
    response = api.post(f"{MEMORIES}/search", {"query": query, **body}, as_=credential)
    assert response.status_code == 200, response.content
    return response.json()["data"]


def contents(items):
    return [item["content"] for item in items]


def snapshot():
    return sorted(
        Memory.objects.values_list(
            "id", "content", "importance", "tags", "access_count", "expires_at", "user_id"
        )
    )


@pytest.fixture
def alices_facts(api, helper):
    for content in [
        "Alice has a golden retriever named Rex",
        "Alice works as a nurse at Boston General",
        "Alice is allergic to peanuts",
        "Alice wants to visit Kyoto in the autumn",
    ]:
        save(api, helper, content, userId="alice")


def test_save_returns_the_documented_memory(api, helper):
    saved = api.post(
        MEMORIES,
        {"content": "Prefers short answers", "importance": 0.9, "tags": ["style"]},
        as_=helper,
    )
    assert saved.status_code == 201
    memory = saved.json()
    assert memory == {
        "id": memory["id"],
        "agentId": str(helper.agent.id),
        "userId": None,
        "content": "Prefers short answers",
        "summary": "",
        "importance": 0.9,
        "tags": ["style"],
        "metadata": {},
        "messageIds": [],
        "source": "api",
        "accessCount": 0,
        "lastAccessedAt": None,
        "expiresAt": memory["expiresAt"],
        "createdAt": memory["createdAt"],
        "updatedAt": memory["updatedAt"],
    }
    stored = Memory.objects.get(id=memory["id"])
    # Embedded on the request path: a near-duplicate can be caught at once.
    assert stored.embedding is not None and stored.embedding_model
    assert stored.expires_at - stored.created_at == timedelta(days=15)


def test_the_same_fact_again_is_one_memory_with_the_higher_importance_and_every_tag(api, helper):
    first = save(api, helper, "Alice likes green tea", userId="alice", importance=0.8, tags=["a"])
    again = api.post(
        MEMORIES,
        {
            "content": "  alice LIKES green   tea ",
            "userId": "alice",
            "importance": 0.2,
            "tags": ["b"],
        },
        as_=helper,
    )
    assert again.status_code == 200
    assert again.json()["id"] == first["id"]
    assert (again.json()["importance"], again.json()["tags"]) == (0.8, ["a", "b"])
    near = api.post(MEMORIES, {"content": "Alice likes green tea.", "userId": "alice"}, as_=helper)
    assert near.status_code == 200 and near.json()["id"] == first["id"]
    # Saved again without an importance: it keeps its own, whatever a new one would get.
    low = save(api, helper, "Alice hums", userId="alice", importance=0.3)
    again = api.post(MEMORIES, {"content": "Alice hums", "userId": "alice"}, as_=helper)
    assert (again.json()["id"], again.json()["importance"]) == (low["id"], 0.3)
    assert save(api, helper, "Alice sings", userId="alice")["importance"] == 0.5
    # Tags grow to at most the 50 a save may give, the newest kept.
    tagged = save(api, helper, "Alice hums", userId="alice", tags=[f"t{i}" for i in range(50)])
    assert tagged["tags"] == [f"t{i}" for i in range(50)]
    more = api.post(
        MEMORIES, {"content": "Alice hums", "userId": "alice", "tags": ["new"]}, as_=helper
    )
    assert more.json()["tags"] == [*[f"t{i}" for i in range(1, 50)], "new"]
    # About another user, or kept by another agent, it is another memory.
    assert (
        api.post(
            MEMORIES, {"content": "Alice likes green tea", "userId": "bob"}, as_=helper
        ).status_code
        == 201
    )
    other = make_agent("other")
    assert (
        api.post(
            MEMORIES, {"content": "Alice likes green tea", "userId": "alice"}, as_=other
        ).status_code
        == 201
    )
    assert Memory.objects.count() == 5


def test_the_same_fact_written_in_other_unicode_forms_is_one_memory(api, helper):
    first = save(api, helper, "Alice has 3 cats", userId="alice")
    # A zero-width space in a word (the model reads none, the hash did): one fact by its
    # vector and what it states (``claims``). (A fullwidth "\uff13": its vector is another.)
    for again in ["Alice has 3 c\u200bats", "Alice has 3 cats\u200b"]:
        answer = api.post(MEMORIES, {"content": again, "userId": "alice"}, as_=helper)
        assert (answer.status_code, answer.json()["id"]) == (200, first["id"]), again
    ligature = save(api, helper, "Alice keeps \ufb01sh", userId="alice")
    answer = api.post(MEMORIES, {"content": "Alice keeps fish", "userId": "alice"}, as_=helper)
    assert (answer.status_code, answer.json()["id"]) == (200, ligature["id"])
    assert Memory.objects.count() == 2


def test_a_batch_saves_all_in_one_go_and_merges_repeats(api, helper):
    response = api.post(
        f"{MEMORIES}/batch",
        {
            "userId": "alice",
            "memories": [
                {"content": "Alice plays the cello"},
                {"content": "Alice runs marathons", "importance": 0.7},
                {"content": "alice plays the cello", "tags": ["music"]},
            ],
        },
        as_=helper,
    )
    assert response.status_code == 201
    data = response.json()["data"]
    assert len(data) == 3 and data[0]["id"] == data[2]["id"]
    assert data[2]["tags"] == ["music"]
    assert Memory.objects.filter(user_id="alice").count() == 2


def test_a_batch_answers_a_memory_as_the_batch_left_it_wherever_it_appears(api, helper):
    response = api.post(
        f"{MEMORIES}/batch",
        {
            "userId": "alice",
            "memories": [
                {"content": "Alice plays the cello", "importance": 0.2},
                {"content": "alice plays the cello", "importance": 0.9, "tags": ["music"]},
            ],
        },
        as_=helper,
    )
    assert response.status_code == 201
    first, again = response.json()["data"]
    stored = api.get(f"{MEMORIES}/{first['id']}", as_=helper).json()
    # Not the memory as first written (importance 0.2, no tags) beside its merged self.
    assert first == again == stored
    assert (first["importance"], first["tags"]) == (0.9, ["music"])


def test_search_finds_by_meaning_and_counts_each_use(api, helper, alices_facts):
    results = search(api, helper, "What kind of dog does she have?", userId="alice")
    assert contents(results)[0] == "Alice has a golden retriever named Rex"
    assert set(results[0]) >= {"score", "relevance", "accessCount"}
    assert results[0]["score"] >= results[-1]["score"]
    found = Memory.objects.get(content="Alice has a golden retriever named Rex")
    # Counted off the request path (the task runs inline in tests).
    assert found.access_count == 1 and found.last_accessed_at is not None
    assert Memory.objects.get(content="Alice is allergic to peanuts").access_count == len(
        [r for r in results if r["content"] == "Alice is allergic to peanuts"]
    )


@pytest.mark.parametrize("prefetch", [False, True])
def test_a_word_after_a_dash_excludes_the_memories_holding_it(api, helper, alices_facts, prefetch):
    query = "Which animals and places does Alice like? Not her pets -retriever"
    found = contents(search(api, helper, query, userId="alice", limit=10, prefetch=prefetch))
    assert "Alice wants to visit Kyoto in the autumn" in found
    assert "Alice has a golden retriever named Rex" not in found


def test_memories_are_found_by_their_words_whatever_accents_or_script(api, helper):
    save(api, helper, "Zoë runs a café in São Paulo", userId="alice")
    save(api, helper, "アリスは東京に住んでいます", userId="alice")
    assert contents(search(api, helper, "Zoe cafe Sao Paulo", userId="alice", mode="keyword")) == [
        "Zoë runs a café in São Paulo"
    ]
    assert contents(search(api, helper, "東京", userId="alice", mode="keyword")) == [
        "アリスは東京に住んでいます"
    ]


def test_min_score_filters_on_relevance(api, helper, alices_facts):
    assert search(api, helper, "quantum chromodynamics lattice", userId="alice", minScore=0.5) == []
    everything = search(api, helper, "quantum chromodynamics lattice", userId="alice", minScore=0)
    assert len(everything) == 4
    assert all(0 <= r["relevance"] < 0.5 for r in everything)


@pytest.mark.parametrize("important_first", [False, True])
@pytest.mark.parametrize("mode", ["keyword", "hybrid"])
def test_importance_breaks_a_tie_of_relevance(api, helper, mode, important_first):
    weights = [1.0, 0.1] if important_first else [0.1, 1.0]
    save(api, helper, "The user likes jazz", importance=weights[0])
    save(api, helper, "The user likes jazz", importance=weights[1], userId="alice")
    first = search(api, helper, "jazz", mode=mode, minScore=0)[0]
    alices = search(api, helper, "jazz", mode=mode, minScore=0, userId="alice")[0]
    assert (first["score"] > alices["score"]) == important_first


@pytest.mark.parametrize("mode", ["hybrid", "semantic"])
def test_importance_outweighs_a_small_edge_of_relevance(api, helper, mode):
    """Relevance was stretched over the candidates: of two, the less relevant got 0
    however close, and the memory of importance 0 outranked the one of importance 1, both
    shown relevant (review)."""
    save(api, helper, "Dave drinks green tea every morning", importance=0.0, userId="dave")
    save(api, helper, "Dave enjoys a cup of green tea after lunch", importance=1.0, userId="dave")
    found = search(api, helper, "green tea", userId="dave", minScore=0, mode=mode)
    assert contents(found)[0] == "Dave enjoys a cup of green tea after lunch"


def test_of_memories_holding_the_same_words_the_weightier_are_the_candidates(api, helper):
    """41 memories hold "coffee" alike (each word counts once): the 30 keyword candidates
    were any 30, and the one of importance 1, nearest to none by meaning, was found from
    limit 8 on, never at MCP's default of 5 (review)."""
    memories = [{"content": f"Coffee order number {i}", "importance": 0.0} for i in range(40)]
    important = (
        "Coffee is what the user said once, while we were discussing the migration of the "
        "billing database to a new cluster and the holiday schedule for the operations team"
    )
    memories.append({"content": important, "importance": 1.0})
    response = api.post(f"{MEMORIES}/batch", {"memories": memories}, as_=helper)
    assert response.status_code == 201, response.content
    for limit in (1, 5, 20):
        assert contents(search(api, helper, "coffee", limit=limit, minScore=0))[0] == important


@pytest.mark.parametrize("mode", ["hybrid", "semantic"])
def test_a_smaller_limit_gives_the_first_results_of_a_larger_one(api, helper, mode):
    """Candidates were 5 per result (at least 30), chosen by relevance alone: the memory of
    importance 1, 37th by relevance and first by score, was found at limit 10 and missing
    at limit 5 (review)."""
    words = "zebra giraffe lion tiger hippo walrus otter"
    memories = [{"content": f"{words} badger count {n}", "importance": 0.0} for n in range(36)]
    memories.append({"content": f"{words} sighting 999", "importance": 1.0})
    memories += [{"content": f"Dan owns a red bicycle number {n}"} for n in range(40)]
    response = api.post(f"{MEMORIES}/batch", {"userId": "dan", "memories": memories}, as_=helper)
    assert response.status_code == 201, response.content
    query = {"userId": "dan", "minScore": 0, "mode": mode}
    longest = contents(search(api, helper, f"{words} badger", limit=20, **query))
    assert longest[0] == f"{words} sighting 999"
    for limit in (1, 5, 10):
        assert (
            contents(search(api, helper, f"{words} badger", limit=limit, **query))
            == (longest[:limit])
        )


def test_a_memorys_score_does_not_depend_on_what_else_was_found(api, helper, alices_facts):
    """A tags filter (fewer candidates) moved an unchanged memory's score from 0.81 to
    0.20 (review)."""
    save(api, helper, "Alice works night shifts at the hospital", userId="alice", tags=["work"])
    save(api, helper, "Alice cycles to the hospital", userId="alice", tags=["work"])
    query = "alice night shifts at the hospital"
    every = search(api, helper, query, userId="alice", minScore=0)
    tagged = search(api, helper, query, userId="alice", minScore=0, tags=["work"])
    assert len(every) > len(tagged) == 2
    scores = {r["content"]: r["score"] for r in every}
    assert all(scores[r["content"]] == r["score"] for r in tagged)


@pytest.mark.parametrize("mode", ["hybrid", "semantic", "keyword"])
def test_a_search_ranks_its_candidates_on_what_it_read_of_them(api, helper, alices_facts, mode):
    # The importance and age of each candidate come with it from the nearest-vector
    # statement (0.4 of a search's 7 ms were a statement for them); candidates found by
    # their words alone are read for them.
    with recorded_statements() as sent:
        assert (
            len(search(api, helper, "Alice", userId="alice", limit=2, minScore=0, mode=mode)) == 2
        )
    read = sum(sql.startswith("SELECT id, importance, created_at FROM memory") for sql in sent)
    assert read == (mode == "keyword")


def test_a_search_reads_whole_only_the_memories_it_returns(api, helper, alices_facts):
    # Every candidate is ranked on its importance and age; only the ones returned are read
    # with their text, tags and metadata.
    read_whole = []

    def record(execute, sql, params, many, context):
        if sql.startswith('SELECT "memory"."id", "memory"."agent_id"'):
            read_whole.append(len(params))  # one per memory id
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        results = search(api, helper, "Alice", userId="alice", limit=2, minScore=0)
    assert len(results) == 2
    assert read_whole == [2]


def test_prefetch_searches_each_sentence(api, helper, alices_facts):
    # Each sentence finds its own memory; a memory keeps its best sentence's result.
    query = "I am going to travel to Japan soon. Can I eat peanut butter?"
    statements = []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        prefetched = search(api, helper, query, userId="alice", limit=2, prefetch=True, minScore=0)
    # The store's scope is probed once for both sentences: whether it holds a memory, and
    # how to find its nearest vectors (counted up to the exact-search limit).
    assert sum("SELECT EXISTS (SELECT 1 FROM (SELECT m.agent_id" in sql for sql in statements) == 1
    assert sum("SELECT (SELECT count(*) FROM (" in sql for sql in statements) == 1
    assert sorted(contents(prefetched)) == [
        "Alice is allergic to peanuts",
        "Alice wants to visit Kyoto in the autumn",
    ]
    assert len({r["id"] for r in prefetched}) == 2


def test_a_scope_is_counted_again_only_after_a_minute(api, helper, alices_facts, monkeypatch):
    # Counting an agent's store up to the exact-search limit cost more than the graph walk
    # after it (1.35 of 10 ms at 10,000 memories): the way it chose is kept a while.
    # Whether the store holds a memory is kept too (only a yes: a memory saved since must
    # be found).
    def counts() -> tuple[int, int]:
        with recorded_statements() as sent:
            assert search(api, helper, "peanut butter", userId="alice", minScore=0)
        counted = sum("SELECT (SELECT count(*) FROM (" in sql for sql in sent)
        probed = sum("SELECT EXISTS (SELECT 1 FROM (SELECT m.agent_id" in sql for sql in sent)
        return counted, probed

    assert counts() == (1, 1)
    assert counts() == (0, 0)
    monkeypatch.setattr(search_statements, "SCOPE_KEPT_SECONDS", 0)
    assert counts() == (1, 1)


def test_a_store_found_empty_finds_the_memory_saved_next(api, helper):
    # An empty store is not searched at all (one probe); that it was empty is not kept.
    assert search(api, helper, "peanut butter", userId="alice", minScore=0) == []
    save(api, helper, "Alice is allergic to peanuts", userId="alice")
    assert contents(search(api, helper, "peanut butter", userId="alice", minScore=0)) == [
        "Alice is allergic to peanuts"
    ]


def test_with_prefetch_a_memory_keeps_its_best_of_each_measure_whatever_the_threshold(api, helper):
    """Each memory kept the measures of the sentence it ranked best on, after a threshold
    applied sentence by sentence: its shown relevance was not its best, and raising
    ``minScore`` moved its score (0.570 -> 0.530; review)."""
    for content, importance in [
        ("Carl is allergic to peanuts", 0.9),
        ("Carl is allergic to peanuts and shellfish", 0.0),
        ("Carl drives a blue Volvo", 0.5),
        ("Carl prefers vim over emacs", 0.5),
        ("Carl's daughter is named Mia", 0.5),
        ("Carl lives in Porto", 0.5),
        ("The peanut butter jar is in the kitchen", 0.1),
    ]:
        save(api, helper, content, importance=importance, userId="carl")
    sentences = ["What car does he drive?", "Where does Carl live?"]
    alone = [search(api, helper, s, userId="carl", limit=10, minScore=0) for s in sentences]
    both = search(
        api, helper, " ".join(sentences), userId="carl", limit=10, prefetch=True, minScore=0
    )
    assert len(both) == 7
    for hit in both:
        best = max(r["relevance"] for found in alone for r in found if r["id"] == hit["id"])
        assert hit["relevance"] == best
        at_best = best - 1e-5  # (shown rounded to 6 places)
        kept = search(
            api,
            helper,
            " ".join(sentences),
            userId="carl",
            limit=10,
            prefetch=True,
            minScore=at_best,
        )
        assert (hit["score"], hit["relevance"]) in [(r["score"], r["relevance"]) for r in kept]


def test_prefetch_searches_a_bounded_number_of_sentences(api, helper, alices_facts):
    # Each sentence is a search of its own: a query of 2,000 characters held hundreds of
    # them (seconds of work for one request). A long one costs what its first ones cost.
    def statements_of(query) -> int:
        statements = []

        def record(execute, sql, params, many, context):
            statements.append(sql)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(record):
            search(api, helper, query, userId="alice", prefetch=True, minScore=0)
        return len(statements)

    sentences = [f"Question number {n} about Alice." for n in range(200)]
    long_query = " ".join(sentences)[:2000]
    first = " ".join(sentences[: selectors.PREFETCH_MAX_SENTENCES])
    statements_of(first)  # (how to find the scope's nearest vectors: counted once, kept)
    assert statements_of(long_query) == statements_of(first)


def test_tags_filter_search_and_list(api, helper):
    save(api, helper, "Deploys happen on Tuesdays", tags=["ops"])
    save(api, helper, "Tuesdays are for team lunch", tags=["social"])
    assert contents(search(api, helper, "Tuesdays", tags=["ops"], minScore=0)) == [
        "Deploys happen on Tuesdays"
    ]
    listed = api.get(MEMORIES, as_=helper, tag="social").json()["data"]
    assert contents(listed) == ["Tuesdays are for team lunch"]


def test_a_memory_is_found_by_the_words_it_shows_whatever_invisible_characters_they_hold(
    api, helper
):
    """(A soft hyphen or a zero-width space inside a word hid it from keyword search.)"""
    save(api, helper, "Alice prefers the Mar\u00adgherita at Lu\u200bigi place")
    for query in ("Margherita", "Luigi"):
        found = search(api, helper, query, minScore=0.5)
        assert contents(found) == ["Alice prefers the Mar\u00adgherita at Lu\u200bigi place"]


def test_a_tag_stored_before_the_name_rules_is_still_found_by_it(api, helper):
    """A tag is given as a name now (no blank ends); one stored before is looked up as it
    is."""
    memory = save(api, helper, "Deploys happen on Tuesdays", tags=["ops"])
    Memory.objects.filter(id=memory["id"]).update(tags=["ops "])
    found = search(api, helper, "Tuesdays", tags=["ops "], minScore=0)
    assert contents(found) == ["Deploys happen on Tuesdays"]
    assert search(api, helper, "Tuesdays", tags=["ops"], minScore=0) == []


def expire(*memories, used: int = 0):
    """Let these memories expire a second ago, used ``used`` times, the prune not yet run."""
    Memory.objects.filter(id__in=[memory["id"] for memory in memories]).update(
        expires_at=timezone.now() - timedelta(seconds=1), access_count=used
    )


def test_expired_memories_are_not_found(api, helper):
    memory = save(api, helper, "A fact about bicycles")
    expire(memory)
    assert search(api, helper, "bicycles", minScore=0) == []


@pytest.mark.parametrize("used", [0, 10], ids=["to-be-deleted", "to-be-extended"])
def test_an_expired_memory_is_gone_everywhere_before_the_prune_runs(api, helper, alice, used):
    """Search left it out, but lists, reads, changes and the user's door still showed it
    until the daily prune. A popular one, which the prune will give a new life, is gone
    until then too; a delete still reaches it, so that the prune does not bring it back."""
    kept = save(api, helper, "Alice rides a red bicycle", userId="alice")
    gone = save(api, helper, "Alice rides to work on Mondays", userId="alice")
    own_gone = save(api, helper, "The helper's expired note")
    expire(gone, own_gone, used=used)

    for listing in (
        api.get(MEMORIES, as_=helper, userId="alice"),
        api.get(MEMORIES, as_=helper, userId="alice", order="popular"),
        api.get(MINE, as_=alice),
        api.get(MINE, as_=alice, agentId=str(helper.agent.id), order="popular"),
    ):
        assert contents(listing.json()["data"]) == [kept["content"]]
    assert contents(api.get(MEMORIES, as_=helper).json()["data"]) == []
    assert contents(search(api, helper, "Alice rides", userId="alice", minScore=0)) == [
        kept["content"]
    ]
    found = api.post(f"{MINE}/search", {"query": "Alice rides", "minScore": 0}, as_=alice)
    assert contents(found.json()["data"]) == [kept["content"]]
    url = f"{MEMORIES}/{gone['id']}"
    assert api.get(url, as_=helper).status_code == 404
    before = snapshot()
    assert api.patch(url, {"importance": 0.9}, as_=helper).status_code == 404
    assert snapshot() == before

    # Deletes reach it (and count only what was still there to see).
    assert api.delete(f"{MEMORIES}/{own_gone['id']}", as_=helper).status_code == 204
    assert api.call("DELETE", MINE, as_=alice).json() == {"deleted": 1}
    assert not Memory.objects.exists()


def test_saving_an_expired_fact_again_keeps_it_as_new(api, helper):
    """An expired memory, not yet pruned, is no duplicate to merge into (which brought it
    back with its old uses, tags and age): the fact is saved anew, by the same words or
    by near ones."""
    old = save(api, helper, "Alice likes green tea", userId="alice", tags=["old"])
    expire(old, used=12)
    again = api.post(MEMORIES, {"content": "alice likes GREEN tea", "userId": "alice"}, as_=helper)
    assert again.status_code == 201, again.content
    new = again.json()
    assert new["id"] != old["id"]
    assert (new["content"], new["tags"], new["accessCount"]) == ("alice likes GREEN tea", [], 0)
    assert list(Memory.objects.values_list("id", flat=True)) == [uuid.UUID(new["id"])]

    near = save(api, helper, "Alice drinks black coffee", userId="alice")
    expire(near)
    again = api.post(
        MEMORIES, {"content": "Alice drinks black coffee.", "userId": "alice"}, as_=helper
    )
    assert again.status_code == 201 and again.json()["id"] != near["id"]
    # A change of another memory to the expired one's words is no conflict either.
    expire(new)
    changed = api.patch(
        f"{MEMORIES}/{again.json()['id']}", {"content": "Alice likes green tea"}, as_=helper
    )
    assert changed.status_code == 200, changed.content
    # (The expired near one waits for the prune: it held other words.)
    assert sorted(Memory.objects.values_list("content", flat=True)) == [
        "Alice drinks black coffee",
        "Alice likes green tea",
    ]


def test_a_memory_holding_a_less_than_sign_is_found_by_its_words_after_it(api, helper):
    """The words after an unclosed "<style" were not indexed (read as markup)."""
    save(api, helper, "Put a <style block before the zebrafoo widget", importance=0.5)
    save(api, helper, "Nothing about it", importance=0.5)
    assert contents(search(api, helper, "zebrafoo widget", mode="keyword")) == [
        "Put a <style block before the zebrafoo widget"
    ]


def test_a_memory_is_found_by_keyword_before_it_has_a_vector(api, helper, monkeypatch):
    class Down:
        model = "down"

        def embed(self, texts):
            raise EmbeddingError("embedding service unreachable", transient=True)

    # The embedding service is outside memsvc: its failure is simulated.
    monkeypatch.setattr("search.services.configured_backend", lambda: Down())
    memory = save(api, helper, "The staging database password rotates monthly")
    assert Memory.objects.get(id=memory["id"]).embedding is None
    monkeypatch.undo()
    assert contents(search(api, helper, "staging database", minScore=0)) == [
        "The staging database password rotates monthly"
    ]


def test_memories_are_found_by_keyword_while_the_embedding_service_is_down(
    api, helper, alices_facts, monkeypatch
):
    class Down:
        model = "down"

        def embed(self, texts):
            raise EmbeddingError("embedding service unreachable", transient=True)

    # The query cannot be embedded: its words still find (a 500 before).
    monkeypatch.setattr("search.engine.configured_backend", lambda: Down())
    assert contents(search(api, helper, "peanuts", userId="alice")) == [
        "Alice is allergic to peanuts"
    ]


def test_list_pages_recent_or_popular(api, helper):
    for index in range(5):
        save(
            api,
            helper,
            f"Fact number {index} about the {['sea', 'sky', 'hills', 'city', 'woods'][index]}",
        )
    Memory.objects.filter(content__contains="number 2").update(access_count=9)
    first = api.get(MEMORIES, as_=helper, limit=2).json()
    assert len(first["data"]) == 2 and first["nextCursor"]
    seen = contents(
        first["data"] + items_after(api, MEMORIES, first["nextCursor"], as_=helper, limit=2)
    )
    assert len(seen) == len(set(seen)) == 5
    assert seen[0].startswith("Fact number 4")  # newest first
    popular = api.get(MEMORIES, as_=helper, order="popular").json()["data"]
    assert popular[0]["content"].startswith("Fact number 2")
    assert api.get(MEMORIES, as_=helper, order="oldest").status_code == 400
    assert api.get(MEMORIES, as_=helper, after="garbage!").status_code == 400
    # A cursor of the right shape whose time is no time: 400 too, not a database error.
    forged = rekeyed(first["nextCursor"], "yesterday", "x")
    assert api.get(MEMORIES, as_=helper, after=forged).status_code == 400

    # Times Python reads and PostgreSQL would not (an offset past 15:59) are read in UTC,
    # or are a 400 naming the cursor when UTC has no such time; not the database's 400.
    def after(moment):
        forged = rekeyed(first["nextCursor"], moment, str(uuid.uuid4()))
        return api.get(MEMORIES, as_=helper, after=forged)

    assert after("2026-01-01T00:00:00+16:00").status_code == 200
    forged = after("0001-01-01T00:00:00+23:59")
    assert forged.status_code == 400 and "after" in forged.json()["details"], forged.content


def test_a_walk_by_popularity_shows_each_memory_once_while_searches_count_uses(api, helper):
    """Every search moves the counts the popular order sorts on: a walk keyed on them
    showed a memory again when its count was reset, and skipped one whose count rose past
    the page's edge. A walk follows the order its first page saw."""
    saved = [
        save(api, helper, f"Fact number {i} about the {word}")
        for i, word in enumerate(["sea", "sky", "hills", "city", "woods", "rain", "snow"])
    ]
    for used, memory in enumerate(saved):
        Memory.objects.filter(id=memory["id"]).update(access_count=used)
    first = api.get(MEMORIES, as_=helper, order="popular", limit=3).json()
    seen = [item["id"] for item in first["data"]]
    assert seen == [saved[6]["id"], saved[5]["id"], saved[4]["id"]]
    # Between pages: the least used one is used a lot (it rose past the page's edge), one
    # already shown has its count reset (the prune), one not yet shown is deleted and one
    # is saved.
    Memory.objects.filter(id=saved[0]["id"]).update(access_count=100)
    Memory.objects.filter(id=saved[6]["id"]).update(access_count=0)
    assert api.delete(f"{MEMORIES}/{saved[2]['id']}", as_=helper).status_code == 204
    save(api, helper, "A fact saved during the walk")
    rest = items_after(api, MEMORIES, first["nextCursor"], as_=helper, order="popular", limit=3)
    seen += [item["id"] for item in rest]
    assert seen == [saved[i]["id"] for i in (6, 5, 4, 3, 1, 0)]
    # The order is the first page's; what is shown is the memory as it is now.
    assert rest[-1]["accessCount"] == 100
    # A new walk sees the new counts; a cursor of no walk is refused.
    again = api.get(MEMORIES, as_=helper, order="popular", limit=2).json()["data"]
    assert again[0]["id"] == saved[0]["id"]
    for key in ((str(uuid.uuid4()), 3), ("x", 3)):
        forged = rekeyed(first["nextCursor"], *key)
        refused = api.get(MEMORIES, as_=helper, order="popular", after=forged)
        assert refused.status_code == 400 and "after" in refused.json()["details"]


def test_a_popular_cursor_lasts_a_day_whenever_the_prune_runs(api, helper):
    """The README says a walk by popularity lasts a day: its cursor was read until the daily
    prune reclaimed its order, up to a day later (review)."""
    from agents_api.models import MEMORY_LISTING_TTL, MemoryListing

    for i in range(3):
        save(api, helper, f"Fact {i} about the {['sea', 'sky', 'hills'][i]}")
    cursor = api.get(MEMORIES, as_=helper, order="popular", limit=1).json()["nextCursor"]
    assert api.get(MEMORIES, as_=helper, order="popular", after=cursor).status_code == 200
    MemoryListing.objects.update(
        created_at=timezone.now() - MEMORY_LISTING_TTL - timedelta(minutes=1)
    )
    refused = api.get(MEMORIES, as_=helper, order="popular", after=cursor)
    assert refused.status_code == 400
    assert refused.json()["details"] == {"after": ["unknown or expired cursor: list again"]}


def test_a_popular_cursor_of_another_list_is_400_not_its_end(api, helper, rival):
    """Another user's, tag's or agent's cursor read as an empty last page: a walk believed
    it had ended (review)."""
    for i in range(3):
        save(api, helper, f"Bob's fact {i} about the sea", userId="bob", tags=["t"])
    cursor = api.get(MEMORIES, as_=helper, userId="bob", order="popular", limit=1).json()
    cursor = cursor["nextCursor"]
    assert api.get(MEMORIES, as_=helper, userId="bob", order="popular", after=cursor).json()["data"]
    for credential, params in [
        (helper, {"userId": "alice"}),
        (helper, {"userId": "bob", "tag": "t"}),
        (rival, {"userId": "bob"}),
    ]:
        refused = api.get(MEMORIES, as_=credential, order="popular", after=cursor, **params)
        assert refused.status_code == 400, refused.content
        assert "after" in refused.json()["details"]


def test_a_recent_cursor_of_another_list_filter_or_caller_is_400_not_its_end(
    api, helper, rival, alice, bob
):
    """A cursor held only the last memory's place (createdAt, id): given to another list
    (the user's door, another user, tag, agent, or the user an agent acts for), it answered
    that list's memories past that place, often none: ``{"data": [], "nextCursor": null}``,
    read as the end of a list of 10 (review). Each list's own cursors still walk it."""
    for i in range(3):
        save(api, helper, f"Fact {i} about the agent itself")
        save(api, helper, f"Alice's fact {i} about the sea", userId="alice", tags=["sea"])
    first = api.get(MEMORIES, as_=helper, limit=2).json()
    seen = contents(
        first["data"] + items_after(api, MEMORIES, first["nextCursor"], as_=helper, limit=2)
    )
    assert seen == [f"Fact {i} about the agent itself" for i in (2, 1, 0)]
    cursor = first["nextCursor"]
    for credential, path, params in [
        (alice, MINE, {}),  # the review's: as alice, an agent's cursor was her list's end
        (helper, MEMORIES, {"userId": "alice"}),
        (helper, MEMORIES, {"tag": "sea"}),
        (helper.acting_for("alice"), MEMORIES, {}),
        (rival, MEMORIES, {}),
    ]:
        refused = api.get(path, as_=credential, after=cursor, **params)
        assert another_list(refused), (path, params, refused.content)

    first = api.get(MINE, as_=alice, limit=1).json()
    seen = contents(first["data"] + items_after(api, MINE, first["nextCursor"], as_=alice, limit=1))
    assert seen == [f"Alice's fact {i} about the sea" for i in (2, 1, 0)]
    cursor = first["nextCursor"]
    for credential, path, params in [
        (bob, MINE, {}),
        (alice, MINE, {"agentId": str(rival.agent.id)}),
        (alice, MINE, {"tag": "sea"}),
        (helper, MEMORIES, {"userId": "alice"}),
    ]:
        refused = api.get(path, as_=credential, after=cursor, **params)
        assert another_list(refused), (path, params, refused.content)


def test_first_pages_by_popularity_read_again_and_again_keep_a_few_listings(
    api, helper, settings, monkeypatch
):
    """A read-only client asking for a first page by popularity again and again wrote a
    listing of every memory each time, kept a day: a list keeps its newest few, a first
    page read again unchanged writes none, and a listing holds the most popular
    ``MEMORY_LISTING_MAX`` only."""
    from agents_api import selectors as agent_selectors

    monkeypatch.setattr(agent_selectors, "MEMORY_LISTING_MAX", 5)
    saved = [save(api, helper, f"Fact {i} about the {w}") for i, w in enumerate("abcdefg")]
    save(api, helper, "About Alice", userId="alice")  # another list, with one page

    first = [api.get(MEMORIES, as_=helper, order="popular", limit=2).json() for _ in range(3)]
    assert len({page["nextCursor"] for page in first}) == 1  # one listing, read three times
    [listing] = MemoryListing.objects.all()
    assert len(listing.memory_ids) == 5
    shown = items_after(api, MEMORIES, first[0]["nextCursor"], as_=helper, order="popular", limit=2)
    assert len(first[0]["data"] + shown) == 5

    for used, memory in enumerate(saved * 2):  # each first page now sees another order
        Memory.objects.filter(id=memory["id"]).update(access_count=used)
        assert api.get(MEMORIES, as_=helper, order="popular", limit=2).status_code == 200
    assert MemoryListing.objects.count() == MEMORY_LISTINGS_PER_SCOPE
    assert set(MemoryListing.objects.values_list("scope", flat=True)) == {listing.scope}


def test_a_popular_walk_read_with_few_of_its_memories_takes_few_queries(api, helper):
    """A walk's cursor read after most of its memories were deleted finds few of the listed
    memories: it read the listing one page's length at a time, a query for every two
    memories listed with ``limit=1``. (Read with another tag or by another agent, a cursor
    is refused: ``test_a_popular_cursor_of_another_list_is_400_not_its_end``.)"""
    saved = [save(api, helper, f"Fact {index} of the walk") for index in range(24)]
    cursor = api.get(MEMORIES, as_=helper, order="popular", limit=1).json()["nextCursor"]

    def page():
        with CaptureQueriesContext(connection) as queries:
            response = api.get(MEMORIES, as_=helper, order="popular", limit=1, after=cursor)
        assert response.status_code == 200, response.content
        return response.json(), len(queries.captured_queries)

    walked, walked_queries = page()
    assert len(walked["data"]) == 1 and walked["nextCursor"]
    Memory.objects.filter(id__in=[memory["id"] for memory in saved[1:-1]]).delete()
    sparse, sparse_queries = page()
    assert contents(sparse["data"]) == ["Fact 0 of the walk"] and sparse["nextCursor"] is None
    assert sparse_queries <= walked_queries + 4


def test_get_patch_and_delete(api, helper):
    memory = save(api, helper, "Uses vim", tags=["editor"])
    url = f"{MEMORIES}/{memory['id']}"
    assert api.get(url, as_=helper).json()["content"] == "Uses vim"
    changed = api.patch(url, {"content": "Uses emacs", "importance": 0.9}, as_=helper)
    assert changed.status_code == 200
    assert (changed.json()["content"], changed.json()["importance"]) == ("Uses emacs", 0.9)
    assert contents(search(api, helper, "emacs", mode="keyword", minScore=0)) == ["Uses emacs"]
    assert api.delete(url, as_=helper).status_code == 204
    assert api.get(url, as_=helper).status_code == 404


@pytest.mark.parametrize(
    ("expires_at", "status"),
    [
        ("2031-05-06", 400),  # a date alone: which moment of it, where?
        ("2031-05-06T10:00:00", 400),  # a time without its offset
        ("2031-05-06T10:00:00+25:00", 400),
        ("next week", 400),
        ("2031-05-06t10:00:00z", 201),  # RFC 3339 in lower case
        ("2031-05-06 10:00:00+02:00", 201),  # as Python writes one
        ("2031-05-06T10:00:00.123456Z", 201),
        ("2031-05-06T10:00:00.1234567891Z", 201),  # (RFC 3339's fraction has no cap)
        ("\uff12\uff10\uff13\uff11-05-06T10:00:00Z", 400),  # fullwidth digits
    ],
)
def test_a_time_is_taken_with_its_offset_as_rfc_3339_writes_it(api, helper, expires_at, status):
    """The schema says ``date-time``: a date alone and a time without its offset were read
    in the server's zone, and RFC 3339's lower-case ``t`` and ``z`` refused (review)."""
    response = api.post(
        MEMORIES, {"content": "Quinn keeps bees", "expiresAt": expires_at}, as_=helper
    )
    assert response.status_code == status, response.content
    if status == 400:
        assert "RFC 3339" in response.json()["details"]["expiresAt"][0]
        assert not Memory.objects.exists()


@pytest.mark.parametrize("moment", ["9999-12-31T23:00:00-05:00", "0001-01-01T00:00:00+05:30"])
def test_a_time_past_the_years_a_date_holds_is_said_in_memsvcs_words(api, helper, moment):
    """(DRF's own "Datetime value out of range.", where every other time is refused in the
    API's words: review.)"""
    response = api.post(MEMORIES, {"content": "Quinn keeps bees", "expiresAt": moment}, as_=helper)
    assert response.status_code == 400
    assert response.json()["details"] == {
        "expiresAt": ["must be between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z in UTC"]
    }


def test_a_patch_that_changes_nothing_leaves_the_memory_as_it_was(api, helper):
    """(Each moved ``updatedAt``: a memory looked edited when nothing had changed; review.)"""
    memory = save(api, helper, "Uses vim", tags=["editor"], importance=0.4)
    url = f"{MEMORIES}/{memory['id']}"
    for body in [{}, {"content": "Uses vim", "tags": ["editor"], "importance": 0.4}]:
        response = api.patch(url, body, as_=helper)
        assert response.status_code == 200, response.content
        assert response.json()["updatedAt"] == memory["updatedAt"]
    assert api.patch(url, {"importance": 0.5}, as_=helper).json()["updatedAt"] > memory["updatedAt"]


def test_an_id_in_a_path_is_read_in_either_case(api, helper, alice):
    """As a body's ids are: a client that writes UUIDs in capitals (Swift's ``uuidString``)
    got "no such route"."""
    memory = save(api, helper, "Uses vim", userId="alice")
    upper = memory["id"].upper()
    assert api.get(f"{MEMORIES}/{upper}", as_=helper).json()["id"] == memory["id"]
    assert api.delete(f"{MINE}/{upper}", as_=alice).status_code == 204
    assert api.get(f"{MEMORIES}/{upper}", as_=helper).json()["code"] == "not_found"


def test_patching_into_another_memorys_content_is_a_conflict(api, helper):
    save(api, helper, "Drinks coffee")
    tea = save(api, helper, "Drinks tea")
    response = api.patch(f"{MEMORIES}/{tea['id']}", {"content": "drinks COFFEE"}, as_=helper)
    assert response.status_code == 409
    assert Memory.objects.get(id=tea["id"]).content == "Drinks tea"


def test_delete_by_user(api, helper):
    save(api, helper, "Alice fact one", userId="alice")
    save(api, helper, "Alice fact two", userId="alice")
    save(api, helper, "Bob fact", userId="bob")
    response = api.call("DELETE", f"{MEMORIES}?userId=alice", as_=helper)
    assert response.json() == {"deleted": 2}
    assert list(Memory.objects.values_list("user_id", flat=True)) == ["bob"]


@pytest.mark.parametrize(
    ("path", "who"),
    [
        (f"{MEMORIES}?userid=alice", "helper"),  # misspelt: the agent's own would go
        (f"{MEMORIES}?userId=alice&tag=old", "helper"),  # a filter the list has, not this
        (f"{MINE}?agentid=x", "alice"),  # misspelt: every agent's memories of Alice would go
    ],
)
def test_a_bulk_delete_with_a_parameter_it_does_not_take_is_400_and_deletes_nothing(
    api, helper, alice, path, who
):
    save(api, helper, "Alice fact", userId="alice", tags=["old"])
    save(api, helper, "The helper's own note")
    before = snapshot()
    response = api.call("DELETE", path, as_={"helper": helper, "alice": alice}[who])
    assert response.status_code == 400
    [unknown] = response.json()["details"]
    assert unknown in path
    assert snapshot() == before


BOTH = ["Alice fact", "The helper's own note"]


@pytest.mark.parametrize(
    ("path", "body", "who", "status", "left"),
    [
        # (what is left after the deletion asked with ``{}``: memories, blocks, records)
        (MEMORIES, {"userId": "alice"}, "helper", 200, (["Alice fact"], 1, 1)),  # its own
        (MINE, {"agentId": "x"}, "alice", 200, (["The helper's own note"], 1, 1)),
        ("/v1/agent/memory-blocks/human", {"userId": "alice"}, "helper", 204, (BOTH, 0, 1)),
        ("/v1/agent/tool-records?taskId=t", {"taskId": "u"}, "helper", 200, (BOTH, 1, 0)),
    ],
)
def test_a_deletion_chosen_by_its_query_refuses_a_body_and_deletes_nothing(
    api, helper, alice, path, body, who, status, left
):
    """Its filter in a body was passed over: ``{"userId": "bob"}`` deleted the agent's own
    memories instead (review)."""
    save(api, helper, "Alice fact", userId="alice")
    save(api, helper, "The helper's own note")
    block = {"label": "human", "value": "Knows Alice"}
    assert api.post("/v1/agent/memory-blocks", block, as_=helper).status_code == 201
    record = {"toolName": "look", "output": "x", "taskId": "t"}
    assert api.post("/v1/agent/tool-records", record, as_=helper).status_code == 201

    def kept():
        return snapshot(), MemoryBlock.objects.count(), ToolRecord.objects.count()

    before = kept()
    caller = {"helper": helper, "alice": alice}[who]
    response = api.call("DELETE", path, as_=caller, body=body)
    assert response.status_code == 400
    assert "takes no body" in response.json()["error"]
    assert kept() == before
    # An empty one is none, as a client that always sends one sends it: deleted as asked.
    emptied = api.call("DELETE", path, as_=caller, body={})
    assert emptied.status_code == status, emptied.content
    contents_left = sorted(Memory.objects.values_list("content", flat=True))
    assert (contents_left, MemoryBlock.objects.count(), ToolRecord.objects.count()) == left


def test_a_tag_the_newest_save_sends_again_is_among_the_newest(api, helper):
    """(Kept at its old place, it was dropped as one of the oldest: review.)"""
    save(api, helper, "Gina likes tags", tags=[f"t{n}" for n in range(50)])
    merged = save(api, helper, "gina likes tags", tags=["n1", "t0", "n2"])
    assert merged["tags"] == [f"t{n}" for n in range(3, 50)] + ["n1", "t0", "n2"]


@pytest.mark.parametrize(
    ("path", "body", "who", "named"),
    [
        (f"{MEMORIES}?userId=alice", {"content": "Alice likes tea"}, "helper", "userId"),
        (
            f"{MEMORIES}/batch?userId=alice",
            {"memories": [{"content": "Alice likes tea"}]},
            "helper",
            "userId",
        ),
        (f"{MEMORIES}/search?userId=alice", {"query": "tea"}, "helper", "userId"),
        (
            f"{MINE}/search?agentId=0d5e4c1a-9f3b-4a43-b2cb-5a8a6f6f0e11",
            {"query": "tea"},
            "alice",
            "agentId",
        ),
        (
            "/v1/agent/tool-records?taskId=t",
            {"toolName": "look", "output": "x"},
            "helper",
            "taskId",
        ),
        ("/v1/agent/tool-records/search?taskId=t", {"query": "look"}, "helper", "taskId"),
    ],
)
def test_a_save_or_search_naming_its_subject_in_the_query_is_400_and_saves_nothing(
    api, helper, alice, path, body, who, named
):
    """Whom they are about is the body's: a ``?userId=alice`` was passed over, and the
    memories saved were the agent's own, the search searched those (review); a user's
    ``?agentId=`` searched every agent's (code review)."""
    before = snapshot(), ToolRecord.objects.count()
    response = api.post(path, body, as_={"helper": helper, "alice": alice}[who])
    assert response.status_code == 400
    assert response.json()["details"] == {named: ["unknown query parameter"]}
    assert (snapshot(), ToolRecord.objects.count()) == before


@pytest.mark.parametrize(
    ("method", "path", "who", "field"),
    [
        # A client's unset variable: every one of these deleted (or listed) what the filter
        # was there to narrow, the agent's own memories or every agent's about Alice.
        ("DELETE", f"{MEMORIES}?userId=", "helper", "userId"),
        ("DELETE", f"{MINE}?agentId=", "alice", "agentId"),
        ("DELETE", "/v1/agent/memory-blocks/own?userId=", "helper", "userId"),
        ("GET", f"{MEMORIES}?userId=", "helper", "userId"),
        ("GET", f"{MEMORIES}?userId=alice&tag=", "helper", "tag"),
        ("GET", f"{MINE}?agentId=", "alice", "agentId"),
    ],
)
def test_an_empty_filter_is_400_not_no_filter(api, helper, alice, method, path, who, field):
    save(api, helper, "Alice fact", userId="alice")
    save(api, helper, "The helper's own note")
    block = api.post("/v1/agent/memory-blocks", {"label": "own", "value": "v"}, as_=helper)
    assert block.status_code == 201, block.content
    before = (snapshot(), list(MemoryBlock.objects.values_list("id", "value")))
    response = api.call(method, path, as_={"helper": helper, "alice": alice}[who])
    assert response.status_code == 400, response.content
    assert list(response.json()["details"]) == [field]
    assert (snapshot(), list(MemoryBlock.objects.values_list("id", "value"))) == before


def test_a_whole_number_written_as_a_float_is_an_integer(api, helper):
    """JSON Schema counts 5.0 as an integer, and the MCP tools' validator passes it: the
    body check refused it (review)."""
    save(api, helper, "Frank owns a boat")
    found = api.post(f"{MEMORIES}/search", {"query": "boat", "limit": 5.0}, as_=helper)
    assert found.status_code == 200, found.content
    refused = api.post(f"{MEMORIES}/search", {"query": "boat", "limit": 5.5}, as_=helper)
    assert refused.status_code == 400 and list(refused.json()["details"]) == ["limit"]
    # A large one is held to the field's bounds ("A valid integer is required.": review).
    huge = {"label": "l", "value": "v", "limit": 1e16}
    huge = api.post("/v1/agent/memory-blocks", huge, as_=helper)
    assert huge.status_code == 400 and "less than or equal" in huge.json()["error"]
    listed = api.post(
        "/v1/agent/search/messages",
        {"query": "boat", "conversationIds": [str(uuid.uuid4()), 3]},
        as_=helper,
    )
    assert listed.status_code == 400
    assert list(listed.json()["details"]) == ["conversationIds[1]"]  # (the item, by its place)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (MEMORIES, {"content": "Frank owns a boat", "importance": True}, "importance"),
        (MEMORIES, {"content": "Frank owns a boat", "importance": "0.5"}, "importance"),
        (MEMORIES, {"content": "Frank owns a boat", "messageIds": [3]}, "messageIds[0]"),
        ("/v1/agent/memory-blocks", {"label": "l", "value": "v", "limit": "10"}, "limit"),
        ("/v1/agent/memory-blocks", {"label": "l", "value": "v", "readOnly": 1}, "readOnly"),
        ("/v1/agent/memory-blocks", {"label": "l", "value": "v", "limit": 10.5}, "limit"),
        (f"{MEMORIES}/search", {"query": "boat", "prefetch": "yes"}, "prefetch"),
        (f"{MEMORIES}/search", {"query": "boat", "minScore": "0.1"}, "minScore"),
        ("/v1/agent/search/messages", {"query": "boat", "topK": "5"}, "topK"),
        (
            "/v1/agent/search/messages",
            {"query": "boat", "conversationIds": [5]},
            "conversationIds[0]",
        ),
    ],
)
def test_a_value_of_another_json_type_than_the_schemas_is_400(api, helper, path, body, field):
    """DRF's fields took ``true`` for a number, "10" for an integer, 1 for a boolean, 3 for
    a UUID; the schema says which JSON type each is, and the MCP tools refused them
    (review). Nothing is written."""
    before = (snapshot(), list(MemoryBlock.objects.values_list("id", "value")))
    response = api.post(path, body, as_=helper)
    assert response.status_code == 400, response.content
    assert list(response.json()["details"]) == [field]
    assert (snapshot(), list(MemoryBlock.objects.values_list("id", "value"))) == before


# --- who reaches what ------------------------------------------------------------------------


def test_another_agents_memory_is_404_and_untouched(api, helper, rival):
    memory = save(api, helper, "Helper's private note", userId="alice")
    before = snapshot()
    url = f"{MEMORIES}/{memory['id']}"
    assert api.get(url, as_=rival).status_code == 404
    assert api.patch(url, {"content": "defaced"}, as_=rival).status_code == 404
    assert api.delete(url, as_=rival).status_code == 404
    assert api.get(MEMORIES, as_=rival, userId="alice").json()["data"] == []
    assert search(api, rival, "private note", userId="alice", minScore=0) == []
    assert api.call("DELETE", f"{MEMORIES}?userId=alice", as_=rival).json() == {"deleted": 0}
    assert snapshot() == before


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", MEMORIES, {"content": "x"}),
        ("POST", f"{MEMORIES}/batch", {"memories": [{"content": "x"}]}),
        ("PATCH", f"{MEMORIES}/{{id}}", {"content": "y"}),
        ("DELETE", f"{MEMORIES}/{{id}}", None),
        ("DELETE", MEMORIES, None),
    ],
)
def test_a_read_key_cannot_write(api, helper, method, path, body):
    memory = save(api, helper, "Written by the helper")
    reader = make_agent("helper", scopes=["read"])
    before = snapshot()
    response = api.call(method, path.format(id=memory["id"]), as_=reader, body=body)
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden"
    assert snapshot() == before
    # Reading is what the key is for.
    assert api.get(MEMORIES, as_=reader).status_code == 200
    assert search(api, reader, "written", minScore=0)


def test_a_write_only_key_cannot_search_or_list(api, helper):
    writer = make_agent("helper", scopes=["write"])
    assert api.post(f"{MEMORIES}/search", {"query": "x"}, as_=writer).status_code == 403
    assert api.get(MEMORIES, as_=writer).status_code == 403


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("POST", MEMORIES, {"content": "Hank's PIN hint is his dog's name"}),
        (
            "POST",
            f"{MEMORIES}/batch",
            {"memories": [{"content": "Hank's PIN hint is his dog's name"}]},
        ),
        ("PATCH", f"{MEMORIES}/{{id}}", {}),
        ("PATCH", f"{MEMORIES}/{{id}}", {"importance": 0.9}),
    ],
)
def test_a_write_only_key_cannot_read_a_memory_by_writing(api, helper, method, path, body):
    """A save merged into a memory kept already answers with it whole (its summary,
    metadata, every tag), as does a change (``{}``: a change of nothing): a key that may
    not read it (GET: 403) read it that way (review)."""
    memory = save(api, helper, "Hank's PIN hint is his dog's name", summary="private")
    writer = make_agent("helper", scopes=["write"])
    before = snapshot()
    response = api.call(method, path.format(id=memory["id"]), as_=writer, body=body)
    assert response.status_code == 403, response.content
    assert response.json()["error"] == "this API key lacks the 'read' scope"
    assert "private" not in response.content.decode()
    assert snapshot() == before
    # What writing alone reveals nothing of is the key's to do.
    assert api.delete(f"{MEMORIES}/{memory['id']}", as_=writer).status_code == 204


def test_acting_for_a_user_reaches_that_users_memories_only(api, helper):
    bobs = save(api, helper, "Bob's fact", userId="bob")
    as_alice = helper.acting_for("alice")
    mine = save(api, as_alice, "Alice's fact")  # the user's id is implied
    assert mine["userId"] == "alice"
    assert api.get(f"{MEMORIES}/{bobs['id']}", as_=as_alice).status_code == 404
    assert api.get(MEMORIES, as_=as_alice, userId="bob").status_code == 403
    assert contents(api.get(MEMORIES, as_=as_alice).json()["data"]) == ["Alice's fact"]


def test_without_a_key_it_is_401(api):
    assert api.get(MEMORIES).status_code == 401
    assert api.post(f"{MEMORIES}/search", {"query": "x"}).status_code == 401


# --- the turns a memory rests on ------------------------------------------------------------


def test_a_memory_cites_turns_the_agent_sees_and_no_others(api, helper, rival):
    mine = api.post("/v1/agent/conversations", {"title": "Mine"}, as_=helper).json()["id"]
    theirs = api.post("/v1/agent/conversations", {"title": "Theirs"}, as_=rival).json()["id"]

    def turn(conversation, credential, content):
        response = append(api, credential, conversation, {"role": "user", "content": content})
        assert response.status_code == 201, response.content
        return response.json()["data"][0]["id"]

    first, second = turn(mine, helper, "I moved to Lyon"), turn(mine, helper, "In March")
    memory = save(api, helper, "Alice lives in Lyon", userId="alice", messageIds=[first])
    # The same fact again: one memory citing the turns of both.
    again = save(api, helper, "alice lives in lyon", userId="alice", messageIds=[second, first])
    assert again["id"] == memory["id"] and again["messageIds"] == [first, second]
    url = f"{MEMORIES}/{memory['id']}"
    assert api.patch(url, {"messageIds": [second]}, as_=helper).json()["messageIds"] == [second]

    # Another agent's turn is no turn at all for this one: 400, nothing changed.
    before = snapshot(), Memory.objects.get(id=memory["id"]).message_ids
    elsewhere = turn(theirs, rival, "Secret plans")
    refused = api.patch(url, {"messageIds": [elsewhere]}, as_=helper)
    assert refused.status_code == 400 and "messageIds" in refused.json()["details"]
    refused = api.post(MEMORIES, {"content": "Plans", "messageIds": [elsewhere]}, as_=helper)
    assert refused.status_code == 400 and "messageIds" in refused.json()["details"]
    # In a batch, the memory that cites it is named, as any other refusal of one (review).
    batch = {"memories": [{"content": "Fine", "messageIds": [first]}, {"content": "Plans"}]}
    batch["memories"][1]["messageIds"] = [second, elsewhere]
    refused = api.post(f"{MEMORIES}/batch", batch, as_=helper)
    assert refused.status_code == 400
    assert list(refused.json()["details"]) == ["memories[1].messageIds"]
    assert refused.json()["error"].startswith("memories[1].messageIds: no such message")
    assert (snapshot(), Memory.objects.get(id=memory["id"]).message_ids) == before


def test_a_memory_citing_a_turn_deleted_since_takes_its_ids_back(api, helper, alice):
    """A deletion leaves the ids of the turns a memory cites: its GET's ``messageIds`` sent
    back in a change were a 400 "no such message" (outside review). A turn it does not
    cite yet must still be there."""
    ours = ConversationFactory(group__owner="alice", title="Ours")
    MembershipFactory(group=ours.group, principal_id=helper.agent.as_principal().id)
    first, second, third = (
        str(MessageFactory(conversation=ours, content=text).id) for text in ("a", "b", "c")
    )
    memory = save(api, helper, "Alice moved", userId="alice", messageIds=[second, first])
    messages_delete(Principal.user("ops"), messages=Message.objects.filter(pk=second))
    url = f"{MEMORIES}/{memory['id']}"
    shown = api.get(url, as_=helper).json()["messageIds"]
    assert shown == [second, first]
    changed = api.patch(url, {"messageIds": shown, "importance": 0.9}, as_=helper)
    assert changed.status_code == 200, changed.content
    assert changed.json()["messageIds"] == [second, first]

    messages_delete(Principal.user("ops"), messages=Message.objects.filter(pk=third))
    refused = api.patch(url, {"messageIds": [first, third]}, as_=helper)
    assert refused.status_code == 400 and "messageIds" in refused.json()["details"]
    assert api.get(url, as_=helper).json()["messageIds"] == [second, first]


def test_a_misspelt_query_parameter_is_refused_not_read_as_none(api, helper, alice):
    """``?userid=alice`` listed the agent's own memories (a list passed over a parameter it
    did not take; review): every /v1 operation takes the query its description names."""
    save(api, helper, "The agent's own note")
    save(api, helper, "Alice likes tea", userId="alice")
    for path, caller, query in (
        (MEMORIES, helper, {"userid": "alice"}),
        (MINE, alice, {"agentid": str(helper.agent.id)}),
        ("/v1/agent/conversations", helper, {"limt": "1"}),
        ("/v1/user/conversations", alice, {"qeury": "tea"}),
    ):
        refused = api.get(path, as_=caller, **query)
        assert refused.status_code == 400, (path, refused.content)
        [name] = query
        assert refused.json()["details"] == {name: ["unknown query parameter"]}
    assert contents(api.get(MEMORIES, as_=helper, userId="alice").json()["data"]) == [
        "Alice likes tea"
    ]


def test_a_tag_filter_longer_than_any_tag_is_refused(api, helper, alice):
    """(Cut to the column's 100 characters by PostgreSQL, it matched the tag it starts with.)"""
    save(api, helper, "Alice likes tea", userId="alice", tags=["t" * 100])
    for path, caller, whose in ((MEMORIES, helper, {"userId": "alice"}), (MINE, alice, {})):
        assert len(api.get(path, as_=caller, tag="t" * 100, **whose).json()["data"]) == 1
        refused = api.get(path, as_=caller, tag="t" * 101, **whose)
        assert refused.status_code == 400, refused.content
        assert "tag" in refused.json()["details"]


# --- bad input: 400 naming the field, nothing written ----------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (MEMORIES, {"content": "x", "importance": 1.5}, "importance"),
        (MEMORIES, {"content": "x", "importance": -0.1}, "importance"),
        (MEMORIES, {"content": ""}, "content"),
        (MEMORIES, {"content": "   "}, "content"),
        (MEMORIES, {"content": "\u200b"}, "content"),  # zero-width space: strip() keeps it
        (MEMORIES, {"content": "\u202e\ufeff \u0301"}, "content"),  # bidi, BOM, lone accent
        (MEMORIES, {"content": "nul\x00here"}, "content"),
        (MEMORIES, {"content": "x", "tags": [f"t{i}" for i in range(51)]}, "tags"),
        (MEMORIES, {"content": "x", "tags": ["t" * 101]}, "tags"),
        (MEMORIES, {"content": "x", "tags": ["ok", " "]}, "tags"),  # (kept as a tag: review)
        (MEMORIES, {"content": "x", "tags": ["\u200b"]}, "tags"),
        (MEMORIES, {"content": "x", "tags": ["a", " a "]}, "tags"),  # (two that look one)
        (MEMORIES, {"content": "x", "tags": ["a\u200b"]}, "tags"),
        (MEMORIES, {"content": "x", "tags": ["two\nlines"]}, "tags"),
        (MEMORIES, {"content": "x", "tags": ["\u202egat"]}, "tags"),  # (shown reversed)
        (MEMORIES, {"content": "x", "userId": "agent:someone"}, "userId"),
        (MEMORIES, {"content": "x", "expiresAt": "2001-01-01T00:00:00Z"}, "expiresAt"),
        (MEMORIES, {"content": "x", "colour": "red"}, "colour"),
        (MEMORIES, {"content": "x", "messageIds": ["not-an-id"]}, "messageIds"),
        (MEMORIES, {"content": "x", "messageIds": [str(uuid.uuid4())]}, "messageIds"),
        (MEMORIES, {"content": "x", "messageIds": [str(uuid.uuid4())] * 101}, "messageIds"),
        (
            f"{MEMORIES}/batch",
            {
                "memories": [
                    {"content": "fine"},
                    {"content": "x", "messageIds": [str(uuid.uuid4())]},
                ]
            },
            "memories",  # (``memories[1].messageIds``)
        ),
        (f"{MEMORIES}/batch", {"memories": [{"content": "x"}] * 101}, "memories"),
        (f"{MEMORIES}/batch", {"memories": []}, "memories"),
        (
            f"{MEMORIES}/batch",
            {"memories": [{"content": "fine"}, {"content": "bad", "importance": 2}]},
            "memories",
        ),
        (f"{MEMORIES}/search", {"query": "x", "limit": 0}, "limit"),
        (f"{MEMORIES}/search", {"query": "x", "limit": 21}, "limit"),
        (f"{MEMORIES}/search", {"query": " "}, "query"),
        (f"{MEMORIES}/search", {"query": "\u200b\u200d"}, "query"),
        (f"{MEMORIES}/search", {"query": "x", "mode": "fuzzy"}, "mode"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_writes_nothing(api, helper, path, body, field):
    save(api, helper, "Already here")
    before = snapshot()
    response = api.post(path, body, as_=helper)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "validation_error"
    # The field, or an item of it (``tags[0]``, ``memories[1].importance``).
    assert any(name.split("[")[0] == field for name in response.json()["details"])
    assert snapshot() == before


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (MEMORIES, {"content": "x", "tags": [1] * 51}, "tags"),
        (MEMORIES, {"content": "x", "messageIds": ["x"] * 101}, "messageIds"),
        (f"{MEMORIES}/search", {"query": "x", "tags": [1] * 51}, "tags"),
        (
            "/v1/agent/search/messages",
            {"query": "x", "conversationIds": ["x"] * 101},
            "conversationIds",
        ),
    ],
)
def test_a_list_too_long_is_refused_for_its_length_before_its_items(api, helper, path, body, field):
    """Each item was checked first (1,500,000 tags: 11-24 s to be told 50 is the most;
    review): a list too long is said to be, whatever its items."""
    response = api.post(path, body, as_=helper)
    assert response.status_code == 400, response.content
    [said] = response.json()["details"][field]
    assert "no more than" in said, said


def test_an_agent_may_learn_about_a_user_it_has_never_served(api, helper):
    assert save(api, helper, "New user likes chess", userId="newcomer")["userId"] == "newcomer"


# --- the user's door -------------------------------------------------------------------------


def test_a_user_sees_searches_and_deletes_what_every_agent_keeps_about_them(
    api, helper, rival, alice, bob
):
    save(api, helper, "Alice prefers window seats", userId="alice")
    kept_by_rival = save(api, rival, "Alice is vegetarian", userId="alice")
    save(api, helper, "Bob prefers aisle seats", userId="bob")
    save(api, helper, "The helper's own note")

    listed = api.get(MINE, as_=alice).json()
    assert sorted(contents(listed["data"])) == ["Alice is vegetarian", "Alice prefers window seats"]
    only_rival = api.get(MINE, as_=alice, agentId=str(rival.agent.id)).json()["data"]
    assert contents(only_rival) == ["Alice is vegetarian"]
    assert api.get(MINE, as_=alice, agentId="not-an-agent").status_code == 400

    found = api.post(f"{MINE}/search", {"query": "what does she eat?"}, as_=alice).json()["data"]
    assert contents(found)[0] == "Alice is vegetarian"
    # Alice looking is not an agent using it: the count that keeps a memory alive stays.
    assert Memory.objects.get(id=kept_by_rival["id"]).access_count == 0

    # Bob cannot reach Alice's memory; Alice can delete it.
    assert api.delete(f"{MINE}/{kept_by_rival['id']}", as_=bob).status_code == 404
    assert api.delete(f"{MINE}/{kept_by_rival['id']}", as_=alice).status_code == 204
    assert api.call("DELETE", MINE, as_=alice).json() == {"deleted": 1}
    assert sorted(Memory.objects.values_list("content", flat=True)) == [
        "Bob prefers aisle seats",
        "The helper's own note",
    ]


def test_a_user_is_shown_only_the_cited_turns_they_may_see(api, helper, alice):
    ours = ConversationFactory(group__owner="alice", title="Ours")
    MembershipFactory(group=ours.group, principal_id=helper.agent.as_principal().id)
    said = MessageFactory(conversation=ours, content="I moved to Lyon")
    aside = MessageFactory(conversation=ours, content="(note)", visibility=Visibility.AGENT)
    own = api.post("/v1/agent/conversations", {"title": "Own"}, as_=helper).json()["id"]
    elsewhere = append(api, helper, own, {"role": "assistant", "content": "Lyon, noted"})
    cited = [str(said.id), str(aside.id), elsewhere.json()["data"][0]["id"]]
    memory = save(api, helper, "Alice lives in Lyon", userId="alice", messageIds=cited)
    assert memory["messageIds"] == cited  # the agent that cites them sees all three
    listed = api.get(MEMORIES, as_=helper, userId="alice").json()["data"]
    assert listed[0]["messageIds"] == cited

    # Alice is not told that the agent-only turn or the agent's own turn exist: not in her
    # list, her search or her export, and the memory itself keeps them.
    assert api.get(MINE, as_=alice).json()["data"][0]["messageIds"] == [str(said.id)]
    found = api.post(f"{MINE}/search", {"query": "where does Alice live?"}, as_=alice).json()
    assert found["data"][0]["messageIds"] == [str(said.id)]
    export = json.loads(b"".join(api.get("/v1/user/export", as_=alice).streaming_content))
    assert [m["messageIds"] for m in export["memories"]] == [[str(said.id)]]
    assert [str(i) for i in Memory.objects.get(id=memory["id"]).message_ids] == cited


def test_the_user_api_needs_a_users_token(api, helper):
    assert api.get(MINE).status_code == 401
    assert api.get(MINE, as_=helper).status_code == 401  # an agent key is the wrong credential
