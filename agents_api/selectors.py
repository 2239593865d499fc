"""Reads of agents: their memory blocks and long-term memories, and whose memory a request
reaches."""

import hashlib
import unicodedata
import uuid
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import (
    BooleanField,
    Exists,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    TextField,
    Value,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, Concat
from django.utils import timezone

from agents_api.models import (
    KEPT_BLOCKS,
    LIVE,
    MEMORY_LISTING_MAX,
    MEMORY_LISTING_TTL,
    MEMORY_LISTINGS_PER_SCOPE,
    Agent,
    Memory,
    MemoryBlock,
    MemoryBlockRevision,
    MemoryListing,
    ToolRecord,
    UserErasure,
    UserMemorySetting,
)
from conversations.models import Conversation, Membership
from conversations.selectors import (
    conversation_owner_id,
    conversations_owned_by,
    conversations_visible_to,
    messages_visible_to,
    visible_conversation_ids,
)
from memsvc.api.errors import Forbidden, InvalidInput, NotFound, one_or_404
from memsvc.api.pagination import (
    Page,
    beyond,
    decode_cursor,
    encode_cursor,
    keyset_page,
    list_digest,
)
from memsvc.api.principals import (
    AGENT_PRINCIPAL_PREFIX,
    LOCAL_OWNER,  # owner_principal of the local API's agents
    Principal,
    agent_uuid_of,
    user_id_problem,
)
from memsvc.db import compiled_once
from memsvc.text import shows_nothing
from search import queries, ranking
from search.engine import Citing, find_candidates, without_excluded
from search.statements import Corpus, Scope, holds_any
from search.tuning import MemoryRanking, configured_memory_ranking, configured_tuning


def agent_by_id(agent_id, *, field: str) -> Agent:
    """The agent a request names by id; 400 naming ``field`` when there is none."""
    try:
        agent = Agent.objects.filter(id=uuid.UUID(str(agent_id))).first()
    except ValueError:
        agent = None
    if agent is None:
        raise InvalidInput.for_field(field, "no such agent")
    return agent


def memory_subject(principal: Principal, *, user_id: str | None, field: str = "userId") -> str:
    """Whose memory (blocks, memories) an agent's request reaches: the user it acts for
    (``X-On-Behalf-Of``, which cannot reach another user), else the user it names, else its
    own (""). Any user id will do: agents learn about users they have not served yet. An
    empty one is refused, not taken for none: ``?userId=`` (a client's unset variable) on a
    delete deleted the agent's own memories."""
    if user_id is not None:
        problem = user_id_problem(user_id)
        if problem:
            raise InvalidInput.for_field(field, problem)
    acting_for = principal.on_behalf_of
    if acting_for:
        if user_id is not None and user_id != acting_for:
            raise Forbidden(f"acting for {acting_for}, this request cannot reach another user")
        return acting_for
    return "" if user_id is None else user_id


def memory_blocks(agent: Agent, *, user_id: str) -> list[MemoryBlock]:
    def kept():
        blocks = MemoryBlock.objects.filter(KEPT_BLOCKS, agent=agent, user_id=user_id)
        return blocks.order_by("label")

    return list(compiled_once("memory_blocks", kept, [agent.pk, user_id]))


def memory_block(agent: Agent, *, user_id: str, label: str) -> MemoryBlock:
    """The block labelled ``label``, else the one labelled its composed form (NFC), as
    every label given now is (``validators.composed``): "zoe\u0308" was a 404 naming a
    block that looks exactly like the one there is (review). A label kept decomposed from
    before that rule is found as it is written."""
    labels = list(dict.fromkeys([label, unicodedata.normalize("NFC", label)]))
    blocks = MemoryBlock.objects.filter(KEPT_BLOCKS, agent=agent, user_id=user_id, label__in=labels)
    found = {block.label: block for block in blocks}
    block = next((found[name] for name in labels if name in found), None)
    if block is None:
        raise NotFound(f"no memory block labelled {label!r}")
    return block


def memory_block_revision_page(block: MemoryBlock, *, after: str | None, limit: int) -> Page:
    """A page of the block's kept revisions, newest first. The block is the list: who
    reaches it (the agent, acting for its user or not) reads the same revisions."""
    return keyset_page(
        block.revisions.all(),
        order=MemoryBlockRevision.NEWEST_FIRST,
        after=after,
        limit=limit,
        of_list=list_digest("memory block revisions", block=block.pk),
    )


def memory_blocks_with_revisions(
    agent: Agent | None = None, *, user_id: str | None = None
) -> QuerySet[MemoryBlock]:
    """An agent's blocks (about every user and its own), or every agent's blocks about a
    user, each with its revisions oldest first (``exported_revisions``)."""
    blocks = MemoryBlock.objects.filter(KEPT_BLOCKS)
    if agent is not None:
        blocks = blocks.filter(agent=agent)
    if user_id is not None:
        blocks = blocks.filter(user_id=user_id)
    return blocks.order_by("agent_id", "user_id", "label").prefetch_related(
        Prefetch(
            "revisions",
            queryset=MemoryBlockRevision.objects.order_by("created_at", "id"),
            to_attr="exported_revisions",
        )
    )


def agents_serving(principal: Principal) -> QuerySet[Agent]:
    """The agents that serve a user, by name: those that keep memory blocks or memories
    about them, or belong to a conversation the user sees."""
    in_their_conversations = Membership.objects.filter(
        group_id__in=conversations_visible_to(principal).values("group_id"),
        principal_id=Concat(Value(AGENT_PRINCIPAL_PREFIX), Cast(OuterRef("id"), TextField())),
    )
    return Agent.objects.filter(
        Q(Exists(Memory.objects.filter(LIVE, agent=OuterRef("pk"), user_id=principal.id)))
        | Q(Exists(MemoryBlock.objects.filter(agent=OuterRef("pk"), user_id=principal.id)))
        | Q(Exists(in_their_conversations))
    ).order_by("name", "id")


def agent_names(principal_ids) -> dict[str, str]:
    """The name of each agent among ``principal_ids`` (``agent:<id>`` -> name), one query;
    users and unknown agents are left out."""
    ids = {agent_uuid_of(principal_id) for principal_id in principal_ids} - {None}
    if not ids:
        return {}
    return {
        f"{AGENT_PRINCIPAL_PREFIX}{agent_id}": name
        for agent_id, name in Agent.objects.filter(id__in=ids).values_list("id", "name")
    }


def local_agent_named(name: str) -> bool:
    """Whether an agent of the local API (keyless or given a key since) has ``name``."""
    return Agent.objects.filter(owner_principal=LOCAL_OWNER, name=name).exists()


def local_agent(caller_agent: Agent | None, name: str, *, memories: bool = False) -> Agent:
    """The named agent of the local API, as a caller may reach it: a trusted keyless
    loopback caller (``caller_agent`` None) reaches the agents the local API made for such
    callers (``Agent.loopback_trusted``), a key only its own agent. 404 otherwise.
    ``memories``: a keyless caller's agent, read here, comes with ``keeps_memory``
    (``keeps_memories``) from the same statement (the context's; the other views' statement
    reads no memory). A key's agent comes from the key, without it: ``keeps_memories``
    probes for it."""

    def trusted():
        agents = Agent.objects.filter(owner_principal=LOCAL_OWNER, name=name, loopback_trusted=True)
        if memories:
            keeps = RawSQL(  # noqa: S611 (a constant text: the agent's column)
                keeps_live_memory_sql(f'"{Agent._meta.db_table}"."id"'), [], BooleanField()
            )
            agents = agents.annotate(keeps_memory=keeps)
        return agents[:1]

    if caller_agent is not None:
        agent = caller_agent if caller_agent.name == name else None
    elif memories:
        params = [name, LOCAL_OWNER]
        agent = next(iter(compiled_once("local_agent_and_memories", trusted, params)), None)
    else:
        agent = next(iter(compiled_once("local_agent", trusted, [name, LOCAL_OWNER])), None)
    if agent is None:
        if caller_agent is None and local_agent_named(name):
            # (Its 404 said "Agent not found" where ``POST /agents`` says how to reach it:
            # review.)
            raise reached_with_a_key(name)
        raise NotFound("Agent not found")
    return agent


def reached_with_a_key(name: str) -> Forbidden:
    """The refusal of a keyless caller asking for a local agent made by another door
    (`memsvc apikey create`, `memsvc mcp --agent`; it may have no key yet, so the message
    says how to get one), or one that has a key now."""
    return Forbidden(
        f"this agent is reached with an API key (`memsvc apikey create {name}` makes one): "
        "keyless calls reach only agents this API made"
    )


# --- the Letta-compatible routes --------------------------------------------------------------


def letta_agents(caller: Agent) -> QuerySet[Agent]:
    """The agents a key reaches through the Letta routes: its own, and those it created
    there (``services.letta_agent_create``), each with its own blocks (``letta_blocks``,
    as ``memory_blocks`` orders them): a list of agents is two queries, not one per agent."""
    return Agent.objects.filter(
        Q(pk=caller.pk) | Q(owner_principal=caller.principal_id)
    ).prefetch_related(
        Prefetch(
            "memory_blocks",
            queryset=MemoryBlock.objects.filter(KEPT_BLOCKS, user_id="").order_by("label"),
            to_attr="letta_blocks",
        )
    )


def letta_agents_tagged(
    agents: QuerySet[Agent], tags: Sequence[str], *, match_all: bool = False
) -> QuerySet[Agent]:
    """Agents with any of ``tags`` (every one with ``match_all``), Letta's list filter."""
    wanted = [Q(metadata__letta__tags__contains=[tag]) for tag in tags]
    combined = wanted[0]
    for condition in wanted[1:]:
        combined = (combined & condition) if match_all else (combined | condition)
    return agents.filter(combined)


def letta_blocks(caller: Agent, *, label: str | None = None) -> QuerySet[MemoryBlock]:
    """The blocks of the agents a key reaches, and those it made that wait for their attach
    (``services.letta_block_create``): Letta lists a block attached to no agent too."""
    blocks = MemoryBlock.objects.filter(user_id="", agent__in=letta_agents(caller))
    if label:
        blocks = blocks.filter(label=label)
    return blocks.order_by("created_at", "id")


LETTA_ORDERS = {"asc": ("created_at", "id"), "desc": ("-created_at", "-id")}
LETTA_MESSAGE_ORDERS = {"asc": ("seq",), "desc": ("-seq",)}  # a conversation's own order


def letta_page(
    rows: QuerySet,
    *,
    order: str,
    after=None,
    before=None,
    limit: int,
    orders=LETTA_ORDERS,
    missing: str | None = None,
) -> list:
    """A page of a Letta list (``letta_agents``, ``letta_blocks``; an agent's messages with
    ``LETTA_MESSAGE_ORDERS``) in creation ``order`` ("asc" or "desc"): the rows after the
    row ``after`` and before the row ``before`` in that order (primary keys or lookups, as
    ``_named`` reads them; one that names
    none of ``rows`` is ignored, as Letta's server ignores it, or, with ``missing``, a 404
    saying so, as its message list answers). letta-client walks a list by ``after`` the
    last item of each page."""
    keys = orders[order]
    fields = [key.removeprefix("-") for key in keys]
    backwards = orders["desc" if order == "asc" else "asc"]
    # Both rows looked up among all of ``rows``: a ``before`` at or before ``after`` was
    # looked up past ``after``, not found, ignored, and the page ran on (review).
    cursors = [
        (_named(rows, key).prefetch_related(None).values_list(*fields).first(), direction)
        for key, direction in ((after, keys), (before, backwards))
        if key is not None
    ]
    for cursor, direction in cursors:
        if cursor is not None:
            rows = rows.filter(beyond(direction, list(cursor)))
        elif missing is not None:
            raise NotFound(missing)
    return list(rows.order_by(*keys)[:limit])


def letta_agent(caller: Agent, agent_id) -> Agent:
    agent = letta_agents(caller).filter(pk=agent_id).first()
    if agent is None:
        raise NotFound("Agent not found")
    return agent


def _named(rows: QuerySet, key) -> QuerySet:
    """The row of ``rows`` that ``key`` names: a primary key, or a lookup (``Q``: a block's
    id names its ``public_id``)."""
    return rows.filter(key if isinstance(key, Q) else Q(pk=key))


def letta_block(caller: Agent, block: Q) -> MemoryBlock:
    """A block of ``letta_blocks`` (``block``: its lookup, ``parse_block_id``): an agent's
    own (Letta has no users, so the blocks an agent keeps per user are not Letta's), or one
    waiting for its attach."""
    block = _named(letta_blocks(caller), block).select_related("agent").first()
    if block is None:
        raise NotFound("Block not found")
    return block


# --- long-term memories ----------------------------------------------------------------------


def memory_enabled_for(user_id: str | None) -> bool:
    """Whether agents may remember ``user_id`` (``UserMemorySetting``); an agent's own memory
    ("" or None) is always on."""
    return not user_id or not memory_off_for([user_id])


def memory_setting_of(user_id: str) -> QuerySet[UserMemorySetting]:
    """The user's memory switch, as a row (none: memory is on)."""
    return UserMemorySetting.objects.filter(user_id=user_id).order_by("user_id")


def memory_off_for(user_ids: Iterable[str], *, lock: bool = False) -> set[str]:
    """Those of ``user_ids`` who turned memory off (one query). ``lock``: their settings
    rows are locked until the transaction ends, so none is turned off meanwhile."""
    user_ids = {user_id for user_id in user_ids if user_id}
    if not user_ids:
        return set()
    settings_ = UserMemorySetting.objects.filter(user_id__in=user_ids)
    if lock:  # (in one order, whoever locks several)
        settings_ = settings_.order_by("user_id").select_for_update()
    return {
        user_id
        for user_id, enabled in settings_.values_list("user_id", "memory_enabled")
        if not enabled
    }


def erasures_of(user_ids: Iterable[str], *, restored: bool = True) -> dict:
    """When each of ``user_ids`` who was erased was (``UserErasure``), by user id;
    ``restored`` False: not those who imported their own document since."""
    erasures = UserErasure.objects.filter(user_id__in={user_id for user_id in user_ids if user_id})
    if not restored:
        erasures = erasures.filter(restored_at__isnull=True)
    return dict(erasures.values_list("user_id", "erased_at"))


def erased_conversations(conversation_ids) -> set:
    """Those of ``conversation_ids`` that went with their owner's erase (``UserErasure``)."""
    if not conversation_ids:
        return set()
    erasures = UserErasure.objects.filter(conversation_ids__overlap=list(conversation_ids))
    taken = {i for ids in erasures.values_list("conversation_ids", flat=True) for i in ids}
    return taken & set(conversation_ids)


MEMORIES = Corpus(
    "memory",
    cites="message_ids",
    # The planner's estimate of the table's rows: enough to choose exact or graph search.
    size_sql="SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = 'memory'::regclass",
    importance="importance",  # read with the candidates, for their rank
    scoped_words=True,  # memory_scope_words
)

MEMORY_ORDERS = {"recent": ("-created_at", "id"), "popular": ("-access_count", "-created_at", "id")}


def memories_of(
    agent: Agent | None = None,
    *,
    user_id: str | None = None,
    tag: str | None = None,
    with_expired: bool = False,
) -> QuerySet[Memory]:
    """Memories of an agent (about ``user_id``, "" for its own), or every agent's memories
    of a user (``agent`` None: what is kept about that user). Expired ones are gone
    (``models.LIVE``) unless ``with_expired``: for a delete, so that what its caller asked
    to forget is not given a new life by the prune."""
    memories = Memory.objects.defer(*Memory.SEARCH_DATA)
    if not with_expired:
        memories = memories.filter(LIVE)
    if agent is not None:
        memories = memories.filter(agent=agent)
    if user_id is not None:
        memories = memories.filter(user_id=user_id)
    if tag:
        memories = memories.filter(tags__contains=[tag])
    return memories


def memory_page(
    principal: Principal,
    agent: Agent | None,
    *,
    user_id: str,
    tag: str | None = None,
    order: str,
    after: str | None,
    limit: int,
) -> Page:
    """A page of ``memories_of(agent, user_id=, tag=)`` in ``order``, as ``principal``
    lists them. Its cursors are of that list (``list_digest``), whichever door asks for it:
    an agent's through its API or MCP, a user's through theirs or the pages (each door
    named its own list, and one's cursor was refused by another: code review)."""
    memories = memories_of(agent, user_id=user_id, tag=tag)
    tag = tag or None  # (none and "" are no tag alike: ``memories_of``)
    of_list = list_digest(
        "memories", principal, agent=agent and agent.pk, user_id=user_id, tag=tag, order=order
    )
    if order == "popular":
        return _popular_page(memories, after=after, limit=limit, of_list=of_list)
    return keyset_page(
        memories, order=MEMORY_ORDERS[order], after=after, limit=limit, of_list=of_list
    )


def _popular_page(
    memories: QuerySet[Memory], *, after: str | None, limit: int, of_list: str
) -> Page:
    """A page of ``memories`` by popularity. Every search moves the counts this order sorts
    on, so a keyset cursor on them showed a memory twice, or never, when its count moved
    across a page's edge: the walk follows the order of its first page instead, kept in a
    ``MemoryListing`` when there is a next page (the one write of a read: a cache of an
    order, not data). Its cursor is (listing, position), of the list ``of_list``; an
    unknown one is a 400, and so is one of another list (another agent's, user's or tag's:
    it read as that list's end), which the listing's scope tells as well."""
    if after is None:
        listing_id = None
        popular = memories.order_by(*MEMORY_ORDERS["popular"])
        ids = list(popular.values_list("id", flat=True)[:MEMORY_LISTING_MAX])
        position = 0
    else:
        listing_id, position = decode_cursor(after, types=(str, int), of_list=of_list)
        try:
            # A day's walk, as the README says: the daily prune reclaims older listings, up
            # to a day later (read until then: review).
            listing = MemoryListing.objects.filter(
                id=uuid.UUID(listing_id),
                scope=_listing_scope(memories),
                created_at__gte=timezone.now() - MEMORY_LISTING_TTL,
            ).first()
        except ValueError:
            listing = None
        if listing is None or position < 0:
            raise InvalidInput.for_field("after", "unknown or expired cursor: list again")
        ids = listing.memory_ids
    # The listed memories still there (not deleted or expired since), ``limit`` + 1 of them:
    # the last tells whether there is a next page. (index in the listing, memory) Read in
    # chunks twice as long each time: a listing most of whose memories are not found (gone,
    # or not of ``memories``: another tag) takes a few queries, not one per page's length.
    shown: list[tuple[int, Memory]] = []
    chunk_length = limit + 1
    while len(shown) <= limit and position < len(ids):
        chunk = ids[position : position + chunk_length]
        found = memories.in_bulk(chunk)
        shown += [(position + i, found[id_]) for i, id_ in enumerate(chunk) if id_ in found]
        position += len(chunk)
        chunk_length *= 2
    if len(shown) <= limit:
        return Page([memory for _, memory in shown], None)
    shown = shown[:limit]
    if listing_id is None:
        listing_id = _listing_of(memories, ids)
    cursor = encode_cursor(listing_id, shown[-1][0] + 1, of_list=of_list)
    return Page([memory for _, memory in shown], cursor)


MEMORY_LISTING_REUSED_FOR = timedelta(hours=1)  # (a walk begun on it has 23 hours left)


def _listing_scope(memories: QuerySet[Memory]) -> str:
    """Which list a listing is of: the statement that reads ``memories``."""
    sql, params = memories.query.sql_with_params()
    return hashlib.sha256(repr((sql, params)).encode()).hexdigest()


def _listing_of(memories: QuerySet[Memory], ids: list) -> str:
    """The id of a listing of ``ids`` (``_popular_page``) for the list ``memories`` reads:
    one that lists the same and is under an hour old (a first page read again writes
    nothing), else a new one, the list keeping its newest
    ``MEMORY_LISTINGS_PER_SCOPE``. A listing per first page, of every id in scope and kept a
    day, let a read-only key fill the disk (50 KB a request for 3,000 memories)."""
    scope = _listing_scope(memories)
    of_scope = MemoryListing.objects.filter(scope=scope)
    # Compared by the database: reading a listing back to compare it in Python sent up to
    # 10,000 ids back on every first page.
    cutoff = timezone.now() - MEMORY_LISTING_REUSED_FOR
    same = of_scope.filter(memory_ids=ids, created_at__gt=cutoff).values_list("id", flat=True)
    reused = same.first()
    if reused is not None:
        return str(reused)
    with transaction.atomic():
        listing = MemoryListing.objects.create(scope=scope, memory_ids=ids)
        kept = of_scope.order_by("-created_at", "-id").values("id")[:MEMORY_LISTINGS_PER_SCOPE]
        of_scope.exclude(id__in=kept).delete()
    return str(listing.id)


def memory_of(memories: QuerySet[Memory], memory_id) -> Memory:
    """One of ``memories`` (``memories_of``); 404 for any other id, another agent's too."""
    return one_or_404(memories, memory_id, "memory")


@dataclass
class MemoryHit:
    memory: Memory
    score: float  # the rank: relevance fused with importance and recency
    relevance: float  # how well it answers the query, comparable across queries (0..1)


def memory_scope(agent_id, user_id: str | None, tags: Sequence[str] = ()) -> Scope:
    """The SQL of the memories a search (or a save's look for a near-duplicate) reads: those
    not yet expired (``models.LIVE``) of an agent and user, with any of ``tags``."""
    clauses, params = ["m.expires_at > statement_timestamp()"], []
    if agent_id is not None:
        clauses.append("m.agent_id = %s")
        params.append(agent_id)
    if user_id is not None:
        clauses.append("m.user_id = %s")
        params.append(user_id)
    if not tags:
        if agent_id is None:
            return Scope(" AND ".join(clauses), params)
        probe = keeps_live_memory_sql("%s", None if user_id is None else "%s")
        return Scope(
            " AND ".join(clauses), params, any_sql=f"SELECT {probe}", any_params=(*params, *params)
        )
    clauses.append("m.tags && %s::varchar[]")  # any of the tags
    return Scope(" AND ".join(clauses), [*params, list(tags)], view=memory_scope(agent_id, user_id))


def messages_seen_by(principal: Principal, message_ids: Sequence) -> set:
    """Those of ``message_ids`` the principal may see (``messages_visible_to``): a memory
    cites only those."""
    if not message_ids:
        return set()
    seen = messages_visible_to(principal).filter(id__in=set(message_ids))
    return set(seen.values_list("id", flat=True))


def citations_shown_to(principal: Principal, memories: Sequence[Memory]) -> Sequence[Memory]:
    """The memories, each citing only the messages the principal sees (``messages_seen_by``,
    one query for all): what a user reads of a memory about them does not tell that a turn
    they cannot see exists (another's conversation, an agent-only turn). For output: the
    memories are changed in place and not to be saved."""
    seen = messages_seen_by(principal, [i for memory in memories for i in memory.message_ids])
    for memory in memories:
        memory.message_ids = [i for i in memory.message_ids if i in seen]
    return memories


def memories_citing(principal: Principal) -> Citing:
    """The memories a principal's search of messages reads for the turns they cite
    (``search.selectors.register_citing``): an agent's own, about anyone it serves (with
    ``X-On-Behalf-Of``, about that user); for a user, what every agent keeps about them.
    Never those about a user who turned memory off (``memory_enabled_for``), and only turns
    the search's own scope holds are ranked by them."""
    if principal.kind == "agent":
        scope = memory_scope(principal.agent_id, principal.on_behalf_of)
    else:
        scope = memory_scope(None, principal.id)
    return Citing(MEMORIES, Scope(" AND ".join([scope.sql, *_CITING]), scope.params))


# A row (a memory, a tool record) not about a user who turned memory off: what a search
# finds (``memory_enabled_for``). An agent's own ("") has no setting.
_MEMORY_ON = """NOT EXISTS (SELECT 1 FROM user_memory_setting s
                            WHERE s.user_id = m.user_id AND NOT s.memory_enabled)"""

# A tool record not of a conversation whose owner turned memory off (it is kept about that
# owner too: ``tool_records_about``).
_OWNER_MEMORY_ON = """(m.conversation_id IS NULL OR NOT EXISTS (
    SELECT 1 FROM conversation c
    JOIN membership o ON o.group_id = c.group_id AND o.access_level = 'owner'
    JOIN user_memory_setting s ON s.user_id = o.principal_id AND NOT s.memory_enabled
    WHERE c.id = m.conversation_id))"""

# A memory that cites turns (as ``models.CITES`` says it, so its indexes serve), about a
# user who did not turn memory off.
_CITING = ("NOT (m.message_ids = '{}'::uuid[])", _MEMORY_ON)


# The sentences of a query a prefetch searches, the first ones (as a search of messages
# searches the first ``SearchTuning.query_parts``): each is a search of its own, and a query
# of 2,000 characters can hold hundreds of them (seconds of work for one request).
PREFETCH_MAX_SENTENCES = 10


def prefetch_queries(query: str) -> list[str]:
    """kagent's prefetch: each sentence of a message is a query of its own (a long first
    message asks several things)."""
    return queries.sentences(query)[:PREFETCH_MAX_SENTENCES]


def memory_search(
    agent: Agent | None,
    *,
    user_id: str | None,
    query: str,
    limit: int,
    tags: Sequence[str] = (),
    min_score: float = 0.0,
    mode: str = "hybrid",
    prefetch: bool = False,
    ranking_: MemoryRanking | None = None,
    exclusions: bool = False,
) -> list[MemoryHit]:
    """The ``limit`` memories that best answer ``query``, ranked by relevance
    (``Candidates.measured``: cosine and word share as they are, weighted as hybrid search
    weighs them) fused with importance and recency (``MemoryRanking``). Expired memories are
    not found.

    ``min_score`` filters on relevance, measured so that it means the same for every query:
    the cosine similarity to the query or the share of the query's words (by weight) a
    memory holds, whichever is higher. With ``prefetch`` each sentence of the query is
    searched and a memory keeps its best result. With ``exclusions`` (a search someone
    asked for, not a context's), a memory holding a word the query excludes ("-word",
    ``search.engine.without_excluded``) is not found. A user who turned memory off
    (``memory_enabled_for``) has nothing found about them.
    """
    if not memory_enabled_for(user_id):
        return []
    tuning = configured_tuning()
    ranking_ = ranking_ or configured_memory_ranking()
    scope = memory_scope(agent.id if agent else None, user_id, tags)
    if exclusions:
        scope, query = without_excluded(scope, query)
    best: dict = {}  # memory id -> (its best measured relevance, its best shown relevance)
    probed: dict = {}  # (one scope for every sentence)
    rank_columns: dict = {}  # memory id -> (importance, created_at), as the candidates came
    # The candidates of the largest limit whatever ``limit`` is: importance and recency can
    # lift a memory past those more relevant, and with fewer candidates for a smaller limit
    # the best-scoring memory of limit 10 was missing at limit 5 (review).
    candidates_for = max(limit, settings.MEMORY_MAX_SEARCH_LIMIT)
    for text in prefetch_queries(query) if prefetch else [query]:
        found = find_candidates(
            MEMORIES, scope, text, mode=mode, top_k=candidates_for, tuning=tuning, probed=probed
        )
        rank_columns.update((i, (found.importance[i], found.created[i])) for i in found.created)
        for memory_id in found.ids(mode):
            measured, shown = best.get(memory_id, (0.0, 0.0))
            best[memory_id] = (
                max(measured, found.measured(memory_id, mode, tuning)),
                max(shown, found.relevance(memory_id, mode)),
            )
    # Each measure its best over the sentences, then the threshold: filtered sentence by
    # sentence, a memory's score and relevance moved with ``min_score`` (review).
    best = {memory_id: pair for memory_id, pair in best.items() if pair[1] >= min_score}
    if not best:
        return []
    # Ranked on two columns of each candidate (read with it, but for keyword candidates
    # alone); only the winners are read whole.
    unread = [memory_id for memory_id in best if memory_id not in rank_columns]
    if unread:
        with connection.cursor() as cursor:
            cursor.execute(_RANK_COLUMNS_SQL, [unread])
            rank_columns.update((row[0], row[1:]) for row in cursor.fetchall())
    now = timezone.now()
    ranked = sorted(
        (
            -ranking.memory_rank(
                best[memory_id][0],
                importance,
                (now - created_at).total_seconds() / 86400,
                ranking_,
            ),
            str(memory_id),
            memory_id,
        )
        for memory_id, (importance, created_at) in rank_columns.items()
        if memory_id in best
    )[:limit]
    memories = Memory.objects.defer(*Memory.SEARCH_DATA).in_bulk([row[2] for row in ranked])
    return [
        MemoryHit(
            memory=memories[memory_id],
            score=round(-negative_rank, 6),
            relevance=round(best[memory_id][1], 6),
        )
        for negative_rank, _, memory_id in ranked
        if memory_id in memories
    ]


# (a fixed statement: compiled as a queryset, it cost a search more than it ran)
_RANK_COLUMNS_SQL = "SELECT id, importance, created_at FROM memory WHERE id = ANY(%s)"


# --- memories in an LLM's context ------------------------------------------------------------

# kagent's threshold (~0.3): a memory less relevant than this to what the user just said
# costs prompt tokens and tells the model nothing.
CONTEXT_MIN_RELEVANCE = 0.3


def conversation_memory_subject(conversation: Conversation, *, on_behalf_of: str | None) -> str:
    """Whose memories go with a conversation (into its context, and distilled from it): the
    user an agent acts for, else the owner if a user owns it, else "" (the agent's own: a
    conversation an agent keeps for itself, such as a local agent's)."""
    if on_behalf_of:
        return on_behalf_of
    owner = conversation_owner_id(conversation)
    return "" if owner.startswith(AGENT_PRINCIPAL_PREFIX) else owner


def keeps_live_memory_sql(agent: str, user: str | None = None) -> str:
    """SQL (a boolean) of whether an agent, and a user if given (SQL expressions: ``%s``, a
    column), keeps a memory not yet expired: whether the first entry past (agent, [user,]
    now) of the index on (agent, [user,] expiry) (``memory_agent_expiry``,
    ``memory_scope``) is theirs, one index entry read.

    Not an EXISTS of the live memories: the planner rates an agent's share of the table and
    the live share apart, and for an agent whose many memories have all expired (a short
    ``expiresAt``, a day's not pruned yet) beside another's many live ones it walked the
    table (200,000 memories each: 130 ms each context request and search of that agent, 63
    ms of the other), where this takes 0.3-0.4 ms (docs/benchmarks.md)."""
    columns = ["agent_id"] if user is None else ["agent_id", "user_id"]
    values = [agent] if user is None else [agent, user]
    listed = ", ".join(f"m.{column}" for column in columns)
    theirs = " AND ".join(
        f"n.{column} = {value}" for column, value in zip(columns, values, strict=True)
    )
    # (Constant texts and the caller's SQL expressions; every value is a parameter.)
    return (
        f"EXISTS (SELECT 1 FROM (SELECT {listed} FROM memory m"  # noqa: S608
        f" WHERE ({listed}, m.expires_at) > ({', '.join(values)}, statement_timestamp())"
        f" ORDER BY {listed}, m.expires_at LIMIT 1) n WHERE {theirs})"
    )


def keeps_memories(agent: Agent) -> bool:
    """Whether the agent keeps a memory not yet expired, its own or about a user: one index
    probe, its yes kept a few seconds (``statements.holds_any``), or none for an agent read
    with the answer (``local_agent``'s ``keeps_memory``). An agent that keeps none has none
    to put into a context, and none citing turns: its context asks no more."""
    read = getattr(agent, "keeps_memory", None)
    if read is not None:
        return read
    with connection.cursor() as cursor:
        return holds_any(cursor, MEMORIES, memory_scope(agent.id, None), kept=True)


def memories_for_context(agent: Agent, *, user_id: str, query: str, limit: int) -> list[MemoryHit]:
    """The memories to put beside the messages of an LLM call: the ``limit`` most relevant to
    ``query``, each of its sentences searched (kagent's prefetch: a message often asks
    several things), none below ``CONTEXT_MIN_RELEVANCE``. The caller counts their use
    (``tasks.enqueue_memory_touch``)."""
    if limit <= 0 or shows_nothing(query):
        return []
    return memory_search(
        agent,
        user_id=user_id,
        query=query,
        limit=limit,
        min_score=CONTEXT_MIN_RELEVANCE,
        prefetch=True,
    )


# --- tool records (the memory bank) ----------------------------------------------------------

TOOL_RECORDS = Corpus(
    "tool_record",
    size_sql="SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = 'tool_record'::regclass",
)
TOOL_RECORD_ORDER = ("created_at", "id")  # a task's records in the order they were made


def tool_records_of(
    agent: Agent, *, task_id: str | None = None, principal: Principal | None = None
) -> QuerySet[ToolRecord]:
    """An agent's tool records (of one task, with ``task_id``). Only the agent that made a
    record reaches it; acting for a user (``principal.on_behalf_of``), only those that user
    may see as well, as the user's messages are narrowed (``messages_visible_to``): the
    records of conversations both see, and those made for that user outside any
    conversation (or whose conversation is gone)."""
    records = ToolRecord.objects.filter(agent=agent).defer(*ToolRecord.SEARCH_DATA)
    if task_id is not None:
        records = records.filter(task_id=task_id)
    if principal is not None and principal.on_behalf_of:
        records = records.filter(
            Q(conversation_id__in=visible_conversation_ids(principal))
            | Q(conversation__isnull=True, user_id=principal.on_behalf_of)
        )
    return records


def tool_records_about(user_id: str) -> Q:
    """The tool records kept about a user: those made for them (``X-On-Behalf-Of``), and
    those of the conversations they own, whoever the agent acted for (they would otherwise
    outlive those conversations, unlinked)."""
    return Q(user_id=user_id) | Q(
        conversation_id__in=conversations_owned_by(user_id).order_by().values("id")
    )


def tool_records_kept_about(user_id: str) -> QuerySet[ToolRecord]:
    """Every agent's tool records about a user (``tool_records_about``), for the user's own
    export and erase only (one rule: what the erase takes, the export shows)."""
    return (
        ToolRecord.objects.filter(tool_records_about(user_id))
        .defer(*ToolRecord.SEARCH_DATA)
        .order_by("agent_id", "created_at", "id")
    )


def tool_record_page(
    records: QuerySet[ToolRecord], *, after: str | None, limit: int, of_list: str
) -> Page:
    """A page of ``records`` (``tool_records_of``); ``of_list``: ``list_digest`` of the
    listing, its caller and every filter that shaped ``records``."""
    return keyset_page(records, order=TOOL_RECORD_ORDER, after=after, limit=limit, of_list=of_list)


def tool_record_of(records: QuerySet[ToolRecord], trace_id) -> ToolRecord:
    """One of ``records`` (``tool_records_of``); 404 for any other id, another agent's too."""
    return one_or_404(records, trace_id, "tool record")


@dataclass
class ToolRecordHit:
    record: ToolRecord
    score: float  # the hybrid engine's fused score, 0..1 among the candidates


def tool_record_search(
    agent: Agent,
    *,
    query: str,
    top_k: int,
    task_id: str | None = None,
    mode: str = "hybrid",
    principal: Principal | None = None,
    excluding: Collection[uuid.UUID] = (),
) -> list[ToolRecordHit]:
    """The agent's ``top_k`` tool records (of one task, with ``task_id``; those
    ``principal`` reaches, ``tool_records_of``; none of ``excluding``) that best answer
    ``query``, by the one
    search engine: their summaries' vectors, and the words of the summary, the tool's name
    and the raw output (an identifier only the output holds). As for memories
    (``memory_search``), nothing is found acting for a user who turned memory off, nor
    any record made for such a user or of a conversation they own (those made before stay,
    for their export and erase)."""
    if principal is not None and not memory_enabled_for(principal.on_behalf_of):
        return []
    clauses, params = ["m.agent_id = %s", _MEMORY_ON, _OWNER_MEMORY_ON], [agent.id]
    if principal is not None and principal.on_behalf_of:
        # The narrowing itself is the list's, in SQL: one rule for both.
        reached_sql, reached_params = (
            tool_records_of(agent, principal=principal).values("id").query.sql_with_params()
        )
        clauses.append(f"m.id IN ({reached_sql})")
        params.extend(reached_params)
    scope = Scope(" AND ".join(clauses), params)
    narrowing, narrowed_by = [], []
    if task_id is not None:  # (a word weighs by all the records the caller may read)
        narrowing.append("m.task_id = %s")
        narrowed_by.append(task_id)
    if excluding:
        narrowing.append("m.id <> ALL(%s::uuid[])")
        narrowed_by.append(list(excluding))
    if narrowing:
        scope = Scope(" AND ".join([scope.sql, *narrowing]), [*params, *narrowed_by], view=scope)
    scope, query = without_excluded(scope, query)
    tuning = configured_tuning()
    found = find_candidates(
        TOOL_RECORDS,
        scope,
        query,
        mode=mode,
        top_k=top_k,
        tuning=tuning,
    )
    ranked = ranking.top(found.scores(mode, tuning), top_k)
    records = tool_records_of(agent, principal=principal).in_bulk(
        [record_id for record_id, _ in ranked]
    )
    return [
        ToolRecordHit(record=records[record_id], score=round(score, 6))
        for record_id, score in ranked
        if record_id in records  # deleted meanwhile
    ]
