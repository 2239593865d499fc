"""Reads of conversations and messages, always starting from what the principal may see.

``conversations_visible_to`` is the one place that decides visibility; every list, get and
search goes through it (directly or through ``access_conversation``).
"""

import itertools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import (
    BooleanField,
    Case,
    CharField,
    Exists,
    Expression,
    ExpressionWrapper,
    F,
    FilteredRelation,
    Func,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    UUIDField,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Greatest, Least, Left
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from conversations.models import (
    AccessLevel,
    Channel,
    Conversation,
    ConversationGroup,
    Membership,
    Message,
    OwnershipTransfer,
    Role,
    TransferStatus,
    Visibility,
)
from memsvc.api.errors import Forbidden, InvalidInput, NotFound, one_or_404
from memsvc.api.pagination import (
    Page,
    beyond,
    decode_cursor,
    encode_cursor,
    in_utc,
    keyset_page,
    list_digest,
)
from memsvc.api.principals import (
    AGENT_PRINCIPAL_PREFIX,
    Principal,
    agent_uuid_of,
    stored_principal_id,
)
from memsvc.db import compiled_once
from memsvc.validators import as_uuid

PREVIEW_CHARS = 200

_RANKS = [(level, level.rank) for level in AccessLevel]


def _rank_of(expression):
    return Case(
        *[When(**{expression: level.value}, then=Value(rank)) for level, rank in _RANKS],
        output_field=IntegerField(),
    )


def _level_of(rank_expression):
    return Case(
        *[When(**{rank_expression: rank}, then=Value(level.value)) for level, rank in _RANKS],
        output_field=CharField(),
    )


def conversations_visible_to(principal: Principal) -> QuerySet[Conversation]:
    """Every conversation the principal is a member of, annotated with ``access_level`` and
    ``joined_at`` (since when the principal sees it).

    An agent acting for a user needs both memberships; its level is the lower of the two.
    """
    queryset = Conversation.objects.all()
    for index, member_id in enumerate(principal.member_ids):
        queryset = queryset.annotate(
            **{
                f"_member{index}": FilteredRelation(
                    "group__memberships",
                    condition=Q(group__memberships__principal_id=member_id),
                )
            }
        ).filter(**{f"_member{index}__isnull": False})
    if len(principal.member_ids) == 1:
        return queryset.annotate(
            access_level=F("_member0__access_level"), joined_at=F("_member0__created_at")
        )
    members = range(len(principal.member_ids))
    ranks = [_rank_of(f"_member{i}__access_level") for i in members]
    return queryset.annotate(
        _access_rank=Least(*ranks),
        # (seen since the later of the two memberships)
        joined_at=Greatest(*(F(f"_member{i}__created_at") for i in members)),
    ).annotate(access_level=_level_of("_access_rank"))


# The messages a user reads (agents read every channel): the HISTORY channel's user-visible
# ones. Search's statements say the same in SQL (``search.selectors.message_scope``), and
# ``Message.seen_by_users`` of one message.
SEEN_BY_USERS = Q(channel=Channel.HISTORY, visibility=Visibility.USER)


def visible_conversation_ids(principal: Principal) -> QuerySet:
    """The ids of ``conversations_visible_to(principal)``, as a filter: a semi-join on the
    principal's memberships, without the access level (about half the planning time, which
    counts in a search that filters three statements by it)."""
    queryset = Conversation.objects.all()
    for member_id in principal.member_ids:
        queryset = queryset.filter(
            group_id__in=Membership.objects.filter(principal_id=member_id).values("group_id")
        )
    return queryset.values("id")


def messages_visible_to(principal: Principal) -> QuerySet[Message]:
    """The messages of ``visible_conversation_ids(principal)``, of the channel and visibility
    the principal reads (a user: HISTORY's user-visible ones, as ``conversation_messages``);
    one that is not is "no such message" to the principal, like a random id."""
    messages = Message.objects.filter(conversation_id__in=visible_conversation_ids(principal))
    if principal.kind != "agent":
        messages = messages.filter(SEEN_BY_USERS)
    return messages


def _last_seen_text(**where) -> QuerySet:
    """The text of the last message a user sees among the messages ``where`` picks (a
    subquery)."""
    return Message.objects.filter(SEEN_BY_USERS, **where).order_by("-seq").values("content")[:1]


def activity_column(principal: Principal) -> str:
    """The time of a conversation's latest change as the principal is shown it, and orders
    its lists by: agents read every turn (``updated_at``); users only what ``seen_at``
    counts, so an agent's hidden turns do not tell them when it wrote."""
    return "updated_at" if principal.kind == "agent" else "seen_at"


def _with_summary_fields(
    queryset: QuerySet[Conversation], principal: Principal | None = None
) -> QuerySet[Conversation]:
    """Owner and last message preview, in the same query (no per-row lookups); with the
    ``principal``, the time of its latest change as shown to it (``activity_at``)."""
    if principal is not None:
        queryset = queryset.annotate(activity_at=F(activity_column(principal)))
    last_message = _last_seen_text(conversation=OuterRef("pk"))
    # A fork without messages of its own: the last a user sees up to its fork point (which
    # may itself be an agent-only turn: its text is not a user's to read).
    before_fork = _last_seen_text(
        conversation=OuterRef("forked_at_message__conversation"),
        seq__lte=OuterRef("forked_at_message__seq"),
    )
    return queryset.annotate(
        _owner=FilteredRelation(
            "group__memberships",
            condition=Q(group__memberships__access_level=AccessLevel.OWNER),
        ),
        owner_id=F("_owner__principal_id"),
        last_message_preview=Left(
            Coalesce(Subquery(last_message), Subquery(before_fork)), PREVIEW_CHARS
        ),
    )


_SUBTREE_SQL = """
WITH RECURSIVE subtree(id, parent, point) AS (
    SELECT id, forked_at_conversation_id, forked_at_message_id FROM conversation WHERE id = %s
  UNION ALL
    SELECT c.id, c.forked_at_conversation_id, c.forked_at_message_id
    FROM conversation c JOIN subtree ON c.forked_at_conversation_id = subtree.id
)
SELECT subtree.id, subtree.parent, point.conversation_id
FROM subtree LEFT JOIN message point ON point.id = subtree.point
"""


def _subtree_rows(conversation: Conversation) -> list[tuple]:
    """(id, the conversation it was forked from, the conversation its fork point is in) of
    ``conversation`` and of every fork below it (none when it is gone), in one statement."""
    with connection.cursor() as cursor:
        cursor.execute(_SUBTREE_SQL, [conversation.pk])
        return cursor.fetchall()


def conversation_subtree(conversation: Conversation) -> list:
    """The ids of ``conversation`` and of every fork below it."""
    return [conversation_id for conversation_id, _, _ in _subtree_rows(conversation)]


def deletion(conversation: Conversation) -> tuple[list, dict]:
    """What deleting ``conversation`` (a fork) takes: the ids of it and of the forks below
    it that share its messages, and the forks below it that stay, each with the
    conversation it moves to (``services.conversation_delete``). A fork that shares none of
    its messages (made at a message of an ancestor of it, seen through it, or before any
    message) stays, with what was made from it; one whose parent goes moves to the
    conversation its fork point is in (one made before any message, to the deleted one's
    parent), and reads what it read. Deleting a fork took along every fork made from it,
    other members' branches holding none of its messages (review)."""
    rows = _subtree_rows(conversation)
    subtree = [fork_id for fork_id, _, _ in rows]
    parent_of, point_in = {}, {}
    for fork_id, parent, point in rows:
        parent_of[fork_id], point_in[fork_id] = parent, point
    inside = set(subtree)

    def shares_none(fork_id) -> bool:
        return fork_id != conversation.pk and point_in[fork_id] not in inside

    stays: dict = {conversation.pk: False}

    def staying(fork_id) -> bool:
        if fork_id not in stays:
            stays[fork_id] = shares_none(fork_id) or staying(parent_of[fork_id])
        return stays[fork_id]

    going = [fork_id for fork_id in subtree if not staying(fork_id)]
    moved = {
        fork_id: point_in[fork_id] or conversation.forked_at_conversation_id
        for fork_id in subtree
        if shares_none(fork_id) and parent_of[fork_id] in going
    }
    return going, moved


def deletes_branches(conversation: Conversation) -> bool:
    """Whether deleting ``conversation`` deletes forks too (``services.conversation_delete``):
    a root's, any fork (the group goes); another's, those that share its messages
    (``deletion``)."""
    if conversation.forked_at_conversation_id is None:
        return Conversation.objects.filter(forked_at_conversation=conversation).exists()
    going, _ = deletion(conversation)
    return len(going) > 1


def show_parents(messages) -> None:
    """Set each message's ``parent_shown``: its parent when users see that message, else
    None (the id of an agent-only turn that a reply named was shown to users as its
    ``parentMessageId``, a message none of their lists holds: review). One query."""
    parents = {message.parent_message_id for message in messages if message.parent_message_id}
    seen = set(
        Message.objects.filter(SEEN_BY_USERS, id__in=parents).values_list("id", flat=True)
        if parents
        else ()
    )
    for message in messages:
        message.parent_shown = (
            message.parent_message_id if message.parent_message_id in seen else None
        )


def show_fork_points(conversations) -> None:
    """Set each fork's ``fork_point_shown``: its fork point when users see that message,
    else the last message before it that they see in its view (None when there is none).
    The fork point is the HISTORY message before the turn forked at, whoever sees it: the
    id of an agent-only turn was shown to users as ``forkedAtMessageId``, a message none of
    their lists holds (review). One query for the points; for the forks whose point users
    do not see, two more in all (their views, and the last seen message of each: a list
    of a group's forks read two for each)."""
    forks = [conversation for conversation in conversations if conversation.forked_at_message_id]
    if not forks:
        return
    points = (
        Message.objects.filter(id__in=[fork.forked_at_message_id for fork in forks])
        .annotate(seen=ExpressionWrapper(SEEN_BY_USERS, output_field=BooleanField()))
        .values_list("id", "seq", "seen")
    )
    seq_of = {point: (seq, point_seen) for point, seq, point_seen in points}
    hidden = {}  # fork -> its point's seq
    for fork in forks:
        seq, point_seen = seq_of.get(fork.forked_at_message_id, (None, False))
        fork.fork_point_shown = fork.forked_at_message_id if point_seen else None
        if seq is not None and not point_seen:
            hidden[fork] = seq
    if not hidden:
        return
    lineages = conversation_lineages([fork.id for fork in hidden])
    last_seen = [
        Message.objects.filter(SEEN_BY_USERS, _InLineage(lineages.get(fork.id, [])), seq__lte=seq)
        .annotate(fork_id=Value(fork.id, output_field=UUIDField()))
        .order_by("-seq")
        .values_list("fork_id", "id")[:1]
        for fork, seq in hidden.items()
    ]
    shown = dict(last_seen[0].union(*last_seen[1:], all=True))
    for fork in hidden:
        fork.fork_point_shown = shown.get(fork.id)


def _previewed_through_forks(conversations) -> None:
    """The preview of a fork that ``_with_summary_fields`` could not find (nothing a user
    sees of its own, nor in its fork point's conversation up to it: a fork of a fork made at
    the first turns of its parent, which were agent-only): the last message its view shows,
    read through its whole ancestry. Rare, so one query each."""
    for conversation in conversations:
        if conversation.last_message_preview is None and conversation.forked_at_message_id:
            text = (
                conversation_messages(conversation)
                .order_by("-seq")
                .values_list("content", flat=True)
                .first()
            )
            conversation.last_message_preview = text[:PREVIEW_CHARS] if text else None


def access_conversation(
    principal: Principal,
    conversation_id,
    *,
    need: AccessLevel = AccessLevel.READER,
    summary: bool = True,
) -> Conversation:
    """The conversation if the principal may do what ``need`` allows; with ``summary``, its
    owner and last message preview too (what a view that shows it needs; a write that only
    needs the access skips them: compiling them costs more than the query, about 3 ms).

    404 when it does not exist *or* the principal is not a member (a stranger cannot tell
    the two apart); 403 for a member whose level is below ``need``.
    """
    try:
        conversation_id = uuid.UUID(str(conversation_id))
    except ValueError:
        raise NotFound("conversation not found") from None
    if summary or principal.on_behalf_of:
        visible = conversations_visible_to(principal)
        if summary:
            visible = _with_summary_fields(visible, principal).select_related("forked_at_message")
        conversation = visible.filter(id=conversation_id).first()
    else:
        # A principal's own write's look (an append's above all): its SQL compiled once,
        # and the queryset not even made once it is, as making and compiling it cost four
        # times running it (about 0.9 of an append's 8 ms of the web process's time:
        # docs/benchmarks.md). (An agent acting for a user: its level is a CASE of
        # constants, which ``compiled_once`` does not keep.)
        found = compiled_once(
            "access_conversation",
            lambda: conversations_visible_to(principal).filter(id=conversation_id)[:1],
            [principal.id, conversation_id],
        )
        conversation = next(iter(found), None)
    refuse_below(conversation.access_level if conversation else None, need)
    if summary:
        _previewed_through_forks([conversation])
        show_fork_points([conversation])
    return conversation


def access_group(principal: Principal, group_id, *, need: AccessLevel) -> None:
    """Refuse as ``access_conversation`` does, for the group's conversations as a whole (a
    membership is the group's, so the principal's level is the same in each of them)."""
    level = (
        conversations_visible_to(principal)
        .filter(group_id=group_id)
        .values_list("access_level", flat=True)
        .first()
    )
    refuse_below(level, need)


def refuse_below(level: str | None, need: AccessLevel) -> None:
    """404 for a principal who is not a member (``level`` None), 403 for one whose level is
    below ``need``."""
    if level is None:
        raise NotFound("conversation not found")
    if not AccessLevel(level).allows(need):
        raise Forbidden(f"this needs {AccessLevel(need).value} access to the conversation")


# A text as the conversation list's ``query`` reads it (SQL, ``{}`` the text): accents,
# case and the forms of a letter folded (``unaccent``): "Cafe\u0301" (decomposed) is found
# by "café", "İstanbul" by "istanbul", "Straße" by "STRASSE", a full-width
# "\uff26\uff35\uff2c\uff2c" by "full" (``title__icontains`` found none of them: review).
FOLDED_SQL = "lower(unaccent({}))"


def _holds_folded(text: str, query: str) -> str:
    """SQL: whether ``text`` holds ``query``, both folded (``FOLDED_SQL``). A substring, not
    a LIKE pattern: a fullwidth percent sign or low line is folded to LIKE's own wildcards,
    which an escaped pattern then held unescaped (code review)."""
    return f"strpos({FOLDED_SQL.format(text)}, {FOLDED_SQL.format(query)}) > 0"


class FoldedContains(Func):
    """Whether the text holds ``query`` (``_holds_folded``)."""

    output_field = BooleanField()

    def as_sql(self, compiler, connection, **extra_context):
        text, text_params = compiler.compile(self.source_expressions[0])
        query, query_params = compiler.compile(self.source_expressions[1])
        return _holds_folded(text, query), (*text_params, *query_params)


class MetadataValueContains(Func):
    """Whether a text or number anywhere in a JSON document (``metadata``, at any depth)
    holds ``query`` (``_holds_folded``): the values people write, not the JSON text around
    them, whose keys, quotes and braces every document has."""

    output_field = BooleanField()

    def as_sql(self, compiler, connection, **extra_context):
        document, document_params = compiler.compile(self.source_expressions[0])
        query, query_params = compiler.compile(self.source_expressions[1])
        sql = f"""EXISTS (
            SELECT 1 FROM jsonb_path_query({document}, 'strict $.**') AS v(value)
            WHERE jsonb_typeof(v.value) IN ('string', 'number')
              AND {_holds_folded("v.value #>> '{}'", query)}
        )"""  # noqa: S608 (compiled expressions; every value is a parameter)
        return sql, (*document_params, *query_params)


def conversation_page(
    principal: Principal, *, query: str | None = None, after: str | None = None, limit: int
) -> Page:
    """A page of the conversations the principal may see, latest activity first; ``query``
    is a text that the title, or a text or number in the metadata, contains (in any case
    and accents: ``FOLDED_SQL``)."""
    queryset = _with_summary_fields(conversations_visible_to(principal), principal)
    if query:
        queryset = queryset.filter(
            Q(FoldedContains("title", Value(query)))
            | Q(MetadataValueContains("metadata", Value(query)))
        )
    page = activity_page(
        queryset,
        column=activity_column(principal),
        memberships=Membership.objects.filter(principal_id__in=principal.member_ids),
        after=after,
        limit=limit,
        # (The user's and an agent's lists of the same conversations, another user's, another
        # query's: a cursor of one was read as a place in the other: review.)
        of_list=list_digest("conversations", principal, query=query or None),
    )
    _previewed_through_forks(page.rows)
    return page


# How far back a catch-up pass starts before the time the pass it follows began: a write
# that took its time before that (``updated_at``, ``seen_at``) but committed after it is
# still found.
CATCH_UP_OVERLAP = timedelta(seconds=5)
# The moments a cursor may hold: those that are datetimes in UTC too, late enough for a
# catch-up pass to start ``CATCH_UP_OVERLAP`` before them (a forged one was a 500).
CURSOR_MOMENTS = (
    datetime.min.replace(tzinfo=UTC) + CATCH_UP_OVERLAP,
    datetime.max.replace(tzinfo=UTC),
)


def activity_page(
    queryset: QuerySet[Conversation],
    *,
    column: str,
    memberships: QuerySet[Membership],
    after: str | None,
    limit: int,
    of_list: str,
) -> Page:
    """A page of conversations, latest activity first, where a walk of the pages loses
    none: one that has activity meanwhile moves ahead of the cursor, where no page of the
    walk would reach it, and so may one the principal is given meanwhile (shared with them,
    or theirs by a transfer), so when a pass of the list ends, a pass of the conversations
    with activity, or joined, since that pass began follows (each again, with its new
    ``updatedAt``: a client keeps the latest by id), until there was none.

    The cursor holds the pass (from when its conversations had activity: "" for any time;
    and since when: what moved after, the next pass lists) and the last row's sort key.
    ``column``: the time of activity (``activity_column``); ``queryset`` holds ``joined_at``
    (``conversations_visible_to``); ``memberships``: the principal's; ``of_list``: which
    list this is (``list_digest``), which its cursors carry.
    """
    order = (f"-{column}", "id")
    later = f"{column}__gt"
    if after:
        lower, since, key = _activity_cursor(after, of_list=of_list)
    else:
        lower, since, key = None, timezone.now(), None
    rows = queryset
    if lower is not None:
        rows = rows.filter(Q(**{later: lower}) | Q(joined_at__gt=lower))
    if key is not None:
        rows = rows.filter(beyond(order, key))
    # Whether any moved since the pass began: asked once with the page (InitPlans), not by
    # a query of its own; it only matters on the pass's last page. Each side by its own
    # index: asked as one condition over the join, every conversation of the principal was
    # read (a user of 20,000: 7 ms a page).
    moved_since = (queryset.filter(**{later: since}), memberships.filter(created_at__gt=since))
    moved_now = Q(Exists(moved_since[0])) | Q(Exists(moved_since[1]))
    rows = list(
        rows.annotate(_moved=ExpressionWrapper(moved_now, BooleanField())).order_by(*order)[
            : limit + 1
        ]
    )
    if len(rows) > limit:
        rows = rows[:limit]
        last_at, last_id = getattr(rows[-1], column), rows[-1].id
        return Page(rows, _activity_cursor_of(of_list, lower, since, last_at, last_id))
    moved = rows[0]._moved if rows else any(moved.exists() for moved in moved_since)
    if not moved:
        return Page(rows, None)
    return Page(rows, _activity_cursor_of(of_list, since - CATCH_UP_OVERLAP, timezone.now()))


def _activity_cursor_of(of_list: str, lower, since, last_at=None, last_id=None) -> str:
    return encode_cursor(
        lower.isoformat() if lower else "",
        since.isoformat(),
        last_at.isoformat() if last_at else "",
        str(last_id) if last_id else "",
        of_list=of_list,
    )


def _activity_cursor(cursor: str, *, of_list: str):
    """(lower, since, key) of an ``activity_page`` cursor of the list ``of_list``; 400
    when it is not one."""
    lower, since, updated_at, last_id = decode_cursor(
        cursor, types=(str, str, str, str), of_list=of_list
    )

    def moment(text: str, *, needed: bool):
        try:
            value = parse_datetime(text) if text else None
            if value is not None and value.tzinfo is not None:
                value = in_utc(value)
        except (ValueError, OverflowError):
            value = None
        if (text or needed) and (
            value is None
            or value.tzinfo is None
            or not CURSOR_MOMENTS[0] <= value <= CURSOR_MOMENTS[1]
        ):
            raise InvalidInput.for_field("after", "malformed cursor")
        return value

    key = None
    if updated_at or last_id:
        try:
            key = [moment(updated_at, needed=True), uuid.UUID(last_id)]
        except ValueError:
            raise InvalidInput.for_field("after", "malformed cursor") from None
    return moment(lower, needed=False), moment(since, needed=True), key


def conversation_owner_id(conversation: Conversation) -> str:
    """The owner's principal id (annotated by ``access_conversation``, else looked up)."""
    owner_id = getattr(conversation, "owner_id", None)
    if owner_id is None:
        # (Asked by every append of an agent's user turns, ``_signatures``: its SQL
        # compiled once, as ``access_conversation``'s.)
        [owner] = compiled_once(
            "conversation_owner_id",
            lambda: Membership.objects.filter(
                group_id=conversation.group_id, access_level=AccessLevel.OWNER
            ).only("principal_id"),
            [AccessLevel.OWNER, conversation.group_id],
        )
        owner_id = owner.principal_id
    return owner_id


def group_owners(group_ids) -> dict:
    """Each group's owner's principal id, by group id (one query; ``group_ids``: ids or a
    query of them)."""
    owners = Membership.objects.filter(group_id__in=group_ids, access_level=AccessLevel.OWNER)
    return dict(owners.values_list("group_id", "principal_id"))


# --- messages through fork ancestry ----------------------------------------------------------


@dataclass(frozen=True)
class LineageStep:
    conversation_id: uuid.UUID
    # Messages of this conversation that belong to the view: seq <= max_seq (None: all; a
    # lineage holds no step its view does not reach).
    max_seq: int | None


_LINEAGES_SQL = """
WITH RECURSIVE chain(root, id, fork_seq, parent_id, depth) AS (
    SELECT c.id, c.id, m.seq, c.forked_at_conversation_id, 0
    FROM conversation c LEFT JOIN message m ON m.id = c.forked_at_message_id
    WHERE c.id = ANY(%s::uuid[]) {within}
  UNION ALL
    SELECT chain.root, p.id, pm.seq, p.forked_at_conversation_id, chain.depth + 1
    FROM conversation p
    JOIN chain ON p.id = chain.parent_id
    LEFT JOIN message pm ON pm.id = p.forked_at_message_id
)
SELECT root, id, fork_seq FROM chain ORDER BY root, depth
"""


def conversation_lineages(
    conversation_ids, *, within: tuple[str, Sequence] | None = None
) -> dict[uuid.UUID, list[LineageStep]]:
    """Each conversation's view: the conversation and the ancestors whose messages it sees,
    each with how far into it the view reaches. One query for all, whatever the depths.
    ``within``: the SQL of the ids a conversation must be among to have a view at all (and
    its parameters), such as ``visible_conversation_ids``'s; in the same query.

    A fork sees its parent's view up to and including its fork point, recursively. ``seq``
    is global, so "up to the fork point" is ``seq <= fork point's seq``, and the bound of an
    ancestor is the smallest bound on the way down to it. An ancestor the view does not
    reach (a fork made before its parent had messages) ends the lineage.
    """
    conversation_ids = list(conversation_ids)
    if not conversation_ids:
        return {}
    within_sql, within_params = within or ("", ())
    with connection.cursor() as cursor:
        cursor.execute(
            _LINEAGES_SQL.format(within=f"AND c.id IN ({within_sql})" if within_sql else ""),
            [conversation_ids, *within_params],
        )
        rows = cursor.fetchall()
    lineages: dict[uuid.UUID, list[LineageStep]] = {}
    for root, chain in itertools.groupby(rows, key=lambda row: row[0]):
        steps, bound, child_fork_seq = [], None, None
        for depth, (_root, conversation_id, fork_seq) in enumerate(chain):
            if depth > 0:
                # The fork point of the child (previous row) bounds everything above it.
                child_bound = child_fork_seq or 0  # no fork point: forked before any message
                bound = child_bound if bound is None else min(bound, child_bound)
                if bound == 0:
                    break
            steps.append(LineageStep(conversation_id, bound))
            child_fork_seq = fork_seq
        lineages[root] = steps
    return lineages


def conversation_titles(principal: Principal, conversation_ids) -> dict:
    """id -> title of these conversations, of those the principal sees
    (``visible_conversation_ids``), in one query."""
    titles = Conversation.objects.filter(id__in=set(conversation_ids)).filter(
        id__in=visible_conversation_ids(principal)
    )
    return dict(titles.values_list("id", "title"))


def conversation_ancestry(conversation: Conversation) -> list[Conversation]:
    """The conversation and each one it was forked from, root first, whether or not its
    view reaches them (the admin's lineage): two queries, whatever the depth."""
    with connection.cursor() as cursor:
        cursor.execute(_LINEAGES_SQL.format(within=""), [[conversation.id]])
        ids = [conversation_id for _root, conversation_id, _fork_seq in cursor.fetchall()]
    found = Conversation.objects.in_bulk(ids)
    return [found[conversation_id] for conversation_id in reversed(ids) if conversation_id in found]


def conversation_lineage(conversation: Conversation) -> list[LineageStep]:
    """The view of one conversation (``conversation_lineages``; none if it is gone)."""
    return conversation_lineages([conversation.id]).get(conversation.id, [])


class _InLineage(Expression):
    """A message is in ``lineage``'s view: ``(conversation_id = c AND seq <= s) OR ...``, one
    condition per step, each an index range. Written as SQL once: the same condition of Q
    objects, one per step, cost Django about 25 ms to resolve and compile for a chain of 300
    forks (the statement itself, 0.6 ms), at every request of the conversation (review)."""

    output_field = BooleanField()
    conditional = True

    def __init__(self, lineage: list[LineageStep], columns=None):
        super().__init__()
        self.lineage = lineage
        self.columns = columns or [F("conversation_id"), F("seq")]

    # The columns as its source expressions: resolved and relabelled as Django does any (in
    # a subquery too, where they were resolved against the outer query: code review).
    def get_source_expressions(self):
        return self.columns

    def set_source_expressions(self, exprs):
        self.columns = list(exprs)

    def as_sql(self, compiler, connection):
        if not self.lineage:
            raise EmptyResultSet
        conversation, seq = (compiler.compile(column)[0] for column in self.columns)
        conditions, params = [], []
        for step in self.lineage:
            if step.max_seq is None:
                conditions.append(f"{conversation} = %s")
                params.append(step.conversation_id)
            else:
                conditions.append(f"({conversation} = %s AND {seq} <= %s)")
                params += [step.conversation_id, step.max_seq]
        return f"({' OR '.join(conditions)})", params


def conversation_messages(conversation: Conversation, *, for_agent: bool = False):
    """Every message in the conversation's view, fork ancestry included, in ``seq`` order.

    Users see the HISTORY channel's user-visible messages only; agents see every channel.
    """
    queryset = Message.objects.without_search_data().filter(
        _InLineage(conversation_lineage(conversation))
    )
    if not for_agent:
        queryset = queryset.filter(SEEN_BY_USERS)
    return queryset.order_by("seq")


def _message_list(principal: Principal, conversation: Conversation, *, newest_first: bool) -> str:
    """Which list of messages a cursor is of: the conversation's, read by ``principal``,
    one way (a cursor of the other way, or of another conversation, read as a place in it:
    review). ``starting_at`` is not part of it: a cursor is past it anyway."""
    return list_digest(
        "messages", principal, conversation=conversation.id, newest_first=newest_first
    )


def message_page(
    principal: Principal,
    conversation: Conversation,
    *,
    after: str | None = None,
    limit: int,
    starting_at: Message | None = None,
) -> Page:
    """A page of the messages a user sees in the conversation's view, oldest first;
    ``starting_at`` a message of the view (``message_in_view``), from there on."""
    messages = conversation_messages(conversation)
    if starting_at is not None:
        messages = messages.filter(seq__gte=starting_at.seq)
    return keyset_page(
        messages,
        order=("seq",),
        after=after,
        limit=limit,
        of_list=_message_list(principal, conversation, newest_first=False),
    )


def latest_message_page(
    principal: Principal, conversation: Conversation, *, before: str | None = None, limit: int
) -> Page:
    """The latest messages a user sees in the conversation's view, newest first (where a
    chat opens); the cursor continues with earlier ones."""
    return keyset_page(
        conversation_messages(conversation),
        order=("-seq",),
        after=before,
        limit=limit,
        of_list=_message_list(principal, conversation, newest_first=True),
        cursor_field="before",
    )


def earlier_messages_cursor(
    principal: Principal, conversation: Conversation, *, before: Message
) -> str | None:
    """A ``before`` cursor of ``latest_message_page``: the messages before ``before``; None
    when the conversation's view holds none."""
    if not conversation_messages(conversation).filter(seq__lt=before.seq).exists():
        return None
    return encode_cursor(
        before.seq, of_list=_message_list(principal, conversation, newest_first=True)
    )


def later_messages_cursor(
    principal: Principal, conversation: Conversation, *, after: Message
) -> str | None:
    """An ``after`` cursor of ``message_page``: the messages after ``after``; None when the
    conversation's view holds none."""
    if not conversation_messages(conversation).filter(seq__gt=after.seq).exists():
        return None
    return encode_cursor(
        after.seq, of_list=_message_list(principal, conversation, newest_first=False)
    )


@dataclass(frozen=True)
class ContextPage:
    messages: list[Message]
    has_more: bool


def conversation_context(
    conversation: Conversation, *, after: Message | None = None, limit: int
) -> ContextPage:
    """What an agent puts in its next prompt: the latest summary, then every message after
    the one it covers (fork ancestry included, all channels but older summaries), by ``seq``.

    ``after`` continues a previous page. A summary written since (covering messages past
    ``after``, or replacing the summary ``after`` is) starts the page: what it covers, the
    reader has not read, and will not be given again.
    """
    view = conversation_messages(conversation, for_agent=True)
    summary = view.filter(channel=Channel.SUMMARY).order_by("-seq").first()
    rest = view.exclude(channel=Channel.SUMMARY)
    head: list[Message] = []
    if summary is not None:
        # Null: every message it covered is deleted (``services._summaries_moved_off``); no
        # id at all (as an operator's import once stored) is read the same: it covers none.
        until_id = summary.metadata.get("untilMessageId")
        if not until_id:
            until = {"seq": 0}
        else:
            # Looked up in the whole group, not the view: a fork whose point was deleted
            # starts earlier (``services._forks_moved_off``), and a parent's turn its summary
            # covers up to may be out of its view now; what it covered is still what comes
            # before that turn (seq is global: the order of every turn of the group). An id
            # that names no message of the group: it covers what came before it.
            until_uuid = as_uuid(until_id)
            until = (
                Message.objects.filter(id=until_uuid, conversation__group_id=conversation.group_id)
                .values("seq")
                .first()
                if until_uuid
                else None
            )
        covered_through = until["seq"] if until else summary.seq
        rest = rest.filter(seq__gt=covered_through)
        if (
            after is None
            or (after.channel == Channel.SUMMARY and after.id != summary.id)
            or (
                after.channel != Channel.SUMMARY
                and summary.seq > after.seq
                and covered_through > after.seq
            )
        ):
            head = [summary]
    if after is not None and after.channel != Channel.SUMMARY:
        # (A page that ended on the summary continues right after what it covers.)
        rest = rest.filter(seq__gt=after.seq)
    remaining = limit - len(head)
    rows = list(rest[: remaining + 1])
    return ContextPage(messages=head + rows[:remaining], has_more=len(rows) > remaining)


def latest_user_text(conversation: Conversation, *, turns: int = 3, max_chars: int = 2000) -> str:
    """What the user said last: the text of the view's latest ``turns`` user messages, oldest
    first, at most ``max_chars`` (the latest kept). What to search an agent's memories with
    before it answers."""
    latest = (
        conversation_messages(conversation)
        .filter(role=Role.USER)
        .order_by("-seq")
        .values_list("content", flat=True)[:turns]
    )
    return "\n".join(reversed(list(latest)))[-max_chars:]


def messages_in_view(
    conversation: Conversation, message_ids, *, for_agent: bool = True
) -> list[Message]:
    """Those of ``message_ids`` that are in the conversation's view: any channel for an
    agent, what a user sees for a user (``conversation_messages``)."""
    if not message_ids:
        return []
    view = conversation_messages(conversation, for_agent=for_agent)
    return list(view.filter(id__in=message_ids))


def message_in_view(conversation: Conversation, message_id, *, for_agent: bool = True) -> Message:
    """A message of the conversation's view (``messages_in_view``); 404 otherwise: one a
    user may not see is no message to them, like a random id."""
    try:
        message_id = uuid.UUID(str(message_id))
    except ValueError:
        raise NotFound("message not found") from None
    found = messages_in_view(conversation, [message_id], for_agent=for_agent)
    if not found:
        raise NotFound("message not found")
    return found[0]


def message_before(
    conversation: Conversation,
    message: Message,
    *,
    excluding: QuerySet | None = None,
    channel: str | None = None,
) -> Message | None:
    """The last message of the view (of ``channel``, else of any) that precedes
    ``message``, not one of ``excluding`` (messages about to be deleted)."""
    before = conversation_messages(conversation, for_agent=True).filter(seq__lt=message.seq)
    if channel is not None:
        before = before.filter(channel=channel)
    if excluding is not None:
        before = before.exclude(id__in=excluding.values("id"))
    return before.order_by("-seq").first()


def history_message_before(
    conversation: Conversation, message: Message, *, excluding: QuerySet | None = None
) -> Message | None:
    """The last HISTORY message of the view that precedes ``message`` (a fork point)."""
    return message_before(conversation, message, excluding=excluding, channel=Channel.HISTORY)


def conversation_forks(conversation: Conversation, *, previews: bool = False) -> list[Conversation]:
    """Every conversation of the group in order of creation (so the root comes first);
    ``previews``: each with its ``last_message_preview``, which tells branches apart."""
    forks = Conversation.objects.filter(group_id=conversation.group_id).order_by("created_at", "id")
    if not previews:
        return list(forks)
    forks = list(_with_summary_fields(forks))
    _previewed_through_forks(forks)
    return forks


# --- memberships and transfers ---------------------------------------------------------------


def group_memberships(conversation: Conversation) -> list[Membership]:
    return list(
        Membership.objects.filter(group_id=conversation.group_id).order_by("created_at", "id")
    )


def membership_of(conversation: Conversation, principal_id: str) -> Membership:
    membership = Membership.objects.filter(
        group_id=conversation.group_id, principal_id=stored_principal_id(principal_id)
    ).first()
    if membership is None:
        raise NotFound("membership not found")
    return membership


TRANSFER_ORDER = ("-created_at", "id")


def transfers_for(principal: Principal, *, status: str | None) -> QuerySet[OwnershipTransfer]:
    """Transfers the principal made or received, newest first (``TRANSFER_ORDER``); pending
    ones by default."""
    return OwnershipTransfer.objects.filter(
        Q(from_principal=principal.id) | Q(to_principal=principal.id),
        status=status or TransferStatus.PENDING,
    ).order_by(*TRANSFER_ORDER)


def transfer_page(
    principal: Principal, *, status: str | None, after: str | None, limit: int
) -> Page:
    """A page of ``transfers_for``: those resolved only ever grow (every one was answered
    at once, unpaged: review)."""
    return keyset_page(
        transfers_for(principal, status=status),
        order=TRANSFER_ORDER,
        after=after,
        limit=limit,
        of_list=list_digest(
            "ownership transfers", principal, status=status or TransferStatus.PENDING
        ),
    )


def pending_transfer_seen_by(
    principal: Principal, conversation: Conversation
) -> OwnershipTransfer | None:
    """The pending offer of ``conversation``'s group, for the two it concerns (the owner who
    made it, the one it was made to); None for everyone else."""
    return (
        OwnershipTransfer.objects.filter(
            Q(from_principal=principal.id) | Q(to_principal=principal.id),
            group_id=conversation.group_id,
            status=TransferStatus.PENDING,
        )
        .order_by("-created_at", "id")
        .first()
    )


def access_transfer(principal: Principal, transfer_id) -> OwnershipTransfer:
    """A transfer the principal made or received; 404 for anyone else."""
    return one_or_404(
        OwnershipTransfer.objects.filter(
            Q(from_principal=principal.id) | Q(to_principal=principal.id)
        ),
        transfer_id,
        "ownership transfer",
    )


# --- what is kept about a user (export, erase) -----------------------------------------------
# A user's own id is the only way in: these serve the user themself (``/v1/user/export``,
# ``/v1/user/erase``) and the operator's ``memsvc export``, never another caller.


def groups_owned_by(user_id: str) -> QuerySet[ConversationGroup]:
    return ConversationGroup.objects.filter(
        memberships__principal_id=user_id, memberships__access_level=AccessLevel.OWNER
    )


def conversations_owned_by(user_id: str) -> QuerySet[Conversation]:
    """Every conversation of the user's groups, forks included, parents before forks."""
    return Conversation.objects.filter(group__in=groups_owned_by(user_id)).order_by(
        "group_id", "created_at", "id"
    )


def messages_owned_by(user_id: str) -> QuerySet[Message]:
    """Every message of the user's conversations (whoever wrote it), in ``seq`` order."""
    return (
        Message.objects.without_search_data()
        .filter(conversation__group__in=groups_owned_by(user_id))
        .order_by("seq")
    )


def memberships_of_owned(user_id: str) -> QuerySet[Membership]:
    """The memberships of the user's groups (the user's own, as owner, among them)."""
    return Membership.objects.filter(group__in=groups_owned_by(user_id)).order_by(
        "group_id", "created_at", "id"
    )


def memberships_elsewhere(user_id: str) -> QuerySet[Membership]:
    """The user's memberships of groups someone else owns (a group has one owner), each with
    the id of the group's first conversation (``conversation_id``), the one people share."""
    first_conversation = (
        Conversation.objects.filter(group_id=OuterRef("group_id"))
        .order_by("created_at", "id")
        .values("id")[:1]
    )
    return (
        Membership.objects.filter(principal_id=user_id)
        .exclude(access_level=AccessLevel.OWNER)
        .annotate(conversation_id=Subquery(first_conversation))
        .order_by("created_at", "id")
    )


def said_by(*, role: str, author_principal: str, author_name: str) -> str | None:
    """The user a message is by: the user who wrote it, or, for a user turn an agent wrote
    for someone, the user it is signed with (``author_name``); None for an agent's own
    turns. (What a document may bring back as the user's; once stored, a turn an agent
    wrote is the user's by ``Message.written_for``.)"""
    if not author_principal.startswith(AGENT_PRINCIPAL_PREFIX):
        return author_principal
    return author_name if role == Role.USER else None


def messages_elsewhere(user_id: str) -> QuerySet[Message]:
    """The user's messages in conversations someone else owns: those the user wrote, and the
    user turns an agent wrote for them (``Message.written_for``), whether or not they are
    a member still.

    The two kinds are found apart, each through an index (``message_author``,
    ``message_written_for``), and united: an export or an erase reads the user's messages,
    not the whole table (one condition with OR scanned it: 120-230 ms at 300,000 messages,
    10 ms so).
    """
    written = Message.objects.filter(author_principal=user_id).values("id")
    signed = Message.objects.filter(written_for=user_id).values("id")
    return (
        Message.objects.without_search_data()
        .filter(id__in=written.union(signed))
        .exclude(conversation__group__in=groups_owned_by(user_id))
        .order_by("seq")
    )


WRITING_LEVELS = [level.value for level in AccessLevel if level.allows(AccessLevel.WRITER)]


def _members(conversation: Conversation, *, agents: bool, writers: bool):
    """The memberships of the conversation's group held by agents, or by users (``writers``:
    those that may write in it)."""
    members = Membership.objects.filter(group_id=conversation.group_id)
    is_agent = Q(principal_id__startswith=AGENT_PRINCIPAL_PREFIX)
    members = members.filter(is_agent if agents else ~is_agent)
    return members.filter(access_level__in=WRITING_LEVELS) if writers else members


def user_members(conversation: Conversation, *, writers: bool = False) -> set[str]:
    """The users (not agents) who are members of the conversation's group (``writers``:
    those who may write in it)."""
    members = _members(conversation, agents=False, writers=writers)
    return set(members.values_list("principal_id", flat=True))


def agent_members(conversation: Conversation, *, writers: bool = False) -> list[uuid.UUID]:
    """The ids of the agents that are members of the conversation's group (``writers``:
    those that may write in it), in the order they joined."""
    members = _members(conversation, agents=True, writers=writers)
    ids = members.order_by("created_at", "id").values_list("principal_id", flat=True)
    return [agent for agent in map(agent_uuid_of, ids) if agent]


def turn_speakers(messages: Sequence[Message]) -> dict:
    """Who said each user turn of ``messages`` (message id -> user id), where a person can
    be named: the user who wrote it, or the member an agent recorded it for
    (``Message.written_for``, as ``messages_elsewhere`` finds it). Turns of speakers an
    agent names on its own ("user", "Caroline") are left out."""
    speakers = {}
    for message in messages:
        if message.role != Role.USER:
            continue
        if message.written_for:
            speakers[message.id] = message.written_for
        elif not message.author_principal.startswith(AGENT_PRINCIPAL_PREFIX):
            speakers[message.id] = message.author_principal
    return speakers


def transfers_of_owned(user_id: str) -> QuerySet[OwnershipTransfer]:
    return OwnershipTransfer.objects.filter(group__in=groups_owned_by(user_id)).order_by(
        "created_at", "id"
    )


def transfers_elsewhere(user_id: str) -> QuerySet[OwnershipTransfer]:
    """Transfers the user made or was offered of groups they do not own (now)."""
    return (
        OwnershipTransfer.objects.filter(Q(from_principal=user_id) | Q(to_principal=user_id))
        .exclude(group__in=groups_owned_by(user_id))
        .order_by("created_at", "id")
    )
