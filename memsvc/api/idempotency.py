"""The ``Idempotency-Key`` request header of the creates a client may send again when their
answer was lost: messages (the user API's ``POST .../messages``, the agent API's bulk
append, the local API's ``POST /messages``), conversations and forks, summaries, and tool
records (``POST /v1/agent/tool-records``, the local API's ``POST /tool-records``). A retry
with the same key gets the first request's rows back and writes nothing (``write_once``;
``created_once`` for a view's create of one row; the keys kept in
``memsvc.models.IdempotentRequest``, one store for every API)."""

import hashlib
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

from django.db import connection, transaction
from django.db.models import Model, QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter

from memsvc.api.errors import Conflict, InvalidInput
from memsvc.api.fields import header_text
from memsvc.api.principals import Principal
from memsvc.models import IDEMPOTENCY_KEY_MAX_LENGTH, IdempotentRequest

KEY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"


# A create that a retry may repeat (its answer lost): the header, and the answer's mark.
IDEMPOTENCY_PARAMETERS = [
    OpenApiParameter(
        KEY_HEADER,
        {"type": "string", "minLength": 1, "maxLength": IDEMPOTENCY_KEY_MAX_LENGTH},
        location=OpenApiParameter.HEADER,
        description="A retry with the same key returns the first result, writing nothing; "
        "409 when the key was used for another request, or when what it wrote has been "
        "deleted since (wholly or in part). UTF-8 text, given once (400 otherwise, and when "
        "empty).",
    ),
    OpenApiParameter(
        REPLAYED_HEADER,
        {"type": "string", "enum": ["true"]},
        location=OpenApiParameter.HEADER,
        response=[201, 202],
        description="Set on the answer to a retry: the first request's result, again.",
    ),
]


def idempotency_key(request) -> str | None:
    """The request's key, or None when it sends none; 400 when it is empty, given twice or
    not UTF-8 (``header_text``): taken as none, or as the two joined, a client's retry
    was not the retry it meant (review)."""
    key = header_text(request, KEY_HEADER)
    if key == "":
        raise InvalidInput.for_field(KEY_HEADER, "must not be empty", location="header")
    return key


def request_fingerprint(*parts) -> str:
    """What a retry with the same key must repeat, as one hash: ``parts`` as canonical JSON."""
    canonical = json.dumps(list(parts), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def marked_replayed(response, created: bool):
    """``response``, saying so (``Idempotent-Replayed: true``) when it answers a retry."""
    if not created:
        response[REPLAYED_HEADER] = "true"
    return response


Row = TypeVar("Row", bound=Model)

# How long an Idempotency-Key is remembered: a retry comes within minutes or hours; kept
# forever, every keyed write would leave a row behind for good. (The daily prune.)
IDEMPOTENCY_KEY_TTL = timedelta(days=7)


def idempotency_keys_prune(*, now: datetime | None = None) -> int:
    """Forget the keys of requests older than ``IDEMPOTENCY_KEY_TTL``; how many."""
    now = now or timezone.now()
    deleted, _ = IdempotentRequest.objects.filter(created_at__lt=now - IDEMPOTENCY_KEY_TTL).delete()
    return deleted


def idempotency_keys_forget(principal_id: str) -> int:
    """Forget every key ``principal_id`` sent (their erase: a key's record holds a hash of
    what they sent, and the ids of what it made); how many."""
    deleted, _ = IdempotentRequest.objects.filter(principal_id=principal_id).delete()
    return deleted


def write_once(
    actor: Principal,
    idempotency_key: str | None,
    request_hash: str,
    write: Callable[[], list[Row]],
    rows: QuerySet[Row],
    *,
    kind: str,
) -> tuple[list[Row], bool]:
    """``write()``, once per ``idempotency_key`` of ``actor``: a retry gets the rows the
    first request wrote (of ``rows``, in the order written), and (rows, created) says which.
    A retry after some of them were deleted is a conflict naming their ``kind`` ("message"):
    answered with those left, a client whose answer was lost took its rows for stored, and
    each caller decided it for itself (code review).

    A key reused for a different request (another ``request_hash``: the hash names what
    kind of request it is, so a message's key is no tool record's) is a conflict. Two
    concurrent requests with one key serialise on the key's unique index. The caller holds
    a transaction: the key is claimed in the one that writes.
    """
    if not idempotency_key:
        return write(), True
    if len(idempotency_key) > IDEMPOTENCY_KEY_MAX_LENGTH:
        raise InvalidInput.for_field(
            KEY_HEADER,
            f"must be at most {IDEMPOTENCY_KEY_MAX_LENGTH} characters",
            location="header",
        )
    record_id = _claim_key(actor.id, idempotency_key, request_hash)
    if record_id is None:
        record = IdempotentRequest.objects.get(principal_id=actor.id, key=idempotency_key)
        if record.request_hash != request_hash:
            raise Conflict("this Idempotency-Key was already used for a different request")
        found = {str(row.pk): row for row in rows.filter(pk__in=record.result_ids)}
        if len(found) != len(record.result_ids):
            many = len(record.result_ids) > 1
            raise Conflict(
                f"the {kind}{'s' if many else ''} stored with this Idempotency-Key "
                f"{'have' if many else 'has'} been deleted since"
            )
        return [found[i] for i in record.result_ids], False
    written = write()
    with connection.cursor() as cursor:  # (one fixed statement, as the claim: no ORM update)
        cursor.execute(
            "UPDATE idempotent_request SET result_ids = %s::jsonb WHERE id = %s",
            [json.dumps([str(row.pk) for row in written]), record_id],
        )
    return written, True


def created_once(
    request, create: Callable[[], Row], rows: QuerySet[Row], *, kind: str, request_parts: tuple
) -> tuple[Row, bool]:
    """The row ``create()`` makes, once per the request's ``Idempotency-Key`` of its
    principal (``write_once``: a retry gets the first request's row back, and a 409 when the
    key was used for another request, which ``kind`` and ``request_parts`` name, or the row
    is deleted since); (row, created). Without a key, ``create()`` alone."""
    key = idempotency_key(request)
    if key is None:
        return create(), True
    with transaction.atomic():
        [row], created = write_once(
            request.principal,
            key,
            request_fingerprint(kind, *request_parts),
            lambda: [create()],
            rows,
            kind=kind,
        )
    return row, created


def _claim_key(principal_id: str, key: str, request_hash: str) -> int | None:
    """The id of a new record of ``key``, or None if the key is taken. One statement (an
    ORM ``get_or_create`` sends four: a read, a savepoint, the insert, its release). A
    request with the same key in flight holds the key's unique index entry until it ends:
    this one waits for it, then finds the key taken."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO idempotent_request (principal_id, key, request_hash, result_ids, created_at)
            VALUES (%s, %s, %s, '[]'::jsonb, now())
            ON CONFLICT (principal_id, key) DO NOTHING
            RETURNING id
            """,
            [principal_id, key, request_hash],
        )
        row = cursor.fetchone()
    return row[0] if row else None
