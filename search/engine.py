"""Hybrid search over one corpus and one scope: the candidates of both retrievers, each
scored by both measures (``search.statements``), fused (``search.ranking``); optionally
with what the query says besides its words (``search.queries``: its parts, the time it
names), the turns around the candidates (``SearchTuning``) and the rows that the most
relevant rows of another corpus cite (``Citing``: memories citing turns).

The query is embedded on a thread while the keyword search runs (the model releases the
GIL): the two slowest steps of a hybrid search overlap.
"""

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from search import queries, ranking, statements
from search.embeddings import configured_backend, vector_literal
from search.statements import EXACT_ORDER, INDEX_ORDER, NO_TERMS, Corpus, Scope
from search.tuning import SearchTuning

MODES = ("hybrid", "semantic", "keyword")

_QUERY_EMBEDDER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="query-embedding")
# Queries embedded lately, per model: one request often searches one text twice (the local
# API's context searches memories and messages; learning() sends it before every call).
QUERY_VECTORS_KEPT = 256


@functools.lru_cache(maxsize=QUERY_VECTORS_KEPT)
def query_vector(model: str, query: str) -> str:
    """``query``'s vector as a pgvector literal (``model``: the cache key's other half)."""
    return vector_literal(configured_backend().embed([query])[0])


@dataclass
class Candidates:
    """What both retrievers found: each candidate's cosine similarity to the query (when it
    has a vector), its BM25 score (when it holds a query word), its neighbours, and the
    query words' weights."""

    semantic: dict = field(default_factory=dict)
    keyword: dict = field(default_factory=dict)
    neighbours: dict = field(default_factory=dict)
    idf: dict = field(default_factory=dict)
    created: dict = field(default_factory=dict)  # when each candidate was written
    authors: dict = field(default_factory=dict)  # who wrote it (``Corpus.author``)

    def relevance(self, row_id, mode: str = "hybrid") -> float:
        """How well a candidate answers the query, comparable across queries (0..1): its
        cosine similarity or the share of the query's words (by weight) it holds, whichever
        is higher (of the measures ``mode`` uses)."""
        return max(
            self.semantic.get(row_id, 0.0) if mode != "keyword" else 0.0,
            ranking.keyword_coverage(self.keyword.get(row_id, 0.0), self.idf)
            if mode != "semantic"
            else 0.0,
        )

    def scores(
        self,
        mode: str,
        tuning: SearchTuning,
        *,
        neighbours: bool = False,
        periods: list[queries.Period] = (),
        words: frozenset[str] = frozenset(),
    ) -> dict:
        """One score per candidate for ``mode``: a measure alone, or both fused (plus a
        share of the best neighbour's, for conversation turns, ``date_weight`` for those
        written in one of ``periods`` and ``author_weight`` for those whose author the
        query's ``words`` name)."""
        if mode == "semantic":
            return dict(self.semantic)
        if mode == "keyword":
            return dict(self.keyword)
        fused = ranking.fuse(
            self.semantic,
            self.keyword,
            semantic_weight=tuning.semantic_weight,
            keyword_weight=tuning.keyword_weight,
        )
        if periods and tuning.date_weight:
            slack = timedelta(days=tuning.date_slack_days)
            dated = {i for i in fused if queries.within(self.created.get(i), periods, slack=slack)}
            fused = ranking.with_bonus(fused, dated, weight=tuning.date_weight)
        if words and tuning.author_weight:
            named = {i for i in fused if queries.names(self.authors.get(i), words)}
            fused = ranking.with_bonus(fused, named, weight=tuning.author_weight)
        if neighbours:
            fused = ranking.with_neighbours(
                fused,
                self.neighbours,
                weight=tuning.neighbour_weight,
                expansion=tuning.expansion_weight,
            )
        return fused


@dataclass(frozen=True)
class Citing:
    """Rows of another corpus that cite rows of the one searched (``Corpus.cites``: memories
    citing turns), as far as the searching principal may read them."""

    corpus: Corpus
    scope: Scope


def ranked(
    corpus: Corpus,
    scope: Scope,
    query: str,
    *,
    mode: str,
    top_k: int,
    tuning: SearchTuning,
    now: datetime | None = None,
    citing: Citing | None = None,
) -> list[tuple]:
    """The ``top_k`` best (id, score) of ``query`` in ``scope``: ``find_candidates`` scored
    for ``mode``; with ``SearchTuning.query_parts``, each part of a query that asks several
    things searched too (a row keeps its best score); in hybrid mode, a share for the rows
    the most relevant ``citing`` rows cite (``cited_rows``); rows reached only as a
    candidate's neighbour kept if the scope holds them."""
    texts = [query]
    if tuning.query_parts:
        split = queries.parts(query)
        if len(split) > 1:
            texts += split[: tuning.query_parts]
    periods, words = [], frozenset()
    if tuning.date_weight and mode == "hybrid":
        periods = queries.periods(query, now or timezone.now())
    if tuning.author_weight and mode == "hybrid" and corpus.author:
        words = queries.words(query)
    rankings, found_ids = [], set()
    for text in texts:
        found = find_candidates(corpus, scope, text, mode=mode, top_k=top_k, tuning=tuning)
        rankings.append(
            found.scores(mode, tuning, neighbours=corpus.neighbours, periods=periods, words=words)
        )
        found_ids |= found.semantic.keys() | found.keyword.keys()
    weights = [1.0] + [tuning.part_weight] * (len(texts) - 1)
    scores = ranking.best_of(rankings, weights) if len(texts) > 1 else rankings[0]
    checked = set(found_ids)
    if citing is not None and mode == "hybrid" and tuning.citation_weight:
        shares = cited_rows(citing, corpus, scope, query, tuning)
        scores = ranking.with_shares(scores, shares)
        checked |= shares.keys()
    while True:
        best = ranking.top(scores, top_k)
        reached = [i for i, _ in best if i not in checked]
        if not reached:
            return best
        with connection.cursor() as cursor:
            kept = statements.in_scope(cursor, corpus, scope, reached)
        checked |= kept
        scores = {i: s for i, s in scores.items() if i in kept or i not in reached}


def cited_rows(
    citing: Citing, corpus: Corpus, scope: Scope, query: str, tuning: SearchTuning
) -> dict:
    """The rows of ``scope`` the most relevant ``citing`` rows cite, each with its share
    (``ranking.cited_shares``). A citing row counts if it is at least
    ``citation_min_relevance`` relevant and cites some row of the scope."""
    mode = tuning.citation_mode
    found = find_candidates(
        citing.corpus,
        citing.scope,
        query,
        mode=mode,
        top_k=tuning.cited_memories,
        tuning=tuning,
    )
    fused = found.scores(mode, tuning)
    best = sorted(
        (i for i in fused if found.relevance(i, mode) >= tuning.citation_min_relevance),
        key=lambda i: (-fused[i], str(i)),
    )
    if not best:
        return {}
    with connection.cursor() as cursor:
        cited = statements.cited_in_scope(cursor, citing.corpus, best, corpus, scope)
    return ranking.cited_shares(
        [cited[i] for i in best if i in cited],
        weight=tuning.citation_weight,
        places=tuning.cited_memories,
    )


def find_candidates(
    corpus: Corpus,
    scope: Scope,
    query: str,
    *,
    mode: str,
    top_k: int,
    tuning: SearchTuning,
    probed: dict | None = None,
) -> Candidates:
    """The candidates for ``top_k`` results (``candidates_per_result`` each, at least
    ``min_candidates``). ``probed``: what an earlier query of the same search learned about
    the scope (whether it holds a row, how to find its nearest vectors), kept there and not
    asked again (a prefetch searches each sentence of a text in one scope)."""
    limit = max(tuning.min_candidates, tuning.candidates_per_result * top_k)
    probed = {} if probed is None else probed
    if not scope.visible_sql:
        # One agent's or user's rows (memories, tool records): often none at all, and an
        # index probe costs less than a search that finds nothing.
        if "holds_any" not in probed:
            with connection.cursor() as cursor:
                probed["holds_any"] = statements.holds_any(cursor, corpus, scope)
        if not probed["holds_any"]:
            return Candidates()
    backend = configured_backend()
    embedding = None
    if mode in ("hybrid", "semantic"):
        embedding = _QUERY_EMBEDDER.submit(query_vector, backend.model, query)
    # No transaction: each statement is a message of its own, with its planner settings
    # (``statements.execute_planned``), one round trip each.
    with connection.cursor() as cursor:
        few = bool(scope.few_sql) and statements.sees_few(cursor, scope, tuning)
        terms = NO_TERMS
        keyword = {}
        if mode != "semantic":
            terms = statements.query_terms(cursor, corpus, query, tuning)
            keyword = statements.keyword_candidates(
                cursor, corpus, scope, terms, limit, tuning, few=few
            )
        if embedding is None:
            return Candidates(keyword=keyword, idf=terms.idf)
        # While it embeds: how to find the nearest vectors. A principal's messages, when
        # the principal sees few conversations or the search is narrowed to some: exact
        # distances, capped (``nearest_with_fills``); when the principal sees many: the
        # graph. One agent's or user's rows (memories, tool records): the scope counted.
        capped = bool(scope.visible_sql) and (few or scope.narrowed)
        if capped:
            order = EXACT_ORDER
        elif scope.visible_sql:
            order = INDEX_ORDER
        else:
            if "order" not in probed:
                probed["order"] = statements.nearest_order(cursor, corpus, scope, limit, tuning)
            order = probed["order"]
        vector = embedding.result()
        # Semantic mode is the same statement with no keyword terms or candidates.
        statement = functools.partial(
            statements.nearest_with_fills,
            cursor,
            corpus,
            scope,
            vector,
            backend.model,
            limit,
            terms,
            list(keyword),
            tuning=tuning,
        )
        rows = statement(order, capped=capped, few=few)
        if capped and any(row[7] for row in rows):
            # More rows in scope than exact distances are worth: the graph.
            order = INDEX_ORDER
            rows = statement(order)
        if order == INDEX_ORDER and sum(row[5] for row in rows) < limit:
            # The graph walk gave up (hnsw_max_scan_tuples) before it found enough rows in
            # scope, or the scope holds fewer: exact distances find all there are.
            rows = statement(EXACT_ORDER)
    found = Candidates(keyword=dict(keyword), idf=terms.idf)
    for row_id, similarity, keyword_score, before, after, _nearest, created, _over, author in rows:
        if similarity is not None:
            found.semantic[row_id] = similarity
        if keyword_score is not None:
            found.keyword.setdefault(row_id, float(keyword_score))
        found.neighbours[row_id] = (before, after)
        found.created[row_id] = created
        found.authors[row_id] = author
    return found
