import re

from django import template
from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe

from memsvc.db import MARKUP_STAND_IN
from memsvc.text import shows_nothing

register = template.Library()

_ISOLATES = re.compile("[\u2066-\u2069]")  # LRI, RLI, FSI, PDI
# What ends a paragraph, and every isolate with it (bidi class B): not in a title made here
# (one line), but one restored from an export is not read again (code review).
_PARAGRAPH_ENDS = re.compile("[\n\r\x1c-\x1e\x85\u2029]")


def _title(title: str) -> str:
    """A title to isolate from the text around it: its own isolates left out (one of them
    would end the isolation early), and what ends a paragraph (and every isolate with it)
    a space."""
    return _PARAGRAPH_ENDS.sub(" ", _ISOLATES.sub("", title))


@register.filter
def shown_title(title: str, untitled: str = "Untitled") -> str:
    """A conversation's title as the pages show it in their HTML: ``untitled`` when it shows
    nothing (only spaces, or invisible characters: a link with nothing to click; review),
    else in a ``<bdi>``, isolated from the text around it (a title holding a right-to-left
    override turned around the author and the date after it in a hit's link, and so could
    pass a message off as another's; review). ``shown_title_text`` where no element may be."""
    if shows_nothing(title):
        return untitled
    return format_html("<bdi>{}</bdi>", _title(title))


@register.filter
def shown_title_text(title: str, untitled: str = "Untitled") -> str:
    """``shown_title`` as plain text (the page's title, a dialog's text in an attribute):
    isolated by FSI ... PDI, which those honour too."""
    if shows_nothing(title):
        return untitled
    return f"\u2068{_title(title)}\u2069"


@register.filter
def highlighted(hit) -> str:
    """A search hit's extract (PostgreSQL's ``ts_headline``, matches in ``<b>``) as safe
    HTML: the text escaped whole, then only the markers given back, as ``<mark>`` (which a
    screen reader says; ``<b>`` it does not: review). They are its only ``<b>`` while the
    text's own "<" is still ``MARKUP_STAND_IN``: a message that holds "<b>" shows it as
    written (the API's ``highlights`` cannot tell the two apart)."""
    if not hit.headline:
        return ""
    marked = escape(hit.marked).replace("&lt;b&gt;", "<mark>").replace("&lt;/b&gt;", "</mark>")
    return mark_safe(marked.replace(MARKUP_STAND_IN, "&lt;"))  # noqa: S308 (escaped above)


@register.simple_tag(takes_context=True)
def refusal_of(context, action: str, **same):
    """The refusal of the form at ``action`` sent from this page (``common.refused_form``:
    what it said and what was typed), if it is this form's; ``same``: the values that tell
    it from the other forms of its address (a block's ``label``)."""
    refused = getattr(context.get("request"), "refused_form", None)
    if not refused or refused["action"] != action:
        return None
    if any(refused["typed"].get(name) != str(value) for name, value in same.items()):
        return None
    return refused


@register.simple_tag
def invalid(refused) -> str:
    """A refused form's field: said invalid, described by the refusal, and focused."""
    shown = ' aria-invalid="true" aria-describedby="refusal" autofocus' if refused else ""
    return mark_safe(shown)  # noqa: S308 (a constant)
