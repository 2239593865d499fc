"""Cursor pagination for ``/v1`` lists: ``?limit=`` (1..200, default 20) and ``?after=<cursor>``.

A cursor is opaque to clients (URL-safe base64 of a small JSON list): the sort key of the
last item of the previous page. Pages are read with ``WHERE key > cursor ORDER BY key
LIMIT n + 1``, so rows inserted while a client walks the list never make it see an item
twice, and no page costs more than its own rows.
"""

import base64
import binascii
import functools
import json
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet
from drf_spectacular.utils import OpenApiParameter

from memsvc.api.errors import InvalidInput

DEFAULT_LIMIT = 20
MAX_LIMIT = 200

LIMIT_PARAMETER = OpenApiParameter(
    "limit",
    {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
    description=f"Items per page, 1..{MAX_LIMIT}.",
)
AFTER_PARAMETER = OpenApiParameter("after", str, description="`nextCursor` of the previous page")


def encode_cursor(*key) -> str:
    raw = json.dumps(list(key), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, *, types: tuple[type, ...], field: str = "after") -> list:
    """The key in ``cursor``; 400 naming ``field`` when it is not one of ours."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        key = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, UnicodeError, binascii.Error, RecursionError):
        # (RecursionError: a forged cursor of 1,000 nested lists was a 500, review)
        raise InvalidInput.for_field(field, "malformed cursor") from None
    if (
        not isinstance(key, list)
        or len(key) != len(types)
        or not all(
            isinstance(v, t) and not isinstance(v, bool) for v, t in zip(key, types, strict=True)
        )
    ):
        raise InvalidInput.for_field(field, "malformed cursor")
    return key


_INTEGER = re.compile(r"-?[0-9]+")


def parse_limit(
    raw: str | None,
    *,
    default: int = DEFAULT_LIMIT,
    minimum: int = 1,
    maximum: int = MAX_LIMIT,
    field: str = "limit",
) -> int:
    """``?limit=`` (or another count): ``minimum``..``maximum``; 400 (``InvalidInput``)
    naming ``field`` otherwise, an empty one too (``?limit=`` is not one left out)."""
    if raw is None:
        return default
    # Digits only: Python's int() also reads "1_000", " 10" and other scripts' digits.
    if not _INTEGER.fullmatch(raw):
        raise InvalidInput.for_field(field, "must be an integer", location="query")
    limit = int(raw) if len(raw) <= 18 else maximum + 1  # (int() refuses 4,300 digits)
    if not minimum <= limit <= maximum:
        raise InvalidInput.for_field(
            field, f"must be between {minimum} and {maximum}", location="query"
        )
    return limit


def page_params(request) -> dict:
    """``after`` and ``limit`` of a list request, for a page selector (400 on a bad limit)."""
    return {
        "after": request.query_params.get("after") or None,
        "limit": parse_limit(request.query_params.get("limit")),
    }


def page_data(page: "Page", serializer_class, **kwargs) -> dict:
    """The JSON of a paged list: ``{"data": [...], "nextCursor": ...}``."""
    return {
        "data": serializer_class(page.rows, many=True, **kwargs).data,
        "nextCursor": page.next_cursor,
    }


@dataclass(frozen=True)
class Page:
    rows: list
    next_cursor: str | None


def keyset_page(
    queryset: QuerySet,
    *,
    order: Sequence[str],
    after: str | None,
    limit: int,
    cursor_field: str = "after",
) -> Page:
    """One page of ``queryset`` sorted by ``order`` (field names, ``-`` for descending; the
    last one unique, so the order is total), starting after the cursor ``after`` (which the
    request calls ``cursor_field``: a malformed one is a 400 naming it).

    The cursor holds the last row's sort key; the page is ``WHERE key beyond cursor ORDER BY
    key LIMIT limit + 1``, the extra row telling whether there is a next page.
    """
    fields = [name.removeprefix("-") for name in order]
    if after:
        model_fields = [queryset.model._meta.get_field(name) for name in fields]
        raw_key = decode_cursor(
            after, types=tuple(_json_type(f) for f in model_fields), field=cursor_field
        )
        try:
            key = [
                in_utc(f.to_python(value)) for f, value in zip(model_fields, raw_key, strict=True)
            ]
        except (ValidationError, ValueError, OverflowError):
            raise InvalidInput.for_field(cursor_field, "malformed cursor") from None
        queryset = queryset.filter(beyond(order, key))
    rows = list(queryset.order_by(*order)[: limit + 1])
    if len(rows) <= limit:
        return Page(rows, None)
    rows = rows[:limit]
    last = rows[-1]
    return Page(rows, encode_cursor(*(_json_value(getattr(last, name)) for name in fields)))


def in_utc(value):
    """A cursor's moment in UTC (anything else as it is): PostgreSQL takes offsets up to 15:59
    only, where Python reads up to 23:59, and one it refused was a 400 naming nothing.
    ``OverflowError`` for a moment beyond the calendar in UTC (year 1 at +23:59),
    ``ValueError`` for one without an offset (memsvc writes none: one was read as the
    machine's local time; review)."""
    if not isinstance(value, datetime):
        return value
    if value.tzinfo is None:
        raise ValueError("a cursor's moment has an offset")
    return value.astimezone(UTC)


def beyond(order: Sequence[str], key: list) -> Q:
    """Rows after ``key`` in ``order``: (k1 beyond) OR (k1 equal AND k2 beyond) OR ..."""
    conditions = []
    for position, name in enumerate(order):
        field = name.removeprefix("-")
        lookup = "lt" if name.startswith("-") else "gt"
        equal = {order[i].removeprefix("-"): key[i] for i in range(position)}
        conditions.append(Q(**equal, **{f"{field}__{lookup}": key[position]}))
    return functools.reduce(operator.or_, conditions)


def _json_type(field) -> type:
    return int if field.get_internal_type().endswith(("IntegerField", "AutoField")) else str


def _json_value(value):
    if isinstance(value, int | str):
        return value
    return value.isoformat() if hasattr(value, "isoformat") else str(value)
