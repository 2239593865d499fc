"""Hybrid search over one corpus and one scope: the candidates of both retrievers, each
scored by both measures (``search.statements``), fused (``search.ranking``); optionally
with what the query says besides its words (``search.queries``: its parts, the time it
names), the turns around the candidates (``SearchTuning``) and the rows that the most
relevant rows of another corpus cite (``Citing``: memories citing turns).

The query is embedded on a thread while the keyword search runs (the model releases the
GIL): the two slowest steps of a hybrid search overlap.
"""

import functools
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from memsvc.api.errors import Unavailable
from search import queries, ranking, statements
from search.embeddings import (
    EmbeddingError,
    configured_backend,
    embedded_within,
    is_remote,
    vector_literal,
)
from search.statements import EXACT_ORDER, INDEX_ORDER, NO_TERMS, Corpus, Scope, Terms
from search.tuning import SEARCH_MODES, SearchTuning

logger = logging.getLogger(__name__)

MODES = SEARCH_MODES

_QUERY_EMBEDDER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="query-embedding")
# Queries embedded lately, per model: one request often searches one text twice (the local
# API's context searches memories and messages; learning() sends it before every call).
QUERY_VECTORS_KEPT = 256
# A query that is little more than names ("Melanie?") keeps its own vector.
MIN_UNNAMED_WORDS = 2
# How long a search waits for its query's vector from a remote embedding service (the local
# model is on this machine, and its first load may take longer): one that hung kept every
# search, and the database connection it held, waiting for the client's whole 60 s (review).
REMOTE_QUERY_SECONDS = 5.0


@functools.lru_cache(maxsize=QUERY_VECTORS_KEPT)
def query_vector(model: str, query: str, unnamed_share: float = 0.0) -> str:
    """``query``'s vector as a pgvector literal (``model``: the cache key's other half).
    With ``unnamed_share`` (``SearchTuning.unnamed_vector_share``), a query that names
    someone gets that share of the vector of its other words added
    (``ranking.mixed_vector``): two texts to embed, one batch."""
    unnamed = queries.without_names(query) if unnamed_share else query
    # (A remote service's answer waited for no longer than a search waits for it: its thread
    # is free again for the next query.)
    backend = configured_backend()
    if unnamed == query or len(unnamed.split()) < MIN_UNNAMED_WORDS:
        return vector_literal(embedded_within(backend, [query], REMOTE_QUERY_SECONDS)[0])
    vector, other = embedded_within(backend, [query, unnamed], REMOTE_QUERY_SECONDS)
    return vector_literal(ranking.mixed_vector(vector, other, unnamed_share))


# The embeddings on their way, so that a request that starts one ahead (``search.selectors.
# embed_query_ahead``) and
# the search that then needs it share it; once done, ``query_vector`` keeps the vector.
_ON_THEIR_WAY: dict[tuple, Future] = {}
_ON_THEIR_WAY_LOCK = threading.RLock()  # (a future done already calls back at once)


def query_embedding(model: str, query: str, unnamed_share: float = 0.0) -> Future:
    """``query_vector`` computed on the embedding thread (the model releases the GIL while
    the caller's statements run); the same one if it is already on its way."""
    key = (model, query, unnamed_share)
    with _ON_THEIR_WAY_LOCK:
        future = _ON_THEIR_WAY.get(key)
        if future is None:
            future = _QUERY_EMBEDDER.submit(query_vector, *key)
            # (What a search waits for it, at most, from a remote service: ``_embedded``.)
            future.deadline = time.monotonic() + REMOTE_QUERY_SECONDS
            _ON_THEIR_WAY[key] = future
            future.add_done_callback(lambda done: _arrived(key, done))
    return future


def _arrived(key: tuple, future: Future) -> None:
    with _ON_THEIR_WAY_LOCK:
        if _ON_THEIR_WAY.get(key) is future:
            del _ON_THEIR_WAY[key]


@dataclass
class Candidates:
    """What both retrievers found: each candidate's cosine similarity to the query (when it
    has a vector), its BM25 score (when it holds a query word), its neighbours, and the
    query's words with their weights."""

    semantic: dict = field(default_factory=dict)
    keyword: dict = field(default_factory=dict)
    neighbours: dict = field(default_factory=dict)
    created: dict = field(default_factory=dict)  # when each candidate was written
    authors: dict = field(default_factory=dict)  # who wrote it (``Corpus.author``)
    importance: dict = field(default_factory=dict)  # ``Corpus.importance``
    vectorless: set = field(default_factory=set)  # candidates not embedded yet
    terms: Terms = NO_TERMS  # the query's words, as the keyword retriever took them

    @property
    def idf(self) -> dict:
        return self.terms.idf

    def add(self, rows: list[tuple]) -> "Candidates":
        """The rows of ``statements.nearest_with_fills`` (or ``described``) taken in: a
        keyword score already known (the keyword candidates') stays."""
        for row in rows:
            row_id, similarity, keyword_score, before, after, _near, created, _over = row[:8]
            author, importance = row[8:]
            if similarity is not None:
                self.semantic[row_id] = similarity
            else:
                self.vectorless.add(row_id)
            if keyword_score is not None:
                self.keyword.setdefault(row_id, float(keyword_score))
            self.neighbours[row_id] = (before, after)
            self.created[row_id] = created
            self.authors[row_id] = author
            self.importance[row_id] = importance
        return self

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

    def ids(self, mode: str) -> set:
        """The candidates ``mode`` scores (``scores``' keys, without scoring them)."""
        if mode == "semantic":
            return set(self.semantic)
        if mode == "keyword":
            return set(self.keyword)
        return self.semantic.keys() | self.keyword.keys()

    def measured(self, row_id, mode: str, tuning: SearchTuning) -> float:
        """A candidate's relevance as its measures stand: the cosine similarity and the
        share of the query's words it holds, weighted as hybrid search weighs them (one
        alone in its own mode). Unlike ``scores`` it is not stretched over the candidates:
        it means the same whatever else was found, and leaves room for what is fused with
        it (a memory's importance and recency: stretched, the last candidate's relevance
        was 0 however close, and a memory with the least importance outranked one with the
        most; review)."""
        cosine = self.semantic.get(row_id, 0.0)
        share = ranking.keyword_coverage(self.keyword.get(row_id, 0.0), self.idf)
        if mode == "semantic":
            return cosine
        if mode == "keyword":
            return share
        return tuning.semantic_weight * cosine + tuning.keyword_weight * share

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
            vectorless=self.vectorless,
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


def without_excluded(scope: Scope, query: str) -> tuple[Scope, str]:
    """The scope without the rows the query excludes ("cake -chocolate": those holding
    "chocolate", ``queries.exclusions``), and the query without those words: what the
    search then looks for, by vector and by keyword."""
    query, excluded = queries.exclusions(query)
    return (scope.without(excluded) if excluded else scope), query


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
    exclusions: bool = False,
    min_relevance: float = 0.0,
) -> list[tuple]:
    """The ``top_k`` best (id, score) of ``query`` in ``scope``: ``find_candidates`` scored
    for ``mode``; with ``SearchTuning.query_parts``, each part of a query that asks several
    things searched too (a row keeps its best score); in hybrid mode, a share for the rows
    the most relevant ``citing`` rows cite (``cited_rows``), and with
    ``SearchTuning.feedback_words`` the whole query's candidates scored again with the best
    rows' words (``with_feedback``); rows reached only as a candidate's neighbour kept if
    the scope holds them. With ``exclusions`` (a search someone asked for, not the chat
    text a context is found with, where "-Tom" signs a message: review), rows holding a
    word the query excludes are not found (``without_excluded``). ``min_relevance``: only
    rows at least that relevant themselves (``Candidates.relevance``, by any text searched:
    a row reached only through a neighbour or a citation has none)."""
    if exclusions:
        scope, query = without_excluded(scope, query)
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

    def scored(found: Candidates) -> dict:
        return found.scores(
            mode, tuning, neighbours=corpus.neighbours, periods=periods, words=words
        )

    probed: dict = {}  # (one scope for every text)
    found = [
        find_candidates(corpus, scope, text, mode=mode, top_k=top_k, tuning=tuning, probed=probed)
        for text in texts
    ]
    weights = [1.0] + [tuning.part_weight] * (len(texts) - 1)

    def fused() -> dict:
        rankings = [scored(f) for f in found]
        return ranking.best_of(rankings, weights) if len(texts) > 1 else rankings[0]

    scores = fused()
    checked = {i for f in found for i in f.semantic.keys() | f.keyword.keys()}
    shares, citing_best = {}, []
    if citing is not None and mode == "hybrid" and tuning.citation_weight:
        shares, citing_best = cited_rows(citing, corpus, scope, query, tuning)
        scores = ranking.with_shares(scores, shares)
        checked |= shares.keys()
    if tuning.feedback_words and mode == "hybrid" and corpus.feedback and found[0].idf:
        best = [(i, s) for i, s in ranking.top(scores, len(scores)) if i in checked]
        found[0] = with_feedback(
            corpus,
            scope,
            query,
            found[0],
            best[: tuning.feedback_rows],
            citing.corpus if citing else None,
            citing_best[: tuning.feedback_memories],
            top_k=top_k,
            tuning=tuning,
            probed=probed,
        )
        checked |= found[0].semantic.keys() | found[0].keyword.keys()
        scores = ranking.with_shares(fused(), shares)
    # Ties (min-max fusion makes them: the best by one measure and the worst by the other
    # score alike) go to the more relevant as measured: a turn holding the identifier asked
    # for, not the one holding a neighbour of it whose vector is nearer (review).
    if min_relevance:
        scores = {
            i: score
            for i, score in scores.items()
            if max(f.relevance(i, mode) for f in found) >= min_relevance
        }
    measured = {i: found[0].measured(i, mode, tuning) for i in scores}
    while True:
        best = ranking.top(scores, top_k, then=measured)
        reached = [i for i, _ in best if i not in checked]
        if not reached:
            return best
        with connection.cursor() as cursor:
            kept = statements.in_scope(cursor, corpus, scope, reached)
        checked |= kept
        scores = {i: s for i, s in scores.items() if i in kept or i not in reached}


def with_feedback(
    corpus: Corpus,
    scope: Scope,
    query: str,
    found: Candidates,
    best: list[tuple],
    citing: Corpus | None,
    citing_best: list,
    *,
    top_k: int,
    tuning: SearchTuning,
    probed: dict,
) -> Candidates:
    """``found`` (``query``'s candidates) again, with keyword feedback: the words of the
    ``best`` rows (id, score; in scope) and of the ``citing_best`` rows (the most relevant
    memories, each counted as the best row) that describe them best
    (``ranking.feedback_words``) join the query's terms at ``feedback_weight`` x their
    BM25 weight; the rows holding them join the candidates, and every candidate is scored
    again with the longer query (a turn that says the answer in other words moves up).

    The candidates' scores grow by the new words they hold (their words read with the best
    rows'); only the rows the new words find besides them are read for their similarity,
    neighbours, date and author."""
    if not best:
        return found
    top_score = best[0][1] or 1.0
    limit = tuning.candidates_for(top_k)
    candidates = found.keyword.keys() | found.semantic.keys()
    few = probed.get("few", False)
    with connection.cursor() as cursor:
        words = statements.row_words(
            cursor, corpus, list(candidates | {i for i, _ in best}), citing, citing_best
        )
        weights = {i: score / top_score for i, score in best} | dict.fromkeys(citing_best, 1.0)
        offered = {w for i in weights for w in words.get(i, ())} - found.idf.keys()
        view, frequencies = statements.view_frequencies(
            cursor, corpus, scope, sorted(offered), tuning, few=few
        )
        idf = ranking.bm25_idf(frequencies, view.documents, floor=tuning.document_count_floor)
        chosen = ranking.feedback_words(
            ((weight, words.get(i, ())) for i, weight in weights.items()),
            idf,
            known=found.idf.keys(),
            count=tuning.feedback_words,
        )
        if not chosen:
            return found
        added = {w: tuning.feedback_weight * idf[w] for w in chosen}
        terms = Terms(
            found.idf | added,
            found.terms.match_on
            + ranking.rarest_within({w: frequencies[w] for w in chosen}, tuning.keyword_match_cap),
            found.terms.view_rows,
        )
        keyword = statements.keyword_candidates(
            cursor, corpus, scope, terms, limit, tuning, few=few
        )
        new = [i for i in keyword if i not in candidates]
        rows = []
        if new:
            backend = configured_backend()
            # (Embedded for ``found``, or given up: asked again without a deadline, it kept a
            # search 60 s on a service that hung: code review.)
            embedding = query_embedding(backend.model, query, tuning.unnamed_vector_share)
            vector = _embedded(embedding, "hybrid")  # (None: their words alone)
            rows = statements.described(cursor, corpus, scope, new, vector, backend.model, terms)
    again = Candidates(
        semantic=dict(found.semantic),
        keyword={
            i: found.keyword.get(i, 0.0) + ranking.keyword_score(words.get(i, ()), added)
            for i in candidates
        }
        | keyword,
        neighbours=dict(found.neighbours),
        created=dict(found.created),
        authors=dict(found.authors),
        importance=dict(found.importance),
        vectorless=set(found.vectorless),  # (lost, the fix was undone by feedback: code review)
        terms=terms,
    )
    return again.add(rows)


def cited_rows(
    citing: Citing, corpus: Corpus, scope: Scope, query: str, tuning: SearchTuning
) -> tuple[dict, list]:
    """The rows of ``scope`` the most relevant ``citing`` rows cite, each with its share
    (``ranking.cited_shares``), and those citing rows (ids, most relevant first). A citing
    row counts if it is at least ``citation_min_relevance`` relevant and cites some row of
    the scope."""
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
        return {}, []
    with connection.cursor() as cursor:
        cited = statements.cited_in_scope(cursor, citing.corpus, best, corpus, scope)
    citing_best = [i for i in best if i in cited]
    shares = ranking.cited_shares(
        [cited[i] for i in citing_best],
        weight=tuning.citation_weight,
        places=tuning.cited_memories,
    )
    return shares, citing_best


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
    limit = tuning.candidates_for(top_k)
    probed = {} if probed is None else probed
    if not scope.visible_sql:
        # One agent's or user's rows (memories, tool records): often none at all, and an
        # index probe costs less than a search that finds nothing.
        if "holds_any" not in probed:
            with connection.cursor() as cursor:
                probed["holds_any"] = statements.holds_any(cursor, corpus, scope, kept=True)
        if not probed["holds_any"]:
            return Candidates()
    backend = configured_backend()
    embedding = None
    if mode in ("hybrid", "semantic"):
        embedding = query_embedding(backend.model, query, tuning.unnamed_vector_share)
    # No transaction: each statement is a message of its own, with its planner settings
    # (``statements.execute_planned``), one round trip each.
    with connection.cursor() as cursor:
        if "few" not in probed:
            probed["few"] = bool(scope.few_sql) and statements.sees_few(cursor, scope, tuning)
        few = probed["few"]
        terms = NO_TERMS
        keyword = {}
        if mode != "semantic":
            terms = statements.query_terms(cursor, corpus, scope, query, tuning, few=few)
            keyword = statements.keyword_candidates(
                cursor, corpus, scope, terms, limit, tuning, few=few
            )
        if embedding is None:
            return Candidates(keyword=keyword, terms=terms)
        # While it embeds: how to find the nearest vectors. A principal's messages, when
        # the principal sees few conversations or the search is narrowed to some: exact
        # distances, capped (``nearest_with_fills``); when the principal sees many: the
        # graph. One agent's or user's rows (memories, tool records): the scope counted.
        capped = bool(scope.visible_sql) and (few or scope.narrowed)
        if capped and statements.over_the_cap(corpus, scope, limit, tuning):
            capped = False  # (the graph, as the last capped read said)
        if capped:
            order = EXACT_ORDER
        elif scope.visible_sql:
            order = INDEX_ORDER
        else:
            if "order" not in probed:
                probed["order"] = statements.nearest_order(
                    cursor, corpus, scope, limit, tuning, kept=True
                )
            order = probed["order"]
        vector = _embedded(embedding, mode)
        if vector is None:
            return Candidates(keyword=dict(keyword), terms=terms)
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
            # More rows in scope than exact distances are worth: the graph (at once for a
            # while: ``statements.over_the_cap``).
            statements.keep_over_the_cap(corpus, scope, limit, tuning)
            order = INDEX_ORDER
            rows = statement(order)
        if order == INDEX_ORDER and sum(row[5] for row in rows) < limit:
            # The graph walk gave up (hnsw_max_scan_tuples) before it found enough rows in
            # scope, or the scope holds fewer: exact distances find all there are.
            rows = statement(EXACT_ORDER)
    return Candidates(keyword=dict(keyword), terms=terms).add(rows)


def _embedded(embedding: Future, mode: str) -> str | None:
    """The query's vector, or None when the embedding backend failed (a service that is
    down, or a remote one that did not answer within ``REMOTE_QUERY_SECONDS`` of when it was
    asked: every wait for it ends then, each part of a question, each corpus a search reads,
    not each after 5 s more: code review): a hybrid search then answers with its keyword
    candidates, as it finds rows not yet embedded; a semantic search has nothing to answer
    with (503)."""
    try:
        left = (
            max(embedding.deadline - time.monotonic(), 0.0)
            if is_remote(configured_backend())
            else None
        )
        return embedding.result(timeout=left)
    except (EmbeddingError, FutureTimeout) as exc:
        if mode == "semantic":
            raise Unavailable(
                "the embedding service is unavailable; try again shortly (keyword search works)"
            ) from None
        why = str(exc) or "no answer in time"
        logger.warning("search query not embedded (%s): keyword candidates only", why)
        return None
