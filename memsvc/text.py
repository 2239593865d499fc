"""Text helpers with nothing of Django in them (``memsvc.client`` uses them too)."""

import re
import unicodedata

# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt): what draws nothing
# where it means nothing, beyond category Cf: a combining grapheme joiner, Hangul fillers,
# variation selectors (review: "ali\u034fce" and "ali\u3164ce" were ids shown as "alice").
DEFAULT_IGNORABLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]"
)

# --- what a name may not hold (``memsvc.validators``'s rules; the client's too) ---


def has_control_characters(value: str) -> bool:
    """Whether ``value`` holds a control character (a tab, a newline, an escape: category
    Cc), which nothing shown on one line (a name, a title) has."""
    return not value.isprintable() and any(unicodedata.category(c) == "Cc" for c in value)


# Unicode's bidirectional controls: marks, embeddings, overrides and isolates. In a name
# they change how the text around them is shown ("\u202eecila" shows as "alice").
BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)


def has_bidi_controls(value: str) -> bool:
    return not BIDI_CONTROLS.isdisjoint(value)


# Separators that break a line as a newline does (U+2028, U+2029).
_LINE_SEPARATORS = frozenset({"Zl", "Zp"})


def has_line_separators(value: str) -> bool:
    return any(unicodedata.category(c) in _LINE_SEPARATORS for c in value)


def has_blank_ends(value: str) -> bool:
    """Whether ``value`` begins or ends with what draws nothing and is no mark of the one
    before it: a space of any kind, a zero-width one, a BOM, a Braille blank ("bob " and
    "bob\u2800" are listed as "bob"; review). An emoji's style or a flag's cancel tag at
    the end is part of the emoji ("I \u2764\ufe0f" was refused: code review)."""
    if not value:
        return False
    end = len(value) - 1
    return _blank(value[0]) or (_blank(value[end]) and not (end and _joined(value, end)))


def _blank(character: str) -> bool:
    # (A bidirectional control is refused as one, wherever it is.)
    return (
        character not in BIDI_CONTROLS
        and character not in _DRAWN_FORMATS
        and (
            character == "\u2800"
            or character.isspace()
            or unicodedata.category(character) in {"Cf", "Zs", "Zl", "Zp"}
            or DEFAULT_IGNORABLE.match(character) is not None  # (a Hangul filler: review)
        )
    )


# What joins or varies the character beside it and draws nothing, where it does (each kind
# but where it has a use is a character hidden in a name: ``hidden_characters``).
_ZWJ, _ZWNJ = "\u200d", "\u200c"
_EMOJI_STYLES = re.compile("[\ufe00-\ufe0f]")  # (variation selectors: text or emoji style)
_IDEOGRAPHIC_VARIANTS = re.compile("[\U000e0100-\U000e01ef]")  # (a CJK ideograph's form)
_TAGS = re.compile("[\U000e0020-\U000e007f]")  # (a subdivision's flag, after a black flag)
_TAG_END, _BLACK_FLAG = "\U000e007f", "\U0001f3f4"
_MONGOLIAN_VARIANTS = re.compile("[\u180b-\u180f]")
_KEYCAP_BASES = frozenset("0123456789#*")
# Format characters that are drawn: Arabic's number signs and the end of an ayah, Syriac's
# abbreviation mark, Kaithi's and Brahmi's number signs.
_DRAWN_FORMATS = frozenset(
    "\u0600\u0601\u0602\u0603\u0604\u0605\u06dd\u070f\u0890\u0891\u08e2\U000110bd\U000110cd"
)
# Scripts whose words a joiner or a non-joiner shapes (Arabic, Syriac, Thaana, N'Ko and
# their kin; the Brahmic scripts of India and South-East Asia; Mongolian).
_JOINING_SCRIPTS = re.compile(
    "[\u0600-\u08ff\u0900-\u0dff\u1000-\u109f\u1780-\u18af\ua800-\ua8ff\ufb50-\ufdff\ufe70-\ufeff]"
)
_IDEOGRAPHS = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003ffff]")


def _symbol(character: str) -> bool:
    """An emoji or another symbol, or an emoji's skin tone (what a joiner makes sequences
    of, and a variation selector draws in emoji or text style)."""
    return bool(character) and unicodedata.category(character) in {"So", "Sk", "Sm"}


def _joined(value: str, place: int) -> bool:
    """Whether the character at ``place`` (one that draws nothing) shapes what is beside it
    there: a joiner inside an emoji sequence (after an emoji, its style or its skin tone)
    or a word of a joining script; a variation selector after a symbol, a keycap's digit, an
    ideograph or a Mongolian letter; a tag inside a black flag's subdivision, which ends
    with its cancel tag."""
    character = value[place]
    before = value[place - 1] if place else ""
    after = value[place + 1] if place + 1 < len(value) else ""
    if character in (_ZWJ, _ZWNJ):
        in_script = bool(
            _JOINING_SCRIPTS.match(before or " ") and _JOINING_SCRIPTS.match(after or " ")
        )
        if character == _ZWNJ:
            return in_script
        styled = _EMOJI_STYLES.match(before or " ") and place > 1 and _symbol(value[place - 2])
        return in_script or ((_symbol(before) or bool(styled)) and _symbol(after))
    if _EMOJI_STYLES.match(character):
        return _symbol(before) or before in _KEYCAP_BASES or bool(_IDEOGRAPHS.match(before or " "))
    if _IDEOGRAPHIC_VARIANTS.match(character):
        return bool(_IDEOGRAPHS.match(before or " "))
    if _MONGOLIAN_VARIANTS.match(character):
        return bool(_JOINING_SCRIPTS.match(before or " "))
    if _TAGS.match(character):
        start = place
        while start > 0 and _TAGS.match(value[start - 1]):
            start -= 1
        end = place
        while end + 1 < len(value) and _TAGS.match(value[end + 1]):
            end += 1
        return start > 0 and value[start - 1] == _BLACK_FLAG and value[end] == _TAG_END
    return False


# What a name or an id holding one is told (``hidden_characters``, the user-id rule).
INVISIBLE_PROBLEM = "must not contain invisible characters (a zero-width space or joiner)"


def hidden_characters(value: str) -> list[int]:
    """The places in ``value`` of characters that draw nothing and shape nothing there: a
    zero-width space, a word joiner, a soft hyphen, a Hangul filler anywhere; a joiner or a
    variation selector but where it has a use (``_joined``): "a\u200bb", "a\u200db" and a
    Russian name with a non-joiner inside are listed as "ab" and the name, two labels or
    agents that look one (review; code review). Not a bidirectional control (refused as
    one: ``has_bidi_controls``), nor a format character that is drawn."""
    if value.isascii():
        return []
    return [
        place
        for place, character in enumerate(value)
        if character not in BIDI_CONTROLS
        and character not in _DRAWN_FORMATS
        and (DEFAULT_IGNORABLE.match(character) or unicodedata.category(character) == "Cf")
        and not _joined(value, place)
    ]


# A run of "-" (with nothing but punctuation or spaces between them): to
# ``websearch_to_tsquery`` each is a NOT of the word that follows, however far, and 32 of
# them ("-----...", a pasted rule) nest deeper than it can read: "tsquery stack too small"
# (review: a 500). One NOT is what such a run asks.
MINUS_RUN = re.compile(r'-(?:(?:(?![-"])[\W_])*-)+')


# A space to Python but not to PostgreSQL (a no-break space, a line separator, ASCII's
# separators \x1c-\x1f): a space to ``exclusions``, but to ``websearch_to_tsquery`` part of
# a word's run ("cake\u00a0-lemon" read as the phrase "cake lemon", excluded as "lemon" in
# the ranking: review).
_WIDE_SPACE = re.compile(r"[^\S \t\n\r\f\v]")


def query_read(text: str) -> str:
    """A query's words as PostgreSQL is given them (``memsvc.db.websearch_text``) and its
    exclusions are read (``search.queries.exclusions``): the default-ignorable characters
    left out, as the words index leaves them out; every space an ASCII one; a run of "-"
    one."""
    return MINUS_RUN.sub("-", _WIDE_SPACE.sub(" ", DEFAULT_IGNORABLE.sub("", text)))


# What draws nothing of its own: controls, format marks (zero-width spaces and joiners, bidi
# marks, a BOM), combining marks with nothing to combine with, and separators.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Mn", "Me", "Zs", "Zl", "Zp"})


def shows_nothing(text: str) -> bool:
    """Whether ``text`` holds nothing to read or search: "   ", and "\u200b" too, which
    ``str.strip`` keeps (a memory or a message of it was stored, and a query of it searched,
    finding what shared nothing with it). (A Hangul filler or a Braille blank alone is not
    nothing here: stored so before, widening the rule refused the documents that hold them
    on import; review.)"""
    return all(c.isspace() or unicodedata.category(c) in _INVISIBLE_CATEGORIES for c in text)


def shortened(text: str, limit: int) -> str:
    """``text`` whole when it has at most ``limit`` characters, else cut to ``limit``
    characters, the last of them "…" (a quoted name, a prompt's line, a summary)."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


NAMED_MAX_CHARS = 64


def named(name: str) -> str:
    """A name the caller sent (an unknown field's, parameter's or argument's), as a refusal
    names it: whole up to ``NAMED_MAX_CHARS`` characters, else cut short. A refusal of a
    megabyte-long name quoted it in the message and again as the key of its details."""
    return shortened(name, NAMED_MAX_CHARS)
