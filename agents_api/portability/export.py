"""Reads: an export document as text, streamed a batch of records at a time.

``GET /v1/user/export`` and ``memsvc export`` write the same document. The whole of it is
never in memory: each section is read with a server-side cursor and written ``BATCH``
records at a time, so 10,000 messages cost what 500 do.
"""

import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone
from rest_framework import serializers

from agents_api.portability.records import AgentRecord, Record

FORMAT = "memsvc-export"
VERSION = 1
BATCH = 500
_TIME = serializers.DateTimeField()  # times written as the records write theirs


@dataclass(frozen=True)
class Section:
    """One kind of record of a document: its key, its shape, whose rows it holds (for the
    subject of the document: a user id, or an agent), and how an import puts them back."""

    name: str
    record: type[Record]
    rows: Callable[[Any], Iterable]  # a queryset in a stable order
    # (subject, validated records) -> how many were stored; the others were skipped.
    restore: Callable[[Any, list[dict]], int]
    # (subject, a batch of rows) -> the rows as the document shows them to its subject.
    shown: Callable[[Any, list], Sequence] = lambda subject, rows: rows


def user_header(user_id: str) -> dict:
    return {"format": FORMAT, "version": VERSION, "kind": "user", "userId": user_id}


def agent_header(agent) -> dict:
    return {"format": FORMAT, "version": VERSION, "kind": "agent", "agent": AgentRecord(agent).data}


def _json(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _batches(rows: Iterable, size: int) -> Iterator[list]:
    iterator = iter(rows)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def document_chunks(header: dict, sections: list[Section], subject) -> Iterator[str]:
    """The document (``header`` and ``exportedAt``, then each section) as pieces of text.

    Read in one snapshot (REPEATABLE READ): a message appended meanwhile is in every
    section or in none. A reader that stops early ends the transaction (generator close).
    """
    snapshot = not connection.in_atomic_block  # (a test's transaction is its snapshot)
    with transaction.atomic():
        if snapshot:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        opening = _json({**header, "exportedAt": _TIME.to_representation(timezone.now())})
        yield opening[:-1]
        for section in sections:
            yield f",{_json(section.name)}:["
            # One serializer for the section: a serializer per batch would be garbage with
            # cycles (fields and their parent), kept until a full collection.
            record = section.record()
            separator = ""
            for batch in _batches(section.rows(subject).iterator(chunk_size=BATCH), BATCH):
                rows = section.shown(subject, batch)
                yield separator + ",".join(_json(record.to_representation(row)) for row in rows)
                separator = ","
            yield "]"
        yield "}\n"
