"""Rows copied straight into the ``message`` table (binary COPY), in the model's columns.

The columns are the concrete fields of ``conversations.models.Message``, but for those
PostgreSQL fills itself (``seq`` from its sequence, the generated ``search_vector``); their
binary types are the table's, read from the catalogue. The caller gives a value for each
column it cares about, by name; every other column gets the model's default, as
``Message.objects.create`` would write it, and a column with neither a default nor NULL
allowed stops the copy before its first row, naming the column. So a column added to the model
can neither shift the values of a hand-kept list nor be left out of the copy unnoticed.
"""

import itertools
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql

from bench.common import BenchError, private_env


def setup_django(conn: psycopg.Connection, data_dir: Path) -> None:
    """Set Django up in this process, to read the models, with the settings of the private
    server in ``data_dir`` and its database (``conn``'s).

    The database is given as ``DATABASE_URL`` (with ``MEMSVC_LOCAL_MODE`` for the data
    directory's secrets), not left to the embedded server's own start-up: that would make
    this process one of the server's holders and keep PostgreSQL running after
    ``memsvc serve`` stops. The environment is restored afterwards: settings read it once.
    Logging is set to warnings (see below).
    """
    import django

    saved = dict(os.environ)
    try:
        os.environ.update(private_env(data_dir))
        os.environ["DATABASE_URL"] = (
            f"postgres://{quote(conn.info.user)}@{quote(conn.info.host, safe='')}:"
            f"{conn.info.port}/{quote(conn.info.dbname)}"
        )
        os.environ["MEMSVC_LOCAL_MODE"] = "1"
        # Django's logging settings give the root logger a handler; at INFO every request
        # of the benchmark's HTTP client would be printed.
        os.environ["MEMSVC_LOG_LEVEL"] = "WARNING"
        os.environ["DJANGO_SETTINGS_MODULE"] = "memsvc.settings"
        django.setup()
    finally:
        os.environ.clear()
        os.environ.update(saved)


class MessageCopy:
    """How rows go into ``message`` by binary COPY: ``statement`` and ``types`` for
    ``cursor.copy``, then ``rows(values)`` to write. Django must be set up
    (``setup_django``)."""

    def __init__(self, conn: psycopg.Connection):
        from django.db.models import NOT_PROVIDED

        from conversations.models import Message

        self.table = Message._meta.db_table
        self.fields = [
            field
            for field in Message._meta.concrete_fields
            if not field.generated and field.db_default is NOT_PROVIDED
        ]
        self.columns = [field.column for field in self.fields]
        type_oids = dict(
            conn.execute(
                "SELECT attname, atttypid::int FROM pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
                [self.table],
            ).fetchall()
        )
        missing = [column for column in self.columns if column not in type_oids]
        if missing:
            raise BenchError(f"table {self.table} has no column {missing}: migrations not run?")
        self.types = [type_oids[column] for column in self.columns]

    @property
    def statement(self) -> sql.Composed:
        return sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT BINARY)").format(
            sql.Identifier(self.table),
            sql.SQL(", ").join(sql.Identifier(column) for column in self.columns),
        )

    def rows(self, values: Iterable[Mapping[str, object]]) -> Iterator[list]:
        """Each of ``values`` (a row's values by column name) as a row in ``columns`` order,
        the model's defaults in the columns it does not give. Every row must give the same
        columns as the first."""
        from django.db import connection

        values = iter(values)
        first = next(values, None)
        if first is None:
            return
        given = first.keys()
        unknown = given - set(self.columns)
        if unknown:
            raise BenchError(f"the Message model has no column {sorted(unknown)} to copy into")
        no_default = [
            field.column
            for field in self.fields
            if field.column not in given and not field.has_default() and not field.null
        ]
        if no_default:
            raise BenchError(
                f"message.{', '.join(no_default)} has no default and allows no NULL: "
                "give the copied rows a value for it"
            )
        given = frozenset(given)
        # A default is made again for each row: it may be a callable (uuid4, now).
        plan = [
            (field.column, field if field.column not in given else None) for field in self.fields
        ]
        for row in itertools.chain([first], values):
            if row.keys() != given:
                raise BenchError(f"a copied row gives {sorted(row)}, the first {sorted(given)}")
            yield [
                row[column]
                if field is None
                else field.get_db_prep_save(field.get_default(), connection)
                for column, field in plan
            ]
