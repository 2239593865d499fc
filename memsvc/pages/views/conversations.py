"""The conversations pages: the list with search, one conversation with its forks, members
and transfers. Each view parses its form with the user API's own input serializer, reaches
the conversation through ``access_conversation`` and calls one service or selector."""

import logging
from dataclasses import dataclass

from django.conf import settings
from django.contrib import messages as flash
from django.db.models import prefetch_related_objects
from django.http import StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from agents_api.assistant import (
    ANSWER_FAILED,
    answering,
    assistant_of,
    assistant_reply,
    pages_assistant,
    read_by_others,
    refuse_answered,
)
from conversations import selectors, services
from conversations.api import serializers as s
from conversations.models import AccessLevel, Conversation, Role
from memsvc.api.errors import ApiError, Conflict, NotFound
from memsvc.api.fields import InputSerializer, PrincipalIdField
from memsvc.api.principals import principal_for_sharing
from memsvc.llm import LLMError, llm_configured
from memsvc.pages.views.common import (
    PAGE_SIZE,
    action,
    back,
    fields_named,
    form_fields,
    fragment_or_page,
    names_shown,
    page,
    say_who_recorded,
)
from memsvc.text import shows_nothing
from search.selectors import search_messages

logger = logging.getLogger(__name__)


@page
def home(request):
    conversations = selectors.conversation_page(
        request.principal, after=request.GET.get("after") or None, limit=PAGE_SIZE
    )
    # The newest pending offers (anyone may offer anyone a conversation: unbounded, every
    # one was a row of this page).
    transfers = selectors.transfer_page(
        request.principal, status=None, after=None, limit=PAGE_SIZE
    ).rows
    prefetch_related_objects(transfers, "conversation")  # their titles, in one query
    # Which of them the person may open: one offered to them may be of a group they are not
    # in yet (its link was a 404).
    opened = set(
        selectors.visible_conversation_ids(request.principal)
        .filter(id__in=[transfer.conversation_id for transfer in transfers])
        .values_list("id", flat=True)
    )
    for transfer in transfers:
        transfer.opens = transfer.conversation_id in opened
    context = {
        "conversations": conversations,
        "transfers": transfers,
        "llm": llm_configured(),
    }
    return fragment_or_page(request, "pages/_conversation_rows.html", "pages/home.html", context)


SEARCH_WORDS = "Search words"  # (the search box's label)
# The relevance a hit needs to be shown to a person (the API's ``minScore``): with none, any
# word found the 20 messages nearest it, however unrelated (review); 0.3 keeps a message
# holding a third of the words, or as near in meaning as a paraphrase.
PAGE_MIN_SCORE = 0.3


@page(q=SEARCH_WORDS)
def search(request):
    query = request.GET.get("q", "")
    hits = []
    if not shows_nothing(query):
        with fields_named(query=SEARCH_WORDS):
            # As many hits as the API gives at most.
            asked = s.SearchMessagesIn.search_arguments(
                {
                    "query": query,
                    "topK": settings.MEMORY_MAX_SEARCH_LIMIT,
                    "minScore": PAGE_MIN_SCORE,
                }
            )
        hits = search_messages(request.principal, **asked)
    # Each hit named by its conversation too: "alice, 2026-12-06 11:39", three times, said
    # nowhere where the link goes (review).
    titles = selectors.conversation_titles(
        request.principal, (hit.message.conversation_id for hit in hits)
    )
    say_who_recorded([hit.message for hit in hits])
    context = {
        "query": query,
        "hits": [(hit, titles.get(hit.message.conversation_id, "")) for hit in hits],
    }
    return fragment_or_page(request, "pages/_search_results.html", "pages/search.html", context)


@action
def conversation_create(request):
    with fields_named(title="Title"):
        data = s.CreateConversationIn.parse(form_fields(request, "title"))
    writers = []
    if llm_configured() and request.POST.get("assistant") == "on":
        writers.append(pages_assistant().principal_id)
    conversation = services.conversation_create(
        request.principal, title=data.get("title", ""), writer_ids=writers
    )
    return redirect("pages:conversation", conversation.id)


# How deep the branches' list indents; deeper ones are drawn at that depth (a chain of forks
# made as a person edits a message again and again has hundreds).
FORK_TREE_INDENTS = 8


@dataclass
class ForkRow:
    """A conversation of the group in the branches' list: ``depth`` forks from the root;
    ``forked``: whether a nested list of its forks follows; ``ends``: how many nested
    lists end after it (its depth down to the next row's)."""

    conversation: Conversation
    depth: int
    forked: bool = False
    ends: range = range(0)

    @property
    def forks_indented(self) -> bool:
        return self.depth + 1 < FORK_TREE_INDENTS


def _fork_rows(forks: list[Conversation]) -> list[ForkRow]:
    """The group's conversations (root first, ``conversation_forks``) in the order the
    branches' nested lists show them, each fork under its parent. Walked with a list of
    its own, not drawn by a template that includes itself: a chain of about 70 forks
    reached Python's recursion limit and no page of the group opened (review)."""
    ids = {fork.id for fork in forks}
    children: dict = {}
    for fork in forks:
        parent = fork.forked_at_conversation_id if fork.forked_at_conversation_id in ids else None
        children.setdefault(parent, []).append(fork)
    rows: list[ForkRow] = []
    waiting = [(root, 0) for root in reversed(children.get(None, []))]
    while waiting:
        fork, depth = waiting.pop()
        forked = children.get(fork.id, [])
        rows.append(ForkRow(fork, depth, forked=bool(forked)))
        waiting.extend((child, depth + 1) for child in reversed(forked))
    for row, after in zip(rows, [*rows[1:], None], strict=True):
        if not row.forked:
            row.ends = range(row.depth - (after.depth if after else 0))
    return rows


@page
def conversation(request, conversation_id):
    """A conversation opens on its latest messages (``?before=`` pages back to earlier
    ones); ``?at=`` opens it at a message (a search hit) and ``?after=`` pages on from
    there. htmx asks for the rows of the next page only."""
    conversation = selectors.access_conversation(request.principal, conversation_id)
    starting_at = request.GET.get("at")
    after = request.GET.get("after") or None
    if starting_at or after:
        forward = selectors.message_page(
            request.principal,
            conversation,
            after=after,
            limit=PAGE_SIZE,
            starting_at=selectors.message_in_view(conversation, starting_at, for_agent=False)
            if starting_at
            else None,
        )
        rows, earlier, later = forward.rows, None, forward.next_cursor
        if starting_at and rows and not request.htmx:
            # Opened at a message (a search hit): the turns before it are a page back, as
            # from the latest (there was no way to them but from the latest: review).
            earlier = selectors.earlier_messages_cursor(
                request.principal, conversation, before=rows[0]
            )
    else:
        backward = selectors.latest_message_page(
            request.principal,
            conversation,
            before=request.GET.get("before") or None,
            limit=PAGE_SIZE,
        )
        rows, earlier, later = backward.rows[::-1], backward.next_cursor, None
        if request.GET.get("before") and rows and not request.htmx:
            # A page back opened as a page of its own (a link opened in a tab, no script):
            # the turns after it are a page on, as from a search hit (it had no way to them,
            # and the chat put a message sent there after its last row: review).
            later = selectors.later_messages_cursor(request.principal, conversation, after=rows[-1])
    say_who_recorded(rows)
    level = AccessLevel(conversation.access_level)
    llm = llm_configured()
    context = {
        "conversation": conversation,
        "rows": rows,
        "earlier": earlier,
        "later": later,
        "at": starting_at,
        "can_write": level.allows(AccessLevel.WRITER),
        "can_manage": level.allows(AccessLevel.MANAGER),
        "is_owner": level == AccessLevel.OWNER,
        "llm": llm,
        "assistant": _assistant(request, conversation),
    }
    if context["assistant"] is not None:
        context["read_by_others"] = read_by_others(conversation, request.principal.id)
        # The latest turn the person's, still unanswered (the model failed, the page was
        # left meanwhile): the answer may be asked for again (it could not, once the page
        # was reloaded: review).
        context["unanswered"] = later is None and bool(rows) and rows[-1].role == Role.USER
    if request.htmx:  # the next page of messages
        return render(request, "pages/_message_rows.html", context)
    memberships = selectors.group_memberships(conversation)
    names = names_shown(m.principal_id for m in memberships)
    for membership in memberships:
        membership.shown_as = names[membership.principal_id]
    forks = selectors.conversation_forks(conversation, previews=True)
    context.update(
        forks=_fork_rows(forks),
        # Deleting it deletes them too (``conversation_delete``): its button says so.
        has_branches=selectors.deletes_branches(conversation),
        memberships=memberships,
        levels=[level for level in AccessLevel if level != AccessLevel.OWNER],
        offer=selectors.pending_transfer_seen_by(request.principal, conversation),
    )
    return render(request, "pages/conversation.html", context)


def _assistant(request, conversation):
    """The agent that answers the person asking in ``conversation`` (``assistant_of``);
    None without an LLM."""
    return assistant_of(conversation, asked_by=request.principal.id) if llm_configured() else None


def _at_level(request, conversation_id, need: AccessLevel) -> Conversation:
    return selectors.access_conversation(request.principal, conversation_id, need=need)


@action
def message_append(request, conversation_id):
    """The person's message. The page's script asks for the assistant's answer as a stream
    (``reply``) and gets just the new message to show; without the script the assistant (if
    any) answers before the page comes back."""
    conversation = _at_level(request, conversation_id, AccessLevel.WRITER)
    with fields_named(content="Your message"):
        data = s.CreateUserMessageIn.parse(form_fields(request, "content"))
    assistant = _assistant(request, conversation)
    if request.htmx:
        if assistant is not None:
            # A busy assistant refuses before the message is kept, as without the script (a
            # look: one that fills meanwhile refuses the answer the script then asks for).
            answering.check()
        message = services.message_append(request.principal, conversation=conversation, **data)
        context = {"rows": [message], "conversation": conversation, "can_write": True}
        return render(request, "pages/_message_rows.html", context)
    message = _kept_and_answered(
        request,
        assistant,
        lambda: services.message_append(request.principal, conversation=conversation, **data),
    )
    page_url = reverse("pages:conversation", args=[conversation.id])
    return redirect(f"{page_url}#m-{message.id}")


@action
def reply(request, conversation_id):
    """The assistant's answer to the latest turns, streamed as plain text while the model
    writes it, then kept as its message."""
    conversation = _at_level(request, conversation_id, AccessLevel.WRITER)
    assistant = _assistant(request, conversation)
    if assistant is None:
        raise Conflict("no assistant answers in this conversation")
    # An answer asks for a turn to answer: a second tab, or a request sent again, had the
    # assistant answer the answered turns once more, and keep it (review). Looked at again
    # as the answer is kept (two tabs asking at once).
    turn = refuse_answered(conversation)
    release = answering.take()

    def stream():
        try:
            yield from assistant_reply(assistant, conversation, user=request.principal, turn=turn)
        # (The conversation gone, or the person out of it, meanwhile: an ApiError. Said as a
        # refusal, not left as the assistant's answer: review.)
        except (LLMError, ApiError) as exc:
            yield f"{ANSWER_FAILED}{_not_answered(conversation, exc)}"

    response = _Answer(stream(), release=release, content_type="text/plain; charset=utf-8")
    response["X-Accel-Buffering"] = "no"  # a proxy in front passes the pieces on at once
    return response


def _kept_and_answered(request, assistant, keep):
    """What ``keep()`` returns (the person's message appended, or the fork made with it),
    then ``assistant``'s answer (if any) in its conversation, before the page comes back.
    The answer's place is taken first: refused (429), nothing is kept. A model's failure,
    or an answer that cannot be kept, is said on the page; the person's message stays."""
    release = answering.take() if assistant is not None else lambda: None
    try:
        kept = keep()
        conversation = kept if isinstance(kept, Conversation) else kept.conversation
        if assistant is not None:
            try:
                for _ in assistant_reply(assistant, conversation, user=request.principal):
                    pass
            except ApiError as exc:  # (answered meanwhile, in another tab: was a 409 page)
                flash.error(request, _not_answered(conversation, exc))
    except LLMError as exc:
        flash.error(request, _not_answered(conversation, exc))
    finally:
        release()
    return kept


class _Answer(StreamingHttpResponse):
    """A streamed answer, which gives its place back (``answering``) when it is closed:
    sent whole, cut short, or its client gone."""

    def __init__(self, *args, release, **kwargs):
        super().__init__(*args, **kwargs)
        self.release = release

    def close(self):
        try:
            super().close()
        finally:
            self.release()


def _not_answered(conversation, exc: LLMError | ApiError) -> str:
    """Why the assistant's answer is not in ``conversation``, as a page says it (the chat's
    stream, or the page after a form); a model's failure logged."""
    if isinstance(exc, LLMError):
        logger.warning(
            "the assistant of conversation %s could not answer: %s", conversation.id, exc
        )
        return f"The assistant could not answer: {exc.shown}"
    return f"The answer could not be kept: {exc.message}"


@action
def fork(request, conversation_id, message_id):
    conversation = _at_level(request, conversation_id, AccessLevel.WRITER)
    message = selectors.message_in_view(conversation, message_id, for_agent=False)
    with fields_named(content="A new version of this message"):
        data = s.CreateUserMessageIn.parse(form_fields(request, "content"))
    # Its new version of the message is answered as a message sent is (it was not: review).
    new = _kept_and_answered(
        request,
        _assistant(request, conversation),
        lambda: services.conversation_fork(
            request.principal, conversation=conversation, message=message, new_message=data
        ),
    )
    flash.success(request, "A new branch, with your new version of the message.")
    return redirect("pages:conversation", new.id)


@action
def rename(request, conversation_id):
    conversation = _at_level(request, conversation_id, AccessLevel.WRITER)
    with fields_named(title="New title"):
        data = s.UpdateConversationIn.parse(form_fields(request, "title"))
        services.conversation_update(request.principal, conversation=conversation, **data)
    flash.success(request, "Title saved.")
    return redirect("pages:conversation", conversation.id)


@action
def delete(request, conversation_id):
    conversation = _at_level(request, conversation_id, AccessLevel.OWNER)
    services.conversation_delete(request.principal, conversation=conversation)
    flash.success(request, "The conversation was deleted.")
    return redirect("pages:home")


@action
def share(request, conversation_id):
    conversation = _at_level(request, conversation_id, AccessLevel.MANAGER)
    # A refusal names the fields by their labels (SHARE_LABELS), not the form's names.
    with fields_named(**SHARE_LABELS):
        fields = form_fields(request, "userId", "accessLevel", user_ids=("userId",))
        data = s.ShareIn.parse(fields)
        member = principal_for_sharing(data["userId"], field="userId")
        services.membership_create(
            request.principal,
            conversation=conversation,
            principal_id=member,
            access_level=data["accessLevel"],
        )
    flash.success(request, f"Shared with {_named(member)}, as a {data['accessLevel']}.")
    return redirect("pages:conversation", conversation.id)


# The labels of the share and transfer forms' fields (templates/pages/conversation.html).
SHARE_LABELS = {"userId": "Share with", "accessLevel": "Access"}
TRANSFER_LABELS = {"newOwnerUserId": "Transfer ownership to"}


class MemberIn(InputSerializer):
    # The member a form is about (``urls``: in the form, not in its address), exactly as
    # the membership names them.
    userId = PrincipalIdField()


def _named(principal_id: str) -> str:
    """A member as the page names them (``names_shown``)."""
    return names_shown([principal_id])[principal_id]


def _member_id(request) -> str:
    return MemberIn.parse(form_fields(request, "userId"))["userId"]


@action
def membership_update(request, conversation_id):
    user_id = _member_id(request)
    conversation = _at_level(request, conversation_id, AccessLevel.MANAGER)
    membership = selectors.membership_of(conversation, user_id)
    with fields_named(accessLevel="Access"):
        data = s.UpdateMembershipIn.parse(form_fields(request, "accessLevel"))
    services.membership_update(
        request.principal, membership=membership, access_level=data["accessLevel"]
    )
    flash.success(request, f"{_named(user_id)} is now a {data['accessLevel']}.")
    return redirect("pages:conversation", conversation.id)


@action
def membership_delete(request, conversation_id):
    user_id = _member_id(request)
    need = services.removal_needs(request.principal, user_id)
    conversation = _at_level(request, conversation_id, need)
    membership = selectors.membership_of(conversation, user_id)
    services.membership_delete(request.principal, membership=membership)
    if user_id == request.principal.id:  # (left: the conversation is no longer theirs to see)
        flash.success(request, "You left the conversation.")
        return redirect("pages:home")
    flash.success(request, f"{_named(user_id)} was removed.")
    return redirect("pages:conversation", conversation.id)


@action
def transfer(request, conversation_id):
    conversation = _at_level(request, conversation_id, AccessLevel.OWNER)
    with fields_named(**TRANSFER_LABELS):
        fields = form_fields(request, "newOwnerUserId", user_ids=("newOwnerUserId",))
        data = s.TransferIn.parse(fields)
        services.ownership_transfer_start(
            request.principal, conversation=conversation, to_principal=data["newOwnerUserId"]
        )
    flash.success(
        request, f"Ownership offered to {_named(data['newOwnerUserId'])}: theirs once they accept."
    )
    return redirect("pages:conversation", conversation.id)


_RESOLVE = {
    "accept": (services.ownership_transfer_accept, "The conversation is yours now."),
    "decline": (services.ownership_transfer_decline, "The offer was declined."),
    "cancel": (services.ownership_transfer_cancel, "The offer was cancelled."),
}


@action
def transfer_resolve(request, transfer_id, verb):
    if verb not in _RESOLVE:
        raise NotFound("no such action")
    transfer = selectors.access_transfer(request.principal, transfer_id)
    resolve, said = _RESOLVE[verb]
    resolve(request.principal, transfer=transfer)
    flash.success(request, said)
    return back(request, "pages:home")
