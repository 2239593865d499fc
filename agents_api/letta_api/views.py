"""Letta's routes, for Letta's own clients: the ``agentic-learning`` SDK's ``learning()``
and its agents / memory / messages helpers work against memsvc unmodified.

Authentication is a memsvc API key as the bearer (the SDK sends ``LETTA_API_KEY``); reads
need the ``read`` scope and writes ``write``, as on ``/v1/agent``. Errors are FastAPI's
``{"detail": ...}``, as Letta's server answers them. Every operation is a memsvc service
or selector; a route of Letta's that memsvc does not serve answers 501 naming it.
"""

from contextlib import contextmanager

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_api import selectors, services
from agents_api.authentication import HasScope, OwnMemoryKeyAuthentication
from agents_api.letta_api import serializers as s
from agents_api.local_api.fastapi import fastapi_errors, render_local_error
from agents_api.tasks import enqueue_letta_observation, enqueue_memory_extraction
from conversations.models import Message
from conversations.selectors import conversation_messages
from memsvc.api.errors import ApiError, InvalidInput, NotFound
from memsvc.api.pagination import parse_limit
from memsvc.api.ratelimit import CountedBeforePermissions

MAX_LIST_LIMIT = 1000


class NotImplementedByMemsvc(ApiError):
    status_code = 501
    code = "not_implemented"


# Answers the same request gets again whenever it is sent: Letta's client retries every 409
# and 5xx unless told not to, and an attach that conflicted, whose waiting block it deletes,
# was retried into a 404 "Block not found"; a 501 was asked three times (review).
FINAL_STATUSES = {409, 501}


def letta_errors(exc, context):
    """Errors as the local API answers them (``fastapi_errors``), with ``x-should-retry:
    false`` on those a retry cannot change (``FINAL_STATUSES``)."""
    response = fastapi_errors(exc, context)
    if response is not None and response.status_code in FINAL_STATUSES:
        response["x-should-retry"] = "false"
    return response


class LettaView(CountedBeforePermissions, APIView):
    authentication_classes = [OwnMemoryKeyAuthentication]
    permission_classes = [IsAuthenticated, HasScope]
    # Letta's writes answer with the agent's state or the block, every block's value in it:
    # a key that may not read may not learn them by writing (review).
    writes_read = ("POST", "PUT", "PATCH", "DELETE")
    # Refusals outside the view (body too large, NUL in the path, database down, rate
    # limits: memsvc.api.middleware) in Letta's shape too, not /v1's.
    render_error = staticmethod(render_local_error)

    def get_exception_handler(self):
        return letta_errors

    def caller(self, request):
        """The key's agent: the agents it reaches are ``selectors.letta_agents``."""
        return request.auth.agent

    def agent(self, request, agent_id: str):
        return selectors.letta_agent(self.caller(request), _agent_id(agent_id))

    def block(self, request, block_id: str):
        return selectors.letta_block(self.caller(request), s.parse_block_id(block_id))

    def http_method_not_allowed(self, request, *args, **kwargs):
        # A method of a route memsvc serves, but not with it (``DELETE /v1/groups/{id}``):
        # 501, as every route it does not serve (it was a 405; review).
        raise NotImplementedByMemsvc(
            f"memsvc does not serve {request.method} {request.path} of Letta's API"
        )


# The filters of Letta's lists that memsvc does not apply: a list asked with one is refused
# (501), not answered whole. Answered whole, Letta's clean-up of unattached blocks
# (``connected_to_agents_count_eq=0``, then a delete of each) deleted every attached one
# (review).
UNAPPLIED_BLOCK_FILTERS = (
    "connected_to_agents_count_eq",
    "connected_to_agents_count_gt",
    "connected_to_agents_count_lt",
    "description_search",
    "identifier_keys",
    "identity_id",
    "label_search",
    "name",
    "project_id",
    "templates_only",
    "value_search",
)
UNAPPLIED_MESSAGE_FILTERS = ("group_id",)  # (answered whole, a group's were all the agent's)
UNAPPLIED_AGENT_FILTERS = (
    "base_template_id",
    "identifier_keys",
    "identity_id",
    "last_stop_reason",
    "project_id",
    "query_text",
    "template_id",
)


def _refuse_unapplied(params, filters: tuple[str, ...], listed: str) -> None:
    """``NotImplementedByMemsvc`` naming the ``filters`` a list request asks for (but
    ``templates_only=false``, which asks for the list as it is)."""
    asked = [
        name
        for name in filters
        if params.get(name) and not (name == "templates_only" and params[name].lower() == "false")
    ]
    if asked:
        raise NotImplementedByMemsvc(f"memsvc does not filter {listed} by {', '.join(asked)}")


def _order(params, default: str) -> str:
    """Letta's ``order``, else its older ``ascending`` (true: oldest first), else
    ``default``; by creation, the one order memsvc lists by (another ``order_by`` or
    ``sort_by`` is a 501: one asked for was passed over, and a client asking oldest first
    by ``ascending`` was given the newest; review)."""
    for name in ("order_by", "sort_by"):
        if params.get(name) and params[name] != "created_at":
            raise NotImplementedByMemsvc(f"memsvc lists by created_at only, not by {params[name]}")
    order = params.get("order")
    if not order and params.get("ascending"):
        ascending = params["ascending"].lower()
        if ascending not in ("true", "false"):
            raise InvalidInput.for_field("ascending", "must be true or false", location="query")
        order = "asc" if ascending == "true" else "desc"
    order = order or default
    if order not in selectors.LETTA_ORDERS:
        raise InvalidInput.for_field("order", "must be 'asc' or 'desc'", location="query")
    return order


def _cursor(params, name: str, parse, *, missing: str | None):
    """The item ``?after=`` or ``?before=`` names, parsed; None when absent or naming none
    (Letta's server ignores such a cursor; with ``missing``, a 404 saying so)."""
    raw = params.get(name)
    if not raw:
        return None
    try:
        return parse(raw)
    except NotFound:
        if missing is not None:
            raise
        return None


def _page(
    rows,
    params,
    *,
    default_order: str,
    parse_id,
    default_limit: int = 50,
    missing: str | None = None,
    **options,
) -> list:
    """A page of a Letta list, by Letta's ``order``, ``after``, ``before`` and ``limit``
    (``missing``: ``selectors.letta_page``'s)."""
    return selectors.letta_page(
        rows,
        order=_order(params, default_order),
        after=_cursor(params, "after", parse_id, missing=missing),
        before=_cursor(params, "before", parse_id, missing=missing),
        limit=parse_limit(params.get("limit"), default=default_limit, maximum=MAX_LIST_LIMIT),
        missing=missing,
        **options,
    )


def _refuse_block_ids(request) -> None:
    """A 501 for Letta's ``block_ids`` (the blocks an agent is made with, or that replace its
    own): passed over as the options memsvc does not take are, the agent was made or left
    without the blocks it was to share (reviews)."""
    given = request.data.get("block_ids") if isinstance(request.data, dict) else None
    if given or (given is not None and request.method == "PATCH"):  # ([] there: detach all)
        raise NotImplementedByMemsvc(
            "memsvc does not set an agent's blocks by id (block_ids): attach each, "
            "PATCH /v1/agents/{agent_id}/core-memory/blocks/attach/{block_id}"
        )


def _agent_id(raw: str):
    return s.parse_uuid_id(raw, s.AGENT_ID_PREFIX, "Agent")


def _agent_state(agent) -> dict:
    """An agent of ``selectors.letta_agents`` (its blocks prefetched) in Letta's shape; one
    changed since it was read (created, updated, a block attached) is read again."""
    blocks = getattr(agent, "letta_blocks", None)
    if blocks is None:
        blocks = selectors.memory_blocks(agent, user_id="")
    return s.agent_out(agent, blocks)


class AgentsView(LettaView):
    @extend_schema(exclude=True)
    def get(self, request):
        params = request.query_params
        _refuse_unapplied(params, UNAPPLIED_AGENT_FILTERS, "agents")
        agents = selectors.letta_agents(self.caller(request))
        if params.get("name"):
            agents = agents.filter(name=params["name"])
        tags = params.getlist("tags")
        if tags:
            match_all = params.get("match_all_tags", "").lower() == "true"
            agents = selectors.letta_agents_tagged(agents, tags, match_all=match_all)
        page = _page(agents, params, default_order="desc", parse_id=_agent_id)
        return Response([_agent_state(agent) for agent in page])

    @extend_schema(exclude=True)
    def post(self, request):
        _refuse_block_ids(request)
        data = s.AgentIn.parse(request.data)
        agent = services.letta_agent_create(
            self.caller(request),
            name=data.pop("name"),
            tags=data.pop("tags"),
            memory_blocks=data.pop("memory_blocks"),
            metadata=data.pop("metadata", None),
            settings=data,
        )
        return Response(_agent_state(agent))


class AgentView(LettaView):
    @extend_schema(exclude=True)
    def get(self, request, agent_id):
        return Response(_agent_state(self.agent(request, agent_id)))

    @extend_schema(exclude=True)
    def patch(self, request, agent_id):
        agent = self.agent(request, agent_id)
        _refuse_block_ids(request)
        data = s.AgentUpdateIn.parse(request.data)
        agent = services.letta_agent_update(
            self.caller(request),
            agent=agent,
            name=data.pop("name", None),
            metadata=data.pop("metadata", None),
            settings=data,
        )
        return Response(_agent_state(agent))

    @extend_schema(exclude=True)
    def delete(self, request, agent_id):
        services.letta_agent_delete(self.caller(request), agent=self.agent(request, agent_id))
        return Response(None)


class AgentMessagesView(LettaView):
    @extend_schema(exclude=True)
    def get(self, request, agent_id):
        """``after`` and ``before`` in the list's ``order``: ``after`` the last of a page in
        the default (newest first) order walked back to the newest (review)."""
        _refuse_unapplied(request.query_params, UNAPPLIED_MESSAGE_FILTERS, "messages")
        agent = self.agent(request, agent_id)
        conversation = agent.local_conversation
        messages = (
            Message.objects.none()
            if conversation is None
            else conversation_messages(conversation, for_agent=True)
        )
        page = _page(
            messages,
            request.query_params,
            default_order="desc",
            parse_id=lambda raw: s.parse_uuid_id(raw, s.MESSAGE_ID_PREFIX, "Message"),
            default_limit=100,
            orders=selectors.LETTA_MESSAGE_ORDERS,
            missing="Message not found",  # (Letta's server: a 404, not ignored)
        )
        return Response([s.message_out(message, agent) for message in page])

    @extend_schema(exclude=True)
    def post(self, request, agent_id):
        raise NotImplementedByMemsvc(
            "memsvc does not run agents: POST /v1/agents/{agent_id}/messages is not served "
            "(store turns with POST /v1/agents/{agent_id}/messages/capture)"
        )


class CaptureView(LettaView):
    @extend_schema(exclude=True)
    def post(self, request, agent_id):
        agent = self.agent(request, agent_id)
        data = s.CaptureIn.parse(request.data)
        messages = services.letta_capture(
            agent,
            request_messages=data["request_messages"],
            response=data["response_dict"],
            model=data["model"],
            provider=data["provider"],
        )
        if messages:
            enqueue_memory_extraction(agent, messages[0].conversation)
            enqueue_letta_observation(agent)
        return Response({"success": True, "message_ids": [f"message-{m.id}" for m in messages]})


class AttachBlockView(LettaView):
    @extend_schema(exclude=True)
    def patch(self, request, agent_id, block_id):
        block = self.block(request, block_id)
        try:
            agent = self.agent(request, agent_id)
        except NotFound:  # (refused by the service: the block made for it goes too)
            agent = None
        services.letta_block_attach(self.caller(request), agent=agent, block=block)
        return Response(_agent_state(self.agent(request, agent_id)))  # with the new block


class GroupView(LettaView):
    def _agent(self, request, group_id):
        """The agent whose sleeptime group this is; another's, or none: "Group not found",
        as a malformed id (it said "Agent not found": review), and as the group of an agent
        without sleeptime, which has none (its ``multi_agent_group`` is null; review)."""
        try:
            agent = selectors.letta_agent(
                self.caller(request), s.parse_uuid_id(group_id, s.GROUP_ID_PREFIX, "Group")
            )
        except NotFound:
            raise NotFound("Group not found") from None
        if not s.letta_settings(agent).get("enable_sleeptime"):
            raise NotFound("Group not found")
        return agent

    @extend_schema(exclude=True)
    def get(self, request, group_id):
        return Response(s.group_out(self._agent(request, group_id)))

    @extend_schema(exclude=True)
    def patch(self, request, group_id):
        agent = self._agent(request, group_id)
        config = s.GroupUpdateIn.parse(request.data).get("manager_config") or {}
        agent = services.letta_sleeptime_update(
            agent, frequency=config.get("sleeptime_agent_frequency")
        )
        return Response(s.group_out(agent))


class BlocksView(LettaView):
    @extend_schema(exclude=True)
    def get(self, request):
        params = request.query_params
        _refuse_unapplied(params, UNAPPLIED_BLOCK_FILTERS, "blocks")
        blocks = selectors.letta_blocks(self.caller(request), label=params.get("label"))
        page = _page(blocks, params, default_order="asc", parse_id=s.parse_block_id)
        return Response([s.block_out(block) for block in page])

    @extend_schema(exclude=True)
    def post(self, request):
        data = s.BlockIn.parse(request.data)
        block = services.letta_block_create(self.caller(request), **data)
        return Response(s.block_out(block))


class BlockView(LettaView):
    @extend_schema(exclude=True)
    def get(self, request, block_id):
        return Response(s.block_out(self.block(request, block_id)))

    @extend_schema(exclude=True)
    def patch(self, request, block_id):
        block = self.block(request, block_id)
        data = s.BlockUpdateIn.parse(request.data)
        if data.get("read_only", block.read_only) != block.read_only:
            # (Passed over: a block asked to be kept from writes stayed writable; review.)
            raise NotImplementedByMemsvc("memsvc sets a block's read_only when it is made only")
        with _deleted_meanwhile():
            block = services.memory_block_update(
                block.agent.as_principal(),
                block=block,
                value=data.get("value"),
                description=data.get("description"),
                limit=data.get("limit"),
                label=data.get("label"),
            )
        return Response(s.block_out(block))

    @extend_schema(exclude=True)
    def delete(self, request, block_id):
        block = self.block(request, block_id)
        with _deleted_meanwhile():
            services.memory_block_delete(block.agent.as_principal(), block=block)
        return Response(None)


@contextmanager
def _deleted_meanwhile():
    """A block deleted after it was read: Letta's "Block not found", as when it was gone
    before (the services' own words are the agent API's; review)."""
    try:
        yield
    except NotFound:
        raise NotFound("Block not found") from None


class UnsupportedView(LettaView):
    """Every other route under Letta's prefixes (after the key is checked): 501 naming it,
    not a 404 that a client would take for a missing agent."""

    @extend_schema(exclude=True)
    def get(self, request, *args, **kwargs):
        raise NotImplementedByMemsvc(
            f"memsvc serves only the routes of Letta's API that the agentic-learning SDK "
            f"uses; {request.method} {request.path} is not one of them"
        )

    post = put = patch = delete = get
