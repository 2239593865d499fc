"""The tunables of search, in one object: defaults chosen on benchmarks (docs/benchmarks.md),
replaced as a whole by a test or code (``settings.SEARCH_TUNING``), never patched piece by
piece. A deployment changes some from the environment (``MEMSVC_SEARCH_TUNING``,
``MEMSVC_MEMORY_RANKING``: README, "Configuration")."""

import functools
import math
from dataclasses import dataclass, fields, replace

from django.conf import settings

SEARCH_MODES = ("hybrid", "semantic", "keyword")


def _check_numbers(tunables, *, positive: tuple[str, ...] = ()) -> None:
    """Every number of ``tunables`` finite and >= 0, those named in ``positive`` >= 1: a
    ValueError naming the first that is not."""
    for item in fields(tunables):
        value = getattr(tunables, item.name)
        if isinstance(value, str):
            continue
        least = 1 if item.name in positive else 0
        if not math.isfinite(value) or value < least:
            raise ValueError(f"{item.name} must be a number >= {least}, got {value}")


@dataclass(frozen=True)
class SearchTuning:
    # The fusion weights of the two measures, and the share of a candidate's best direct
    # neighbour's score it gets (a conversation's turn next to a good match is often the
    # answer). Tuned as a whole on the LoCoMo development split, never per question.
    semantic_weight: float = 0.5
    keyword_weight: float = 0.5
    neighbour_weight: float = 0.2
    # Context expansion: a candidate's neighbour that no retriever found joins the results
    # with this share of the candidate's score. 0.5 found a little more on LoCoMo (chosen
    # leaving one conversation out, docs/benchmarks.md), but a turn reached that way must
    # be checked against the scope, a statement more in some searches: off (0) by default.
    expansion_weight: float = 0.0
    # A query that asks several things (sentences, clauses: ``search.queries.parts``) is
    # also searched part by part, up to ``query_parts`` parts; a row keeps its best score,
    # a part's weighted by ``part_weight``. Off (0) by default: it did not move LoCoMo
    # (5 of its questions have parts), and each part costs a search of its own.
    query_parts: int = 0
    part_weight: float = 1.0
    # Temporal grounding: a row written in a span of time the query names ("in May", "last
    # week": ``search.queries.periods``, relative to the moment of the search), or up to
    # ``date_slack_days`` after it, gets this much more (0: off). Chosen leaving one LoCoMo
    # conversation out (docs/benchmarks.md).
    date_weight: float = 0.1
    date_slack_days: int = 0
    # Author grounding: a row whose author the query names ("What did Melanie paint?": a
    # turn Melanie wrote) gets this much more (0: off). Chosen leaving one LoCoMo
    # conversation out (docs/benchmarks.md).
    author_weight: float = 0.2
    # Memories beside messages: a hybrid search of messages also searches the memories its
    # principal may read (``search.selectors.register_citing``); the turns in scope cited by
    # the ``cited_memories`` most relevant of them get ``citation_weight`` x (1 - rank /
    # cited_memories) more, from the best memory citing each: the first memory's turns
    # about a whole score, enough to lead. A memory less relevant than
    # ``citation_min_relevance`` (cosine or keyword coverage) cites nothing, so a memory that
    # merely exists does not push its turns up. 0 weight: off. Chosen leaving one LoCoMo
    # conversation out, with its observations as memories (docs/benchmarks.md).
    citation_weight: float = 1.0
    cited_memories: int = 3
    citation_min_relevance: float = 0.5
    # How the memories are searched: "semantic" saves the keyword statements (about 5 ms of
    # the 14 citations cost here, with 943 memories) for 0.009 of LoCoMo hit@5.
    citation_mode: str = "hybrid"
    # Keyword feedback (pseudo-relevance feedback, RM3-like): the ``feedback_words`` words
    # of the ``feedback_rows`` best rows in scope and the ``feedback_memories`` most relevant
    # citing memories that the query lacks (ranked by those rows' scores x the words' BM25
    # weight) join the query's keyword terms at ``feedback_weight`` x their weight, and the
    # candidates are scored again: turns that say the answer in other words than the
    # question move up. Only for a corpus with kept word statistics (messages), in hybrid
    # mode. Off (0) by default: +0.02 LoCoMo recall@10 held out for about 5 ms more per
    # search (docs/benchmarks.md, "Keyword feedback").
    feedback_words: int = 0
    feedback_rows: int = 5
    feedback_memories: int = 3
    feedback_weight: float = 0.3
    # A query naming someone ("What did Melanie paint?"): the vector of its words besides the
    # names (``search.queries.without_names``) is added at this share to the query's, the sum
    # normalised, for every corpus searched. A small model's vector of a short question
    # leans on the name, which every row about that person says (the memories about them,
    # the other speaker's "Hey Melanie!"), so the rows about what it asks come after them.
    # Costs a second query embedding for a query that names someone. Off (0) by default:
    # LoCoMo MRR +0.02 with keyword feedback on, hit@5 and recall@10 within noise
    # (docs/benchmarks.md, "Names in the query's vector").
    unnamed_vector_share: float = 0.0
    # Each retriever proposes this many candidates per requested result (at least min).
    candidates_per_result: int = 5
    min_candidates: int = 30
    # Keyword candidates are the rows holding the query's rarest words, taken rarest first
    # while together they occur in at most this many rows (the rarest one always counts);
    # commoner words still add to the score of the rows found. BM25 ranks those matches at
    # a cost proportional to their number.
    keyword_match_cap: int = 500
    # A query's first this many distinct words (stop words out) are its keyword terms: each
    # is counted among the caller's rows, and a query of 2,000 characters of distinct words
    # (500 of them) held the database 3 s (review). No LoCoMo question has half as many.
    query_words: int = 32
    # A word's weight (its BM25 IDF) comes from the rows the searcher may read
    # (``search.statements.view_frequencies``): the ``view_words_kept`` commonest words of
    # the first ``scope_sample_rows`` rows of the caller's view, a larger view's rows counted
    # up to ``scope_rows_cap``, and any other word counted in the view. Each word counts as
    # held by at least ``document_count_floor`` rows: a word in fewer weighs as one in none
    # (docs/benchmarks.md, "Word counts from the searcher's own rows").
    document_count_floor: int = 5
    scope_sample_rows: int = 5000
    scope_rows_cap: int = 100_000
    view_words_kept: int = 1000
    # A view of fewer rows, counted whole, has its keyword candidates read row by row, each
    # row's words tested, not from the words index: the index's entry for a word lists the
    # rows of everyone holding it, and reading it took as long as they are many (a
    # stranger's 100,000 rows holding a word made a search of it 3.3 -> 46 ms). A visitor
    # of 1,000 rows: 1.5 ms a search against 5.1 (docs/benchmarks.md).
    keyword_scan_below: int = 3000
    hnsw_ef_search: int = 100
    # Exact distances or the HNSW graph. The exact scan costs in proportion to the scope;
    # the graph returns about candidates x corpus / scope rows before enough of them are in
    # scope, each costing ``hnsw_cost_per_exact`` exact distances (measured, see
    # docs/benchmarks.md). So the exact scan wins below sqrt(cost x candidates x corpus)
    # rows in scope; never below ``exact_search_below``.
    hnsw_cost_per_exact: float = 10
    exact_search_below: int = 3000
    # A principal's whole scope is only counted when it sees at most this many
    # conversations, so one who sees many pays nothing for the check and walks the graph. A
    # scope narrowed to some conversations (or to messages before one) is always counted.
    few_conversations: int = 200
    # The graph walk gives up after this many rows (pgvector's default); a walk starved by
    # the access filter is redone with exact distances.
    hnsw_max_scan_tuples: int = 20_000

    def __post_init__(self):
        _check_numbers(
            self,
            positive=(
                "min_candidates",
                "hnsw_ef_search",
                "hnsw_max_scan_tuples",
                "scope_sample_rows",
                "scope_rows_cap",
                "view_words_kept",
                "query_words",
            ),
        )
        if self.scope_rows_cap < self.scope_sample_rows:
            raise ValueError("scope_rows_cap must be >= scope_sample_rows")
        if self.hnsw_ef_search > 1000:  # pgvector's most
            raise ValueError(f"hnsw_ef_search must be <= 1000, got {self.hnsw_ef_search}")
        if self.citation_mode not in SEARCH_MODES:
            raise ValueError(
                f"citation_mode must be one of {', '.join(SEARCH_MODES)}, got {self.citation_mode!r}"
            )

    def candidates_for(self, top_k: int) -> int:
        """How many candidates each retriever proposes for ``top_k`` results."""
        return max(self.min_candidates, self.candidates_per_result * top_k)


@dataclass(frozen=True)
class MemoryRanking:
    """How a memory's rank mixes its relevance to the query (the hybrid engine's fused
    score), its importance (0..1) and its recency (``exp(-age_days / recency_days)``)."""

    relevance: float = 0.7
    importance: float = 0.15
    recency: float = 0.15
    recency_days: float = 30.0

    def __post_init__(self):
        _check_numbers(self)
        if self.recency_days <= 0:
            raise ValueError(f"recency_days must be > 0, got {self.recency_days}")


# OpenMemory's ranking: importance x 0.6 + recency x 0.4, relevance only as a filter.
OPENMEMORY_RANKING = MemoryRanking(relevance=0.0, importance=0.6, recency=0.4)

DEFAULT_TUNING = SearchTuning()
DEFAULT_MEMORY_RANKING = MemoryRanking()
# ``MEMSVC_SEARCH_FEEDBACK``: the default with keyword feedback, as chosen leaving one
# LoCoMo conversation out (docs/benchmarks.md, "Keyword feedback").
FEEDBACK_TUNING = replace(DEFAULT_TUNING, feedback_words=20)


@functools.lru_cache(maxsize=8)
def _changed(base, changes: tuple):
    return replace(base, **dict(changes))


def configured_tuning() -> SearchTuning:
    """``settings.SEARCH_TUNING`` if set, else the default (with ``MEMSVC_SEARCH_FEEDBACK``,
    ``FEEDBACK_TUNING``) with the changes ``MEMSVC_SEARCH_TUNING`` names."""
    tuning = getattr(settings, "SEARCH_TUNING", None)
    if tuning is not None:
        return tuning
    chosen = FEEDBACK_TUNING if settings.MEMSVC_SEARCH_FEEDBACK else DEFAULT_TUNING
    return _changed(chosen, tuple(sorted(settings.MEMSVC_SEARCH_TUNING.items())))


def configured_memory_ranking() -> MemoryRanking:
    """``settings.MEMORY_RANKING`` if set, else the default with the changes
    ``MEMSVC_MEMORY_RANKING`` names."""
    ranking = getattr(settings, "MEMORY_RANKING", None)
    if ranking is not None:
        return ranking
    return _changed(DEFAULT_MEMORY_RANKING, tuple(sorted(settings.MEMSVC_MEMORY_RANKING.items())))
