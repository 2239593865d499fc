"""The agent API (``/v1/agent``): thin views over the same services as the user API."""

from drf_spectacular.utils import OpenApiParameter
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from agents_api import selectors as agent_selectors
from agents_api import services as agent_services
from agents_api.api import serializers as s
from agents_api.authentication import ON_BEHALF_HEADER, ApiKeyAuthentication, HasScope
from agents_api.models import Scope
from agents_api.tasks import enqueue_memory_extraction, enqueue_memory_touch
from conversations import selectors, services
from conversations.api.serializers import (
    CONVERSATION_LIST_DESCRIPTION,
    CONVERSATION_LIST_PARAMETERS,
    ConversationOut,
    ConversationPage,
    ConversationSummaryOut,
    MessageOut,
    SearchMessagesIn,
    SearchResultsOut,
)
from conversations.models import AccessLevel, Channel, Conversation, Message
from conversations.services import NewMessage
from memsvc.api.errors import InvalidInput, NotFound
from memsvc.api.fields import chosen_by_query
from memsvc.api.idempotency import (
    IDEMPOTENCY_PARAMETERS,
    created_once,
    idempotency_key,
    marked_replayed,
    request_fingerprint,
)
from memsvc.api.pagination import (
    AFTER_PARAMETER,
    LIMIT_PARAMETER,
    decode_cursor,
    encode_cursor,
    list_digest,
    page_data,
    page_params,
    parse_limit,
)
from memsvc.api.principals import PRINCIPAL_MAX_LENGTH
from memsvc.api.schema import errors, listed, paged
from memsvc.api.views import ApiView, operation
from memsvc.text import shows_nothing
from memsvc.validators import as_uuid
from search.selectors import search_messages

ON_BEHALF = OpenApiParameter(
    ON_BEHALF_HEADER,
    {"type": "string", "minLength": 1, "maxLength": PRINCIPAL_MAX_LENGTH},
    location=OpenApiParameter.HEADER,
    description="Act for this user (needs the `impersonate` scope); the user's access applies too.",
)
USER_ID = OpenApiParameter(
    "userId",
    {"type": "string", "minLength": 1, "maxLength": PRINCIPAL_MAX_LENGTH},
    description="The user they are about (default: the agent's own).",
)


def agent_operation(operation_id: str, *, parameters=(), **kwargs):
    return operation(operation_id, tags=["agent"], parameters=[ON_BEHALF, *parameters], **kwargs)


class AgentApiView(ApiView):
    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated, HasScope]


class MeView(AgentApiView):
    @agent_operation("getAgent", responses={200: s.MeOut, **errors(401, 403)})
    def get(self, request):
        agent = request.agent
        return Response(
            s.MeOut(
                {
                    "id": agent.id,
                    "name": agent.name,
                    "principal_id": agent.principal_id,
                    "scopes": sorted(request.principal.scopes),
                }
            ).data
        )


class ConversationsView(AgentApiView):
    @agent_operation(
        "agentListConversations",
        description=CONVERSATION_LIST_DESCRIPTION,
        parameters=CONVERSATION_LIST_PARAMETERS,
        responses={200: ConversationPage, **errors(400, 401, 403)},
    )
    def get(self, request):
        page = selectors.conversation_page(
            request.principal, query=request.query_params.get("query"), **page_params(request)
        )
        return Response(page_data(page, ConversationSummaryOut))

    @agent_operation(
        "agentCreateConversation",
        parameters=IDEMPOTENCY_PARAMETERS,
        request=s.CreateAgentConversationIn,
        responses={201: ConversationOut, **errors(400, 401, 403, 409)},
    )
    def post(self, request):
        data = s.CreateAgentConversationIn.parse(request.data)
        principal = request.principal
        conversation, created = created_once(
            request,
            lambda: services.conversation_create(
                principal,
                title=data.get("title", ""),
                metadata=data.get("metadata"),
                writer_ids=[principal.id] if principal.on_behalf_of else [],
            ),
            Conversation.objects,
            kind="conversation",
            request_parts=(request.data, principal.on_behalf_of),
        )
        conversation = selectors.access_conversation(principal, conversation.id)
        return marked_replayed(Response(ConversationOut(conversation).data, status=201), created)


def _request_hash(principal, conversation_id, data) -> str:
    """What a retry must repeat: the conversation, the body, and the user acted for (the same
    body for another user is another request: their turn, signed with their id)."""
    return request_fingerprint(str(conversation_id), data, principal.on_behalf_of)


def _in_view(conversation, message_id, field: str):
    """A message of the conversation's view named in a request body: 400, not 404."""
    try:
        return selectors.message_in_view(conversation, message_id)
    except NotFound:
        raise InvalidInput.for_field(field, "not a message of this conversation") from None


def _parents_in_view(conversation, items: list[dict]) -> dict:
    """The messages named as parents, in one query; 400 naming the first that is not in the
    conversation's view."""
    wanted = {item["parentMessageId"] for item in items if item.get("parentMessageId")}
    found = {m.id: m for m in selectors.messages_in_view(conversation, wanted)}
    for index, item in enumerate(items):
        if item.get("parentMessageId") and item["parentMessageId"] not in found:
            raise InvalidInput.for_field(
                f"messages[{index}].parentMessageId", "not a message of this conversation"
            )
    return found


class MessagesView(AgentApiView):
    @agent_operation(
        "agentAppendMessages",
        parameters=IDEMPOTENCY_PARAMETERS,
        request=s.BulkMessagesIn,
        responses={201: s.MessageList, **errors(400, 401, 403, 404, 409)},
    )
    def post(self, request, conversation_id):
        conversation = selectors.access_conversation(
            request.principal, conversation_id, need=AccessLevel.WRITER, summary=False
        )
        data = s.BulkMessagesIn.parse(request.data)
        parents = _parents_in_view(conversation, data["messages"])
        new_messages = [
            NewMessage(
                content=item["content"],
                role=item["role"],
                channel=item["channel"],
                visibility=item["visibility"],
                metadata=item.get("metadata", {}),
                author_name=item.get("authorName"),
                parent_message=parents.get(item.get("parentMessageId")),
                created_at=item.get("createdAt"),
            )
            for item in data["messages"]
        ]
        messages, created = agent_services.agent_messages_append(
            request.principal,
            conversation=conversation,
            messages=new_messages,
            idempotency_key=idempotency_key(request),
            request_hash=_request_hash(request.principal, conversation.id, request.data),
        )
        if created:
            enqueue_memory_extraction(request.agent, conversation)
        return marked_replayed(
            Response({"data": MessageOut(messages, many=True).data}, status=201), created
        )


MAX_CONTEXT_MEMORIES = 20


def _context_memories(request, conversation, count: int) -> list:
    """The agent's ``count`` memories about the conversation's user most relevant to what
    that user said last; their use is counted."""
    if not count:
        return []
    hits = agent_selectors.memories_for_context(
        request.agent,
        user_id=agent_selectors.conversation_memory_subject(
            conversation, on_behalf_of=request.principal.on_behalf_of
        ),
        query=selectors.latest_user_text(conversation),
        limit=count,
    )
    enqueue_memory_touch([hit.memory.id for hit in hits])
    return [hit.memory for hit in hits]


class ContextView(AgentApiView):
    @agent_operation(
        "agentGetContext",
        parameters=[
            OpenApiParameter(
                "after",
                str,
                description="`nextCursor` of the last page of this conversation's context, "
                "read by the same caller (another's is a 400: list again): where it ended, "
                "which outlives its last message (erased by its author meanwhile, the walk "
                "goes on).",
            ),
            OpenApiParameter(
                "afterMessageId",
                str,
                description="`nextAfterMessageId` of the last page (400 once that message "
                "is deleted: `after` is not).",
            ),
            LIMIT_PARAMETER,
            OpenApiParameter(
                "memories",
                {"type": "integer", "minimum": 0, "maximum": MAX_CONTEXT_MEMORIES, "default": 0},
                description="Also return up to this many of the agent's long-term memories "
                "about the conversation's user (the user in `X-On-Behalf-Of`, else the owner; "
                "the agent's own memories when an agent owns the conversation): those most "
                "relevant to the user's latest messages, best first. Each counts as a use.",
            ),
        ],
        responses={200: s.ContextOut, **errors(400, 401, 403, 404)},
    )
    def get(self, request, conversation_id):
        conversation = selectors.access_conversation(
            request.principal, conversation_id, summary=False
        )
        limit = parse_limit(request.query_params.get("limit"))
        memory_count = parse_limit(
            request.query_params.get("memories"),
            default=0,
            minimum=0,
            maximum=MAX_CONTEXT_MEMORIES,
            field="memories",
        )
        of_list = list_digest("agent context", request.principal, conversation=conversation.id)
        after = _context_after(conversation, request.query_params, of_list=of_list)
        context = selectors.conversation_context(conversation, after=after, limit=limit)
        # Where the page ended (where it began, when it is empty): an agent waiting for what
        # is written next comes back with it (review: the last page had no cursor, and the id
        # of its last message was refused once that message was deleted).
        end = context.messages[-1] if context.messages else after
        cursor = end and encode_cursor(end.seq, str(end.id), end.channel, of_list=of_list)
        return Response(
            s.ContextOut(
                {
                    "conversationId": conversation.id,
                    "messages": context.messages,
                    "nextAfterMessageId": end.id if context.has_more else None,
                    "nextCursor": cursor if context.has_more else None,
                    "resumeCursor": cursor,
                    "memories": _context_memories(request, conversation, memory_count),
                }
            ).data
        )


def _context_after(conversation, params, *, of_list: str) -> Message | None:
    """Where a page of context goes on: ``after`` (a page's ``nextCursor``: the place of its
    last message, read as a message that needs no row) or ``afterMessageId`` (the message
    itself, which must still be there: once its author erased it, an agent that resumed by
    it was refused, and could only read everything again). ``of_list``: the conversation's
    context as the caller reads it (``list_digest``): a cursor of another conversation was
    read as a place in this one (review)."""
    cursor, after_id = params.get("after"), params.get("afterMessageId")
    if cursor and after_id:
        raise InvalidInput.for_field("after", "give after or afterMessageId, not both")
    if after_id:
        return _in_view(conversation, after_id, "afterMessageId")
    if not cursor:
        return None
    seq, message_id, channel = decode_cursor(cursor, types=(int, str, str), of_list=of_list)
    if as_uuid(message_id) is None or channel not in Channel.values:
        raise InvalidInput.for_field("after", "malformed cursor")
    return Message(id=as_uuid(message_id), seq=seq, channel=channel)


class SummariesView(AgentApiView):
    @agent_operation(
        "agentCreateSummary",
        parameters=IDEMPOTENCY_PARAMETERS,
        request=s.SummaryIn,
        responses={201: MessageOut, **errors(400, 401, 403, 404, 409)},
    )
    def post(self, request, conversation_id):
        conversation = selectors.access_conversation(
            request.principal, conversation_id, need=AccessLevel.WRITER, summary=False
        )
        data = s.SummaryIn.parse(request.data)
        until_message = _in_view(conversation, data["untilMessageId"], "untilMessageId")
        title = data.get("title")  # (blank: "   " too, which wiped the title: review)
        message, created = created_once(
            request,
            lambda: services.summary_create(
                request.principal,
                conversation=conversation,
                title=None if title is None or shows_nothing(title) else title,
                summary=data["summary"],
                until_message=until_message,
                summarized_at=data["summarizedAt"],
            ),
            Message.objects.without_search_data(),
            kind="summary",
            request_parts=(str(conversation.id), request.data, request.principal.on_behalf_of),
        )
        return marked_replayed(Response(MessageOut(message).data, status=201), created)


class SearchView(AgentApiView):
    required_scope = Scope.READ  # a POST, but searching changes nothing

    @agent_operation(
        "agentSearchMessages",
        request=SearchMessagesIn,
        responses={200: SearchResultsOut, **errors(400, 401, 403)},
    )
    def post(self, request):
        hits = search_messages(
            request.principal, for_agent=True, **SearchMessagesIn.search_arguments(request.data)
        )
        return Response(SearchResultsOut({"data": hits}).data)


# --- memory blocks ---------------------------------------------------------------------------

BlockList = listed(s.MemoryBlockOut, "MemoryBlockList")
RevisionPage = paged(s.MemoryBlockRevisionOut, "MemoryBlockRevisionPage")


def _block_owner(request) -> str:
    return agent_selectors.memory_subject(
        request.principal, user_id=request.query_params.get("userId")
    )


class MemoryBlocksView(AgentApiView):
    @agent_operation(
        "agentListMemoryBlocks",
        parameters=[USER_ID],
        responses={200: BlockList, **errors(401, 403)},
    )
    def get(self, request):
        blocks = agent_selectors.memory_blocks(request.agent, user_id=_block_owner(request))
        return Response({"data": s.MemoryBlockOut(blocks, many=True).data})

    @agent_operation(
        "agentCreateMemoryBlock",
        parameters=[USER_ID],
        request=s.CreateMemoryBlockIn,
        responses={201: s.MemoryBlockOut, **errors(400, 401, 403, 409)},
    )
    def post(self, request):
        user_id = _block_owner(request)
        data = s.CreateMemoryBlockIn.parse(request.data)
        block = agent_services.memory_block_create(
            request.principal,
            agent=request.agent,
            user_id=user_id,
            label=data["label"],
            value=data["value"],
            description=data["description"],
            limit=data["limit"],
            read_only=data["readOnly"],
        )
        return Response(s.MemoryBlockOut(block).data, status=201)


def _requested_block(request, label):
    return agent_selectors.memory_block(request.agent, user_id=_block_owner(request), label=label)


class MemoryBlockView(AgentApiView):
    writes_read = ("PUT", "PATCH")  # the whole block: an append answers with what it held

    @agent_operation(
        "agentGetMemoryBlock",
        parameters=[USER_ID],
        responses={200: s.MemoryBlockOut, **errors(401, 403, 404)},
    )
    def get(self, request, label):
        return Response(s.MemoryBlockOut(_requested_block(request, label)).data)

    @agent_operation(
        "agentReplaceMemoryBlock",
        parameters=[USER_ID],
        request=s.PutMemoryBlockIn,
        responses={200: s.MemoryBlockOut, **errors(400, 401, 403, 404, 409)},
    )
    def put(self, request, label):
        block = _requested_block(request, label)
        data = s.PutMemoryBlockIn.parse(request.data)
        block = agent_services.memory_block_update(
            request.principal,
            block=block,
            value=data["value"],
            description=data.get("description"),
            limit=data.get("limit"),
        )
        return Response(s.MemoryBlockOut(block).data)

    @agent_operation(
        "agentUpdateMemoryBlock",
        parameters=[USER_ID],
        request=s.PatchMemoryBlockIn,
        responses={200: s.MemoryBlockOut, **errors(400, 401, 403, 404, 409)},
    )
    def patch(self, request, label):
        block = _requested_block(request, label)
        data = s.PatchMemoryBlockIn.parse(request.data)
        replace = data.get("replace")
        block = agent_services.memory_block_update(
            request.principal,
            block=block,
            value=data.get("value"),
            append=data.get("append"),
            replace=(replace["old"], replace["new"]) if replace else None,
            description=data.get("description"),
            limit=data.get("limit"),
        )
        return Response(s.MemoryBlockOut(block).data)

    @agent_operation(
        "agentDeleteMemoryBlock",
        parameters=[USER_ID],
        responses={204: None, **errors(400, 401, 403, 404)},
    )
    def delete(self, request, label):
        chosen_by_query(request, "userId")
        agent_services.memory_block_delete(
            request.principal, block=_requested_block(request, label)
        )
        return Response(status=204)


class MemoryBlockRevisionsView(AgentApiView):
    @agent_operation(
        "agentListMemoryBlockRevisions",
        parameters=[USER_ID, LIMIT_PARAMETER, AFTER_PARAMETER],
        responses={200: RevisionPage, **errors(400, 401, 403, 404)},
    )
    def get(self, request, label):
        page = agent_selectors.memory_block_revision_page(
            _requested_block(request, label), **page_params(request)
        )
        return Response(page_data(page, s.MemoryBlockRevisionOut))
