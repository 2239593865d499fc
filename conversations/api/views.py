"""The user API (``/v1/user``): thin views that parse, check access, call one service or
selector, and serialize."""

from drf_spectacular.utils import OpenApiParameter
from rest_framework.response import Response

from conversations import selectors, services
from conversations.api import serializers as s
from conversations.models import (
    AccessLevel,
    Conversation,
    Membership,
    Message,
    OwnershipTransfer,
    TransferStatus,
)
from memsvc.api.fields import no_body_fields, query_choice
from memsvc.api.idempotency import IDEMPOTENCY_PARAMETERS, created_once, marked_replayed
from memsvc.api.pagination import AFTER_PARAMETER, LIMIT_PARAMETER, page_data, page_params
from memsvc.api.principals import agent_principal_id, principal_for_sharing
from memsvc.api.schema import errors, listed, paged
from memsvc.api.views import UserApiView, user_operation
from search.selectors import search_messages

MessagePage = paged(s.MessageOut, "MessagePage")
ForkList = listed(s.ForkOut, "ConversationForkList")
MembershipList = listed(s.MembershipOut, "ConversationMembershipList")
TransferPage = paged(s.TransferOut, "OwnershipTransferPage")


class ConversationsView(UserApiView):
    @user_operation(
        "listConversations",
        description=s.CONVERSATION_LIST_DESCRIPTION,
        parameters=s.CONVERSATION_LIST_PARAMETERS,
        responses={200: s.ConversationPage, **errors(400, 401)},
    )
    def get(self, request):
        page = selectors.conversation_page(
            request.principal, query=request.query_params.get("query"), **page_params(request)
        )
        return Response(page_data(page, s.ConversationSummaryOut))

    @user_operation(
        "createConversation",
        parameters=IDEMPOTENCY_PARAMETERS,
        request=s.CreateConversationIn,
        responses={201: s.ConversationOut, **errors(400, 401, 409)},
    )
    def post(self, request):
        data = s.CreateConversationIn.parse(request.data)
        agent_id = data.get("agentId")
        writers = [agent_principal_id(agent_id, field="agentId")] if agent_id else []
        conversation, created = created_once(
            request,
            lambda: services.conversation_create(
                request.principal,
                title=data.get("title", ""),
                metadata=data.get("metadata"),
                writer_ids=writers,
            ),
            Conversation.objects,
            kind="conversation",
            request_parts=(request.data,),
        )
        conversation = selectors.access_conversation(request.principal, conversation.id)
        return marked_replayed(Response(s.ConversationOut(conversation).data, status=201), created)


class ConversationView(UserApiView):
    @user_operation("getConversation", responses={200: s.ConversationOut, **errors(401, 404)})
    def get(self, request, conversation_id):
        conversation = selectors.access_conversation(request.principal, conversation_id)
        return Response(s.ConversationOut(conversation).data)

    @user_operation(
        "updateConversation",
        request=s.UpdateConversationIn,
        responses={200: s.ConversationOut, **errors(400, 401, 403, 404)},
    )
    def patch(self, request, conversation_id):
        conversation = selectors.access_conversation(
            request.principal, conversation_id, need=AccessLevel.WRITER
        )
        data = s.UpdateConversationIn.parse(request.data)
        services.conversation_update(
            request.principal,
            conversation=conversation,
            title=data.get("title"),
            metadata=data.get("metadata"),
        )
        conversation = selectors.access_conversation(request.principal, conversation_id)
        return Response(s.ConversationOut(conversation).data)

    @user_operation(
        "deleteConversation",
        description="The conversation (its owner only), with the forks that share its "
        "messages (made at its own messages, and what was made from them at theirs); a "
        "fork that holds none of them (made at an earlier message of its parent) stays, "
        "moved up to where its fork point is. The first conversation of a group takes the "
        "whole group.",
        responses={204: None, **errors(401, 403, 404)},
    )
    def delete(self, request, conversation_id):
        conversation = selectors.access_conversation(
            request.principal, conversation_id, need=AccessLevel.OWNER
        )
        services.conversation_delete(request.principal, conversation=conversation)
        return Response(status=204)


class MessagesView(UserApiView):
    @user_operation(
        "listMessages",
        parameters=[LIMIT_PARAMETER, AFTER_PARAMETER],
        responses={200: MessagePage, **errors(400, 401, 404)},
    )
    def get(self, request, conversation_id):
        conversation = selectors.access_conversation(
            request.principal, conversation_id, summary=False
        )
        page = selectors.message_page(request.principal, conversation, **page_params(request))
        selectors.show_parents(page.rows)
        return Response(page_data(page, s.MessageOut))

    @user_operation(
        "appendMessage",
        parameters=IDEMPOTENCY_PARAMETERS,
        request=s.CreateUserMessageIn,
        responses={201: s.MessageOut, **errors(400, 401, 403, 404, 409)},
    )
    def post(self, request, conversation_id):
        conversation = selectors.access_conversation(
            request.principal, conversation_id, need=AccessLevel.WRITER, summary=False
        )
        data = s.CreateUserMessageIn.parse(request.data)
        message, created = created_once(
            request,
            lambda: services.message_append(request.principal, conversation=conversation, **data),
            Message.objects.without_search_data(),
            kind="message",
            request_parts=(str(conversation.id), request.data),
        )
        selectors.show_parents([message])
        return marked_replayed(Response(s.MessageOut(message).data, status=201), created)


class ForkView(UserApiView):
    @user_operation(
        "forkConversation",
        parameters=IDEMPOTENCY_PARAMETERS,
        request=s.ForkIn,
        responses={201: s.ConversationOut, **errors(400, 401, 403, 404, 409)},
    )
    def post(self, request, conversation_id, message_id):
        conversation = selectors.access_conversation(
            request.principal, conversation_id, need=AccessLevel.WRITER
        )
        message = selectors.message_in_view(conversation, message_id, for_agent=False)
        data = s.ForkIn.parse(request.data)
        fork, created = created_once(
            request,
            lambda: services.conversation_fork(
                request.principal,
                conversation=conversation,
                message=message,
                title=data.get("title"),
                new_message=data.get("newMessage"),
            ),
            Conversation.objects,
            kind="conversation",
            request_parts=(str(conversation.id), str(message.id), request.data),
        )
        fork = selectors.access_conversation(request.principal, fork.id)
        return marked_replayed(Response(s.ConversationOut(fork).data, status=201), created)


class ForksView(UserApiView):
    @user_operation("listForks", responses={200: ForkList, **errors(401, 404)})
    def get(self, request, conversation_id):
        conversation = selectors.access_conversation(request.principal, conversation_id)
        forks = selectors.conversation_forks(conversation)
        selectors.show_fork_points(forks)
        data = s.ForkOut(forks, many=True, context={"current_id": conversation.id}).data
        return Response({"data": data})


class MembershipsView(UserApiView):
    @user_operation("listMemberships", responses={200: MembershipList, **errors(401, 404)})
    def get(self, request, conversation_id):
        conversation = selectors.access_conversation(request.principal, conversation_id)
        memberships = selectors.group_memberships(conversation)
        context = {"conversation_id": conversation.id}
        return Response({"data": s.MembershipOut(memberships, many=True, context=context).data})

    @user_operation(
        "shareConversation",
        parameters=IDEMPOTENCY_PARAMETERS,
        request=s.ShareIn,
        responses={201: s.MembershipOut, **errors(400, 401, 403, 404, 409)},
    )
    def post(self, request, conversation_id):
        conversation = selectors.access_conversation(
            request.principal, conversation_id, need=AccessLevel.MANAGER
        )
        data = s.ShareIn.parse(request.data)
        principal_id = principal_for_sharing(data["userId"], field="userId")
        # (With a key, a retry whose answer was lost gets the membership, not "already a
        # member": review.)
        membership, created = created_once(
            request,
            lambda: services.membership_create(
                request.principal,
                conversation=conversation,
                principal_id=principal_id,
                access_level=data["accessLevel"],
            ),
            Membership.objects,
            kind="membership",
            request_parts=(str(conversation.id), request.data),
        )
        context = {"conversation_id": conversation.id}
        response = Response(s.MembershipOut(membership, context=context).data, status=201)
        return marked_replayed(response, created)


class MembershipView(UserApiView):
    @user_operation(
        "updateMembership",
        request=s.UpdateMembershipIn,
        responses={200: s.MembershipOut, **errors(400, 401, 403, 404)},
    )
    def patch(self, request, conversation_id, user_id):
        conversation = selectors.access_conversation(
            request.principal, conversation_id, need=AccessLevel.MANAGER
        )
        membership = selectors.membership_of(conversation, user_id)
        data = s.UpdateMembershipIn.parse(request.data)
        membership = services.membership_update(
            request.principal, membership=membership, access_level=data["accessLevel"]
        )
        context = {"conversation_id": conversation.id}
        return Response(s.MembershipOut(membership, context=context).data)

    @user_operation("revokeMembership", responses={204: None, **errors(401, 403, 404)})
    def delete(self, request, conversation_id, user_id):
        conversation = selectors.access_conversation(
            request.principal,
            conversation_id,
            need=services.removal_needs(request.principal, user_id),
        )
        membership = selectors.membership_of(conversation, user_id)
        services.membership_delete(request.principal, membership=membership)
        return Response(status=204)


class TransferOwnershipView(UserApiView):
    @user_operation(
        "transferOwnership",
        parameters=IDEMPOTENCY_PARAMETERS,
        request=s.TransferIn,
        responses={202: s.TransferOut, **errors(400, 401, 403, 404, 409)},
    )
    def post(self, request, conversation_id):
        conversation = selectors.access_conversation(
            request.principal, conversation_id, need=AccessLevel.OWNER
        )
        data = s.TransferIn.parse(request.data)
        # (A retry whose answer was lost was "already has a pending ownership transfer".)
        transfer, created = created_once(
            request,
            lambda: services.ownership_transfer_start(
                request.principal, conversation=conversation, to_principal=data["newOwnerUserId"]
            ),
            OwnershipTransfer.objects,
            kind="ownership transfer",
            request_parts=(str(conversation.id), request.data),
        )
        return marked_replayed(Response(s.TransferOut(transfer).data, status=202), created)


class SearchView(UserApiView):
    @user_operation(
        "searchMessages",
        request=s.SearchMessagesIn,
        responses={200: s.SearchResultsOut, **errors(400, 401)},
    )
    def post(self, request):
        hits = search_messages(
            request.principal, **s.SearchMessagesIn.search_arguments(request.data)
        )
        selectors.show_parents([hit.message for hit in hits])
        return Response(s.SearchResultsOut({"data": hits}).data)


class TransfersView(UserApiView):
    @user_operation(
        "listOwnershipTransfers",
        parameters=[
            LIMIT_PARAMETER,
            AFTER_PARAMETER,
            OpenApiParameter(
                "status", str, enum=TransferStatus.values, description="default: pending"
            ),
        ],
        responses={200: TransferPage, **errors(400, 401)},
    )
    def get(self, request):
        status = query_choice(request, "status", TransferStatus.values)
        page = selectors.transfer_page(request.principal, status=status, **page_params(request))
        return Response(page_data(page, s.TransferOut))


class TransferView(UserApiView):
    @user_operation("cancelOwnershipTransfer", responses={204: None, **errors(401, 403, 404, 409)})
    def delete(self, request, transfer_id):
        transfer = selectors.access_transfer(request.principal, transfer_id)
        services.ownership_transfer_cancel(request.principal, transfer=transfer)
        return Response(status=204)


class AcceptTransferView(UserApiView):
    @user_operation(
        "acceptOwnershipTransfer",
        request=None,
        responses={200: s.TransferOut, **errors(401, 403, 404, 409)},
    )
    def post(self, request, transfer_id):
        no_body_fields(request)
        transfer = selectors.access_transfer(request.principal, transfer_id)
        transfer = services.ownership_transfer_accept(request.principal, transfer=transfer)
        return Response(s.TransferOut(transfer).data)


class DeclineTransferView(UserApiView):
    @user_operation(
        "declineOwnershipTransfer",
        request=None,
        responses={200: s.TransferOut, **errors(401, 403, 404, 409)},
    )
    def post(self, request, transfer_id):
        no_body_fields(request)
        transfer = selectors.access_transfer(request.principal, transfer_id)
        transfer = services.ownership_transfer_decline(request.principal, transfer=transfer)
        return Response(s.TransferOut(transfer).data)
