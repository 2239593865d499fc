"""Reads of the search app: hybrid search over what a principal may see.

Two retrievers run in PostgreSQL, each over the principal's scope only:

- semantic: cosine distance on the HNSW index of ``message.embedding`` (pgvector 0.8's
  iterative scan keeps looking when access filters reject the nearest rows);
- keyword: the GIN-indexed ``search_vector``, matched with any word of the query and
  ranked by BM25 (PostgreSQL's ``ts_rank`` ignores how rare a word is; BM25 weighs it by
  the corpus statistics of ``search.models``).

Hybrid search takes the candidates of both, scores every candidate by both measures
(so a message found by one retriever is not penalised for missing from the other's short
list), normalises each measure over the candidates, and adds them with fixed weights. A
conversation is a sequence: the turn next to a good match is often the answer, so a
candidate also gets a share of its best direct neighbour's score.

The constants below were tuned once, as a whole, on the LoCoMo development split
(``python -m bench.locomo``; see docs/benchmarks.md), never per question:

- BM25 without length normalisation (b = 0): turns are short and of similar length, and
  normalising by length mostly promotes one-word turns ("Wow!") that happen to share a word;
- equal weights for the two measures, and 0.2 of the best neighbour's score.
"""

import math
import uuid
from dataclasses import dataclass

from django.contrib.postgres.search import SearchHeadline, SearchQuery
from django.db import connection, transaction

from conversations.models import TEXT_SEARCH_CONFIG, Channel, Message, Visibility
from conversations.selectors import conversation_lineage, conversations_visible_to
from memsvc.api.errors import InvalidInput
from memsvc.api.principals import Principal
from search.embeddings import configured_backend

MODES = ("hybrid", "semantic", "keyword")

# BM25 parameters (the usual ones) and the fusion weights.
BM25_K1 = 1.2
BM25_B = 0.0
SEMANTIC_WEIGHT = 0.5
KEYWORD_WEIGHT = 0.5
NEIGHBOUR_WEIGHT = 0.2
# Each retriever proposes this many candidates per requested result (at least MIN).
CANDIDATES_PER_RESULT = 10
MIN_CANDIDATES = 50
# Keyword candidates are the messages holding the query's rarest words, taken rarest first
# while together they occur in at most this many messages (the rarest one always counts);
# commoner words still add to the score of the messages found. BM25 ranks those matches
# by what they have in common with the query, at a cost proportional to their number.
KEYWORD_MATCH_CAP = 500
HNSW_EF_SEARCH = 100


def pending_embedding_count() -> int:
    """Messages waiting for an embedding (counted on the partial index ``message_unembedded``)."""
    return Message.objects.filter(embedded_at__isnull=True).count()


@dataclass
class SearchHit:
    message: Message
    score: float
    highlights: str | None


@dataclass
class _Scope:
    sql: str
    params: list


def _scope(principal: Principal, *, for_agent: bool, conversation_ids, before_message_id) -> _Scope:
    """The SQL condition (on alias ``m``) of the messages the principal may find.

    Visibility is ``conversations_visible_to``; a fork's inherited messages belong to the
    conversation that owns them and are found there, once.
    """
    visible = conversations_visible_to(principal).values("id")
    visible_sql, visible_params = visible.query.sql_with_params()
    clauses = [f"m.conversation_id IN ({visible_sql})"]
    params = list(visible_params)
    if not for_agent:
        clauses.append("m.channel = %s AND m.visibility = %s")
        params += [Channel.HISTORY, Visibility.USER]
    if conversation_ids is not None:
        views = []
        for conversation in conversations_visible_to(principal).filter(id__in=conversation_ids):
            for step in conversation_lineage(conversation):
                if step.max_seq is None:
                    views.append("m.conversation_id = %s")
                    params.append(step.conversation_id)
                elif step.max_seq > 0:
                    views.append("(m.conversation_id = %s AND m.seq <= %s)")
                    params += [step.conversation_id, step.max_seq]
        clauses.append(f"({' OR '.join(views) or 'FALSE'})")
    if before_message_id is not None:
        before = Message.objects.filter(id=before_message_id).values_list("seq", flat=True).first()
        if before is None:
            raise InvalidInput.for_field("before", "no such message")
        clauses.append("m.seq < %s")
        params.append(before)
    return _Scope(" AND ".join(clauses), params)


def _vector_literal(vector) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in vector) + "]"


def _semantic_candidates(cursor, scope: _Scope, query_vector: str, model: str, limit: int):
    cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
    cursor.execute(f"SET LOCAL hnsw.ef_search = {max(HNSW_EF_SEARCH, limit)}")
    cursor.execute(
        f"""
        SELECT m.id, 1 - (m.embedding <=> %s::vector) AS similarity
        FROM message m
        WHERE m.embedding IS NOT NULL AND m.embedding_model = %s AND {scope.sql}
        ORDER BY m.embedding <=> %s::vector
        LIMIT %s
        """,
        [query_vector, model, *scope.params, query_vector, limit],
    )
    return dict(cursor.fetchall())


def _query_terms(cursor, text: str) -> tuple[list[str], list[float], float, list[str]]:
    """The query's lexemes with their BM25 IDF, the average message length, and the
    lexemes to match on (the rarest, see ``KEYWORD_MATCH_CAP``)."""
    cursor.execute(
        """
        SELECT q.lexeme, coalesce(t.document_count, 0), c.document_count, c.total_length
        FROM unnest(tsvector_to_array(to_tsvector(%s::regconfig, %s))) AS q(lexeme)
        LEFT JOIN search_term_stat t ON t.lexeme = q.lexeme
        LEFT JOIN search_corpus_stat c ON c.id = 1
        """,
        [TEXT_SEARCH_CONFIG, text],
    )
    rows = cursor.fetchall()
    if not rows:
        return [], [], 1.0, []
    documents = max(rows[0][2] or 0, 1)
    average_length = (rows[0][3] or documents) / documents
    lexemes, idfs, frequencies = [], [], {}
    for lexeme, frequency, _, _ in rows:
        frequency = min(frequency, documents)
        lexemes.append(lexeme)
        idfs.append(math.log(1 + (documents - frequency + 0.5) / (frequency + 0.5)))
        frequencies[lexeme] = frequency
    match_on, covered = [], 0
    for lexeme in sorted(lexemes, key=lambda word: (frequencies[word], word)):
        if match_on and covered + frequencies[lexeme] > KEYWORD_MATCH_CAP:
            break
        match_on.append(lexeme)
        covered += frequencies[lexeme]
    return lexemes, idfs, average_length, match_on


_BM25 = """
WITH q AS (SELECT * FROM unnest(%s::text[], %s::float8[]) AS q(lexeme, idf)),
candidates AS ({candidates})
SELECT c.id,
       sum(q.idf * (tf.n * {k1_plus_1}) / (tf.n + {k1} * (1 - {b} + {b} * length(c.search_vector) / %s)))
FROM candidates c
CROSS JOIN LATERAL unnest(c.search_vector) AS t(lexeme, positions, weights)
JOIN q ON q.lexeme = t.lexeme
CROSS JOIN LATERAL (SELECT coalesce(array_length(t.positions, 1), 1)::float8 AS n) tf
GROUP BY c.id
ORDER BY 2 DESC
LIMIT %s
"""


def _bm25(cursor, candidates_sql, candidate_params, lexemes, idfs, average_length, limit):
    sql = _BM25.format(candidates=candidates_sql, k1=BM25_K1, k1_plus_1=BM25_K1 + 1, b=BM25_B)
    cursor.execute(sql, [lexemes, idfs, *candidate_params, average_length, limit])
    return {message_id: float(score) for message_id, score in cursor.fetchall()}


def _keyword_candidates(cursor, scope: _Scope, terms, limit: int):
    lexemes, idfs, average_length, match_on = terms
    if not lexemes:
        return {}
    # Any of the words to match on will do (OR); quoting each lexeme keeps it literal.
    tsquery = " | ".join("'" + lexeme.replace("'", "''") + "'" for lexeme in match_on)
    candidates = (
        "SELECT m.id, m.search_vector FROM message m "
        f"WHERE m.search_vector @@ to_tsquery('simple', %s) AND {scope.sql} LIMIT %s"
    )
    return _bm25(
        cursor,
        candidates,
        [tsquery, *scope.params, KEYWORD_MATCH_CAP],
        lexemes,
        idfs,
        average_length,
        limit,
    )


def _keyword_scores_of(cursor, ids, terms):
    lexemes, idfs, average_length, _ = terms
    if not ids or not lexemes:
        return {}
    candidates = "SELECT m.id, m.search_vector FROM message m WHERE m.id = ANY(%s)"
    return _bm25(cursor, candidates, [list(ids)], lexemes, idfs, average_length, len(ids))


def _similarities_of(cursor, ids, query_vector: str, model: str):
    if not ids:
        return {}
    cursor.execute(
        """
        SELECT id, 1 - (embedding <=> %s::vector) FROM message
        WHERE id = ANY(%s) AND embedding IS NOT NULL AND embedding_model = %s
        """,
        [query_vector, list(ids), model],
    )
    return dict(cursor.fetchall())


def _normalised(scores: dict, ids) -> dict:
    """Min-max over the candidates; a candidate without a score gets 0."""
    values = [scores[i] for i in ids if i in scores]
    if not values:
        return dict.fromkeys(ids, 0.0)
    low, high = min(values), max(values)
    spread = high - low
    return {i: ((scores[i] - low) / spread if spread else 1.0) if i in scores else 0.0 for i in ids}


_NEIGHBOURS = """
SELECT c.id,
       (SELECT p.id FROM message p
        WHERE p.conversation_id = c.conversation_id AND p.seq < c.seq
        ORDER BY p.seq DESC LIMIT 1),
       (SELECT n.id FROM message n
        WHERE n.conversation_id = c.conversation_id AND n.seq > c.seq
        ORDER BY n.seq LIMIT 1)
FROM message c WHERE c.id = ANY(%s)
"""


def _with_neighbours(cursor, scores: dict, top_k: int) -> dict:
    """Each candidate plus ``NEIGHBOUR_WEIGHT`` of its best neighbour's score (the messages
    just before and after it in its conversation; a neighbour that is no candidate adds 0).

    Only candidates that could still reach the top ``top_k`` are looked at: a boost adds at
    most ``NEIGHBOUR_WEIGHT`` times the best score, and the ``top_k``-th score only grows.
    """
    if not scores:
        return scores
    ranked = sorted(scores.values(), reverse=True)
    floor = ranked[min(top_k, len(ranked)) - 1] - NEIGHBOUR_WEIGHT * ranked[0]
    contenders = [message_id for message_id, score in scores.items() if score >= floor]
    cursor.execute(_NEIGHBOURS, [contenders])
    return {
        message_id: scores[message_id]
        + NEIGHBOUR_WEIGHT * max(scores.get(before, 0.0), scores.get(after, 0.0))
        for message_id, before, after in cursor.fetchall()
    }


def fuse(semantic: dict, keyword: dict) -> dict:
    """One score per candidate from both measures, each normalised over the candidates."""
    ids = set(semantic) | set(keyword)
    s, k = _normalised(semantic, ids), _normalised(keyword, ids)
    return {i: SEMANTIC_WEIGHT * s[i] + KEYWORD_WEIGHT * k[i] for i in ids}


def search_messages(
    principal: Principal,
    *,
    query: str,
    top_k: int,
    mode: str = "hybrid",
    conversation_ids: list | None = None,
    before_message_id: uuid.UUID | None = None,
    for_agent: bool = False,
) -> list[SearchHit]:
    """The ``top_k`` messages the principal may see that best answer ``query``."""
    scope = _scope(
        principal,
        for_agent=for_agent,
        conversation_ids=conversation_ids,
        before_message_id=before_message_id,
    )
    candidates = max(MIN_CANDIDATES, CANDIDATES_PER_RESULT * top_k)
    backend = configured_backend()
    query_vector = None
    if mode in ("hybrid", "semantic"):
        query_vector = _vector_literal(backend.embed([query])[0])
    with transaction.atomic(), connection.cursor() as cursor:
        semantic, keyword = {}, {}
        if mode in ("hybrid", "semantic"):
            semantic = _semantic_candidates(cursor, scope, query_vector, backend.model, candidates)
        if mode in ("hybrid", "keyword"):
            terms = _query_terms(cursor, query)
            keyword = _keyword_candidates(cursor, scope, terms, candidates)
        if mode == "hybrid":
            keyword.update(_keyword_scores_of(cursor, set(semantic) - set(keyword), terms))
            semantic.update(
                _similarities_of(cursor, set(keyword) - set(semantic), query_vector, backend.model)
            )
            scores = _with_neighbours(cursor, fuse(semantic, keyword), top_k)
        else:
            scores = semantic or keyword
    ranked = sorted(scores.items(), key=lambda item: (-item[1], str(item[0])))[:top_k]
    return _hits(ranked, query)


def _hits(ranked: list[tuple], query: str) -> list[SearchHit]:
    if not ranked:
        return []
    ids = [message_id for message_id, _ in ranked]
    words = SearchQuery(query, search_type="websearch", config=TEXT_SEARCH_CONFIG)
    messages = (
        Message.objects.without_search_data()
        .filter(id__in=ids)
        .annotate(
            headline=SearchHeadline(
                "content",
                words,
                config=TEXT_SEARCH_CONFIG,
                max_fragments=2,
                max_words=20,
                min_words=5,
                start_sel="<b>",
                stop_sel="</b>",
            )
        )
    )
    by_id = {message.id: message for message in messages}
    return [
        SearchHit(message=by_id[i], score=round(score, 6), highlights=by_id[i].headline)
        for i, score in ranked
        if i in by_id
    ]
