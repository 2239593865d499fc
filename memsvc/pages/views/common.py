"""What every page shares: who is asking, and how a refusal of a service looks on a page."""

import time
from contextlib import contextmanager
from functools import partial, wraps
from urllib.parse import urlsplit

from django.contrib import messages as flash
from django.contrib.auth.views import redirect_to_login
from django.http import HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django.views import defaults
from django_htmx.http import HttpResponseClientRedirect
from rest_framework.exceptions import ValidationError

from agents_api.selectors import agent_names
from conversations.models import Role
from memsvc.api.errors import ApiError, as_api_error, exception_handler
from memsvc.api.middleware import request_refusal
from memsvc.api.principals import Principal, agent_uuid_of, user_id_problem
from memsvc.api.ratelimit import auth_check_ended, limit_principal
from memsvc.pages.security import under_the_pages

PAGE_SIZE = 50


def names_shown(principal_ids) -> dict[str, str]:
    """How the pages name each of ``principal_ids``: a user by their id, an agent as
    "agent <its name>" (not ``agent:<uuid>``, an id the person never sees elsewhere; and
    an agent named bob was the user bob beside it: review), one no longer there by its id."""
    principal_ids = set(principal_ids)
    agents = agent_names(principal_ids)
    return {
        principal_id: f"agent {agents[principal_id]}" if principal_id in agents else principal_id
        for principal_id in principal_ids
    }


def say_who_recorded(messages) -> None:
    """A user's turn an agent wrote (recorded for them, or signed with any name) says which
    agent wrote it (``message.recorded_by``): it was shown as that person's own, a turn any
    agent in the conversation could sign "alice" (review). An agent's own turns are its
    role's (assistant, tool, ...), signed with its name when it wrote them, which a rename
    since does not make another's (code review)."""
    recorded = [
        message
        for message in messages
        if message.role == Role.USER and agent_uuid_of(message.author_principal)
    ]
    agents = agent_names(message.author_principal for message in recorded)
    for message in recorded:
        name = agents.get(message.author_principal)
        message.recorded_by = f"agent {name}" if name else "an agent"


def page(view=None, /, **query_labels: str):
    """A page for a logged-in person (``@page``; ``@page(q="Search words")``: the page's
    query parameters as it labels them, for the refusals made before it reads them: a NUL
    in ``?q=`` named "q", a field the person never saw; review). ``request.principal`` is that person as the API knows
    them: the username is the principal id, the ``sub`` of their JWT, so the pages and the
    user API show one person the same conversations, and count against one rate limit
    (``limit_principal``). Whatever a service or selector refuses (404 to a stranger, 403
    below the needed level, 400, 409, 429) is answered with the API's status and message,
    as a page or, for htmx, as a fragment.

    An address answers htmx with a fragment and a browser with the page, so every answer
    varies on ``HX-Request``: else the browser keeps the fragment of a search whose address
    htmx pushed, and going back to that address shows the bare fragment."""

    if view is None:
        return partial(page, **query_labels)
    shown = _logged_in(view, query_labels)

    @wraps(view)
    def only_read(request, *args, **kwargs):
        # (A POST, PUT or DELETE was answered with the page, 200: review.)
        if request.method not in ("GET", "HEAD"):
            return not_a_page(request, allowed="GET, HEAD", said=NOT_A_FORM)
        return shown(request, *args, **kwargs)

    return only_read


def _logged_in(view, query_labels: dict):
    """``view`` as a page or a form's POST is served (``page``, ``action``)."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return _to_login(request)
        auth_check_ended(request)  # (a page's credential is its session, not a header)
        name = request.user.get_username()
        problem = user_id_problem(name)
        if problem:
            # A login made before its name became memsvc's own (``local``, ``memsvc``:
            # the owners of its agents) acts as no one (review: an upgrade's "local"
            # made conversations as the owner of the local agents).
            error = f"This login cannot use the pages: its name {problem}."
            response = refusal_page(request, error, status=403, came_from=None)
            patch_vary_headers(response, ["HX-Request"])
            return response
        request.principal = Principal.user(name)
        try:
            # What the API refuses before any view (a NUL in the path or the query, which
            # PostgreSQL cannot compare): the pages too, not as a 500.
            refusal = request_refusal(request)
            if refusal is not None:
                raise refusal.named(query_labels)
            limit_principal(request.principal.rate_limit_key)
            request.refused_form = refused_form(request)
            response = view(request, *args, **kwargs)
        except (ApiError, ValidationError) as exc:
            response = _from_the_start(request, exc) or _refused(
                request, exception_handler(exc, None)
            )
        patch_vary_headers(response, ["HX-Request"])
        return response

    return wrapper


# The cursors of the pages' lists (``?after=``, ``?before=``).
_CURSORS = ("after", "before")


def _from_the_start(request, exc) -> HttpResponseRedirect | None:
    """A page opened with a cursor its list refuses (another list's, another
    conversation's, one made before cursors named their list: a link kept from another page
    or tab) opens at its list's start, saying so: the refusal spoke the API's words to a
    person ("before: a cursor of another list, or of other filters or another caller: list
    again"), with no way back but to the conversations (review). Not for htmx, whose
    fragment goes into a page that holds the list already."""
    details = getattr(exc, "details", None) or {}
    if request.method != "GET" or request.htmx or not set(details) & set(_CURSORS):
        return None
    query = request.GET.copy()
    for name in _CURSORS:
        query.pop(name, None)
    flash.info(request, "That part of the list is no longer there: here is its start.")
    return HttpResponseRedirect(request.path + (f"?{query.urlencode()}" if query else ""))


# A form's refusal kept for the page it was sent from (``_refused``): the form's address, what
# it said, and what was typed into it.
REFUSED_FORM = "refused_form"
# Refusals of what a form said (invalid, or in conflict with what is there), not of who sent
# it or when (403, 404, 429: the refusal's own page says those).
_KEPT_ON_THE_FORM = {400, 409}


def _refused(request, refusal):
    """A refusal as a page, or as a fragment for htmx. A plain form's refusal of what it said
    goes back to the page it was sent from, which shows it on the form with what was typed
    (``refused_form``; a page of its own took the person away from the form, and going back
    to it lost their text: review). The refused POST's address is no page to reload: a
    reload posted the form again (review)."""
    came_from = _came_from(request)
    error = refusal.data["error"]
    if (
        request.method == "POST"
        and not request.htmx
        and came_from
        and refusal.status_code in _KEPT_ON_THE_FORM
    ):
        typed = {name: value for name, value in request.POST.items() if name not in _NOT_TYPED}
        # One a page (two tabs' refusals on two pages took each other's place: review).
        waiting = _waiting_refusals(request)
        waiting[urlsplit(came_from).path] = {
            "action": request.path,
            "at": time.time(),
            "error": error,
            "typed": typed,
        }
        request.session[REFUSED_FORM] = waiting
        return HttpResponseRedirect(came_from)
    response = refusal_page(request, error, status=refusal.status_code, came_from=came_from)
    if "Retry-After" in refusal:
        response["Retry-After"] = refusal["Retry-After"]
    return response


def refusal_page(request, error: str, *, status: int, came_from: str | None):
    """The pages' refusal: ``error`` said, with the way back to ``came_from`` (this site's
    page the request came from, if any) and to the conversations; asked by htmx, the part
    that says it (``_refused.html``), the address in the history left as it was."""
    template = "pages/_refused.html" if request.htmx else "pages/refused.html"
    context = {"error": error, "came_from": came_from}
    response = render(request, template, context, status=status)
    if request.htmx:  # (no address in the history for what was refused: review)
        response["HX-Push-Url"] = "false"
    return response


_NOT_TYPED = {"csrfmiddlewaretoken", "next"}


# How long a refusal waits for its page (another tab of the session may load another page
# first); then it is forgotten.
REFUSED_FORM_SECONDS = 60


def not_found(request, exception):
    """Django's answer to a path no route takes (``handler404``): under the pages', their
    refusal page, with its way back to the conversations (Django's bare "Not Found" page had
    none: review); elsewhere (the admin's, static files') Django's."""
    if under_the_pages(request):
        return refusal_page(request, "There is no such page here.", status=404, came_from=None)
    return defaults.page_not_found(request, exception)


def refused_form(request) -> dict | None:
    """The refusal of a form sent from this page (``_refused``), once: a page shown again
    later shows none, and another page does not take it (another tab's, or the next page
    loaded after it: code review)."""
    if request.method != "GET" or request.htmx or REFUSED_FORM not in request.session:
        return None
    waiting = _waiting_refusals(request)
    refused = waiting.pop(request.path, None)
    if waiting:
        request.session[REFUSED_FORM] = waiting
    else:
        del request.session[REFUSED_FORM]
    return refused


def _waiting_refusals(request) -> dict:
    """The refusals waiting for their pages (page -> refusal), those of the last minute."""
    now = time.time()
    return {
        page: refused
        for page, refused in request.session.get(REFUSED_FORM, {}).items()
        if now - refused["at"] <= REFUSED_FORM_SECONDS
    }


def _to_login(request):
    """The login page, which then comes back to the page the person was on. Asked by htmx
    or the chat's script (a session ended meanwhile: logged out in another tab, expired),
    the browser goes there whole (``HX-Redirect``): a redirect was followed inside the
    request, and the login page swapped in as a fragment (review). A form's POST, and a
    fragment, come back to the page they were sent from (the ``HX-Current-URL``, else the
    ``Referer``), not to their own address."""
    here = request.get_full_path()
    if request.htmx or request.method != "GET":
        here = _sent_from(request)
    login = redirect_to_login(here)
    return HttpResponseClientRedirect(login.url) if request.htmx else login


def _sent_from(request) -> str:
    """The page a request was sent from (the ``HX-Current-URL``, else the ``Referer``), of
    this site; else the home page."""
    sent_from = [request.htmx.current_url, request.headers.get("Referer", "")]
    ours = [urlsplit(target) for target in sent_from if target and _ours(request, target)]
    return ours[0]._replace(scheme="", netloc="").geturl() if ours else reverse("pages:home")


OUT_OF_DATE = "The page was out of date (a login in another tab renews it): try again."


def csrf_failure(request, reason=""):
    """``CSRF_FAILURE_VIEW``: a form sent from a page whose token a login in another tab
    renewed (or not sent from a page of this site). Asked by htmx or the chat's script, the
    whole browser loads that page again, with the new token (``HX-Redirect``): Django's own
    refusal page was put into the chat's form or a memory's row (review). A plain form gets
    the pages' refusal (403), with a link back."""
    if request.htmx:
        return HttpResponseClientRedirect(_sent_from(request))
    return refusal_page(request, OUT_OF_DATE, status=403, came_from=_came_from(request))


def action(view):
    """A form's POST (as a ``page`` is served): CSRF-checked by the middleware, answered by
    a redirect; its address opened in the browser, ``not_a_page``."""
    posted = _logged_in(view, {})

    @wraps(view)
    def only_posted(request, *args, **kwargs):
        if request.method != "POST":
            return not_a_page(request)
        return posted(request, *args, **kwargs)

    return only_posted


NOT_A_PAGE = "This address takes a form's answer, not a visit: go back to the page of the form."
NOT_A_FORM = "This page is to be read: nothing is sent to it."


def not_a_page(request, allowed: str = "POST", said: str = NOT_A_PAGE):
    """The address of a form's POST opened in the browser (a bookmark, Enter in the address
    bar after a refusal left it there), or a page's sent to: the pages' refusal (405), with
    its ways back. It was an empty 405, which the browser showed as an error page of its
    own (review)."""
    response = refusal_page(request, said, status=405, came_from=_came_from(request))
    response["Allow"] = allowed
    return response


def back(request, fallback: str, *args, **kwargs):
    """Where a form goes after its POST: the ``next`` page it names (this site's only),
    else ``fallback``. A ``next`` is an address, never a view's name to look up (``redirect``
    would, and fail with a 500 on a word that names none)."""
    target = request.POST.get("next", "")
    if _ours(request, target):
        return HttpResponseRedirect(target)
    return redirect(fallback, *args, **kwargs)


def _came_from(request) -> str | None:
    """The page a refused request was made from, to go back to: a form's ``next``, else the
    page the browser says it came from (``Referer``), this site's only, and never the
    refused address itself."""
    for target in (request.POST.get("next", ""), request.headers.get("Referer", "")):
        # (Not the login page either: for a logged-in person it goes straight back to the
        # refused page, a loop after logging in as another person; review.)
        path = urlsplit(target).path
        if _ours(request, target) and path not in (request.path, reverse("pages:login")):
            return target
    return None


def _ours(request, target: str) -> bool:
    return bool(target) and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )


def fragment_or_page(request, fragment: str, page_template: str, context: dict):
    """An htmx request gets the fragment it swaps in; a plain one, the whole page."""
    return render(request, fragment if request.htmx else page_template, context)


@contextmanager
def fields_named(**names: str):
    """A refusal inside names the fields as the page does (``query="q"``: the search box is
    ``?q=``, and "query: Ensure this field has no more than 2000 characters" named a field
    the person never saw; review)."""
    try:
        yield
    except (ApiError, ValidationError) as exc:
        raise as_api_error(exc).named(names) from None


def form_fields(request, *names: str, user_ids: tuple[str, ...] = ()) -> dict:
    """The named fields a form sent (absent ones left out, as in a JSON body), their line
    breaks as the API's ("\n": a browser sends a textarea's as "\r\n", so a block saved
    unchanged was rewritten, and a text within its limit as typed went past it: review).
    The ``user_ids`` fields lose the spaces around them: typed or pasted with one (a phone
    keyboard adds it after a completed word), a user id would name someone else."""
    fields = {
        name: request.POST[name].replace("\r\n", "\n") for name in names if name in request.POST
    }
    return {name: value.strip() if name in user_ids else value for name, value in fields.items()}
