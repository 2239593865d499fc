from django import template
from django.utils.html import escape
from django.utils.safestring import mark_safe

register = template.Library()


@register.filter
def shown_title(title: str) -> str:
    """A conversation's title as the pages show it: "Untitled" when it has none, or only
    spaces (which would make a link with nothing to click)."""
    return title if title.strip() else "Untitled"


@register.filter
def highlighted(headline: str | None) -> str:
    """A search hit's ``highlights`` (PostgreSQL's ``ts_headline``, matches in ``<b>``) as
    safe HTML: the text escaped whole, then only the ``<b>`` markers given back. A message
    that itself holds ``<b>`` shows it bold, never anything else."""
    if not headline:
        return ""
    text = escape(headline).replace("&lt;b&gt;", "<b>").replace("&lt;/b&gt;", "</b>")
    return mark_safe(text)  # noqa: S308 (escaped above)
