"""Small database expressions shared by the models of every app, and ``beside``."""

import contextlib
import functools
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import psycopg
from django.conf import settings
from django.contrib.postgres.operations import AddIndexConcurrently
from django.contrib.postgres.search import SearchQuery, SearchVector, SearchVectorField
from django.db import (
    DEFAULT_DB_ALIAS,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
    migrations,
    models,
)
from django.db.models import Q
from django.db.models.lookups import Exact
from django.db.models.sql import Query
from pgvector.django import HnswIndex
from psycopg import errors

from memsvc.api.errors import NotFound
from memsvc.api.principals import agent_uuid_of
from memsvc.outage import Reminder
from memsvc.text import DEFAULT_IGNORABLE, query_read

logger = logging.getLogger(__name__)

# What a background task tries again: the database did not answer (restarting, a
# connection dropped), or chose it to end a deadlock; nothing it wrote was kept. Such tasks
# were dropped: messages waited for the sweep a minute or more, a tool record kept its
# fallback summary for good (review).
DATABASE_DID_NOT_ANSWER = (OperationalError, InterfaceError)


# The database being gone (``database_gone``) said by a process once a minute, whatever
# meets it (a request, an MCP tool's call), not by each: some 115 lines a refused request
# with its traceback, 11,400 in an outage of 7 s (review).
DATABASE_GONE_SAID = Reminder()


def database_gone(exception) -> bool:
    """Whether ``exception`` is the database not being there (refused, broken, or not
    answering a new connection in time: an outage every request meets), not a statement's
    own failure (psycopg's other subclasses of its ``OperationalError``: a statement's
    timeout, a deadlock). (A connection's timeout was a statement's: each request of a
    frozen database logged its traceback, and waited for a second connection; review.)"""
    cause = exception.__cause__
    return isinstance(exception, InterfaceError) or type(cause) in (
        psycopg.OperationalError,
        psycopg.InterfaceError,
        errors.ConnectionTimeout,
    )


def not_migrated(exc: Exception) -> bool:
    """Whether a statement failed for a table memsvc's migrations make: a database not (or
    not fully) migrated, which the command line and health say in words."""
    return isinstance(exc.__cause__, errors.UndefinedTable)


def json_is_object(field: str, name: str) -> models.CheckConstraint:
    """A check constraint: the JSON column ``field`` holds an object (not a list or a scalar)."""
    return models.CheckConstraint(
        condition=Exact(
            models.Func(models.F(field), function="jsonb_typeof", output_field=models.TextField()),
            "object",
        ),
        name=name,
    )


def embedding_index(name: str) -> HnswIndex:
    """The HNSW index (cosine) on a table's ``embedding`` column, built alike for every
    corpus search reads."""
    return HnswIndex(
        name=name, fields=["embedding"], m=16, ef_construction=64, opclasses=["vector_cosine_ops"]
    )


# The text search configuration of every words index and every query of one: english
# stemming and stop words, accents folded (``unaccent``: "cafe" finds "café", "Zoe"
# finds "Zoë"). Made by ``conversations`` migration 0011, with ``memsvc_words``.
TEXT_SEARCH_CONFIG = "memsvc"
# A text as the words index reads it (SQL, ``{}`` the text): each Chinese character, kana
# and CJK symbol a word of its own. PostgreSQL's parser takes a run of them, written
# without spaces, for one word: "東京" was found only as a whole message's text.
WORDS_SQL = "memsvc_words({})"
# The characters ``memsvc_words`` parts (as its migration writes them; a test holds the two
# alike). Hangul is left whole: Korean separates its words with spaces.
CJK_CHARACTERS = (
    "\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
    "\U00020000-\U0003ffff"  # (the rarer characters, beyond the first 65,536)
)
_CJK_RUN = re.compile(f"[{CJK_CHARACTERS}]+")


# What ``memsvc_words`` gives the parser for each "<" (conversations migration 0012): a
# noncharacter, never in a text people exchange, and a blank to the parser. PostgreSQL's
# parser takes "<" for the start of markup and skips what looks like a tag ("<div>", the
# "b and c" of "a<b and c>d") and all that follows an unclosed "<script" or "<style".
MARKUP_STAND_IN = "\ufdd0"
# The same translation as ``memsvc_words``': a text that holds the stand-in itself has a
# U+FFFD in its place, never read back as a "<" (a highlight showed "<script>" that the
# text never held; review).
_WORDS_TRANSLATION = str.maketrans({"<": MARKUP_STAND_IN, MARKUP_STAND_IN: "\ufffd"})


def words_read(text: str) -> str:
    """``text`` as ``memsvc_words`` reads it before it spaces CJK characters (conversations
    migration 0015): ``_WORDS_TRANSLATION``, and the default-ignorable characters, which
    draw nothing, left out ("infor\u00admation" is the word it shows; review)."""
    return DEFAULT_IGNORABLE.sub("", text.translate(_WORDS_TRANSLATION))


# A CJK character as ``memsvc_words`` spaces it, and as a highlight may mark it.
_SPACED_CJK = re.compile(f" ?(<b>)?([{CJK_CHARACTERS}])(</b>)? ?")


def words_unspaced(text: str) -> str:
    """A text ``memsvc_words`` spaced, back as it was written: the one space it put on each
    side of a CJK character taken away (its marks, a highlight's ``<b>``, kept). The spaces
    the text had stay."""
    return _SPACED_CJK.sub(r"\1\2\3", text) if _CJK_RUN.search(text) else text


# A highlight's marks, and what ``ts_headline`` puts between two extracts of one text.
_MARKS = re.compile("(</?b>)")
FRAGMENT_DELIMITER = " ... "


def headline_as_written(headline: str, content: str) -> str:
    """``ts_headline``'s extract of ``memsvc_words(content)`` as ``content`` is written: the
    spaces put around CJK characters taken away (``words_unspaced``, extract by extract: the
    space before a delimiter was taken for one), and the characters the words index leaves
    out (``words_read``: an emoji's zero-width joiner and variation selector, a Persian
    zero-width non-joiner) put back where the text has them (the family emoji showed as
    three; review). Its marks (``<b>``) kept, the text's own "<" still ``MARKUP_STAND_IN``:
    the only ``<b>`` are the marks."""
    extracts = [words_unspaced(extract) for extract in headline.split(FRAGMENT_DELIMITER)]
    written = content.translate(_WORDS_TRANSLATION)
    if not DEFAULT_IGNORABLE.search(content):
        return FRAGMENT_DELIMITER.join(_from_word_starts(extracts, written))
    # ``read``: the text as the index reads it; ``at[i]``: where its i-th character is
    # written (and, last, the text's end).
    read = words_read(content)
    at = [i for i, character in enumerate(written) if not DEFAULT_IGNORABLE.match(character)]
    at.append(len(written))
    shown, place, first = [], 0, 0
    while first < len(extracts):
        # An extract, found whole as the index reads the text (the first place of a run of
        # text the text repeats lent its characters to the second: review); or several,
        # when the text itself holds the delimiter.
        for last in range(first, len(extracts)):
            marked = FRAGMENT_DELIMITER.join(extracts[first : last + 1])
            start = read.find(_MARKS.sub("", marked), place)
            if start >= 0:
                break
        else:  # (not found as read: shown as the headline has it)
            shown.append(extracts[first])
            first += 1
            continue
        pieces = []
        for piece in _MARKS.split(marked):
            if _MARKS.fullmatch(piece):
                pieces.append(piece)
            else:
                pieces.append(written[at[start] : at[start + len(piece)]])
                start += len(piece)
        shown.append("".join(pieces))
        place, first = start, last + 1
    return FRAGMENT_DELIMITER.join(_from_word_starts(shown, written))


# How far back an extract reaches for the start of the word it begins inside.
_WORD_START_REACH = 30


def _from_word_starts(extracts: list[str], written: str) -> list[str]:
    """Each extract (marked) of ``written`` begun where its first word is written: the
    parser's word may start inside it ("s 10 weeks" of "She's 10 weeks", "4,500" of
    "€4,500", "see below)" of "(see below)": reviews). A CJK character is a word of its
    own; an extract not found as written is left as it is."""
    place = 0
    for index, extract in enumerate(extracts):
        plain = _MARKS.sub("", extract)
        start = written.find(plain, place)
        if start < 0:
            continue
        begin = start
        while (
            begin > 0
            and start - begin < _WORD_START_REACH
            and not written[begin - 1].isspace()
            and not _CJK_RUN.match(written[begin - 1])
        ):
            begin -= 1
        extracts[index] = written[begin:start] + extract
        place = start + len(plain)
    return extracts


def websearch_text(text: str) -> str:
    """``text`` for ``websearch_to_tsquery``, its words as the words index reads them: a "<"
    no markup's start (``MARKUP_STAND_IN``); a run of "-" one (``memsvc.text.query_read``); a run of
    CJK characters a quoted phrase of them, one word
    each ("-東京" excludes the texts holding 東 then 京, as "-Tokyo" those holding Tokyo),
    spaced within a quoted phrase."""
    text = query_read(text.translate(_WORDS_TRANSLATION))
    pieces, quoted, start = [], False, 0
    for match in _CJK_RUN.finditer(text):
        before = text[start : match.start()]
        if before.count('"') % 2:  # (a quote opened or closed since the last run)
            quoted = not quoted
        characters = " ".join(match.group())
        pieces += [before, f" {characters} " if quoted else f'"{characters}"']
        start = match.end()
    return "".join([*pieces, text[start:]])


class Words(models.Func):
    """``WORDS_SQL`` as an expression (a generated column's)."""

    function = "memsvc_words"
    output_field = models.TextField()


def words_column(*parts) -> models.GeneratedField:
    """A ``search_vector`` column: the words of ``parts`` (expressions, joined as given)."""
    return models.GeneratedField(
        expression=SearchVector(
            Words(models.functions.Concat(*parts, output_field=models.TextField())),
            config=TEXT_SEARCH_CONFIG,
        ),
        output_field=SearchVectorField(),
        db_persist=True,
    )


def words_query(text: str) -> SearchQuery:
    """The rows whose ``search_vector`` holds ``text``'s words, as a person types them
    (``websearch_to_tsquery``: "quoted phrases", ``or``, ``-word``): the admin's search."""
    return SearchQuery(websearch_text(text), search_type="websearch", config=TEXT_SEARCH_CONFIG)


def embedding_has_model(name: str) -> models.CheckConstraint:
    """A vector is never stored without the model (and the time) that made it: vectors of
    two models are never compared by mistake."""
    return models.CheckConstraint(
        condition=Q(embedding__isnull=True)
        | (Q(embedded_at__isnull=False) & ~Q(embedding_model="")),
        name=name,
    )


def words_column_replaced(model_name: str, field: models.GeneratedField, index) -> list:
    """A migration's steps: the ``search_vector`` column of ``model_name`` made again as
    ``field`` (``words_column``) and ``index``, its words index, built again on it.
    PostgreSQL before 17 cannot change a generated column's expression: the column is
    dropped (its index with it) and added again, which rewrites the table once."""
    return [
        migrations.RemoveIndex(model_name=model_name, name=index.name),
        migrations.RemoveField(model_name=model_name, name="search_vector"),
        migrations.AddField(model_name=model_name, name="search_vector", field=field),
        migrations.AddIndex(model_name=model_name, index=index),
    ]


def index_added_concurrently(model_name: str, index: models.Index) -> list:
    """A migration's steps (``atomic = False``): ``index`` built without holding writes to the
    table (``CREATE INDEX CONCURRENTLY``), after dropping an index of its name that a failed
    or interrupted build left behind, INVALID: the migration, run again, failed with
    "already exists" (code review)."""
    return [
        migrations.RunSQL(
            f'DROP INDEX CONCURRENTLY IF EXISTS "{index.name}"', reverse_sql=migrations.RunSQL.noop
        ),
        AddIndexConcurrently(model_name=model_name, index=index),
    ]


def foreign_key_unindexed(
    model_name: str, name: str, *, to: str, related_name: str, table: str, index: str
) -> migrations.SeparateDatabaseAndState:
    """A migration's step: the foreign key ``name`` (on delete, cascade) becomes
    ``db_index=False`` (an index of several columns starts with it) and loses ``index``, the
    one Django made for it, and nothing else. Django's own ``AlterField`` drops and re-adds
    the constraint, checking every row again, and drops every other index on that column
    alone (a partial unique one too). Not ``CONCURRENTLY``: dropping an index takes a moment
    under a lock of the table, where the concurrent form waits, twice, for every
    transaction that touches it."""
    field = models.ForeignKey(
        db_index=False, on_delete=models.CASCADE, related_name=related_name, to=to
    )
    return migrations.SeparateDatabaseAndState(
        state_operations=[migrations.AlterField(model_name=model_name, name=name, field=field)],
        database_operations=[
            migrations.RunSQL(
                f'DROP INDEX IF EXISTS "{index}"',
                reverse_sql=f'CREATE INDEX IF NOT EXISTS "{index}" ON "{table}" ("{name}_id")',
            )
        ],
    )


def locked_row(
    queryset: models.QuerySet,
    pk,
    *,
    missing: str,
    no_key: bool = False,
    kept_as: str | None = None,
) -> models.Model:
    """Row ``pk`` of ``queryset`` as it is now, locked (FOR UPDATE; ``no_key``: FOR NO KEY
    UPDATE, the lock an update of no key column takes, which lets rows that refer to it be
    written meanwhile) until the caller's transaction ends; ``NotFound(missing)`` when it is
    gone: deleted by a concurrent request since the caller read it (a PATCH racing a DELETE
    is a 404, not a failed save). ``kept_as``: its SQL compiled once under that name
    (``compiled_once``), for a lock taken by every request of a kind (an append's)."""

    def locking():
        return queryset.select_for_update(no_key=no_key).filter(pk=pk)

    if kept_as is None:
        row = locking().first()
    else:
        row = next(iter(compiled_once(kept_as, lambda: locking()[:1], [pk])), None)
    if row is None:
        raise NotFound(missing)
    return row


def lock_name(*parts, shared: bool = False) -> None:
    """Hold a lock on the name ``parts`` make until the caller's transaction ends (a
    transaction-level advisory lock): writers of the same name take turns, others pass.
    ``shared``: held at once by every holder that shares it, while one that holds it alone
    (not shared) waits for them all, and they for it."""
    lock_names([parts], shared=shared)


def lock_key(*parts) -> str:
    """The name of the advisory lock of ``parts`` (what PostgreSQL hashes to its key,
    ``hashtextextended(name, 0)``): the transaction's of ``lock_names``, and the session's
    of the embedding claims (``search.services.claim_name``), one key space."""
    return "\x1f".join(str(part) for part in parts)


def lock_names(names, *, shared: bool = False) -> None:
    """``lock_name`` of each of ``names`` (each a tuple of parts), in one statement, in
    their order as text (the same whoever takes several)."""
    keys = sorted({lock_key(*parts) for parts in names})
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {function}(hashtextextended(name, 0)) FROM unnest(%s::text[]) AS name",  # noqa: S608 (one of two names)
            [keys],
        )


def hold_users(user_ids: Iterable[str], *, alone: bool = False) -> None:
    """Writes about a user take turns with that user's erase
    (``agents_api.services.user_erase``). A write holds the users it writes about until it
    commits, shared with the other writes about them; the erase holds its user ``alone``: it
    waits for the writes in flight, and takes what they wrote; one that comes later waits for
    the erase, then writes anew (or finds what it needed gone with them). First in a
    transaction, before any other lock: the erase takes this before any of its own, so it
    never waits for one a waiting write holds. One statement; nothing for an agent's own
    ("") or an agent (``agent:<id>``), whom no user's erase concerns."""
    names = [("user", user_id) for user_id in user_ids if user_id and not agent_uuid_of(user_id)]
    if names:
        lock_names(names, shared=not alone)


def held_keys(model: type[models.Model], pks) -> set:
    """Which of ``pks`` (rows of ``model``) still exist, each held until the caller's
    transaction ends (FOR KEY SHARE: the lock a foreign key to it takes at commit, taken
    before the rows pointing at it are written). A deletion in flight ends first, and its
    rows are missing here; one that comes later waits. The caller refuses what is missing,
    rather than a foreign key violated at commit (a 500). Rows are held in id order, the
    order a deletion of several locks them in (``conversations.services._lock_messages``),
    so that neither holds one the other waits for while it waits."""
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT id FROM "{table}" WHERE id = ANY(%s) ORDER BY id FOR KEY SHARE',  # noqa: S608 (a model's table)
            [list(pks)],
        )
        return {pk for (pk,) in cursor.fetchall()}


# name -> (model, SQL) of ``compiled_once``
_COMPILED_SQL: dict[str, tuple[type[models.Model], str]] = {}


def compiled_once(
    name: str, queryset: Callable[[], models.QuerySet], params: list
) -> Iterable[models.Model]:
    """The rows (as model instances) of the queryset that ``queryset()`` makes, its SQL
    compiled by the ORM once per process and kept under ``name``: making and compiling a
    small queryset costs more than running it (0.2-0.4 ms of Python, on every request that
    reads an agent or its blocks), so once its SQL is kept the queryset is not even made.
    For a queryset whose SQL is the same text every time (no lists of varying length, no
    optional filters), with ``params`` its parameters in the order its SQL takes them; if
    the first compile shows other parameters, nothing is kept (slower, never wrong)."""
    kept = _COMPILED_SQL.get(name)
    if kept is None:
        made = queryset()
        sql, compiled = made.query.sql_with_params()
        if list(compiled) != list(params):
            return made
        kept = _COMPILED_SQL[name] = (made.model, sql)
    model, sql = kept
    return kept_rows(name, model, sql, params)


class _Reader:
    """How the rows of one statement become ``model`` instances, as ``RawQuerySet`` makes
    them (its columns that are the model's fields, the fields' converters, the other
    columns set as attributes), worked out once: ``RawQuerySet`` works it out again at
    every query, as much Python as reading the row."""

    def __init__(self, model: type[models.Model], columns: tuple[str, ...]):
        fields = {field.column: field for field in model._meta.concrete_fields}
        self.model = model
        self.columns = columns
        # In the model's order of fields, as ``Model.from_db`` takes them (a statement may
        # name its columns in another: ``SELECT a.*`` has the table's); a column named
        # twice is read where it first comes, as ``RawQuerySet`` reads it.
        chosen = [
            (field.attname, columns.index(field.column))
            for field in model._meta.concrete_fields
            if field.column in columns
        ]
        self.field_names = [name for name, _ in chosen]
        self.field_positions = [pos for _, pos in chosen]
        self.others = [(column, pos) for pos, column in enumerate(columns) if column not in fields]
        self.compiler = connection.ops.compiler("SQLCompiler")(
            Query(model), connection, DEFAULT_DB_ALIAS
        )
        table = model._meta.db_table
        self.converters = self.compiler.get_converters(
            [fields[column].get_col(table) if column in fields else None for column in columns]
        )

    def instances(self, rows: list[tuple]) -> list[models.Model]:
        if self.converters:
            rows = self.compiler.apply_converters(rows, self.converters)
        instances = []
        for values in rows:
            instance = self.model.from_db(
                DEFAULT_DB_ALIAS, self.field_names, [values[pos] for pos in self.field_positions]
            )
            for column, pos in self.others:
                setattr(instance, column, values[pos])
            instances.append(instance)
        return instances


# name -> its statement's ``_Reader`` (``kept_rows``)
_READERS: dict[str, _Reader] = {}


def kept_rows(name: str, model: type[models.Model], sql: str, params: list) -> list[models.Model]:
    """``model.objects.raw(sql, params)``'s instances, for a statement whose SQL is the same
    text every time (``name`` names it; its columns are read once, ``_Reader``)."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        columns = tuple(column.name for column in cursor.description)
        reader = _READERS.get(name)
        # (Read again if its columns changed: a migration changed those of a ``SELECT a.*``.)
        if reader is None or reader.columns != columns:
            reader = _READERS[name] = _Reader(model, columns)
        return reader.instances(cursor.fetchall())


T = TypeVar("T")

# Threads of ``beside``, per process (one for each request a web process serves at once,
# ``WEB_REQUEST_THREADS``), each keeping its own database connection.
_beside_pool: ThreadPoolExecutor | None = None
_beside_lock = threading.Lock()


@contextlib.contextmanager
def beside(work: Callable[..., T], /, *args, **kwargs) -> Iterator[Callable[[], T]]:
    """``work(*args, **kwargs)`` started on a thread of its own, with a database connection
    of its own, while the caller goes on with its own statements inside the ``with`` block:
    the two wait for PostgreSQL at once (a context request's memory search beside its
    message search). The block is given what returns the work's result, or raises its
    exception.

    The work never outlives the block: leaving it (on an error of the caller's too) cancels
    work not started yet and waits for work under way, whose error, if nobody asked for its
    result, is logged. A request's work beside it thus ends with the request, and holds no
    thread or connection after its answer.

    For reads that need nothing the caller has written: inside a transaction (the
    caller's, a test's), whose writes another connection does not see, the work runs in
    the caller's thread, when its result is asked for."""
    global _beside_pool
    if connection.in_atomic_block:
        yield functools.partial(work, *args, **kwargs)
        return
    with _beside_lock:
        if _beside_pool is None:
            _beside_pool = ThreadPoolExecutor(
                settings.WEB_REQUEST_THREADS, thread_name_prefix="beside"
            )
    future = _beside_pool.submit(_as_a_request, work, args, kwargs)
    asked = []

    def result() -> T:
        asked.append(True)
        return future.result()

    try:
        yield result
    finally:
        if not future.cancel():
            futures.wait([future])
            if not asked and future.exception() is not None:
                logger.error(
                    "work beside a request failed, its result never asked for",
                    exc_info=future.exception(),
                )


def _as_a_request(work: Callable[..., T], args: tuple, kwargs: dict) -> T:
    with like_a_request():
        return work(*args, **kwargs)


@contextlib.contextmanager
def like_a_request() -> Iterator[None]:
    """Database work on a long-lived thread of one's own (not a request's), bracketed as
    Django brackets a request: the thread's connection kept from one piece of work to the
    next, and dropped once broken or too old (``CONN_MAX_AGE``)."""
    close_old_connections()
    try:
        yield
    finally:
        close_old_connections()
