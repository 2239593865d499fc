"""Cursor pagination for ``/v1`` lists: ``?limit=`` (1..200, default 20) and ``?after=<cursor>``.

A cursor is opaque to clients (URL-safe base64 of a small JSON list): which list it is of
(``list_digest``), then the sort key of the last item of the previous page. Pages are read
with ``WHERE key > cursor ORDER BY key LIMIT n + 1``, so rows inserted while a client walks
the list never make it see an item twice, and no page costs more than its own rows.

A cursor given to another list (another endpoint, other filters, another caller) is a 400
asking to list again: it held only a sort key, and read as another list's place, often as
its end (``{"data": [], "nextCursor": null}`` for a user with 10 memories, review). Cursors
issued before they named their list are refused the same way.
"""

import base64
import binascii
import functools
import hashlib
import json
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet
from drf_spectacular.utils import OpenApiParameter

from memsvc.api.errors import InvalidInput

if TYPE_CHECKING:
    from memsvc.api.principals import Principal

DEFAULT_LIMIT = 20
MAX_LIMIT = 200

LIMIT_PARAMETER = OpenApiParameter(
    "limit",
    {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
    description=f"Items per page, 1..{MAX_LIMIT}.",
)
AFTER_PARAMETER = OpenApiParameter(
    "after",
    str,
    description="`nextCursor` of the previous page of this list, with the same filters and "
    "caller (another list's cursor is a 400: list again).",
)
ANOTHER_LIST = "a cursor of another list, or of other filters or another caller: list again"


def list_digest(name: str, principal: "Principal | None" = None, **filters) -> str:
    """Which list a cursor is of (``keyset_page``'s ``of_list``): a short digest of the
    list's ``name`` (one per listing), who lists it (``principal``: its id, and the user an
    agent acts for) and each filter that shapes its items, by name (``None``, a filter left
    out, is not ""). Values JSON holds, others (UUIDs) as text. 72 bits: no two lists a
    client walks share one by chance; not a secret, nor needs to be (a cursor's key only
    says where a page starts in what the caller may see anyway)."""
    text = json.dumps(
        [name, None if principal is None else principal.member_ids, filters],
        default=str,
        sort_keys=True,
        separators=(",", ":"),
    )
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()[:9]).decode()


# What ``list_digest`` makes: 9 bytes in URL-safe base64.
_DIGEST = re.compile(r"[A-Za-z0-9_-]{12}")


def encode_cursor(*key, of_list: str) -> str:
    """A cursor of the list ``of_list`` (``list_digest``) holding ``key``."""
    raw = json.dumps([of_list, *key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(
    cursor: str, *, types: tuple[type, ...], of_list: str, field: str = "after"
) -> list:
    """The key in ``cursor``, a cursor of the list ``of_list``; 400 naming ``field`` when
    it is not one of ours ("malformed cursor"), or is another list's (``ANOTHER_LIST``), as
    is one issued before cursors named their list (a key of these types alone)."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        key = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, UnicodeError, binascii.Error, RecursionError):
        # (RecursionError: a forged cursor of 1,000 nested lists was a 500, review)
        raise InvalidInput.for_field(field, "malformed cursor") from None
    named = isinstance(key, list) and key and isinstance(key[0], str)
    if named and key[0] == of_list:
        if _holds(key[1:], types):
            return key[1:]
        raise InvalidInput.for_field(field, "malformed cursor")
    # Another list's, whatever its key (a list of messages' cursor on a list of memories
    # was "malformed": review), or one of before lists named theirs.
    if (named and _DIGEST.fullmatch(key[0])) or _holds(key, types):
        raise InvalidInput.for_field(field, ANOTHER_LIST)
    raise InvalidInput.for_field(field, "malformed cursor")


def _holds(key, types: tuple[type, ...]) -> bool:
    """``key`` is a list of values of ``types``, one each (``True`` is no int here)."""
    return (
        isinstance(key, list)
        and len(key) == len(types)
        and all(
            isinstance(v, t) and not isinstance(v, bool) for v, t in zip(key, types, strict=True)
        )
    )


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
    of_list: str,
    cursor_field: str = "after",
) -> Page:
    """One page of ``queryset`` sorted by ``order`` (field names, ``-`` for descending; the
    last one unique, so the order is total), starting after the cursor ``after`` (which the
    request calls ``cursor_field``: a malformed one, or one of another list than
    ``of_list``, is a 400 naming it). ``of_list``: ``list_digest`` of what shapes
    ``queryset`` (the caller, every filter), which its cursors carry.

    The cursor holds ``of_list`` and the last row's sort key; the page is ``WHERE key beyond
    cursor ORDER BY key LIMIT limit + 1``, the extra row telling whether there is a next page.
    """
    fields = [name.removeprefix("-") for name in order]
    if after:
        model_fields = [queryset.model._meta.get_field(name) for name in fields]
        raw_key = decode_cursor(
            after,
            types=tuple(_json_type(f) for f in model_fields),
            of_list=of_list,
            field=cursor_field,
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
    key = (_json_value(getattr(last, name)) for name in fields)
    return Page(rows, encode_cursor(*key, of_list=of_list))


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
