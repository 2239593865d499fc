"""Tool records, the memory bank's store (``/v1/agent/tool-records``): thin views over
``agents_api.selectors`` and ``agents_api.services``. A record is its agent's alone; an agent
acting for a user reaches only what that user may see of them (``tool_records_of``)."""

from drf_spectacular.utils import OpenApiParameter
from rest_framework.response import Response

from agents_api import selectors, services
from agents_api.api import serializers as s
from agents_api.api.views import AgentApiView, agent_operation
from agents_api.models import Scope
from agents_api.services import NewToolRecord
from agents_api.tasks import enqueue_tool_record_observation
from conversations.selectors import access_conversation
from memsvc.api.errors import InvalidInput, NotFound
from memsvc.api.fields import chosen_by_query, query_text
from memsvc.api.idempotency import (
    IDEMPOTENCY_PARAMETERS,
    idempotency_key,
    marked_replayed,
    request_fingerprint,
)
from memsvc.api.pagination import (
    AFTER_PARAMETER,
    LIMIT_PARAMETER,
    list_digest,
    page_data,
    page_params,
)
from memsvc.api.schema import errors

_TASK_ID_SCHEMA = {"type": "string", "minLength": 1, "maxLength": s.TASK_ID_MAX_LENGTH}
TASK_ID = OpenApiParameter("taskId", _TASK_ID_SCHEMA, description="Only this task's records.")
REQUIRED_TASK_ID = OpenApiParameter(
    "taskId",
    _TASK_ID_SCHEMA,
    required=True,
    description="The task whose records are deleted.",
)


def _task_id(request) -> str | None:
    """``?taskId=``, a task's id as a record may have it: a longer one named no task, and
    listed nothing where a search refused it (review)."""
    task_id = query_text(request, "taskId")
    if task_id is not None and len(task_id) > s.TASK_ID_MAX_LENGTH:
        raise InvalidInput.for_field(
            "taskId", f"must be at most {s.TASK_ID_MAX_LENGTH} characters", location="query"
        )
    return task_id


def _conversation(request, conversation_id):
    """The conversation a record names: one the agent sees, else 400 naming the field."""
    if conversation_id is None:
        return None
    try:
        return access_conversation(request.principal, conversation_id)
    except NotFound:
        raise InvalidInput.for_field("conversationId", "no such conversation") from None


class ToolRecordsView(AgentApiView):
    @agent_operation(
        "agentCreateToolRecord",
        parameters=IDEMPOTENCY_PARAMETERS,
        request=s.CreateToolRecordIn,
        responses={201: s.ToolRecordOut, **errors(400, 401, 403, 409)},
    )
    def post(self, request):
        data = s.CreateToolRecordIn.parse(request.data)
        [record], created = services.tool_records_create(
            request.principal,
            agent=request.agent,
            records=[
                NewToolRecord(
                    tool_name=data["toolName"],
                    raw_input=data.get("input", {}),
                    raw_output=data["output"],
                    summary=data.get("summary", ""),
                    task_id=data.get("taskId", ""),
                    step=data.get("step"),
                    conversation=_conversation(request, data.get("conversationId")),
                )
            ],
            idempotency_key=idempotency_key(request),
            request_hash=request_fingerprint(
                "tool-records", request.data, request.principal.on_behalf_of
            ),
        )
        if created:
            enqueue_tool_record_observation([record])
        return marked_replayed(Response(s.ToolRecordOut(record).data, status=201), created)

    @agent_operation(
        "agentListToolRecords",
        parameters=[TASK_ID, LIMIT_PARAMETER, AFTER_PARAMETER],
        responses={200: s.ToolRecordPage, **errors(400, 401, 403)},
    )
    def get(self, request):
        task_id = _task_id(request)
        records = selectors.tool_records_of(
            request.agent, task_id=task_id, principal=request.principal
        )
        page = selectors.tool_record_page(
            records,
            **page_params(request),
            of_list=list_digest("agent tool records", request.principal, task_id=task_id),
        )
        return Response(page_data(page, s.ToolRecordOut))

    @agent_operation(
        "agentDeleteToolRecords",
        parameters=[REQUIRED_TASK_ID],
        responses={200: s.DeletedOut, **errors(400, 401, 403)},
    )
    def delete(self, request):
        chosen_by_query(request, "taskId")
        task_id = _task_id(request)
        if not task_id:
            raise InvalidInput.for_field("taskId", "name the task whose records to delete")
        records = selectors.tool_records_of(
            request.agent, task_id=task_id, principal=request.principal
        )
        deleted = services.tool_records_delete(request.principal, records=records)
        return Response({"deleted": deleted})


class ToolRecordSearchView(AgentApiView):
    required_scope = Scope.READ  # a POST, but searching changes nothing

    @agent_operation(
        "agentSearchToolRecords",
        request=s.SearchToolRecordsIn,
        responses={200: s.ToolRecordHitList, **errors(400, 401, 403)},
    )
    def post(self, request):
        data = s.SearchToolRecordsIn.parse(request.data)
        hits = selectors.tool_record_search(
            request.agent,
            query=data["query"],
            top_k=data["topK"],
            task_id=data.get("taskId"),
            principal=request.principal,
        )
        return Response({"data": s.ToolRecordHitOut(hits, many=True).data})


class ToolRecordView(AgentApiView):
    @agent_operation(
        "agentGetToolRecord", responses={200: s.ToolRecordOut, **errors(401, 403, 404)}
    )
    def get(self, request, trace_id):
        records = selectors.tool_records_of(request.agent, principal=request.principal)
        return Response(s.ToolRecordOut(selectors.tool_record_of(records, trace_id)).data)
