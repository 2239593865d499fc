"""The SQL of search and the planner settings it needs, for any corpus of short texts with
a vector and a full-text column (messages, memories).

Two retrievers run in PostgreSQL, each over the caller's scope only:

- semantic: cosine distance on the corpus's HNSW index (pgvector 0.8's iterative scan keeps
  looking when access filters reject the nearest rows), or exact distances when the scope
  is small (``nearest_order``);
- keyword: the GIN-indexed ``search_vector``, matched with the query's rarest words and
  scored by BM25 (PostgreSQL's ``ts_rank`` ignores how rare a word is).
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from memsvc.db import TEXT_SEARCH_CONFIG, WORDS_SQL, websearch_text
from search.ranking import bm25_idf, rarest_within
from search.tuning import SearchTuning


@dataclass(frozen=True)
class Corpus:
    """A table search can read: ``id``, ``embedding`` (+ ``embedding_model``) and
    ``search_vector`` columns, the HNSW and GIN indexes on them."""

    table: str
    # One number: how many rows the vector index holds (exact distances or the graph).
    size_sql: str
    # Conversations: the turns just before and after each candidate count for it
    # (``conversation_id`` and ``seq`` columns).
    neighbours: bool = False
    # Keyword feedback applies (``SearchTuning.feedback_words``: conversation turns).
    feedback: bool = False
    # Who wrote each row (messages: ``author_name``): a query that names the author of a
    # candidate ranks it higher (``SearchTuning.author_weight``).
    author: str = ""
    # A row's own weight in its ranking, read with it (memories: ``importance``).
    importance: str = ""
    # A column of the ids of the messages each row rests on (memories): a message search
    # reads the best rows of this corpus too, for the turns they cite (``search.engine``).
    cites: str = ""
    # The words are indexed under the scope's columns (memories: ``memory_scope_words``): a
    # keyword search of one agent's or user's rows reads them from that index, never by
    # walking the scope's rows in another index (``keyword_candidates``).
    scoped_words: bool = False


@dataclass
class Scope:
    """The SQL condition (on alias ``m``) of the rows a caller may find, and its parameters."""

    sql: str
    params: list
    # Smaller than the caller's whole view (some conversations, one user's memories): its
    # rows are always counted to choose between exact distances and the graph.
    narrowed: bool = True
    # The conversations the principal may see (ids), counted first (``sees_few``).
    visible_sql: str = ""
    visible_params: tuple = ()
    # ``sql`` with those conversations as an array (``= ANY(ARRAY(...))``) instead of a
    # join, for a principal who sees few of them: PostgreSQL then reads the few
    # conversations' rows from the ``(conversation_id, seq)`` index and intersects them
    # with a word's rows in the GIN index before it reads a row, where the join reads every
    # row holding the word in the whole corpus (docs/benchmarks.md, "The keyword tail").
    # For a principal who sees many, the array is the slower way by far. Empty: no such
    # form (the scope names its conversations), and no count of them (``sees_few``).
    few_sql: str = ""
    # The caller's whole view, when this scope narrows it (to some conversations, messages
    # before one, memories with some tags): a word's weight is counted there
    # (``view_frequencies``), once per caller and not once per narrowing.
    view: "Scope | None" = None
    # Of a conversation that holds one of its rows, which turns the scope holds too (on
    # alias ``m``): a turn's neighbours are the ones before and after it among them
    # (``_around``), never a turn the caller does not see (an agent's, another channel's,
    # one past a fork point), whose place would tell it is there (review).
    turns_sql: str = "TRUE"
    turns_params: tuple = ()
    # A statement (one boolean) of whether the scope holds a row, for ``holds_any``, where
    # the EXISTS of ``sql`` is planned astray; empty: that EXISTS. (Of the scope before any
    # ``without``: a probe that says yes where every row is excluded costs a search that
    # finds nothing, never a row missed.)
    any_sql: str = ""
    any_params: tuple = ()

    def sql_for(self, few: bool) -> str:
        return self.few_sql if few and self.few_sql else self.sql

    def without(self, excluded: list[str]) -> "Scope":
        """This scope without the rows that hold any of the ``excluded`` words or phrases
        (``search.queries.exclusions``; read as ``websearch_to_tsquery`` reads them, so
        a stop word excludes nothing). A word weighs as it does in the whole scope."""
        words = websearch_text(" or ".join(excluded))
        clause = " AND NOT (m.search_vector @@ websearch_to_tsquery(%s::regconfig, %s))"
        return replace(
            self,
            sql=self.sql + clause,
            params=[*self.params, TEXT_SEARCH_CONFIG, words],
            few_sql=self.few_sql + clause if self.few_sql else "",
            view=self.view or self,
            turns_sql=self.turns_sql + clause,
            turns_params=(*self.turns_params, TEXT_SEARCH_CONFIG, words),
        )


# By distance on the HNSW index, or by an expression the index cannot serve: exact distances.
INDEX_ORDER = "m.embedding <=> %s::vector"
EXACT_ORDER = "(m.embedding <=> %s::vector) + 0"


def order_on(order: str, vector_sql: str) -> str:
    """``order`` (``INDEX_ORDER`` or ``EXACT_ORDER``) by the distance to a vector the
    statement names (``vector_sql``: a column of a LATERAL join's outer row, say), not to
    one given as a parameter."""
    return order.replace("%s::vector", vector_sql)


def exact_below(corpus: Corpus, limit: int, tuning: SearchTuning) -> tuple[str, list]:
    """SQL of one row, ``n``: below that many rows in scope, exact distances cost less
    than the graph (``SearchTuning.hnsw_cost_per_exact``), and its parameters."""
    return (
        f"SELECT greatest(%s, ceil(sqrt(%s::float8 * %s * ({corpus.size_sql}))))::bigint AS n",
        [tuning.exact_search_below, tuning.hnsw_cost_per_exact, int(limit)],
    )


# What searches learned about a scope, kept per process for this long (``SCOPES_KEPT``
# scopes at most):
# - how to find its nearest vectors: counting an agent's store up to the threshold on
#   every search cost more than the graph walk after it (1.35 of 10 ms for a store of
#   10,000 memories, docs/benchmarks.md). A store that crossed the threshold meanwhile is
#   searched the other way for a while: exact distances are right, only slower; a graph
#   walk that comes back short is redone exactly (``search.engine.find_candidates``);
# - that it holds a row (never that it holds none: a row saved since must be found). One
#   emptied meanwhile is searched and answers nothing, as it should;
# - whether a principal sees few conversations (``sees_few``): a round trip of every
#   message search;
# - how many of its rows hold a word the view's commonest words do not tell
#   (``view_frequencies``): a word's weight, up to a minute old;
# - that a capped exact read of it found more rows than the cap (``over_the_cap``): the
#   next searches walk the graph at once. The capped read was thrown away each time, once a
#   principal's few conversations held a few thousand messages (10 ms of PostgreSQL's time
#   and 0.7 ms of the web process's a search: docs/benchmarks.md). One that shrank under
#   the cap meanwhile is walked on the graph a while: its nearest rows approximately, as
#   any large scope's (a walk that comes back short is redone exactly,
#   ``search.engine.find_candidates``).
SCOPE_KEPT_SECONDS = 60
SCOPES_KEPT = 4096
_KEPT: dict[tuple, tuple[object, float]] = {}


def _scope_key(what: str, corpus: Corpus, scope: Scope, *more) -> tuple:
    return (what, corpus.table, scope.sql, tuple(map(str, scope.params)), *more)


def _kept(key: tuple, store: dict = _KEPT) -> object:
    """What was learned under ``key`` less than ``SCOPE_KEPT_SECONDS`` ago, else None."""
    value, at = store.get(key, (None, 0.0))
    return value if time.monotonic() - at < SCOPE_KEPT_SECONDS else None


def _keep(key: tuple, value: object, store: dict = _KEPT, most: int = SCOPES_KEPT) -> None:
    """``value`` kept under ``key`` in ``store``, which holds ``most`` at most: when it is
    full, what is stale goes, and if that is not enough, everything (scopes of many agents
    and users: start again)."""
    if len(store) >= most:
        now = time.monotonic()
        # (A copy first: a request thread that keeps something meanwhile made the loop a
        # RuntimeError, the search a 500: code review. ``dict.copy`` copies in one step;
        # ``list(store.items())`` made a tuple an item, and a collection of garbage among
        # them could let another thread in: CI, 2026-12-07.)
        for stale in [k for k, (_, at) in store.copy().items() if now - at >= SCOPE_KEPT_SECONDS]:
            store.pop(stale, None)
        if len(store) >= most:
            store.clear()
    store[key] = (value, time.monotonic())


def _kept_or_learned(key: tuple, learn: Callable[[], object], *, kept: bool = True) -> object:
    """What was learned under ``key`` (``kept``: if it is recent), else ``learn()``, kept."""
    value = _kept(key) if kept else None
    if value is None:
        value = learn()
        _keep(key, value)
    return value


def holds_any(cursor, corpus: Corpus, scope: Scope, *, kept: bool = False) -> bool:
    """Whether the scope holds a row at all (an index probe). ``kept``: true without the
    probe when it held one less than ``SCOPE_KEPT_SECONDS`` ago."""
    key = _scope_key("holds_any", corpus, scope)
    if kept and _kept(key):
        return True
    if scope.any_sql:
        cursor.execute(scope.any_sql, scope.any_params)
    else:
        cursor.execute(
            f"SELECT EXISTS (SELECT 1 FROM {corpus.table} m WHERE {scope.sql})", scope.params
        )
    held = cursor.fetchone()[0]
    if held:
        _keep(key, True)
    return held


def _cap_key(corpus: Corpus, scope: Scope, limit: int, tuning: SearchTuning) -> tuple:
    """What decides the cap of a capped read (``exact_below``) beside the scope."""
    return _scope_key(
        "over_the_cap", corpus, scope, limit, tuning.exact_search_below, tuning.hnsw_cost_per_exact
    )


def over_the_cap(corpus: Corpus, scope: Scope, limit: int, tuning: SearchTuning) -> bool:
    """Whether a capped read of the scope found more rows than its cap lately."""
    return bool(_kept(_cap_key(corpus, scope, limit, tuning)))


def keep_over_the_cap(corpus: Corpus, scope: Scope, limit: int, tuning: SearchTuning) -> None:
    _keep(_cap_key(corpus, scope, limit, tuning), True)


def sees_few(cursor, scope: Scope, tuning: SearchTuning) -> bool:
    """Whether the scope's principal sees at most ``few_conversations`` conversations
    (counted up to one more). False for a scope of no conversations (memories).

    The answer is kept ``SCOPE_KEPT_SECONDS``: it chooses only how a search reads (the
    conversations as an array or joined, exact distances or the graph), and each way reads
    the conversations the principal sees when it runs. One who joined or left many
    meanwhile is searched the slower way a while."""
    if not scope.visible_sql:
        return False

    def count() -> bool:
        cursor.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM ({scope.visible_sql}) v LIMIT %s) c",
            [*scope.visible_params, tuning.few_conversations + 1],
        )
        return cursor.fetchone()[0] <= tuning.few_conversations

    key = ("sees_few", scope.visible_sql, *map(str, scope.visible_params), tuning.few_conversations)
    return _kept_or_learned(key, count)


def nearest_order(
    cursor, corpus: Corpus, scope: Scope, limit: int, tuning: SearchTuning, *, kept: bool = False
) -> str:
    """The ORDER BY for the nearest vectors of a scope of one agent's or user's rows: the
    HNSW index when the scope holds ``exact_below`` rows or more (counted up to there),
    exact distances below. (A principal's messages need no count: ``nearest_with_fills``,
    ``capped``.) ``kept``: the answer of an earlier count of the same scope, if it is less
    than ``SCOPE_KEPT_SECONDS`` old (for a caller that redoes a short graph walk)."""
    key = _scope_key(
        "order", corpus, scope, limit, tuning.exact_search_below, tuning.hnsw_cost_per_exact
    )
    return _kept_or_learned(
        key, lambda: _counted_order(cursor, corpus, scope, limit, tuning), kept=kept
    )


def _counted_order(cursor, corpus: Corpus, scope: Scope, limit: int, tuning: SearchTuning) -> str:
    below, below_params = exact_below(corpus, limit, tuning)
    cursor.execute(
        f"""
        WITH exact_below AS ({below})
        SELECT (SELECT count(*) FROM (
                    SELECT 1 FROM {corpus.table} m WHERE {scope.sql}
                    LIMIT (SELECT n FROM exact_below)
                ) s) >= (SELECT n FROM exact_below)
        """,
        [*below_params, *scope.params],
    )
    return INDEX_ORDER if cursor.fetchone()[0] else EXACT_ORDER


def nearest_settings(order: str, limit: int, tuning: SearchTuning) -> dict:
    """The planner settings of a statement ordered by ``order`` (``execute_planned``): the
    graph's scan (pgvector 0.8: keep walking when access filters drop the nearest rows,
    up to ``hnsw_max_scan_tuples``), and no sort once the index is chosen."""
    settings = {
        "hnsw.iterative_scan": "relaxed_order",
        "hnsw.max_scan_tuples": tuning.hnsw_max_scan_tuples,
        "hnsw.ef_search": max(tuning.hnsw_ef_search, int(limit)),
    }
    if order == INDEX_ORDER:
        settings["enable_sort"] = "off"
    return settings


@dataclass(frozen=True)
class Terms:
    """The query's lexemes with their IDF, the ones to match candidates on, and how many
    rows the caller's view holds when they were all counted (else 0)."""

    idf: dict[str, float]
    match_on: list[str]
    view_rows: int = 0

    @staticmethod
    def _literal(lexeme: str) -> str:
        return "'" + lexeme.replace("'", "''") + "'"  # quoted: a lexeme, never an operator

    def score_sql(self, column: str) -> tuple[str, list]:
        """The BM25 score of ``column`` (``search.ranking``): the sum of the IDFs of the
        query words it holds. One ``@@`` test per word, no unnesting."""
        parts, params = [], []
        for lexeme, weight in self.idf.items():
            parts.append(f"(CASE WHEN {column} @@ %s::tsquery THEN %s ELSE 0 END)")
            params += [self._literal(lexeme), weight]
        return " + ".join(parts) or "0", params

    def match_sql(self) -> str:
        """A tsquery matching any of the words to match on."""
        return " | ".join(self._literal(lexeme) for lexeme in self.match_on)


NO_TERMS = Terms({}, [])


def query_terms(
    cursor, corpus: Corpus, scope: Scope, text: str, tuning: SearchTuning, *, few: bool = False
) -> Terms:
    """The query's words, each weighted by how rare it is among the rows the caller may read
    (``view_frequencies``), and the rarest to match candidates on."""
    lexemes = text_lexemes(cursor, text)[: tuning.query_words]
    if not lexemes:
        return NO_TERMS
    words, frequencies = view_frequencies(cursor, corpus, scope, lexemes, tuning, few=few)
    return Terms(
        bm25_idf(frequencies, words.documents, floor=tuning.document_count_floor),
        rarest_within(frequencies, tuning.keyword_match_cap),
        words.documents if words.complete else 0,
    )


# The lexemes of texts searched lately (``to_tsvector``'s: they depend on the text alone).
_LEXEMES: dict[str, list[str]] = {}
LEXEMES_KEPT = 4096


def text_lexemes(cursor, text: str) -> list[str]:
    """The lexemes a search of ``text`` looks for (its words stemmed, stop words out), in the
    order the text first says them."""
    lexemes = _LEXEMES.get(text)
    if lexemes is None:
        cursor.execute(
            "SELECT array_agg(lexeme ORDER BY positions[1], lexeme) FROM "
            f"unnest(to_tsvector(%s::regconfig, {WORDS_SQL.format('%s')}))",
            [TEXT_SEARCH_CONFIG, text],
        )
        lexemes = cursor.fetchone()[0] or []
        if len(_LEXEMES) >= LEXEMES_KEPT:
            _LEXEMES.clear()
        _LEXEMES[text] = lexemes
    return lexemes


@dataclass(frozen=True)
class ViewWords:
    """The commonest words of a caller's view, counted in its first ``sampled`` rows (all of
    them when ``complete``), scaled to its ``documents`` rows."""

    documents: int  # the view's rows (counted up to ``SearchTuning.scope_rows_cap``)
    sampled: int  # the rows whose words were counted
    complete: bool  # the sample is the whole view
    counts: dict[str, int]  # its commonest words: how many sampled rows hold each
    least: int  # a word held by fewer sampled rows is not among ``counts``

    def frequency(self, lexeme: str, floor: int) -> int | None:
        """About how many of the view's rows hold ``lexeme``; 0 for a word of the whole view
        held by fewer than ``floor`` rows (it weighs as one held by none); None when the
        sample cannot tell (count it in the view)."""
        if lexeme in self.counts:
            return round(self.counts[lexeme] * self.documents / max(self.sampled, 1))
        return 0 if self.complete and self.least <= floor else None


# The words of this many views at most are kept per process (each up to
# ``SearchTuning.view_words_kept`` words), each ``SCOPE_KEPT_SECONDS``.
VIEWS_KEPT = 256
_VIEW_WORDS: dict[tuple, tuple[ViewWords, float]] = {}


def forget_scopes() -> None:
    """Forget what searches learned about scopes and views (tests: each its own rows)."""
    _KEPT.clear()
    _VIEW_WORDS.clear()


def view_frequencies(
    cursor,
    corpus: Corpus,
    scope: Scope,
    lexemes: list[str],
    tuning: SearchTuning,
    *,
    few: bool = False,
) -> tuple["ViewWords", dict[str, int]]:
    """The caller's view (``Scope.view``) as ``view_words`` counted it, and about how many
    of its rows hold each of ``lexemes``: a common word from the view's words (``view_words``), any
    other counted in the view up to one more row than ``keyword_match_cap`` (kept
    ``SCOPE_KEPT_SECONDS``). ``few``: the principal of an unnarrowed scope sees few
    conversations (``sees_few``; asked here for a narrowed one, when a word is counted).

    Counted among the rows the caller may read, never the whole corpus: a weight from
    everyone's rows told the caller how many of them hold a word. A stranger's 30 private
    messages holding it moved the caller's score from 3.64 to 2.03, and working BM25
    backwards gave the exact count; the words chosen to match on told it too
    (``rarest_within``)."""
    view = scope.view or scope
    words = view_words(cursor, corpus, view, tuning)
    cap = tuning.keyword_match_cap + 1
    key = _scope_key("counted", corpus, view, cap)
    frequencies, missing = {}, []
    for lexeme in lexemes:
        frequency = words.frequency(lexeme, tuning.document_count_floor)
        if frequency is None:
            frequency = _kept((*key, lexeme))
        if frequency is None:
            missing.append(lexeme)
        else:
            frequencies[lexeme] = frequency
    if missing:
        if words.complete:
            # A view counted whole: its rows' words tested, as many rows as ``view_words``
            # read (the words index lists everyone's rows holding a word, and takes as long).
            rows, settings = _first_rows(corpus, view, tuning.scope_sample_rows), VIEW_ROWS_SETTINGS
        else:
            if scope.view is not None:
                few = bool(view.few_sql) and sees_few(cursor, view, tuning)
            rows, settings = _in_scope(corpus, view, few), _keyword_settings(corpus, view)
        counted = execute_planned(
            cursor,
            f"""
            {rows.read}
            SELECT q.lexeme, (SELECT count(*) FROM (
                    SELECT 1 FROM {rows.within}
                    AND m.search_vector @@ to_tsquery('simple', quote_literal(q.lexeme))
                    LIMIT %s) f)
            FROM unnest(%s::text[]) AS q(lexeme)
            """,
            [*rows.read_params, *rows.within_params, cap, missing],
            settings,
        )
        for lexeme, count in counted:
            frequencies[lexeme] = count
            _keep((*key, lexeme), count)
    return words, {w: min(f, words.documents) for w, f in frequencies.items()}


@dataclass(frozen=True)
class _Rows:
    """Rows a statement reads (alias ``m``): a WITH clause that reads them first, if any,
    and the FROM and WHERE of the statement, each with its parameters."""

    read: str
    read_params: list
    within: str
    within_params: list


def _first_rows(corpus: Corpus, scope: Scope, rows: int) -> _Rows:
    """The first ``rows`` rows of a scope, read once."""
    read = f"""WITH read AS MATERIALIZED (
        SELECT m.id, m.search_vector FROM {corpus.table} m WHERE {scope.sql} LIMIT %s)"""
    return _Rows(read, [*scope.params, rows], "read m WHERE true", [])


def _in_scope(corpus: Corpus, scope: Scope, few: bool) -> _Rows:
    """All of the scope's rows (the form of ``Scope.sql_for(few)``)."""
    return _Rows("", [], f"{corpus.table} m WHERE {scope.sql_for(few)}", list(scope.params))


# How a view's first rows are read (``view_words``): a loop over the principal's
# conversations, each read from the index of its messages, stops once enough rows are read.
# PostgreSQL's own choice, a hash join over the whole table, read 300,000 rows of a
# stranger's to find 402 of a principal who sees 201 conversations (54 ms against 1): it
# estimates a conversation's rows as the table's average, and one conversation held them.
VIEW_ROWS_SETTINGS = {"enable_hashjoin": "off", "enable_mergejoin": "off", "enable_seqscan": "off"}
# The same, each row's words tested (no words index): a small view's keyword candidates
# (``keyword_candidates``).
VIEW_SCAN_SETTINGS = {**VIEW_ROWS_SETTINGS, "enable_bitmapscan": "off"}


def view_words(cursor, corpus: Corpus, view: Scope, tuning: SearchTuning) -> ViewWords:
    """The commonest words of the caller's view (``ViewWords``): one statement reads the
    words of its first ``scope_sample_rows`` rows and keeps the ``view_words_kept`` words
    most of them hold (at least ``document_count_floor``), and counts a larger view's rows
    up to ``scope_rows_cap``. Kept ``SCOPE_KEPT_SECONDS`` per view: agents search one view
    again and again.

    The first rows of a larger view are its oldest, not a sample of it: a word its newer
    rows hold is not taken for a rare one, only for one to count (``view_frequencies``).
    The view's rows are read through an index, each of the principal's conversations in
    turn until enough rows are read (``VIEW_ROWS_SETTINGS``)."""
    least = max(tuning.document_count_floor, 1)
    key = _scope_key(
        "words",
        corpus,
        view,
        tuning.scope_sample_rows,
        tuning.scope_rows_cap,
        tuning.view_words_kept,
        least,
    )
    kept = _kept(key, _VIEW_WORDS)
    if kept is not None:
        return kept
    where = view.sql
    rows = execute_planned(
        cursor,
        f"""
        WITH sample AS MATERIALIZED (
            SELECT m.search_vector FROM {corpus.table} m WHERE {where} LIMIT %s
        ), sampled AS (SELECT count(*) AS n FROM sample)
        SELECT NULL, n, CASE WHEN n < %s THEN n ELSE (
                   SELECT count(*) FROM (
                       SELECT 1 FROM {corpus.table} m WHERE {where} LIMIT %s) d) END
        FROM sampled
        UNION ALL
        (SELECT lexeme, count(*), NULL
         FROM sample, unnest(tsvector_to_array(sample.search_vector)) AS w(lexeme)
         GROUP BY lexeme HAVING count(*) >= %s
         ORDER BY count(*) DESC, lexeme LIMIT %s)
        """,
        [
            *view.params,
            tuning.scope_sample_rows,
            tuning.scope_sample_rows,
            *view.params,
            tuning.scope_rows_cap,
            least,
            tuning.view_words_kept,
        ],
        VIEW_ROWS_SETTINGS,
    )
    counts, sampled, documents = {}, 0, 0
    for lexeme, count, counted in rows:
        if lexeme is None:
            sampled, documents = count, counted
        else:
            counts[lexeme] = count
    if len(counts) >= tuning.view_words_kept:
        least = min(counts.values()) + 1  # (as common as the last one kept: maybe not kept)
    words = ViewWords(
        documents=max(documents, 1),
        sampled=sampled,
        complete=sampled < tuning.scope_sample_rows,
        counts=counts,
        least=least,
    )
    _keep(key, words, _VIEW_WORDS, VIEWS_KEPT)
    return words


def execute_planned(cursor, sql: str, params: list, settings: dict) -> list[tuple]:
    """The rows of ``sql`` planned and run with these settings, in one round trip: ``SET
    LOCAL`` before it and back to the server's values after it, in one message of several
    statements (one transaction of its own in autocommit, or part of the caller's).

    Where the planner's estimates are known to lead it astray:

    - ``enable_nestloop`` off for keyword candidates: PostgreSQL rates a GIN bitmap scan of a
      common word as cheap, and for a principal who sees a hundred conversations it planned
      the keyword statement as one scan of the word per conversation instead of one scan
      joined to the visible conversations (docs/benchmarks.md).
    - ``enable_seqscan`` off for keyword candidates of one agent's or user's rows, and
      ``enable_indexscan`` too where the words are indexed under the scope: see
      ``keyword_candidates``.
    - ``enable_sort`` off for nearest vectors once ``nearest_order`` has chosen the index
      (the scope counted, or too many conversations to count): the planner estimates the
      scope from the statistics of memberships, which lag behind a principal who has just
      joined many conversations, and then sorted a large scope by distance instead of
      walking the graph.

    If the statement fails, the transaction is aborted and the settings end with it.
    """
    names = list(settings)
    before = "".join(f"SET LOCAL {name} = %s; " for name in names)
    after = "".join(f"; SET LOCAL {name} TO DEFAULT" for name in names)
    cursor.execute(before + sql + after, [*(str(settings[n]) for n in names), *params])
    while cursor.description is None and cursor.nextset():
        pass  # past the settings, to the statement's rows
    return cursor.fetchall()


def _keyword_settings(corpus: Corpus, scope: Scope) -> dict:
    """The planner settings of a statement reading a scope's rows by their words
    (``execute_planned``, ``keyword_candidates``)."""
    settings = {"enable_nestloop": "off"}
    if not scope.visible_sql:
        settings["enable_seqscan"] = "off"
        if corpus.scoped_words:
            settings["enable_indexscan"] = "off"
    return settings


def keyword_candidates(
    cursor,
    corpus: Corpus,
    scope: Scope,
    terms: Terms,
    limit: int,
    tuning: SearchTuning,
    *,
    few: bool = False,
) -> dict:
    """Up to ``limit`` rows holding the query's rarest words, with their BM25 scores (the
    scope's principal sees ``few`` conversations: ``Scope.few_sql``).

    One agent's or user's rows (memories, tool records) are read from an index, never by
    reading the table from its start: for a word most rows hold, PostgreSQL expects to
    find enough of the scope's rows among the first ones, but a store written after
    others sits at the table's end (a table of 150,000 memories: 27 to 50 ms against 1).
    Where the words are indexed under the scope (``Corpus.scoped_words``), only from that
    index: walking the scope's rows in another one until enough hold the word costs
    PostgreSQL about as much, in its estimate, and the choice flips with each ANALYZE, but
    for a word one row in 50 holds it reads the whole scope (a store of 20,000: 9.5 ms
    against 1.3; for the commonest words the word index costs 0.3 ms more).

    A caller's view of fewer than ``keyword_scan_below`` rows, counted whole
    (``Terms.view_rows``), is read row by row, each row's words tested: the words index
    lists everyone's rows holding a word, and its time told how many there are. At most
    that many rows are read: a view that has grown past them since it was counted (a
    conversation shared with the caller meanwhile) is read from the words index."""
    if not terms.idf:
        return {}
    score, score_params = terms.score_sql("m.search_vector")
    # Rows holding the same words score alike (BM25 counts a word once): of those, the
    # weightier first (memories: ``importance``; of 41 memories holding "coffee", the one
    # of importance 1 was left out of the 30 candidates, and of every result: review).
    weight = f"m.{corpus.importance}" if corpus.importance else "0"

    def matches(rows: _Rows, counted: str, settings: dict) -> list[tuple]:
        best = f"""
            SELECT id, score FROM (
                SELECT m.id, {score} AS score, {weight} AS weight FROM {rows.within}
                AND m.search_vector @@ to_tsquery('simple', %s) LIMIT %s
            ) matches ORDER BY score DESC, weight DESC LIMIT %s"""
        return execute_planned(
            cursor,
            f"{rows.read} ({best}) {counted}" if counted else best,
            [
                *rows.read_params,
                *score_params,
                *rows.within_params,
                terms.match_sql(),
                tuning.keyword_match_cap,
                limit,
            ],
            settings,
        )

    if not corpus.scoped_words and 0 < terms.view_rows < tuning.keyword_scan_below:
        first = _first_rows(corpus, scope, tuning.keyword_scan_below)
        rows = matches(first, "UNION ALL SELECT NULL, count(*) FROM read", VIEW_SCAN_SETTINGS)
        if next(n for row_id, n in rows if row_id is None) < tuning.keyword_scan_below:
            return {row_id: float(value) for row_id, value in rows if row_id is not None}
    rows = matches(_in_scope(corpus, scope, few), "", _keyword_settings(corpus, scope))
    return {row_id: float(value) for row_id, value in rows}


def _around(corpus: Corpus, scope: Scope) -> tuple[str, str, str, list]:
    """The SQL of a row's place (on alias ``m`` and unaliased), of the turns of the scope
    just before and after it in its conversation (on alias ``c``: ``Scope.turns_sql``) and
    their parameters, for a corpus of conversation turns; else no place and two nulls."""
    if not corpus.neighbours:
        return "", "", "NULL, NULL,", []
    around = f"""
        (SELECT m.id FROM {corpus.table} m
         WHERE m.conversation_id = c.conversation_id AND m.seq < c.seq AND {scope.turns_sql}
         ORDER BY m.seq DESC LIMIT 1),
        (SELECT m.id FROM {corpus.table} m
         WHERE m.conversation_id = c.conversation_id AND m.seq > c.seq AND {scope.turns_sql}
         ORDER BY m.seq LIMIT 1),"""
    return "m.conversation_id, m.seq,", "conversation_id, seq,", around, [*scope.turns_params] * 2


def _author(corpus: Corpus) -> str:
    """The columns of who wrote a row and of its importance (``Corpus.author``,
    ``Corpus.importance``), null where the corpus has none."""
    author = f"{corpus.author} AS author" if corpus.author else "NULL::text AS author"
    importance = corpus.importance or "NULL::float8"
    return f"{author}, {importance} AS importance"


def nearest_with_fills(
    cursor,
    corpus: Corpus,
    scope: Scope,
    query_vector: str,
    model: str,
    limit: int,
    terms: Terms,
    fills: list,
    order: str,
    tuning: SearchTuning,
    *,
    capped: bool = False,
    few: bool = False,
) -> list[tuple]:
    """In one round trip: the ``limit`` nearest rows with their keyword scores, and the
    similarity of the ``fills`` (keyword candidates) to the query. Each row: (id,
    similarity, keyword score, the row before, the row after, is one of the nearest, when
    it was written, whether the scope held more rows than ``capped`` allows, who wrote it
    (``Corpus.author``, else null), its importance (``Corpus.importance``, else null)). The rows
    before and after are the conversation's neighbouring turns (``Corpus.neighbours``),
    else null.

    ``capped``: exact distances over a principal's messages (one who sees ``few``
    conversations, or a search narrowed to some), without counting the scope first: at most as many rows as the exact-search limit are read
    (``exact_below``), and if the scope held that many, the rows say so and the caller
    walks the graph instead. A scope under the limit, the usual case, is read once, where a
    count would read it twice.
    """
    score, score_params = terms.score_sql("search_vector")
    position, outer_position, around, around_params = _around(corpus, scope)
    below, below_params = exact_below(corpus, limit, tuning)
    author = _author(corpus)
    in_scope = f"""
        FROM {corpus.table} m
        WHERE m.embedding IS NOT NULL AND m.embedding_model = %s AND {scope.sql_for(capped and few)}"""
    ctes, cte_params = f"exact_below AS ({below})", list(below_params)
    if capped:
        # The scope's rows read for their distances alone, kept once: the winners sorted
        # from them, and the rows counted. The winners' other columns are read for them only;
        # carried through the scan (the full-text vector above all) and counted with a
        # window over every row read, they cost a tenth more (1,000,000 messages, a
        # principal's 10,000: 14.2 -> 12.6 ms, docs/benchmarks.md).
        ctes += f""",
        within_limit AS MATERIALIZED (
            SELECT m.id, 1 - (m.embedding <=> %s::vector) AS similarity {in_scope}
            LIMIT (SELECT greatest(n, 1) FROM exact_below)
        )"""
        cte_params += [query_vector, model, *scope.params]
        nearest = f"""
        SELECT m.id, {position} m.search_vector, m.created_at, {author}, best.similarity,
               (SELECT count(*) FROM within_limit) >= (SELECT n FROM exact_below) AS over_limit
        FROM (SELECT * FROM within_limit ORDER BY similarity DESC LIMIT %s) best
        JOIN {corpus.table} m ON m.id = best.id"""
        nearest_params = [limit]
        order = EXACT_ORDER
    else:
        nearest = f"""
        SELECT m.id, {position} m.search_vector, m.created_at, {author},
               1 - (m.embedding <=> %s::vector) AS similarity {in_scope}
        ORDER BY {order} LIMIT %s"""
        nearest_params = [query_vector, model, *scope.params, query_vector, limit]
    # The order was chosen by counting the scope; the planner must not overrule it by its
    # statistics (``nearest_settings``).
    return execute_planned(
        cursor,
        f"""
        WITH {ctes}
        SELECT c.id, c.similarity, c.keyword_score, {around} c.nearest, c.created_at,
               c.over_limit, c.author, c.importance
        FROM (
            SELECT id, {outer_position} similarity, {score} AS keyword_score,
                   true AS nearest, created_at, {"over_limit" if capped else "NULL"} AS over_limit,
                   author, importance
            FROM ({nearest}) nearest
            UNION ALL
            SELECT id, {outer_position}
                   CASE WHEN embedding_model = %s THEN 1 - (embedding <=> %s::vector) END,
                   NULL, false, created_at, NULL, {author}
            FROM {corpus.table} WHERE id = ANY(%s)
        ) c
        """,
        [*cte_params, *around_params, *score_params, *nearest_params, model, query_vector, fills],
        nearest_settings(order, limit, tuning),
    )


def cited_in_scope(cursor, citing: Corpus, ids: list, corpus: Corpus, scope: Scope) -> dict:
    """What each of ``ids`` (rows of ``citing``) cites that ``scope`` holds: id -> the cited
    ids, for those citing any."""
    cursor.execute(
        f"""
        SELECT c.id, m.id FROM {citing.table} c
        CROSS JOIN unnest(c.{citing.cites}) AS cited(id)
        JOIN {corpus.table} m ON m.id = cited.id
        WHERE c.id = ANY(%s) AND {scope.sql}
        """,
        [list(ids), *scope.params],
    )
    found: dict = {}
    for citing_id, cited_id in cursor.fetchall():
        found.setdefault(citing_id, []).append(cited_id)
    return found


def in_scope(cursor, corpus: Corpus, scope: Scope, ids: list) -> set:
    """Those of ``ids`` the scope holds (rows reached otherwise than through it: the
    neighbours of candidates)."""
    if not ids:
        return set()
    cursor.execute(
        f"SELECT m.id FROM {corpus.table} m WHERE m.id = ANY(%s) AND {scope.sql}",
        [list(ids), *scope.params],
    )
    return {row[0] for row in cursor.fetchall()}


def described(
    cursor, corpus: Corpus, scope: Scope, ids: list, query_vector: str, model: str, terms: Terms
) -> list[tuple]:
    """``ids`` (rows found in ``scope``) as ``nearest_with_fills`` gives its rows, their keyword
    scores by ``terms``: the candidates of a query scored again with more words (keyword
    feedback)."""
    score, score_params = terms.score_sql("search_vector")
    _position, outer_position, around, around_params = _around(corpus, scope)
    cursor.execute(
        f"""
        SELECT c.id, c.similarity, c.keyword_score, {around} false, c.created_at, NULL,
               c.author, c.importance
        FROM (
            SELECT id, {outer_position}
                   CASE WHEN embedding_model = %s THEN 1 - (embedding <=> %s::vector) END
                       AS similarity,
                   {score} AS keyword_score, created_at, {_author(corpus)}
            FROM {corpus.table} WHERE id = ANY(%s)
        ) c
        """,
        [*around_params, model, query_vector, *score_params, list(ids)],
    )
    return cursor.fetchall()


def row_words(cursor, corpus: Corpus, ids: list, citing: Corpus | None, citing_ids: list) -> dict:
    """The words of the rows ``ids`` of ``corpus`` and ``citing_ids`` of ``citing``
    (memories): what keyword feedback chooses from, and scores the candidates by."""
    citing_rows, params = "", [list(ids)]
    if citing is not None and citing_ids:
        citing_rows = f"""
            UNION ALL
            SELECT id, tsvector_to_array(search_vector) FROM {citing.table} WHERE id = ANY(%s)"""
        params.append(list(citing_ids))
    cursor.execute(
        f"""
        SELECT id, tsvector_to_array(search_vector) FROM {corpus.table}
        WHERE id = ANY(%s) {citing_rows}
        """,
        params,
    )
    return dict(cursor.fetchall())
