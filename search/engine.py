"""Hybrid search over one corpus and one scope: the candidates of both retrievers, each
scored by both measures (``search.statements``), fused (``search.ranking``).

The query is embedded on a thread while the keyword search runs (the model releases the
GIL): the two slowest steps of a hybrid search overlap.
"""

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from django.db import connection, transaction

from search import ranking, statements
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

    def scores(self, mode: str, tuning: SearchTuning, *, neighbours: bool = False) -> dict:
        """One score per candidate for ``mode``: a measure alone, or both fused (plus a
        share of the best neighbour's, for conversation turns)."""
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
        if neighbours:
            fused = ranking.with_neighbours(fused, self.neighbours, weight=tuning.neighbour_weight)
        return fused


def find_candidates(
    corpus: Corpus, scope: Scope, query: str, *, mode: str, top_k: int, tuning: SearchTuning
) -> Candidates:
    """The candidates for ``top_k`` results (``candidates_per_result`` each, at least
    ``min_candidates``), in one transaction."""
    limit = max(tuning.min_candidates, tuning.candidates_per_result * top_k)
    backend = configured_backend()
    embedding = None
    if mode in ("hybrid", "semantic"):
        embedding = _QUERY_EMBEDDER.submit(query_vector, backend.model, query)
    with transaction.atomic(), connection.cursor() as cursor:
        terms = NO_TERMS
        keyword = {}
        if mode != "semantic":
            terms = statements.query_terms(cursor, corpus, query, tuning)
            keyword = statements.keyword_candidates(cursor, corpus, scope, terms, limit, tuning)
        if embedding is None:
            return Candidates(keyword=keyword, idf=terms.idf)
        order = statements.nearest_order(cursor, corpus, scope, limit, tuning)  # while it embeds
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
        )
        rows = statement(order)
        if order == INDEX_ORDER and sum(nearest for *_, nearest in rows) < limit:
            # The graph walk gave up (hnsw_max_scan_tuples) before it found enough rows in
            # scope, or the scope holds fewer: exact distances find all there are.
            rows = statement(EXACT_ORDER)
    found = Candidates(keyword=dict(keyword), idf=terms.idf)
    for row_id, similarity, keyword_score, before, after, _nearest in rows:
        if similarity is not None:
            found.semantic[row_id] = similarity
        if keyword_score is not None:
            found.keyword.setdefault(row_id, float(keyword_score))
        found.neighbours[row_id] = (before, after)
    return found
