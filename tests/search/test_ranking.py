"""The arithmetic of ranking, without a database."""

import math

import pytest

from search import ranking
from search.tuning import OPENMEMORY_RANKING, MemoryRanking


def test_a_rarer_word_weighs_more_and_a_word_in_every_row_almost_nothing():
    idf = ranking.bm25_idf({"caroline": 2, "the": 1000, "painting": 40}, 1000, floor=0)
    assert idf["caroline"] > idf["painting"] > idf["the"] > 0
    assert idf["the"] == pytest.approx(math.log(1 + 0.5 / 1000.5))


def test_frequencies_past_the_corpus_size_count_as_the_corpus_size():
    assert ranking.bm25_idf({"word": 50}, 10, floor=0) == ranking.bm25_idf(
        {"word": 10}, 10, floor=0
    )


def test_a_word_in_fewer_rows_than_the_floor_weighs_as_one_in_none():
    """The counts are the whole service's: below the floor they tell nothing of others' rows."""
    idf = ranking.bm25_idf({"none": 0, "one": 1, "floor": 5, "more": 6}, 1000, floor=5)
    assert idf["none"] == idf["one"] == idf["floor"] > idf["more"]


def test_candidates_are_matched_on_the_rarest_words_within_the_cap():
    frequencies = {"a": 400, "b": 90, "c": 20, "d": 300}
    assert ranking.rarest_within(frequencies, 500) == ["c", "b", "d"]
    # The rarest word counts even when it alone is over the cap.
    assert ranking.rarest_within({"common": 10_000}, 500) == ["common"]


def test_fusion_normalises_each_measure_over_the_candidates():
    semantic = {"x": 0.9, "y": 0.5}
    keyword = {"y": 12.0, "z": 4.0}
    fused = ranking.fuse(semantic, keyword, semantic_weight=0.5, keyword_weight=0.5)
    # x: best by meaning, no keyword; y: worst by meaning, best by keyword; z: keyword only.
    assert fused == {"x": 0.5, "y": 0.5, "z": 0.0}
    # One without a vector yet is judged by its keywords alone, not as unrelated in meaning.
    vectorless = ranking.fuse(
        {"x": 0.9},
        {"new": 3.0, "z": 1.0},
        semantic_weight=0.5,
        keyword_weight=0.5,
        vectorless={"new"},
    )
    assert vectorless == {"x": 0.5, "new": 1.0, "z": 0.0}


def test_a_candidate_gets_a_share_of_its_best_neighbours_score():
    scores = {"a": 1.0, "b": 0.2, "c": 0.6}
    neighbours = {"b": ("a", "c"), "a": (None, "b")}
    boosted = ranking.with_neighbours(scores, neighbours, weight=0.2)
    assert boosted == pytest.approx({"a": 1.04, "b": 0.4, "c": 0.6})


def test_top_breaks_ties_by_id():
    assert ranking.top({"b": 1.0, "a": 1.0, "c": 2.0}, 2) == [("c", 2.0), ("a", 1.0)]


def test_keyword_coverage_is_the_share_of_the_query_words_weight():
    idf = {"alice": 3.0, "dog": 1.0}
    assert ranking.keyword_coverage(3.0, idf) == 0.75
    assert ranking.keyword_coverage(4.0, idf) == 1.0
    assert ranking.keyword_coverage(1.0, {}) == 0.0


def test_memory_rank_mixes_relevance_importance_and_recency():
    ranking_ = MemoryRanking(relevance=0.5, importance=0.3, recency=0.2, recency_days=30)
    fresh = ranking.memory_rank(1.0, 1.0, 0, ranking_)
    month_old = ranking.memory_rank(1.0, 1.0, 30, ranking_)
    assert fresh == pytest.approx(1.0)
    assert month_old == pytest.approx(0.8 + 0.2 / math.e)
    # OpenMemory's preset ignores relevance: importance 0.6, recency 0.4.
    assert ranking.memory_rank(0.0, 1.0, 0, OPENMEMORY_RANKING) == pytest.approx(1.0)
