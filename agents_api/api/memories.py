"""Long-term memories through both doors: the agent that keeps them (``/v1/agent/memories``)
and the user they are about (``/v1/user/memories``). Thin views over
``agents_api.selectors`` and ``agents_api.services``."""

from drf_spectacular.utils import OpenApiParameter
from rest_framework.response import Response

from agents_api import selectors, services
from agents_api.api import serializers as s
from agents_api.api.views import USER_ID, AgentApiView, agent_operation
from agents_api.models import MEMORY_TAG_MAX_LENGTH, Agent, Scope
from agents_api.tasks import enqueue_memory_touch
from memsvc.api.errors import InvalidInput
from memsvc.api.fields import chosen_by_query, query_choice, query_text
from memsvc.api.pagination import (
    AFTER_PARAMETER,
    LIMIT_PARAMETER,
    page_data,
    page_params,
)
from memsvc.api.schema import errors
from memsvc.api.views import UserApiView, user_operation

ORDER = OpenApiParameter(
    "order", str, enum=list(s.MEMORY_ORDER_CHOICES), description="recent (default) or popular"
)
TAG = OpenApiParameter(
    "tag",
    {"type": "string", "minLength": 1, "maxLength": MEMORY_TAG_MAX_LENGTH},
    description="Only memories with this tag.",
)
AGENT_ID = OpenApiParameter(
    "agentId", {"type": "string", "format": "uuid"}, description="Only what this agent keeps."
)


def _order(request) -> str:
    return query_choice(request, "order", list(s.MEMORY_ORDER_CHOICES), default="recent")


def search_memories(agent, *, user_id, data, in_use: bool) -> list:
    """A search of memories (``SearchMemoriesIn``'s data), for the agent API, the user API
    and the MCP server alike. ``in_use``: an agent's search counts a use of each memory it
    returns (what keeps a memory alive, ``memories_prune``); a user looking through what is
    kept about them does not."""
    hits = selectors.memory_search(
        agent,
        user_id=user_id,
        query=data["query"],
        limit=data["limit"],
        tags=data.get("tags", ()),
        min_score=data["minScore"],
        mode=data["mode"],
        prefetch=data["prefetch"],
        exclusions=True,
    )
    if in_use:
        enqueue_memory_touch([hit.memory.id for hit in hits])
    return hits


# --- the agent's door ------------------------------------------------------------------------


def _reachable(request, *, with_expired: bool = False):
    """The memories this request may name by id: the agent's, and only the user's it acts
    for (``X-On-Behalf-Of``); an expired one only to delete it (``memories_of``)."""
    return selectors.memories_of(
        request.agent, user_id=request.principal.on_behalf_of, with_expired=with_expired
    )


def _tag(request) -> str | None:
    """``?tag=``. One longer than a tag may be is refused: compared with the stored tags it
    would be cut to their length (PostgreSQL casts it to the column's type) and match a tag
    it is not."""
    tag = query_text(request, "tag")
    if tag and len(tag) > MEMORY_TAG_MAX_LENGTH:
        raise InvalidInput.for_field(
            "tag", f"at most {MEMORY_TAG_MAX_LENGTH} characters", location="query"
        )
    return tag


def _subject(request, user_id) -> str:
    return selectors.memory_subject(request.principal, user_id=user_id)


class AgentMemoriesView(AgentApiView):
    writes_read = ("POST",)  # a save merged into a memory kept already answers with it

    @agent_operation(
        "agentListMemories",
        parameters=[USER_ID, TAG, ORDER, LIMIT_PARAMETER, AFTER_PARAMETER],
        responses={200: s.MemoryPage, **errors(400, 401, 403)},
    )
    def get(self, request):
        user_id = _subject(request, request.query_params.get("userId"))
        tag, order = _tag(request), _order(request)
        page = selectors.memory_page(
            request.principal,
            request.agent,
            user_id=user_id,
            tag=tag,
            order=order,
            **page_params(request),
        )
        return Response(page_data(page, s.MemoryOut))

    @agent_operation(
        "agentSaveMemory",
        request=s.CreateMemoryIn,
        responses={
            201: s.MemoryOut,
            200: s.MemoryOut,  # the same memory was already kept: merged into it
            **errors(400, 401, 403, 409),  # (409: the user turned memory off)
        },
    )
    def post(self, request):
        data = s.CreateMemoryIn.parse(request.data)
        memory, created = services.memory_save(
            request.principal,
            agent=request.agent,
            user_id=_subject(request, data.get("userId")),
            **vars(s.NewMemoryIn.new_memory(data)),
        )
        return Response(s.MemoryOut(memory).data, status=201 if created else 200)

    @agent_operation(
        "agentDeleteMemories",
        parameters=[USER_ID],
        responses={200: s.DeletedOut, **errors(400, 401, 403)},
    )
    def delete(self, request):
        chosen_by_query(request, "userId")
        memories = selectors.memories_of(
            request.agent,
            user_id=_subject(request, request.query_params.get("userId")),
            with_expired=True,
        )
        deleted = services.memories_delete(request.principal, memories=memories)
        return Response({"deleted": deleted})


class AgentMemoryBatchView(AgentApiView):
    writes_read = ("POST",)  # as a save

    @agent_operation(
        "agentSaveMemories",
        request=s.BatchMemoriesIn,
        responses={201: s.MemoryList, **errors(400, 401, 403, 409)},
    )
    def post(self, request):
        data = s.BatchMemoriesIn.parse(request.data)
        saved = services.memories_save(
            request.principal,
            agent=request.agent,
            user_id=_subject(request, data.get("userId")),
            memories=[s.NewMemoryIn.new_memory(item) for item in data["memories"]],
        )
        memories = [memory for memory, _ in saved]
        return Response({"data": s.MemoryOut(memories, many=True).data}, status=201)


class AgentMemorySearchView(AgentApiView):
    required_scope = Scope.READ  # a POST, but searching changes nothing the agent wrote

    @agent_operation(
        "agentSearchMemories",
        request=s.AgentSearchMemoriesIn,
        responses={200: s.MemoryHitList, **errors(400, 401, 403)},
    )
    def post(self, request):
        data = s.AgentSearchMemoriesIn.parse(request.data)
        hits = search_memories(
            request.agent, user_id=_subject(request, data.get("userId")), data=data, in_use=True
        )
        return Response({"data": s.MemoryHitOut(hits, many=True).data})


class AgentMemoryView(AgentApiView):
    writes_read = ("PATCH",)  # the whole memory, what the change left of it (``{}``: all)

    @agent_operation("agentGetMemory", responses={200: s.MemoryOut, **errors(401, 403, 404)})
    def get(self, request, memory_id):
        return Response(s.MemoryOut(selectors.memory_of(_reachable(request), memory_id)).data)

    @agent_operation(
        "agentUpdateMemory",
        request=s.UpdateMemoryIn,
        responses={200: s.MemoryOut, **errors(400, 401, 403, 404, 409)},
    )
    def patch(self, request, memory_id):
        memory = selectors.memory_of(_reachable(request), memory_id)
        data = s.UpdateMemoryIn.parse(request.data)
        memory = services.memory_update(
            request.principal,
            memory=memory,
            content=data.get("content"),
            summary=data.get("summary"),
            importance=data.get("importance"),
            tags=data.get("tags"),
            metadata=data.get("metadata"),
            expires_at=data.get("expiresAt"),
            message_ids=data.get("messageIds"),
        )
        return Response(s.MemoryOut(memory).data)

    @agent_operation("agentDeleteMemory", responses={204: None, **errors(401, 403, 404)})
    def delete(self, request, memory_id):
        memory = selectors.memory_of(_reachable(request, with_expired=True), memory_id)
        services.memory_delete(request.principal, memory=memory)
        return Response(status=204)


# --- the user's door: what agents keep about them ------------------------------------------


def _agent_filter(raw, field: str = "agentId") -> Agent | None:
    """``agentId`` narrows a user's memories to one agent's; an agent that keeps nothing
    about the user simply has no memories to show (no 404: agents are not secrets here).
    An empty one is refused: ``?agentId=`` on a delete deleted every agent's."""
    if raw is None:
        return None
    if not raw:
        raise InvalidInput.for_field(field, "must not be empty", location="query")
    return selectors.agent_by_id(raw, field=field)


class UserMemoriesView(UserApiView):
    @user_operation(
        "listMyMemories",
        parameters=[AGENT_ID, TAG, ORDER, LIMIT_PARAMETER, AFTER_PARAMETER],
        responses={200: s.MemoryPage, **errors(400, 401)},
    )
    def get(self, request):
        agent = _agent_filter(request.query_params.get("agentId"))
        tag, order = _tag(request), _order(request)
        page = selectors.memory_page(
            request.principal,
            agent,
            user_id=request.principal.id,
            tag=tag,
            order=order,
            **page_params(request),
        )
        selectors.citations_shown_to(request.principal, page.rows)
        return Response(page_data(page, s.MemoryOut))

    @user_operation(
        "deleteMyMemories",
        parameters=[AGENT_ID],
        responses={200: s.DeletedOut, **errors(400, 401)},
    )
    def delete(self, request):
        chosen_by_query(request, "agentId")
        memories = selectors.memories_of(
            _agent_filter(request.query_params.get("agentId")),
            user_id=request.principal.id,
            with_expired=True,
        )
        return Response({"deleted": services.memories_delete(request.principal, memories=memories)})


class UserMemorySearchView(UserApiView):
    @user_operation(
        "searchMyMemories",
        request=s.UserSearchMemoriesIn,
        responses={200: s.MemoryHitList, **errors(400, 401)},
    )
    def post(self, request):
        data = s.UserSearchMemoriesIn.parse(request.data)
        agent = _agent_filter(data.get("agentId"))
        hits = search_memories(agent, user_id=request.principal.id, data=data, in_use=False)
        selectors.citations_shown_to(request.principal, [hit.memory for hit in hits])
        return Response({"data": s.MemoryHitOut(hits, many=True).data})


class UserMemoryView(UserApiView):
    @user_operation("deleteMyMemory", responses={204: None, **errors(401, 404)})
    def delete(self, request, memory_id):
        mine = selectors.memories_of(user_id=request.principal.id, with_expired=True)
        memory = selectors.memory_of(mine, memory_id)
        services.memory_delete(request.principal, memory=memory)
        return Response(status=204)


class UserMemorySettingView(UserApiView):
    """The user's memory switch (the pages' "private chat"), for a chat frontend of its own:
    it was the pages' alone (review)."""

    @user_operation(
        "getMyMemorySetting",
        description="Whether agents may remember you (on until you turn it off).",
        responses={200: s.MemorySettingOut, **errors(401)},
    )
    def get(self, request):
        setting = selectors.memory_setting_of(request.principal.id).first()
        return Response(s.MemorySettingOut(setting or _NEVER_CHANGED).data)

    @user_operation(
        "setMyMemorySetting",
        description=(
            "Turn agents' memory of you on or off. While it is off, agents keep nothing new "
            "about you, neither memories nor memory blocks (their writes are refused, 409), "
            "and searches of what they kept find nothing; what they kept stays until you "
            "delete it."
        ),
        request=s.MemorySettingIn,
        responses={200: s.MemorySettingOut, **errors(400, 401)},
    )
    def put(self, request):
        data = s.MemorySettingIn.parse(request.data)
        setting = services.memory_setting_update(request.principal, enabled=data["memoryEnabled"])
        return Response(s.MemorySettingOut(setting).data)


# A user who never turned the switch: memory on, no row.
_NEVER_CHANGED = {"memory_enabled": True, "updated_at": None}
