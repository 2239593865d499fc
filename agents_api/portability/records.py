"""The records of an export document, one serializer per kind of row: they write the
records (camelCase, like the API), read them back for an import (``validated_data`` keyed by
model field), and describe them in the OpenAPI document.

What search computes again (vectors, full-text vectors) is left out: an import embeds anew.
"""

from rest_framework import serializers

from agents_api.models import (
    MEMORY_MAX_MESSAGES,
    MEMORY_MAX_TAGS,
    MEMORY_TAG_MAX_LENGTH,
    MemorySource,
    SummarySource,
)
from conversations.models import AccessLevel, Channel, Role, TransferStatus, Visibility
from memsvc.api.principals import PRINCIPAL_MAX_LENGTH


class SubjectField(serializers.CharField):
    """Whom an agent's memory is about: a user id, or null for the agent's own ("" stored)."""

    def __init__(self, **kwargs):
        super().__init__(
            allow_null=True, allow_blank=True, max_length=PRINCIPAL_MAX_LENGTH, **kwargs
        )

    def run_validation(self, data=serializers.empty):
        value = super().run_validation(data)
        return value or ""

    def to_representation(self, value):
        return value or None


class Record(serializers.Serializer):
    # A record keeps its text as it is (no trimming): what comes back is what went out.
    # (A comment: drf-spectacular would copy a docstring into every record's schema.)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            if isinstance(field, serializers.CharField):
                field.trim_whitespace = False


class ConversationRecord(Record):
    id = serializers.UUIDField()
    conversationGroupId = serializers.UUIDField(source="group_id")
    title = serializers.CharField(allow_blank=True)
    metadata = serializers.JSONField()
    forkedAtConversationId = serializers.UUIDField(
        source="forked_at_conversation_id", allow_null=True
    )
    forkedAtMessageId = serializers.UUIDField(source="forked_at_message_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")

    class Meta:
        ref_name = "ExportedConversation"


class MembershipRecord(Record):
    conversationGroupId = serializers.UUIDField(source="group_id")
    userId = serializers.CharField(source="principal_id", max_length=PRINCIPAL_MAX_LENGTH)
    accessLevel = serializers.ChoiceField(source="access_level", choices=AccessLevel.choices)
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        ref_name = "ExportedMembership"


class MembershipElsewhereRecord(MembershipRecord):
    conversationId = serializers.UUIDField(
        source="conversation_id",
        read_only=True,
        help_text="The group's first conversation (the one that was shared).",
    )

    class Meta:
        ref_name = "ExportedMembershipElsewhere"


class MessageRecord(Record):
    id = serializers.UUIDField()
    conversationId = serializers.UUIDField(source="conversation_id")
    seq = serializers.IntegerField(help_text="The message's place in the order of all messages.")
    role = serializers.ChoiceField(choices=Role.choices)
    channel = serializers.ChoiceField(choices=Channel.choices)
    visibility = serializers.ChoiceField(choices=Visibility.choices)
    authorPrincipal = serializers.CharField(
        source="author_principal", max_length=PRINCIPAL_MAX_LENGTH
    )
    authorName = serializers.CharField(
        source="author_name", allow_blank=True, max_length=PRINCIPAL_MAX_LENGTH
    )
    content = serializers.CharField()
    metadata = serializers.JSONField()
    parentMessageId = serializers.UUIDField(source="parent_message_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        ref_name = "ExportedMessage"


class TransferRecord(Record):
    id = serializers.UUIDField()
    conversationGroupId = serializers.UUIDField(source="group_id")
    conversationId = serializers.UUIDField(source="conversation_id")
    fromUserId = serializers.CharField(source="from_principal", max_length=PRINCIPAL_MAX_LENGTH)
    toUserId = serializers.CharField(source="to_principal", max_length=PRINCIPAL_MAX_LENGTH)
    status = serializers.ChoiceField(choices=TransferStatus.choices)
    createdAt = serializers.DateTimeField(source="created_at")
    resolvedAt = serializers.DateTimeField(source="resolved_at", allow_null=True)

    class Meta:
        ref_name = "ExportedOwnershipTransfer"


class MemoryRecord(Record):
    id = serializers.UUIDField()
    agentId = serializers.UUIDField(source="agent_id")
    userId = SubjectField(source="user_id", help_text="null: the agent's own memory")
    content = serializers.CharField()
    summary = serializers.CharField(allow_blank=True)
    importance = serializers.FloatField(min_value=0, max_value=1)
    # (PostgreSQL does not hold an array's items to their declared length: this does.)
    tags = serializers.ListField(
        child=serializers.CharField(max_length=MEMORY_TAG_MAX_LENGTH, trim_whitespace=False),
        max_length=MEMORY_MAX_TAGS,
    )
    metadata = serializers.JSONField()
    # Absent from exports made before memories cited messages.
    messageIds = serializers.ListField(
        source="message_ids",
        child=serializers.UUIDField(),
        max_length=MEMORY_MAX_MESSAGES,
        required=False,
        default=list,
    )
    source = serializers.ChoiceField(choices=MemorySource.choices)
    accessCount = serializers.IntegerField(source="access_count", min_value=0)
    lastAccessedAt = serializers.DateTimeField(source="last_accessed_at", allow_null=True)
    expiresAt = serializers.DateTimeField(source="expires_at")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")

    class Meta:
        ref_name = "ExportedMemory"


class MemoryBlockRevisionRecord(Record):
    value = serializers.CharField(allow_blank=True)
    actor = serializers.CharField(source="actor_principal", max_length=PRINCIPAL_MAX_LENGTH)
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        ref_name = "ExportedMemoryBlockRevision"


class MemoryBlockRecord(Record):
    id = serializers.IntegerField(min_value=1, help_text="Letta's routes show it (block-<id>).")
    agentId = serializers.UUIDField(source="agent_id")
    userId = SubjectField(source="user_id", help_text="null: the agent's own block")
    label = serializers.CharField(max_length=100)
    value = serializers.CharField(allow_blank=True)
    description = serializers.CharField(allow_blank=True)
    limit = serializers.IntegerField(min_value=1)
    readOnly = serializers.BooleanField(source="read_only")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")
    revisions = MemoryBlockRevisionRecord(
        many=True, source="exported_revisions", help_text="Every change, oldest first."
    )

    class Meta:
        ref_name = "ExportedMemoryBlock"


class AgentRecord(Record):
    id = serializers.UUIDField()
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(allow_blank=True)
    metadata = serializers.JSONField()
    ownerPrincipal = serializers.CharField(
        source="owner_principal", max_length=PRINCIPAL_MAX_LENGTH
    )
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        ref_name = "ExportedAgent"


class ToolRecordRecord(Record):
    id = serializers.UUIDField(help_text="The trace id.")
    agentId = serializers.UUIDField(source="agent_id")
    conversationId = serializers.UUIDField(source="conversation_id", allow_null=True)
    taskId = serializers.CharField(source="task_id", allow_blank=True, max_length=255)
    step = serializers.IntegerField(min_value=0, allow_null=True)
    toolName = serializers.CharField(source="tool_name", max_length=200)
    input = serializers.JSONField(source="raw_input")
    output = serializers.JSONField(source="raw_output", allow_null=True)
    summary = serializers.CharField()
    summarySource = serializers.ChoiceField(source="summary_source", choices=SummarySource.choices)
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        ref_name = "ExportedToolRecord"
