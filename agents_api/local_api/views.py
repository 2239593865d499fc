"""The local compatibility API (``seeds/local-memory-server.md``), mounted at the root.

Clients written for the seed's FastAPI server work unchanged: the same paths, snake_case
fields, status codes and ``{"detail": ...}`` errors (422 naming the field). Storage is the
platform's: a local agent is an ``Agent``, its messages live in a conversation of its own
(``services.local_message_append``), its blocks are its memory blocks, and every
operation goes through the same services and selectors as the ``/v1`` APIs.

Auth: an agent API key reaches only its own agent, within the key's scopes (reads need
``read``, writes ``write``, as on ``/v1``). Without a key, a request from a loopback address
is trusted when ``MEMSVC_LOCAL_TRUST_LOOPBACK`` is on (the default in local mode), and
reaches only the agents this API made for such callers (``Agent.loopback_trusted``); every
other request needs a key.
"""

import contextlib
import ipaddress
import logging

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions as drf
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_api import selectors as agent_selectors
from agents_api import services as agent_services
from agents_api.authentication import (
    HasScope,
    OwnMemoryKeyAuthentication,
    refuse_acting_for_a_user,
    require_scope,
)
from agents_api.local_api import serializers as s
from agents_api.local_api.fastapi import FastApiBodies, fastapi_errors, render_local_error
from agents_api.models import Agent, Scope
from agents_api.services import NewToolRecord
from agents_api.tasks import (
    enqueue_memory_extraction,
    enqueue_memory_touch,
    enqueue_tool_record_observation,
)
from conversations.selectors import conversation_messages
from memsvc.api.errors import NotFound
from memsvc.api.health import database_state, unavailable
from memsvc.api.idempotency import idempotency_key, marked_replayed, request_fingerprint
from memsvc.api.pagination import parse_limit
from memsvc.api.ratelimit import CountedBeforePermissions, client_address
from memsvc.db import beside
from memsvc.text import shows_nothing
from search.selectors import embed_query_ahead, search_messages
from search.services import messages_embedded_now

logger = logging.getLogger(__name__)


def _trusted_loopback(request) -> bool:
    """A keyless caller trusted as this machine's: from a loopback address (an IPv4 one as
    an IPv6 server sees it too: ``::ffff:127.0.0.1``, review), and not a web page's request
    (it names its ``Origin``, or ``Sec-Fetch-Site`` says a site made it). A page the user
    opens runs on this machine too: an untyped ``fetch`` it sends needs no preflight, and it
    wrote a block into the agent's memory, in the model's context from then on (review)."""
    if not settings.MEMSVC_LOCAL_TRUST_LOOPBACK:
        return False
    meta = request.META
    if "HTTP_ORIGIN" in meta or meta.get("HTTP_SEC_FETCH_SITE", "none") != "none":
        return False
    try:
        # The client's, past the proxies of MEMSVC_TRUSTED_PROXIES: a proxy on this machine
        # forwarding another's request made that one trusted (review).
        address = ipaddress.ip_address(client_address(request))
    except ValueError:
        return False
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


MAX_LIST_LIMIT = 1000


class LocalCaller:
    """Who calls the local API: a trusted loopback caller (the agents this API made for such
    callers, every scope) or one agent's key (that agent, the key's scopes)."""

    is_authenticated = True

    def __init__(self, agent: Agent | None, scopes: frozenset[str]):
        self.agent = agent  # None: a trusted loopback caller (see selectors.local_agent)
        self.scopes = scopes


class LocalAuthentication(BaseAuthentication):
    def authenticate(self, request):
        # A key, when one is presented, is the credential, from loopback too: its agent and
        # its scopes, never more.
        result = OwnMemoryKeyAuthentication().authenticate(request)
        if result is not None:
            principal, api_key = result
            return LocalCaller(api_key.agent, principal.scopes), api_key
        if _trusted_loopback(request):
            refuse_acting_for_a_user(request)
            return LocalCaller(None, frozenset(Scope.values)), None
        raise drf.NotAuthenticated("an API key is required (X-API-Key or Bearer msk_...)")

    def authenticate_header(self, request):
        return "Bearer"


class IsLocalCaller(BasePermission):
    def has_permission(self, request, view):
        return isinstance(request.user, LocalCaller)


class LocalView(CountedBeforePermissions, APIView):
    authentication_classes = [LocalAuthentication]
    permission_classes = [IsLocalCaller, HasScope]
    content_negotiation_class = FastApiBodies

    # How memsvc.api.errors.render_api_error answers for this API outside the view's own
    # handling (body too large, NUL in the path, database down, rate limits).
    render_error = staticmethod(render_local_error)

    def get_exception_handler(self):
        return fastapi_errors


def _agent(request, name: str, *, memories: bool = False) -> Agent:
    return agent_selectors.local_agent(request.user.agent, name, memories=memories)


def _search(
    agent: Agent,
    query: str,
    limit: int,
    *,
    citations: bool = True,
    exclusions: bool = False,
    min_relevance: float = 0.0,
) -> list[dict]:
    """The agent's messages most relevant to ``query``, best first, ``similarity`` filled.
    ``citations`` False: the agent keeps no memories (``keeps_memories``); ``exclusions``
    and ``min_relevance``: a search asked for (``search_messages``)."""
    if agent.local_conversation_id is None:
        return []
    hits = search_messages(
        agent.as_principal(),
        query=query,
        top_k=limit,
        conversation_ids=[agent.local_conversation_id],
        for_agent=True,
        highlights=False,  # (the seed's messages have none)
        roots=True,  # (``local_conversation_for`` makes a new one, never a fork)
        citations=citations,
        exclusions=exclusions,
        min_relevance=min_relevance,
    )
    return [s.message_out(hit.message, agent, similarity=hit.score) for hit in hits]


class UnknownRouteView(LocalView):
    """Any path no one serves (``memsvc.urls``, last): as the seed's FastAPI server answers
    an unknown path, ``{"detail": "Not Found"}``, whatever the method, not Django's HTML
    page."""

    authentication_classes = []
    permission_classes = [AllowAny]
    schema = None

    def initial(self, request, *args, **kwargs):
        raise NotFound("Not Found")


class HealthView(LocalView):
    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = []  # probes are never refused

    @extend_schema(exclude=True)
    def get(self, request):
        # The probe of /v1/health: a statement, answered within a bound (a connection
        # already open said ok for a database that did not answer).
        _, reason = database_state()
        if reason is not None:
            return unavailable({"status": "unavailable", "detail": reason})
        return Response(
            {
                "status": "ok",
                "embedding_backend": settings.MEMORY_EMBEDDING_BACKEND,
                "embedding_dimension": settings.MEMORY_EMBEDDING_DIMENSION,
                # The seed's field, without the path it held there: which database, not where.
                "database_path": "postgresql (external)"
                if settings.DATABASE_URL
                else "postgresql (embedded)",
            }
        )


class AgentsView(LocalView):
    """``POST /agents``, "create or return", with which ``learning()`` enters its block. A
    key's agent is its own: returned by name to a key of either scope, its metadata only to
    a key that may read (a write-only key enters a ``capture_only`` block: review). A
    keyless caller has every scope."""

    permission_classes = [IsLocalCaller]

    @extend_schema(exclude=True)
    def post(self, request):
        data = s.CreateAgentIn.parse(request.data)
        caller = request.user
        if caller.agent is not None:
            reads = Scope.READ in caller.scopes
            if not reads:  # (before the name is looked up: a key of neither scope learns none)
                require_scope(caller, Scope.WRITE)
            return Response(s.agent_out(_agent(request, data["name"]), reads=reads))
        if not agent_selectors.local_agent_named(data["name"]):
            s.NewAgentIn.parse({"name": data["name"]})  # (a new one: a name given now)
        agent, _ = agent_services.agent_get_or_create(
            owner_principal=agent_selectors.LOCAL_OWNER,
            name=data["name"],
            metadata=data.get("metadata") or {},
            loopback_trusted=True,
        )
        if not agent.loopback_trusted:
            raise agent_selectors.reached_with_a_key(agent.name)
        return Response(s.agent_out(agent))


class AgentView(LocalView):
    @extend_schema(exclude=True)
    def get(self, request, name):
        return Response(s.agent_out(_agent(request, name)))


def _list_messages(request, agent_name: str) -> Response:
    agent = _agent(request, agent_name)
    limit = parse_limit(request.query_params.get("limit"), default=100, maximum=MAX_LIST_LIMIT)
    if agent.local_conversation is None:
        return Response([])
    newest_first = conversation_messages(agent.local_conversation, for_agent=True).order_by("-seq")
    return Response([s.message_out(m, agent) for m in newest_first[:limit]])


class MessagesView(LocalView):
    """``POST /messages``; with an ``Idempotency-Key`` (as on ``/v1/agent``), a retry gets
    the first request's message back and stores nothing (``learning()``'s background
    sender retries a store that timed out)."""

    @extend_schema(exclude=True)
    def post(self, request):
        data = s.CreateMessageIn.parse(request.data)
        agent = _agent(request, data["agent_name"])
        message, created = agent_services.local_message_append(
            agent,
            role=data["role"],
            content=data["content"],
            metadata=data.get("metadata"),
            idempotency_key=idempotency_key(request),
            request_hash=request_fingerprint("local", data),
        )
        if created:
            messages_embedded_now([message.id])
            enqueue_memory_extraction(agent, message.conversation)
        return marked_replayed(Response(s.message_out(message, agent)), created)


class AgentMessagesView(LocalView):
    @extend_schema(exclude=True)
    def get(self, request, agent_name):
        return _list_messages(request, agent_name)


class MessageSearchView(LocalView):
    """``POST /messages/search``; a GET here lists the messages of an agent named "search",
    as the seed's router would."""

    required_scope = Scope.READ  # a POST, but searching changes nothing

    @extend_schema(exclude=True)
    def post(self, request):
        data = s.SearchIn.parse(request.data)
        agent = _agent(request, data["agent_name"])
        return Response(
            _search(
                agent,
                data["query"],
                data["limit"],
                exclusions=True,
                min_relevance=data["min_score"],
            )
        )

    @extend_schema(exclude=True)
    def get(self, request):
        return _list_messages(request, "search")


class MemoryBlocksView(LocalView):
    @extend_schema(exclude=True)
    def post(self, request):
        data = s.CreateBlockIn.parse(request.data)
        agent = _agent(request, data["agent_name"])
        block = agent_services.memory_block_create(
            agent.as_principal(), agent=agent, label=data["label"], value=data["value"]
        )
        return Response(s.block_out(block))


class AgentMemoryBlocksView(LocalView):
    @extend_schema(exclude=True)
    def get(self, request, agent_name):
        agent = _agent(request, agent_name)
        return Response([s.block_out(b) for b in agent_selectors.memory_blocks(agent, user_id="")])


class MemoryBlockView(LocalView):
    writes_read = ("PUT",)  # it answers with the block as stored (as ``/v1``'s)

    def _block(self, request, agent_name, label):
        agent = _agent(request, agent_name)
        try:
            return agent, agent_selectors.memory_block(agent, user_id="", label=label)
        except NotFound:
            raise NotFound("Memory block not found") from None

    @extend_schema(exclude=True)
    def get(self, request, agent_name, label):
        _, block = self._block(request, agent_name, label)
        return Response(s.block_out(block))

    @extend_schema(exclude=True)
    def put(self, request, agent_name, label):
        agent, block = self._block(request, agent_name, label)
        data = s.UpdateBlockIn.parse(request.data)
        block = agent_services.memory_block_update(
            agent.as_principal(), block=block, value=data["value"]
        )
        return Response(s.block_out(block))


class ContextView(LocalView):
    """The seed's context (blocks, relevant messages) and the agent's long-term memories
    most relevant to the query (``memories``): the seed's server has no users, so a local
    agent's memories are its own."""

    required_scope = Scope.READ  # a POST, but reading the context changes nothing

    @extend_schema(exclude=True)
    def post(self, request, agent_name):
        agent = _agent(request, agent_name, memories=True)  # (for ``keeps_memories``)
        data = s.ContextIn.parse(request.data)
        query = data["query"]
        asked = not shows_nothing(query)
        if asked and agent.local_conversation_id is not None:
            embed_query_ahead(query)  # (for both searches, while the memory probe is read)
        keeps = asked and agent_selectors.keeps_memories(agent)
        # The memories searched on a connection of their own while this one searches the
        # messages: each search is several round trips, and they need nothing of each other.
        memory_search = (
            beside(
                agent_selectors.memories_for_context,
                agent,
                user_id="",
                query=query,
                limit=settings.MEMORY_DEFAULT_SEARCH_LIMIT,
            )
            if keeps
            else contextlib.nullcontext(list)  # (list(): no memories)
        )
        with memory_search as memories_found:
            messages = (
                _search(agent, query, settings.MEMORY_MAX_CONTEXT_MESSAGES, citations=keeps)
                if asked
                else []
            )
            blocks = [s.block_out(b) for b in agent_selectors.memory_blocks(agent, user_id="")]
            memories = memories_found()
        enqueue_memory_touch([hit.memory.id for hit in memories])
        return Response(
            {
                "memory_blocks": blocks,
                "relevant_messages": messages,
                "memories": [s.memory_out(hit) for hit in memories],
            }
        )


class ToolRecordsView(LocalView):
    """``POST /tool-records``: the tool interactions of one step of an agent's task (the
    memory bank of ``learning(strategy="memory_bank")``), stored as its tool records. With
    an ``Idempotency-Key``, a retry gets the first request's records and stores nothing
    (the memory bank sends a step's records again when their answer was lost)."""

    @extend_schema(exclude=True)
    def post(self, request):
        data = s.CreateToolRecordsIn.parse(request.data)
        agent = _agent(request, data["agent_name"])
        records, created = agent_services.tool_records_create(
            agent.as_principal(),
            agent=agent,
            records=[
                NewToolRecord(
                    tool_name=item["tool_name"],
                    raw_input=item.get("input", {}),
                    raw_output=item["output"],
                    summary=item.get("summary", ""),
                    task_id=data.get("task_id", ""),
                    step=item.get("step"),
                )
                for item in data["records"]
            ],
            idempotency_key=idempotency_key(request),
            request_hash=request_fingerprint("local-tool-records", data),
        )
        if created:
            enqueue_tool_record_observation(records)
        return marked_replayed(Response([s.tool_record_out(r) for r in records]), created)


class ToolRecordSearchView(LocalView):
    required_scope = Scope.READ  # a POST, but searching changes nothing

    @extend_schema(exclude=True)
    def post(self, request):
        data = s.ToolRecordSearchIn.parse(request.data)
        agent = _agent(request, data["agent_name"])
        hits = agent_selectors.tool_record_search(
            agent,
            query=data["query"],
            top_k=data["top_k"],
            task_id=data.get("task_id"),
            excluding=data.get("exclude_trace_ids", ()),
        )
        return Response([s.tool_record_hit_out(hit) for hit in hits])
