"""The JSON of the user API (camelCase), in and out."""

from rest_framework import serializers

from conversations.models import PRINCIPAL_MAX_LENGTH, AccessLevel, TransferStatus
from memsvc.api.fields import (
    InputSerializer,
    MessageContentField,
    MetadataField,
    TextField,
    TitleField,
)


class PrincipalIdField(TextField):
    def __init__(self, **kwargs):
        kwargs.setdefault("max_length", PRINCIPAL_MAX_LENGTH)
        super().__init__(**kwargs)


# --- out -------------------------------------------------------------------------------------


class MessageOut(serializers.Serializer):
    id = serializers.UUIDField()
    conversationId = serializers.UUIDField(source="conversation_id")
    role = serializers.CharField()
    channel = serializers.CharField()
    visibility = serializers.CharField()
    authorName = serializers.CharField(source="author_name")
    content = serializers.CharField()
    metadata = serializers.DictField()
    parentMessageId = serializers.UUIDField(source="parent_message_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        ref_name = "Message"


class ConversationSummaryOut(serializers.Serializer):
    id = serializers.UUIDField()
    title = serializers.CharField()
    ownerUserId = serializers.CharField(source="owner_id")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")
    lastMessagePreview = serializers.CharField(source="last_message_preview", allow_null=True)
    accessLevel = serializers.ChoiceField(source="access_level", choices=AccessLevel.choices)

    class Meta:
        ref_name = "ConversationSummary"


class ConversationOut(ConversationSummaryOut):
    conversationGroupId = serializers.UUIDField(source="group_id")
    forkedAtConversationId = serializers.UUIDField(
        source="forked_at_conversation_id", allow_null=True
    )
    forkedAtMessageId = serializers.UUIDField(source="forked_at_message_id", allow_null=True)

    class Meta:
        ref_name = "Conversation"


class ForkOut(serializers.Serializer):
    conversationId = serializers.UUIDField(source="id")
    forkedAtConversationId = serializers.UUIDField(
        source="forked_at_conversation_id", allow_null=True
    )
    forkedAtMessageId = serializers.UUIDField(source="forked_at_message_id", allow_null=True)
    forkedFromMessageId = serializers.UUIDField(
        source="forked_at_message_id",
        allow_null=True,
        help_text="The same message: the last one the fork shares with its parent.",
    )
    title = serializers.CharField()
    createdAt = serializers.DateTimeField(source="created_at")
    isCurrentFork = serializers.SerializerMethodField()

    class Meta:
        ref_name = "ConversationForkSummary"

    def get_isCurrentFork(self, conversation) -> bool:
        return conversation.id == self.context["current_id"]


class MembershipOut(serializers.Serializer):
    conversationId = serializers.SerializerMethodField()
    userId = serializers.CharField(source="principal_id")
    accessLevel = serializers.ChoiceField(source="access_level", choices=AccessLevel.choices)
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        ref_name = "ConversationMembership"

    def get_conversationId(self, membership) -> str:
        return str(self.context["conversation_id"])


class TransferOut(serializers.Serializer):
    id = serializers.UUIDField()
    conversationId = serializers.UUIDField(source="conversation_id")
    fromUserId = serializers.CharField(source="from_principal")
    toUserId = serializers.CharField(source="to_principal")
    status = serializers.ChoiceField(choices=TransferStatus.choices)
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        ref_name = "OwnershipTransfer"


def paged(serializer_class, name: str):
    """The schema of a paged list: ``{"data": [...], "nextCursor": ...}``."""
    return type(
        name,
        (serializers.Serializer,),
        {
            "data": serializer_class(many=True),
            "nextCursor": serializers.CharField(allow_null=True),
            "Meta": type("Meta", (), {"ref_name": name}),
        },
    )


def listed(serializer_class, name: str):
    """The schema of an unpaged list: ``{"data": [...]}``."""
    return type(
        name,
        (serializers.Serializer,),
        {"data": serializer_class(many=True), "Meta": type("Meta", (), {"ref_name": name})},
    )


# --- in --------------------------------------------------------------------------------------


class CreateConversationIn(InputSerializer):
    title = TitleField(required=False)
    metadata = MetadataField(required=False)
    agentId = serializers.UUIDField(required=False, help_text="An agent to add as a writer.")

    class Meta:
        ref_name = "CreateConversationRequest"


class UpdateConversationIn(InputSerializer):
    title = TitleField(required=False)
    metadata = MetadataField(required=False)

    class Meta:
        ref_name = "UpdateConversationRequest"


class CreateUserMessageIn(InputSerializer):
    content = MessageContentField()
    metadata = MetadataField(required=False)

    class Meta:
        ref_name = "CreateUserMessageRequest"


class ForkIn(InputSerializer):
    title = TitleField(required=False)
    newMessage = CreateUserMessageIn(required=False)

    class Meta:
        ref_name = "ForkFromMessageRequest"


class ShareIn(InputSerializer):
    userId = PrincipalIdField()
    accessLevel = serializers.ChoiceField(choices=AccessLevel.choices)

    class Meta:
        ref_name = "ShareConversationRequest"


class UpdateMembershipIn(InputSerializer):
    accessLevel = serializers.ChoiceField(choices=AccessLevel.choices)

    class Meta:
        ref_name = "UpdateMembershipRequest"


class TransferIn(InputSerializer):
    newOwnerUserId = PrincipalIdField()

    class Meta:
        ref_name = "TransferOwnershipRequest"
