"""What a query says besides its words: the parts it asks about separately, and the time
it names. Plain functions, no database.

- ``parts``: a question that asks several things ("Where did Anna go? And what did Ben
  cook?") is searched part by part, so that the best match of one part does not crowd out
  the other's (``search.engine``). Split by sentence (kagent's prefetch), then by clause
  (``;``, or ``, and`` / ``, but`` joining two clauses).
- ``periods``: the spans of time a query names ("in May", "May 2023", "in 2022",
  "yesterday", "last week", "3 days ago"), relative ones resolved against a reference
  moment (the time of the search): a message written in that span is more likely the one
  meant (``SearchTuning.date_weight``).
- ``words`` and ``names``: the people a query names ("What did Melanie paint?"): a turn
  its author wrote is more likely the one meant (``SearchTuning.author_weight``).
- ``without_names``: the query without the names it holds ("What did paint?"), whose vector
  says what it asks about (``SearchTuning.unnamed_vector_share``).
- ``exclusions``: the words and phrases a query asks not to find ("cake -chocolate"), as
  ``websearch_to_tsquery`` reads a ``-`` (``search.engine.without_excluded``).
"""

import calendar
import re
from datetime import UTC, date, datetime, timedelta

from memsvc.text import query_read

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
# (Blanks before a ";" looked for from where they begin: from every blank of a long run, a
# context's text of 10,000 spaces took 0.2 s, of 80,000 20 s; review.)
_CLAUSE_BREAK = re.compile(r"(?<!\s)\s*;\s*|,\s+(?=(?:and|but|also)\s)", re.IGNORECASE)
# A part must say something of its own: fewer words than this join the part before.
MIN_PART_WORDS = 3


_WORD = re.compile(r"\w+")
_NOT_WORD = re.compile(r"[^\w']")
_POSSESSIVE = re.compile(r"'s$")
# What does not name anyone: the english stop words PostgreSQL's keyword index drops, but for
# two that are names too ("Will", "Don"). An author who calls themselves "What" or "I" is not
# named by every question.
STOP_WORDS = frozenset(
    """i me my myself we our ours ourselves you your yours yourself yourselves he him his
    himself she her hers herself it its itself they them their theirs themselves what which
    who whom this that these those am is are was were be been being have has had having do
    does did doing a an the and but if or because as until while of at by for with about
    against between into through during before after above below to from up down in out on
    off over under again further then once here there when where why how all any both each
    few more most other some such no nor not only own same so than too very s t can will
    just don should now""".split()  # noqa: SIM905 (127 words: a list literal of them is a page)
) - {"will", "don"}


def words(text: str) -> frozenset[str]:
    """The words of ``text``, in lower case (``Melanie's`` gives ``melanie`` and ``s``)."""
    return frozenset(_WORD.findall(text.lower()))


def names(author: str | None, query_words: frozenset[str]) -> bool:
    """Whether a query of ``query_words`` names ``author``: every word of the name is among
    them ("Melanie" in "What did Melanie paint?", "Ann Lee" in "what did Ann Lee say"),
    ``STOP_WORDS`` aside (a name of only those names no one)."""
    name = words(author or "") - STOP_WORDS
    return bool(name) and name <= query_words


def without_names(text: str) -> str:
    """``text`` without the words that look like names: capitalised words ("Melanie",
    "Melanie's"; not "I", "LGBTQ" or "McDonald") that do not begin a sentence. ``text``
    itself when it holds none."""
    kept, starts = [], True
    for token in text.split():
        word = _POSSESSIVE.sub("", _NOT_WORD.sub("", token))
        if starts or not (len(word) > 1 and word[0].isupper() and word[1:].islower()):
            kept.append(token)
        starts = token.endswith((".", "!", "?"))
    return " ".join(kept) if len(kept) < len(text.split()) else text


# A "-" that starts a word or a quoted phrase ("-chocolate", '-"birthday cake"'), as
# ``websearch_to_tsquery`` reads it; not one inside a word ("well-known") or inside a quoted
# phrase ('"ls -la"', taken whole by the second branch), nor a number's sign ("-5 degrees":
# a question says that, it excludes nothing).
_EXCLUDED = re.compile(r'(?:^|(?<=\s))-("[^"]*"?|[^\s"\d-][^\s"]*)|"[^"]*"?')


def exclusions(text: str) -> tuple[str, list[str]]:
    """``text`` without the words and phrases it excludes, and those (a phrase in its
    quotes). ``text`` as it is when it holds nothing else: a query that only excludes
    asks for nothing. Read as PostgreSQL is given it (``query_read``): the characters that
    draw nothing left out, a run of "-" one ("a \u200b-b" and "a --b"
    exclude "b" there, and were ranked as asking for it; review)."""
    read = query_read(text)
    excluded = [m.group(1) for m in _EXCLUDED.finditer(read) if m.group(1) is not None]
    rest = " ".join(_EXCLUDED.sub(lambda m: m.group() if m.group(1) is None else " ", read).split())
    if not excluded or not _WORD.search(rest):
        return text, []
    return rest, excluded


def sentences(text: str) -> list[str]:
    """Each sentence of ``text`` once, in order (``[text]`` when it has none)."""
    found = [part.strip() for part in _SENTENCE_END.split(text)]
    return list(dict.fromkeys(s for s in found if s)) or [text]


def parts(text: str) -> list[str]:
    """The parts of a query that ask separately: its sentences, each split at clause
    breaks; a part of fewer than ``MIN_PART_WORDS`` words stays with the one before.
    One part (the query itself) when there is nothing to split."""
    pieces: list[str] = []
    for sentence in sentences(text):
        for clause in _CLAUSE_BREAK.split(sentence):
            clause = clause.strip(" ,;")
            if not clause:
                continue
            if pieces and len(clause.split()) < MIN_PART_WORDS:
                pieces[-1] = f"{pieces[-1]} {clause}"
            else:
                pieces.append(clause)
    pieces = list(dict.fromkeys(pieces))
    return pieces if len(pieces) > 1 else [text]


_MONTHS = {name.lower(): number for number, name in enumerate(calendar.month_name) if name}
_MONTHS.update({name.lower(): number for number, name in enumerate(calendar.month_abbr) if name})
_MONTHS["sept"] = 9
del _MONTHS["may"]  # "may" the verb: only the full name counts, checked below
_MONTH_WORDS = "|".join(sorted(_MONTHS, key=len, reverse=True))
# Month names that are words too: "May" or "March" counts only written with a capital and
# not before a pronoun ("May I ask"), an abbreviation ("jan", "Jan": a name too, "dec")
# only with a period, a day or a year after it ("Jan.", "Jan 5", "dec 2022"), unless a
# preposition says it is the month ("in may", "in Jan"). Each lifted the turns of its month
# for a query that named none (review).
_WORDS_TOO = {"may", "march"}
_ABBREVIATIONS = {name.lower() for name in calendar.month_abbr if name} - {"may"} | {"sept"}
_PRONOUN_AFTER = re.compile(r"\s+(?:i|we|you|he|she|it|they)\b", re.I)
_DAY_AFTER = re.compile(r"\.?\s+\d{1,2}(?:st|nd|rd|th)?\b", re.I)
_MONTH = re.compile(
    rf"\b(?:(in|of|during)\s+)?({_MONTH_WORDS}|may)\b\.?(?:,?\s+((?:19|20)\d\d))?", re.I
)
_YEAR = re.compile(r"\b((?:19|20)\d\d)\b")
_UNITS = {"day": 1, "week": 7, "month": 30, "year": 365}
_AGO = re.compile(
    r"\b(\d+|a|an|one|two|three|four|five|six)\s+(day|week|month|year)s?\s+ago\b", re.I
)
# The furthest back "N days/weeks/months/years ago" names a time a message was written.
MAX_AGO_DAYS = 200 * 365
_COUNTS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
_RELATIVE = re.compile(
    r"\b(yesterday|today|last night|(?:last|this|past)\s+(?:week|weekend|month|year))\b", re.I
)

Period = tuple[datetime, datetime]  # [start, end)


def _day(moment: date) -> datetime:
    return datetime(moment.year, moment.month, moment.day, tzinfo=UTC)


def _month_span(year: int, month: int) -> Period:
    start = datetime(year, month, 1, tzinfo=UTC)
    following = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return start, following


def _relative(phrase: str, today: datetime) -> Period:
    phrase = " ".join(phrase.lower().split())
    if phrase in ("yesterday", "last night"):
        return today - timedelta(days=1), today
    if phrase == "today":
        return today, today + timedelta(days=1)
    which, unit = phrase.split()
    if unit == "weekend":  # the Saturday and Sunday before (or of) this week
        saturday = today - timedelta(days=(today.weekday() - 5) % 7 or 7)
        return saturday, saturday + timedelta(days=2)
    if unit == "week":
        monday = today - timedelta(days=today.weekday())
        if which == "this":
            return monday, monday + timedelta(days=7)
        if which == "past":
            return today - timedelta(days=7), today + timedelta(days=1)
        return monday - timedelta(days=7), monday
    if unit == "month":
        if which == "past":
            return today - timedelta(days=31), today + timedelta(days=1)
        year, month = today.year, today.month
        if which == "last":
            year, month = (year - 1, 12) if month == 1 else (year, month - 1)
        return _month_span(year, month)
    if which == "past":
        return today - timedelta(days=365), today + timedelta(days=1)
    year = today.year - (which == "last")
    return datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)


def periods(text: str, now: datetime) -> list[Period]:
    """The spans of time ``text`` names, relative ones resolved against ``now``. A month
    without a year means that month of any year from ten years before ``now`` to ``now``'s
    (a long memory holds several Junes)."""
    today = _day(now.astimezone(UTC).date())
    found: list[Period] = []
    taken: set[int] = set()  # where the years a month named begin
    for match in _MONTH.finditer(text):
        preposition, name, year = match.groups()
        word, after = name.lower(), match.end(2)
        said_so = preposition or year
        as_a_word = not name[0].isupper() or _PRONOUN_AFTER.match(text, after)
        if word in _WORDS_TOO and not said_so and as_a_word:
            continue  # the word ("may", "May I", "march on")
        written_as_one = text[after : after + 1] == "." or _DAY_AFTER.match(text, after)
        if word in _ABBREVIATIONS and not (said_so or written_as_one):
            continue  # the word or the name ("dec", "What did Jan say?")
        month = _MONTHS.get(name.lower().rstrip("."), 5)
        if year:
            taken.add(match.start(3))
            found.append(_month_span(int(year), month))
        else:
            found += [_month_span(y, month) for y in range(today.year - 10, today.year + 1)]
    for match in _YEAR.finditer(text):
        if match.start() in taken:
            continue
        year = int(match.group(1))
        found.append((datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)))
    for match in _AGO.finditer(text):
        count = match.group(1).lower()
        days = (int(count) if count.isdigit() else _COUNTS[count]) * _UNITS[match.group(2).lower()]
        if days > MAX_AGO_DAYS:
            continue  # ("3000000 days ago": before any message, and before the calendar)
        slack = max(1, days // 7)
        middle = today - timedelta(days=days)
        found.append((middle - timedelta(days=slack), middle + timedelta(days=slack + 1)))
    for match in _RELATIVE.finditer(text):
        found.append(_relative(match.group(1), today))
    # Each once: a long text (a context's, someone's message) naming months again and again
    # made thousands of spans, each looked through for each row ranked (review).
    return list(dict.fromkeys(found))


def within(moment: datetime | None, spans: list[Period], *, slack: timedelta) -> bool:
    """Whether ``moment`` falls in one of ``spans`` or up to ``slack`` after its end (a
    message tells of the recent past)."""
    if moment is None:
        return False
    return any(start <= moment < end + slack for start, end in spans)
