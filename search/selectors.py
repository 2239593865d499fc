"""Reads of the search app: hybrid search over what a principal may see.

Two retrievers run in PostgreSQL, each over the principal's scope only:

- semantic: cosine distance on the HNSW index of ``message.embedding`` (pgvector 0.8's
  iterative scan keeps looking when access filters reject the nearest rows), or exact
  distances when the scope is small (``HNSW_COST_PER_EXACT``);
- keyword: the GIN-indexed ``search_vector``, matched with the query's rarest words and
  ranked by BM25 (PostgreSQL's ``ts_rank`` ignores how rare a word is; BM25 weighs it by
  the corpus statistics of ``search.models``).

The query is embedded on a thread while the keyword search runs. Hybrid search takes the
candidates of both, scores every candidate by both measures
(so a message found by one retriever is not penalised for missing from the other's short
list), normalises each measure over the candidates, and adds them with fixed weights. A
conversation is a sequence: the turn next to a good match is often the answer, so a
candidate also gets a share of its best direct neighbour's score.

The constants below were tuned once, as a whole, on the LoCoMo development split
(``python -m bench.locomo``; see docs/benchmarks.md), never per question:

- BM25 without length normalisation (b = 0) and each word counted once per message: turns
  are short and of similar length, and normalising by length mostly promotes one-word
  turns ("Wow!") that happen to share a word;
- equal weights for the two measures, and 0.2 of the best neighbour's score.
"""

import functools
import math
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import connection, transaction

from conversations.models import TEXT_SEARCH_CONFIG, Channel, Message, Visibility
from conversations.selectors import (
    conversation_lineages,
    conversations_visible_to,
    visible_conversation_ids,
)
from memsvc.api.errors import InvalidInput
from memsvc.api.principals import Principal
from search.embeddings import configured_backend, vector_literal

MODES = ("hybrid", "semantic", "keyword")

# The fusion weights.
SEMANTIC_WEIGHT = 0.5
KEYWORD_WEIGHT = 0.5
NEIGHBOUR_WEIGHT = 0.2
# Each retriever proposes this many candidates per requested result (at least MIN).
CANDIDATES_PER_RESULT = 5
MIN_CANDIDATES = 30
# Keyword candidates are the messages holding the query's rarest words, taken rarest first
# while together they occur in at most this many messages (the rarest one always counts);
# commoner words still add to the score of the messages found. BM25 ranks those matches
# by what they have in common with the query, at a cost proportional to their number.
KEYWORD_MATCH_CAP = 500
HNSW_EF_SEARCH = 100
# Exact distances or the HNSW graph: for a small scope (a user who sees little, or one
# conversation) the exact distance to each message is cheaper than walking the graph past
# everything the access filter rejects, and it finds the true nearest. The exact scan costs
# in proportion to the scope; the graph returns about candidates x corpus / scope rows
# before enough of them are in scope, each costing HNSW_COST_PER_EXACT exact distances
# (measured at a million messages: 16 us a row returned, 1.5 us a message scanned
# exactly). So the exact scan wins below sqrt(HNSW_COST_PER_EXACT x candidates x corpus)
# messages in scope: about 5,500 in 100,000 embedded messages and 17,000 in a million,
# with 30 candidates; never below EXACT_SEARCH_BELOW.
HNSW_COST_PER_EXACT = 10
EXACT_SEARCH_BELOW = 3000
# The messages of a principal's whole scope are only counted when the principal sees at most
# this many conversations, so one who sees many pays nothing for the check and walks the
# graph. A scope narrowed to some conversations (or to messages before one) is always counted.
FEW_CONVERSATIONS = 200
# The graph walk gives up after this many rows (pgvector's default): a principal who sees many
# conversations but few messages among a great many can starve it, and then the exact
# distances are computed after all (``_semantic_candidates_and_fills``).
HNSW_MAX_SCAN_TUPLES = 20_000


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
    visible_sql: str  # the conversations the principal may see (ids)
    visible_params: tuple
    narrowed: bool  # to some conversations or to messages before one: smaller than visible_sql


_VISIBLE_SQL: dict[int, str] = {}


def _visible_conversations_sql(principal: Principal) -> tuple[str, tuple]:
    """The SQL of ``visible_conversation_ids(principal)`` and its parameters.

    Compiling the queryset costs more than running it, and its text depends only on how
    many memberships the principal needs, so the text is kept once its parameters are
    known to be exactly those member ids.
    """
    members = tuple(principal.member_ids)
    cached = _VISIBLE_SQL.get(len(members))
    if cached is not None:
        return cached, members
    sql, params = visible_conversation_ids(principal).query.sql_with_params()
    if tuple(params) == members:
        _VISIBLE_SQL[len(members)] = sql
    return sql, params


def _scope(principal: Principal, *, for_agent: bool, conversation_ids, before_message_id) -> _Scope:
    """The SQL condition (on alias ``m``) of the messages the principal may find.

    Visibility is ``conversations_visible_to``; a fork's inherited messages belong to the
    conversation that owns them and are found there, once.
    """
    visible_sql, visible_params = _visible_conversations_sql(principal)
    clauses = [f"m.conversation_id IN ({visible_sql})"]
    params = list(visible_params)
    if not for_agent:
        clauses.append("m.channel = %s AND m.visibility = %s")
        params += [Channel.HISTORY, Visibility.USER]
    if conversation_ids is not None:
        chosen = conversations_visible_to(principal).filter(id__in=conversation_ids)
        views = []
        for lineage in conversation_lineages(chosen.values_list("id", flat=True)).values():
            for step in lineage:
                if step.max_seq is None:
                    views.append("m.conversation_id = %s")
                    params.append(step.conversation_id)
                else:
                    views.append("(m.conversation_id = %s AND m.seq <= %s)")
                    params += [step.conversation_id, step.max_seq]
        clauses.append(f"({' OR '.join(views) or 'FALSE'})")
    if before_message_id is not None:
        before = Message.objects.filter(id=before_message_id).values_list("seq", flat=True).first()
        if before is None:
            raise InvalidInput.for_field("before", "no such message")
        clauses.append("m.seq < %s")
        params.append(before)
    return _Scope(
        " AND ".join(clauses),
        params,
        visible_sql,
        tuple(visible_params),
        narrowed=conversation_ids is not None or before_message_id is not None,
    )


# By distance on the HNSW index, or by an expression the index cannot serve: exact distances.
INDEX_ORDER = "m.embedding <=> %s::vector"
EXACT_ORDER = "(m.embedding <=> %s::vector) + 0"


def _nearest_order(cursor, scope: _Scope, limit: int) -> str:
    """The ORDER BY for the nearest vectors: the HNSW index for a large scope, exact
    distances for a small one (``HNSW_COST_PER_EXACT``). One round trip, which also sets the
    index's scan for this transaction (pgvector 0.8: keep scanning the graph when access
    filters drop the nearest rows)."""
    many_conversations, many_params = "false", []
    if not scope.narrowed:
        many_conversations = (
            f"(SELECT count(*) FROM (SELECT 1 FROM ({scope.visible_sql}) v LIMIT %s) c) > %s"
        )
        many_params = [*scope.visible_params, FEW_CONVERSATIONS + 1, FEW_CONVERSATIONS]
    cursor.execute(
        f"""
        WITH exact_below AS (
            SELECT greatest(%s, ceil(sqrt(%s::float8 * %s * coalesce(max(document_count), 0))))::bigint AS n
            FROM search_corpus_stat
        )
        SELECT CASE
            WHEN {many_conversations} THEN true
            ELSE (SELECT count(*) FROM (
                    SELECT 1 FROM message m WHERE {scope.sql} LIMIT (SELECT n FROM exact_below)
                 ) s) >= (SELECT n FROM exact_below)
        END,
        set_config('hnsw.iterative_scan', 'relaxed_order', true),
        set_config('hnsw.max_scan_tuples', %s, true),
        set_config('hnsw.ef_search', %s, true)
        """,
        [
            EXACT_SEARCH_BELOW,
            HNSW_COST_PER_EXACT,
            int(limit),
            *many_params,
            *scope.params,
            str(HNSW_MAX_SCAN_TUPLES),
            str(max(HNSW_EF_SEARCH, int(limit))),
        ],
    )
    return INDEX_ORDER if cursor.fetchone()[0] else EXACT_ORDER


@dataclass(frozen=True)
class Terms:
    """The query's lexemes with their IDF, and the ones to match on (``KEYWORD_MATCH_CAP``)."""

    idf: dict[str, float]
    match_on: list[str]

    @staticmethod
    def _literal(lexeme: str) -> str:
        return "'" + lexeme.replace("'", "''") + "'"  # quoted: a lexeme, never an operator

    def score_sql(self, column: str) -> tuple[str, list]:
        """BM25 of ``column`` with b = 0 and each word counted once (a turn rarely says a word
        twice, and counting positions costs more than it gains), which is the sum of the IDFs
        of the query words the message holds. One ``@@`` test per word, no unnesting."""
        parts, params = [], []
        for lexeme, weight in self.idf.items():
            parts.append(f"(CASE WHEN {column} @@ %s::tsquery THEN %s ELSE 0 END)")
            params += [self._literal(lexeme), weight]
        return " + ".join(parts) or "0", params

    def match_sql(self) -> str:
        """A tsquery matching any of the words to match on."""
        return " | ".join(self._literal(lexeme) for lexeme in self.match_on)


def _query_terms(cursor, text: str) -> Terms:
    cursor.execute(
        """
        SELECT q.lexeme, coalesce(t.document_count, 0), c.document_count
        FROM unnest(tsvector_to_array(to_tsvector(%s::regconfig, %s))) AS q(lexeme)
        LEFT JOIN search_term_stat t ON t.lexeme = q.lexeme
        LEFT JOIN search_corpus_stat c ON c.id = 1
        """,
        [TEXT_SEARCH_CONFIG, text],
    )
    rows = cursor.fetchall()
    if not rows:
        return Terms({}, [])
    documents = max(rows[0][2] or 0, 1)
    frequencies = {lexeme: min(frequency, documents) for lexeme, frequency, _ in rows}
    idf = {
        lexeme: math.log(1 + (documents - frequency + 0.5) / (frequency + 0.5))
        for lexeme, frequency in frequencies.items()
    }
    match_on, covered = [], 0
    for lexeme in sorted(frequencies, key=lambda word: (frequencies[word], word)):
        if match_on and covered + frequencies[lexeme] > KEYWORD_MATCH_CAP:
            break
        match_on.append(lexeme)
        covered += frequencies[lexeme]
    return Terms(idf, match_on)


def _keyword_candidates(cursor, scope: _Scope, terms: Terms, limit: int) -> dict:
    if not terms.idf:
        return {}
    score, score_params = terms.score_sql("m.search_vector")
    with _planned_without(cursor, "nestloop"):
        cursor.execute(
            f"""
            SELECT id, score FROM (
                SELECT m.id, {score} AS score FROM message m
                WHERE m.search_vector @@ to_tsquery('simple', %s) AND {scope.sql}
                LIMIT %s
            ) matches
            ORDER BY score DESC LIMIT %s
            """,
            [*score_params, terms.match_sql(), *scope.params, KEYWORD_MATCH_CAP, limit],
        )
        return {message_id: float(value) for message_id, value in cursor.fetchall()}


@contextmanager
def _planned_without(cursor, *methods: str):
    """Plan the statements inside without these plan methods (``enable_<method>``, this
    transaction only), where the planner's estimates are known to lead it astray:

    - ``nestloop`` for keyword candidates: PostgreSQL rates a GIN bitmap scan of a common
      word as cheap, and for a principal who sees a hundred conversations it planned the
      keyword statement as one scan of the word per conversation: 120 ms at a million
      messages. One scan joined to the visible conversations took 5 ms there, and the same
      as before for a principal who sees all.
    - ``sort`` for nearest vectors once ``_nearest_order`` has chosen the index (the scope
      counted, or too many conversations to count): the planner estimates the scope from
      the statistics of memberships, which lag behind a principal who has just joined many
      conversations. Without statistics it took a reader of 1,000 conversations for a
      reader of 2 and sorted all their 100,000 messages by distance: searches took 110 ms
      instead of 11.

    Afterwards the server's configured values apply again. If a statement inside fails,
    the transaction is aborted and the settings end with it: nothing is sent then, so the
    statement's own error is the one raised.
    """
    for method in methods:
        cursor.execute(f"SET LOCAL enable_{method} = off")
    yield
    for method in methods:
        cursor.execute(f"SET LOCAL enable_{method} TO DEFAULT")


def _semantic_candidates_and_fills(
    cursor,
    scope: _Scope,
    order: str,
    query_vector: str,
    model: str,
    limit: int,
    terms: Terms,
    keyword: dict,
) -> tuple[dict, dict, dict]:
    """Hybrid, in one round trip: the semantic candidates with their keyword scores, the
    similarity of the keyword candidates the semantic list missed, and the messages just
    before and after each candidate in its conversation (``_with_neighbours``)."""
    statement = functools.partial(
        _nearest_with_fills, cursor, scope, query_vector, model, limit, terms, list(keyword)
    )
    rows = statement(order)
    if order == INDEX_ORDER and sum(nearest for *_, nearest in rows) < limit:
        # The graph walk gave up (HNSW_MAX_SCAN_TUPLES) before it found enough messages in
        # scope, or the scope holds fewer: exact distances find all there are.
        rows = statement(EXACT_ORDER)
    semantic, keyword, neighbours = {}, dict(keyword), {}
    for message_id, similarity, keyword_score, before, after, _nearest in rows:
        if similarity is not None:
            semantic[message_id] = similarity
        if keyword_score is not None:
            keyword.setdefault(message_id, float(keyword_score))
        neighbours[message_id] = (before, after)
    return semantic, keyword, neighbours


def _nearest_with_fills(
    cursor, scope: _Scope, query_vector: str, model: str, limit: int, terms, fills, order: str
) -> list[tuple]:
    """The rows of ``_semantic_candidates_and_fills``, each marked as one of the nearest or a
    fill, for one order."""
    score, score_params = terms.score_sql("search_vector")
    # The order was chosen by counting the scope; the planner must not overrule it by its
    # statistics (``_planned_without``).
    with _planned_without(cursor, *(["sort"] if order == INDEX_ORDER else [])):
        cursor.execute(
            f"""
            SELECT c.id, c.similarity, c.keyword_score,
                   (SELECT p.id FROM message p
                    WHERE p.conversation_id = c.conversation_id AND p.seq < c.seq
                    ORDER BY p.seq DESC LIMIT 1),
                   (SELECT n.id FROM message n
                    WHERE n.conversation_id = c.conversation_id AND n.seq > c.seq
                    ORDER BY n.seq LIMIT 1),
                   c.nearest
            FROM (
                SELECT id, conversation_id, seq, similarity, {score} AS keyword_score,
                       true AS nearest
                FROM (
                    SELECT m.id, m.conversation_id, m.seq, m.search_vector,
                           1 - (m.embedding <=> %s::vector) AS similarity
                    FROM message m
                    WHERE m.embedding IS NOT NULL AND m.embedding_model = %s AND {scope.sql}
                    ORDER BY {order}
                    LIMIT %s
                ) nearest
                UNION ALL
                SELECT id, conversation_id, seq,
                       CASE WHEN embedding_model = %s THEN 1 - (embedding <=> %s::vector) END,
                       NULL, false
                FROM message WHERE id = ANY(%s)
            ) c
            """,
            [
                *score_params,
                query_vector,
                model,
                *scope.params,
                query_vector,
                limit,
                model,
                query_vector,
                fills,
            ],
        )
        return cursor.fetchall()


def _normalised(scores: dict, ids) -> dict:
    """Min-max over the candidates; a candidate without a score gets 0."""
    values = [scores[i] for i in ids if i in scores]
    if not values:
        return dict.fromkeys(ids, 0.0)
    low, high = min(values), max(values)
    spread = high - low
    return {i: ((scores[i] - low) / spread if spread else 1.0) if i in scores else 0.0 for i in ids}


def _with_neighbours(scores: dict, neighbours: dict) -> dict:
    """Each candidate plus ``NEIGHBOUR_WEIGHT`` of its best neighbour's score (the messages
    just before and after it in its conversation; a neighbour that is no candidate adds 0)."""
    return {
        message_id: score
        + NEIGHBOUR_WEIGHT
        * max(scores.get(neighbour, 0.0) for neighbour in neighbours.get(message_id, (None,)))
        for message_id, score in scores.items()
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
    # The query is embedded on another thread while the keyword search runs here (the model
    # releases the GIL): the two slowest steps of a hybrid search overlap.
    embedding = None
    if mode in ("hybrid", "semantic"):
        embedding = _QUERY_EMBEDDER.submit(backend.embed, [query])
    with transaction.atomic(), connection.cursor() as cursor:
        terms = _query_terms(cursor, query) if mode != "semantic" else Terms({}, [])
        keyword = (
            _keyword_candidates(cursor, scope, terms, candidates) if mode != "semantic" else {}
        )
        if embedding is None:
            scores = keyword
        else:
            order = _nearest_order(cursor, scope, candidates)  # while the query embeds
            vector = vector_literal(embedding.result()[0])
            # Semantic mode is the same statement with no keyword terms or candidates.
            semantic, keyword, neighbours = _semantic_candidates_and_fills(
                cursor, scope, order, vector, backend.model, candidates, terms, keyword
            )
            if mode == "semantic":
                scores = semantic
            else:
                scores = _with_neighbours(fuse(semantic, keyword), neighbours)
    ranked = sorted(scores.items(), key=lambda item: (-item[1], str(item[0])))[:top_k]
    return _hits(ranked, query)


_QUERY_EMBEDDER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="query-embedding")


def _hits(ranked: list[tuple], query: str) -> list[SearchHit]:
    if not ranked:
        return []
    messages = Message.objects.raw(
        _HITS_SQL,
        [TEXT_SEARCH_CONFIG, TEXT_SEARCH_CONFIG, query, _HEADLINE_OPTIONS, [i for i, _ in ranked]],
    )
    by_id = {message.id: message for message in messages}
    return [
        SearchHit(message=by_id[i], score=round(score, 6), highlights=by_id[i].headline)
        for i, score in ranked
        if i in by_id
    ]


# The found messages, each with a highlighted extract: the columns the APIs show, in one
# fixed statement (compiling it per search as a queryset cost about a millisecond).
_HITS_SQL = f"""
SELECT {", ".join(field.column for field in Message.shown_fields())},
       ts_headline(%s::regconfig, content, websearch_to_tsquery(%s::regconfig, %s), %s) AS headline
FROM message WHERE id = ANY(%s)
"""
_HEADLINE_OPTIONS = "MaxFragments=2, MaxWords=20, MinWords=5, StartSel=<b>, StopSel=</b>"
