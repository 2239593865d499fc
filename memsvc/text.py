"""Text helpers with nothing of Django in them (``memsvc.client`` uses them too)."""

import unicodedata

# What draws nothing of its own: controls, format marks (zero-width spaces and joiners, bidi
# marks, a BOM), combining marks with nothing to combine with, and separators.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Mn", "Me", "Zs", "Zl", "Zp"})


def shows_nothing(text: str) -> bool:
    """Whether ``text`` holds nothing to read or search: "   ", and "\u200b" too, which
    ``str.strip`` keeps (a memory or a message of it was stored, and a query of it searched,
    finding what shared nothing with it)."""
    return all(c.isspace() or unicodedata.category(c) in _INVISIBLE_CATEGORIES for c in text)


def shortened(text: str, limit: int) -> str:
    """``text`` whole when it has at most ``limit`` characters, else cut to ``limit``
    characters, the last of them "…" (a quoted name, a prompt's line, a summary)."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
