"""Reads of the search app: hybrid search over the messages a principal may see.

The engine (``search.engine``) is the same for every corpus; this module says what the
message corpus is, which messages a principal's search may reach, and how the found ones
are shown. A conversation is a sequence: the turn next to a good match is often the answer,
so a message also gets a share of its best direct neighbour's score.
"""

import itertools
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connection

from conversations.models import Channel, Message, Visibility
from conversations.selectors import (
    SEEN_BY_USERS,
    LineageStep,
    conversation_lineages,
    messages_visible_to,
    visible_conversation_ids,
)
from memsvc.api.errors import InvalidInput
from memsvc.api.principals import Principal
from memsvc.db import (
    CJK_CHARACTERS,
    MARKUP_STAND_IN,
    TEXT_SEARCH_CONFIG,
    WORDS_SQL,
    headline_as_written,
    websearch_text,
)
from search import queries
from search.checks import VECTOR_TABLES
from search.embeddings import configured_backend
from search.engine import MODES, Citing, query_embedding, ranked
from search.statements import Corpus, Scope
from search.tuning import SearchTuning, configured_tuning

__all__ = [
    "MESSAGES",
    "MODES",
    "SearchHit",
    "embed_query_ahead",
    "message_scope",
    "register_citing",
    "search_messages",
]

MESSAGES = Corpus(
    "message",
    size_sql="SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = 'message'::regclass",
    neighbours=True,
    feedback=True,
    author="author_name",
)


# Memories cite the turns they rest on, and a search of messages ranks those turns by the
# memories most relevant to the query. Memories belong to the agents app, built on this one:
# it tells at start-up (``AgentsApiConfig.ready``) which memories a principal's search reads.
_citing: Callable[[Principal], Citing | None] | None = None


def register_citing(source: Callable[[Principal], Citing | None]) -> None:
    global _citing
    _citing = source


# The most rows of a corpus waiting for an embedding that ``pending_embedding_counts`` counts:
# a probe of a service with a backlog of millions read them all, every few seconds.
PENDING_COUNTED_UP_TO = 100_000


def pending_embedding_counts() -> dict[str, int]:
    """The rows waiting for an embedding in each corpus (``VECTOR_TABLES``: messages,
    memories, tool records; only the messages' were counted, and after a ``memsvc reindex
    --resize`` the memories waiting were seen nowhere: review), each up to
    ``PENDING_COUNTED_UP_TO``, in one statement (each on its partial index
    ``<table>_unembedded``)."""
    counted = ", ".join(
        f"(SELECT count(*) FROM (SELECT 1 FROM {table} WHERE embedded_at IS NULL LIMIT %s) w)"
        for table in VECTOR_TABLES
    )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {counted}", [PENDING_COUNTED_UP_TO] * len(VECTOR_TABLES))
        return dict(zip(VECTOR_TABLES, cursor.fetchone(), strict=True))


@dataclass
class SearchHit:
    message: Message
    score: float
    # PostgreSQL's extract (``ts_headline``), matches in ``<b>``, as it marked them: the
    # text's own "<" still ``MARKUP_STAND_IN``, so that its markers are the only ``<b>``.
    headline: str | None
    # Where the HEADLINE_CHARS the extract reads begin in the text (``_extracts_further_in``).
    headline_from: int = 0

    @property
    def marked(self) -> str | None:
        """The extract as written (``headline_as_written``), matches in ``<b>``, the text's
        own "<" still ``MARKUP_STAND_IN`` (the pages escape it, then show the marks)."""
        return self.headline and headline_as_written(
            self.headline,
            # (what the extract reads)
            self.message.content[self.headline_from : self.headline_from + HEADLINE_CHARS],
        )

    @property
    def highlights(self) -> str | None:
        """The extract as the APIs show it: the text as written, matches in ``<b>``."""
        return self.headline and self.marked.replace(MARKUP_STAND_IN, "<")


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


def message_scope(
    principal: Principal,
    *,
    for_agent: bool,
    conversation_ids=None,
    before_message_id=None,
    roots: bool = False,
) -> Scope:
    """The SQL condition (on alias ``m``) of the messages the principal may find.

    Visibility is ``conversations_visible_to``; a fork's inherited messages belong to the
    conversation that owns them and are found there, once. ``roots``: the caller knows that
    none of ``conversation_ids`` is a fork (a local agent's conversation), so each one's
    view is its own messages, and its lineage is not read (a statement fewer).
    """
    visible_sql, visible_params = _visible_conversations_sql(principal)
    clauses, params = [], []
    if not for_agent:
        clauses.append("m.channel = %s AND m.visibility = %s")
        params += [Channel.HISTORY, Visibility.USER]
    if conversation_ids is not None:
        views = []
        # (those the principal sees: others have no view, as if they did not exist)
        # (The visibility clause below holds for a root too: one not seen has no rows.)
        lineages = (
            {c: [LineageStep(c, None)] for c in conversation_ids}
            if roots
            else conversation_lineages(conversation_ids, within=(visible_sql, visible_params))
        )
        for lineage in lineages.values():
            for step in lineage:
                if step.max_seq is None:
                    views.append("m.conversation_id = %s")
                    params.append(step.conversation_id)
                else:
                    views.append("(m.conversation_id = %s AND m.seq <= %s)")
                    params += [step.conversation_id, step.max_seq]
        clauses.append(f"({' OR '.join(views) or 'FALSE'})")
    # (the conditions on a visible conversation's turns: its own conversation is one)
    turns, turns_params = list(clauses), list(params)
    if before_message_id is not None:
        # Only a message the principal may see marks the place: another's message is "no
        # such message" like a random id, or the answer would tell that it exists.
        before_messages = messages_visible_to(principal).filter(id=before_message_id)
        if not for_agent:  # (an agent searching as a user would: the user's messages)
            before_messages = before_messages.filter(SEEN_BY_USERS)
        before = before_messages.values_list("seq", flat=True).first()
        if before is None:
            raise InvalidInput.for_field("before", "no such message")
        # (``+ 0``: no plan reads the whole service's older messages by their number to
        # find the principal's; the conversations' index reads them. A turn's neighbours
        # are read from that index, bounded by the place.)
        clauses.append("m.seq + 0 < %s")
        params.append(before)
        turns.append("m.seq < %s")
        turns_params.append(before)
    return Scope(
        " AND ".join([f"m.conversation_id IN ({visible_sql})", *clauses]),
        [*visible_params, *params],
        narrowed=conversation_ids is not None or before_message_id is not None,
        visible_sql=visible_sql,
        visible_params=tuple(visible_params),
        # Narrowed to some conversations, the scope names them: the principal's other
        # conversations, few or many, change nothing (and are not counted).
        few_sql=""
        if conversation_ids is not None
        else " AND ".join([f"m.conversation_id = ANY(ARRAY({visible_sql}))", *clauses]),
        view=message_scope(principal, for_agent=for_agent)
        if conversation_ids is not None or before_message_id is not None
        else None,
        turns_sql=" AND ".join(turns) or "TRUE",
        turns_params=tuple(turns_params),
    )


def embed_query_ahead(query: str) -> None:
    """Start embedding the query of a hybrid search the request makes once its other work
    is done (``engine.query_embedding``: the search then waits for this one): the vector is
    ready, or nearer, when the search needs it."""
    query_embedding(configured_backend().model, query, configured_tuning().unnamed_vector_share)


def search_messages(
    principal: Principal,
    *,
    query: str,
    top_k: int,
    mode: str = "hybrid",
    conversation_ids: list | None = None,
    before_message_id: uuid.UUID | None = None,
    for_agent: bool = False,
    tuning: SearchTuning | None = None,
    highlights: bool = True,
    roots: bool = False,
    citations: bool = True,
    exclusions: bool = False,
    min_relevance: float = 0.0,
) -> list[SearchHit]:
    """The ``top_k`` messages the principal may see that best answer ``query``; each with
    its ``highlights`` unless the caller shows none (they cost PostgreSQL a headline per
    hit). ``roots``: as ``message_scope`` says. ``citations`` False: the caller knows there
    are no memories to read for the turns they cite (not even a probe for them).
    ``exclusions`` and ``min_relevance``: as ``engine.ranked`` says."""
    tuning = tuning or configured_tuning()
    scope = message_scope(
        principal,
        for_agent=for_agent,
        conversation_ids=conversation_ids,
        before_message_id=before_message_id,
        roots=roots,
    )
    citing = None
    if citations and mode == "hybrid" and tuning.citation_weight and _citing is not None:
        citing = _citing(principal)
    return _hits(
        ranked(
            MESSAGES,
            scope,
            query,
            mode=mode,
            top_k=top_k,
            tuning=tuning,
            citing=citing,
            exclusions=exclusions,
            min_relevance=min_relevance,
        ),
        query if highlights else None,
    )


# A query's parts a hit's extract marks: a quoted phrase (its closing quote may be missing,
# as ``websearch_to_tsquery`` allows) or a word, either after the "-" of an exclusion.
_QUERY_TERM = re.compile(r'-?"[^"]*"?|\S+')
# What glues a query's words into one term where markup is read as words ("<i>budget</i>":
# a phrase of "i budget i", which a hit holding "budget" alone does not hold, so its
# extract was its first words, nothing marked; review): each word a term of its own.
_MARKUP_GLUE = re.compile(r"[<>/=]+")


def highlighted_terms(query: str) -> list[str]:
    """The parts of ``query`` a hit's extract marks, each on its own (``or``): all at once,
    an extract of a hit holding some of them only was its first words, none marked (the
    README's "highlights mark the matches"; review). Not its exclusions, which no hit
    holds, read as the search reads them (``queries.exclusions``: "-5 degrees" excludes
    nothing, and a query of exclusions alone is searched as written, its words marked). A
    quoted phrase's words each, as the keywords read them (a phrase is a bag of words to
    them: a hit holding "cake for the birthday", found and ranked by both words for
    '"birthday cake"', was marked on "cake" alone; review). PostgreSQL's highlighting costs about the product of the text's words and the query's
    (one message of 25,000 words and a query of 40: 9 s, while it held a web thread and a
    connection): it reads the first HEADLINE_CHARS of each hit, for each term once, and the
    terms are those of the query's keywords (``SearchTuning.query_words``, counted here with
    the stop words among them)."""
    asked, _excluded = queries.exclusions(query)
    terms = dict.fromkeys(
        part.lstrip("-")
        for term in _QUERY_TERM.findall(asked.lower())
        for word in term.lstrip("-").strip('"').split()
        for part in _MARKUP_GLUE.split(word)
    )
    return [term for term in terms if term and term != "or"][: 2 * configured_tuning().query_words]


def _hits(ranked: list[tuple], query: str | None) -> list[SearchHit]:
    """The ranked messages, each with its highlights of ``query`` (None: none)."""
    if not ranked:
        return []
    ids = [i for i, _ in ranked]
    terms = [] if query is None else highlighted_terms(query)
    if query is None:
        messages = Message.objects.raw(_HITS_SQL.format(headline="NULL"), [ids])
    else:
        words = websearch_text(" or ".join(terms))
        messages = Message.objects.raw(
            _HITS_SQL.format(headline=_HEADLINE),
            [TEXT_SEARCH_CONFIG, HEADLINE_CHARS, TEXT_SEARCH_CONFIG, words, _HEADLINE_OPTIONS, ids],
        )
    by_id = {message.id: message for message in messages}
    hits = [
        SearchHit(
            message=by_id[i],
            score=round(score, 6),
            headline=by_id[i].headline,
        )
        for i, score in ranked
        if i in by_id
    ]
    if terms:
        _extracts_further_in(hits, terms, words)
    return hits


# A term that begins with a CJK character: a word of its own wherever it is written.
_CJK = re.compile(f"[{CJK_CHARACTERS}]")
# The words of a query's terms as PostgreSQL's parser parts them ("zebra?", "connect_timeout").
_WORD_PART = re.compile(r"[^\W_]+")
# An extract read further in a long text begins this many characters before the word found.
HEADLINE_LEAD_CHARS = 200
# The places of a long text read again (``_extracts_further_in``) at most, per hit.
FURTHER_IN_TRIES = 3


def _extracts_further_in(hits: list[SearchHit], terms: list[str], words: str) -> None:
    """The extracts of texts longer than HEADLINE_CHARS whose first HEADLINE_CHARS hold no
    match (found by words further in, the extract was the text's first words, none marked,
    or nothing; review), read again from a little before a word that begins with one of
    ``terms`` (any case; after a character that is no letter or digit, as PostgreSQL's
    parser parts words: "connect_timeout" holds "timeout"): the first place of each of up to
    ``FURTHER_IN_TRIES`` terms, stop words aside (one begins nearly every sentence), in one
    statement for all, only for such hits; the first place marked is kept. A term the text
    holds only in another form ("cities" for its "city", "koln" for its "Köln") is not
    looked for: that extract stays the first words."""
    unmarked = [
        hit
        for hit in hits
        if hit.headline is not None
        and "<b>" not in hit.headline
        and len(hit.message.content) > HEADLINE_CHARS
    ]
    looked_for = [
        word
        for word in dict.fromkeys(_WORD_PART.findall(" ".join(terms)))
        if len(word) > 1 and word not in queries.STOP_WORDS
    ]
    if not unmarked or not looked_for:
        return
    places = [
        (
            re.compile(
                re.escape(term) if _CJK.match(term) else rf"(?<![^\W_]){re.escape(term)}",
                re.IGNORECASE,
            ),
            HEADLINE_CHARS - len(term),  # (one that ends past the first part)
        )
        for term in looked_for
    ]
    tries = []  # (hit, where its part begins, the part)
    for hit in unmarked:
        content = hit.message.content
        found = sorted(
            place.start()
            for pattern, past in places
            for place in itertools.islice(pattern.finditer(content, past), FURTHER_IN_TRIES)
        )
        starts = []  # (each past the part before it, which holds no match if it is read)
        for place in found:
            if len(starts) < FURTHER_IN_TRIES and (
                not starts or place >= starts[-1] + HEADLINE_CHARS
            ):
                starts.append(max(0, place - HEADLINE_LEAD_CHARS))
        tries += [(hit, start, content[start : start + HEADLINE_CHARS]) for start in starts]
    if not tries:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            _FURTHER_IN_SQL,
            [
                TEXT_SEARCH_CONFIG,
                TEXT_SEARCH_CONFIG,
                words,
                _HEADLINE_OPTIONS,
                [part for _, _, part in tries],
            ],
        )
        headlines = [headline for (headline,) in cursor.fetchall()]
    marked = set()
    for (hit, start, _), headline in zip(tries, headlines, strict=True):
        if "<b>" in headline and id(hit) not in marked:
            marked.add(id(hit))
            hit.headline, hit.headline_from = headline, start


_FURTHER_IN_SQL = f"""
SELECT ts_headline(%s::regconfig, {WORDS_SQL.format("part")},
    websearch_to_tsquery(%s::regconfig, %s), %s)
FROM unnest(%s::text[]) WITH ORDINALITY AS parts(part, n) ORDER BY n
"""


# The found messages, each with a highlighted extract: the columns the APIs show, in one
# fixed statement (compiling it per search as a queryset cost about a millisecond).
_HITS_SQL = f"""
SELECT {", ".join(field.column for field in Message.shown_fields())}, {{headline}} AS headline
FROM message WHERE id = ANY(%s)
"""
# (Of the text as the words index reads it, ``WORDS_SQL``, so that a match inside a CJK run
# is marked too; ``headline_as_written`` gives it back as written.)
_HEADLINE = (
    f"ts_headline(%s::regconfig, {WORDS_SQL.format('left(content, %s)')},"
    " websearch_to_tsquery(%s::regconfig, %s), %s)"
)
HEADLINE_CHARS = 4000
# ``ShortWord=0``: no word is too short to end an extract (by default one of up to 3
# letters is cut from its ends: an extract of Chinese or Japanese, a word a character, was
# the match alone).
_HEADLINE_OPTIONS = (
    "MaxFragments=2, MaxWords=20, MinWords=5, ShortWord=0, StartSel=<b>, StopSel=</b>"
)
