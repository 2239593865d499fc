from django import template
from django.utils.html import escape
from django.utils.safestring import mark_safe

from memsvc.db import MARKUP_STAND_IN

register = template.Library()


@register.filter
def shown_title(title: str) -> str:
    """A conversation's title as the pages show it: "Untitled" when it has none, or only
    spaces (which would make a link with nothing to click)."""
    return title if title.strip() else "Untitled"


@register.filter
def highlighted(hit) -> str:
    """A search hit's extract (PostgreSQL's ``ts_headline``, matches in ``<b>``) as safe
    HTML: the text escaped whole, then only the markers given back. They are its only
    ``<b>`` while the text's own "<" is still ``MARKUP_STAND_IN``: a message that holds
    "<b>" shows it as written (the API's ``highlights`` cannot tell the two apart)."""
    if not hit.headline:
        return ""
    marked = escape(hit.marked).replace("&lt;b&gt;", "<b>").replace("&lt;/b&gt;", "</b>")
    return mark_safe(marked.replace(MARKUP_STAND_IN, "&lt;"))  # noqa: S308 (escaped above)
