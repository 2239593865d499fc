"""Text helpers with nothing of Django in them (``memsvc.client`` uses them too)."""


def shortened(text: str, limit: int) -> str:
    """``text`` whole when it has at most ``limit`` characters, else cut to ``limit``
    characters, the last of them "…" (a quoted name, a prompt's line, a summary)."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
