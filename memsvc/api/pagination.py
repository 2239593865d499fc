"""Cursor pagination for ``/v1`` lists: ``?limit=`` (1..200, default 20) and ``?after=<cursor>``.

A cursor is opaque to clients (URL-safe base64 of a small JSON list): the sort key of the
last item of the previous page. Pages are read with ``WHERE key > cursor ORDER BY key
LIMIT n + 1``, so rows inserted while a client walks the list never make it see an item
twice, and no page costs more than its own rows.
"""

import base64
import binascii
import json

from drf_spectacular.utils import OpenApiParameter

from memsvc.api.errors import InvalidInput

DEFAULT_LIMIT = 20
MAX_LIMIT = 200

LIMIT_PARAMETER = OpenApiParameter(
    "limit",
    {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
    description=f"Items per page, 1..{MAX_LIMIT}.",
)


def encode_cursor(*key) -> str:
    raw = json.dumps(list(key), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, *, types: tuple[type, ...], field: str = "after") -> list:
    """The key in ``cursor``; 400 naming ``field`` when it is not one of ours."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        key = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, UnicodeError, binascii.Error):
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


def parse_limit(
    raw: str | None, *, default: int = DEFAULT_LIMIT, maximum: int = MAX_LIMIT, field: str = "limit"
) -> int:
    """``?limit=``: 1..``maximum``; 400 (``InvalidInput``) naming ``field`` otherwise."""
    if raw is None or raw == "":
        return default
    try:
        limit = int(raw)
    except ValueError:
        raise InvalidInput.for_field(field, "must be an integer") from None
    if not 1 <= limit <= maximum:
        raise InvalidInput.for_field(field, f"must be between 1 and {maximum}")
    return limit


def page(rows: list, limit: int, cursor_of) -> tuple[list, str | None]:
    """Split ``limit + 1`` fetched rows into the page and the cursor of the next one."""
    if len(rows) > limit:
        rows = rows[:limit]
        return rows, cursor_of(rows[-1])
    return rows, None
