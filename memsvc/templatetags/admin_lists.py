"""Tags of memsvc's admin templates."""

from django import template
from django.contrib.admin.views.main import PAGE_VAR

from memsvc.admin_tools import AtLeast

register = template.Library()


@register.simple_tag
def page_past_the_count(cl) -> str:
    """The address of the next page of a list counted past ``COUNT_CAP`` (``AtLeast``)
    whose page links end at this one, or "": the pages past the count were reached only by
    typing ``?p=`` (code review)."""
    paginator = cl.paginator
    if not isinstance(paginator.count, AtLeast) or cl.page_num < paginator.num_pages:
        return ""
    if len(cl.result_list) < cl.list_per_page:
        return ""  # (the last page)
    return cl.get_query_string({PAGE_VAR: cl.page_num + 1})
