"""Validators shared by the models of every app."""

import re
import unicodedata
import uuid

from django.core.exceptions import ValidationError

from memsvc.text import (
    DEFAULT_IGNORABLE,
    INVISIBLE_PROBLEM,
    has_bidi_controls,
    has_blank_ends,
    has_control_characters,
    has_line_separators,
    hidden_characters,
    named,
)


def no_nul_characters(value: str) -> None:
    """PostgreSQL cannot store NUL in text; refuse it with a clear message instead of a 500."""
    if "\x00" in value:
        raise ValidationError("must not contain NUL characters", code="nul_character")


LONE_SURROGATE_PROBLEM = "must not contain lone surrogate characters"


def has_lone_surrogates(value: str) -> bool:
    """Whether ``value`` holds a lone surrogate, which has no UTF-8 (nor a place in
    PostgreSQL's text)."""
    if value.isascii():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def has_invisible_characters(value: str) -> bool:
    """Whether ``value`` holds a character that draws nothing of its own: a format
    character (category Cf: a zero-width space or joiner, a soft hyphen, a BOM) or another
    default-ignorable one (a Hangul filler, a variation selector)."""
    return DEFAULT_IGNORABLE.search(value) is not None or (
        not value.isprintable() and any(unicodedata.category(c) == "Cf" for c in value)
    )


def has_unnormalised_letters(value: str) -> bool:
    """Whether ``value`` is not in Unicode's NFKC form: "zoe" and a combining diaeresis
    shows as "zoë", "bob" in fullwidth letters as "bob", each a different text (review: two
    members listed alike); and a login's name is NFKC (Django makes it so: "\ufb01x" logs
    in as "fix"), so a token's was another person than the pages' (review)."""
    return not value.isascii() and not unicodedata.is_normalized("NFKC", value)


def composed(value: str) -> None:
    """A name as it is given now, its letters composed (NFC): "zoe" and a combining
    diaeresis, and "zoë", were two block labels, and two agents, that look one (review)."""
    if not value.isascii() and not unicodedata.is_normalized("NFC", value):
        normal = unicodedata.normalize("NFC", value)
        raise ValidationError(
            f"must be written with its letters composed (NFC): {named(normal)!r}",
            code="decomposed",
        )


def shown_as_it_is(value: str) -> None:
    """A name shown as what it is: no bidirectional controls ("\u202ebob" showed as "bob"
    reversed) and no space at either end ("bob " and "bob" were two agents that look one)."""
    if has_bidi_controls(value):
        raise ValidationError(
            "must not contain bidirectional control characters", code="bidi_control"
        )
    if value != value.strip():
        raise ValidationError("must not begin or end with a space", code="outer_space")


def one_line(value: str) -> None:
    """A name or a title as it is given now (an import restores one stored before this rule
    as it was): no line separator, which breaks the line as a newline does (review)."""
    if has_line_separators(value):
        raise ValidationError("must be one line", code="line_separator")


def no_blank_ends(value: str) -> None:
    """A name as it is given now: nothing that draws nothing at either end, a zero-width
    space or a BOM as a space ("a\u200b" and "a" were two labels that look one; review).
    (A space and a bidirectional control are ``shown_as_it_is``' to refuse: said once.)"""
    if value == value.strip() and has_blank_ends(value):
        raise ValidationError("must not begin or end with a space", code="outer_space")


def no_hidden_characters(value: str) -> None:
    """A name as it is given now: nothing inside it that draws nothing there
    (``hidden_characters``: "a\u200bb" was a label, an agent, a tool's name listed as "ab";
    review). A joiner inside an emoji or a Persian word is part of it. (At either end it is
    ``no_blank_ends``' to refuse: said once.)"""
    if not has_blank_ends(value) and hidden_characters(value):
        raise ValidationError(
            INVISIBLE_PROBLEM,
            code="invisible_character",
        )


def no_control_characters(value: str) -> None:
    """A one-line text (a title): no control characters (``has_control_characters``). A
    NUL is ``no_nul_characters``' to refuse: said once."""
    if has_control_characters(value.replace("\x00", "")):
        raise ValidationError("must not contain control characters", code="control_character")


# RFC 3986's dot segments, which clients resolve away before they send a path: a thing
# named so in a URL's path cannot be reached by its routes, and one whose name holds one
# between its "/" (or "\\", which browsers read as "/") names another's route ("../../<id>":
# a member's removal was the conversation's DELETE; review).
DOT_SEGMENTS = frozenset({".", ".."})
DOT_SEGMENT_PROBLEM = (
    'must not be "." or "..", nor have one between its "/" (it names it in URLs, where '
    "clients drop those)"
)
_PATH_SEPARATORS = re.compile(r"[/\\]")


def has_dot_segment(value: str) -> bool:
    return any(part in DOT_SEGMENTS for part in _PATH_SEPARATORS.split(value))


def path_segment(value: str) -> None:
    """A text that names a thing in a URL's path (a block's label, a local agent's name):
    no "/", and not "." or "..", which clients resolve away before they send the path
    (RFC 3986's dot segments): its routes could not reach it."""
    if "/" in value:
        raise ValidationError('must not contain "/" (it names it in URLs)', code="slash")
    if has_dot_segment(value):
        raise ValidationError(DOT_SEGMENT_PROBLEM, code="dot_segment")


def as_uuid(value) -> uuid.UUID | None:
    """``value`` read as a UUID the way a UUID column reads it (Django's ``UUIDField``), or
    None when it is none (not a string, or no id)."""
    try:
        return uuid.UUID(value)
    except (TypeError, ValueError, AttributeError):
        return None
