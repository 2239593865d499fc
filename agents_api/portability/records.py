"""The records of an export document, one serializer per kind of row: they write the
records (camelCase, like the API), read them back for an import (``validated_data`` keyed by
model field), and describe them in the OpenAPI document.

What search computes again (vectors, full-text vectors) is left out: an import embeds anew.
An agent's memory (memories, blocks, tool records), which an agent imports through its API,
is held to the API's own field rules (``agents_api.api.serializers``).
"""

from django.conf import settings
from rest_framework import serializers

from agents_api.api.serializers import (
    TOOL_JSON_MAX_BYTES,
    BlockDescriptionField,
    BlockLimitField,
    ImportanceField,
    LabelField,
    MessageIdsField,
    StepField,
    TagsField,
    TaskIdField,
)
from agents_api.letta_api.serializers import letta_settings_checked
from agents_api.models import (
    AGENT_DESCRIPTION_MAX_CHARS,
    AGENT_NAME_MAX_CHARS,
    NAME_RULES,
    MemorySource,
    SummarySource,
)
from conversations.models import AccessLevel, Channel, Role, TransferStatus, Visibility
from memsvc.api.fields import (
    ChoiceField,
    InputSerializer,
    JSONObjectField,
    JSONValueField,
    MessageContentField,
    MetadataField,
    MomentField,
    TextField,
    TitleField,
)
from memsvc.api.principals import (
    AGENT_PRINCIPAL_PREFIX,
    PRINCIPAL_MAX_LENGTH,
    SERVICE_OWNERS,
    agent_uuid_of,
    stored_principal_id,
    user_id_problem,
)
from memsvc.validators import as_uuid

# The largest number a record may give a message's place or a block's id, which an import
# keeps, moving its sequence past it (``restore._keep_numbers``): far below 2**63 - 1,
# so that no document can use a sequence up (what it leaves is 1,023 times what it could
# take), and exact wherever JSON is read (a JavaScript number holds integers up to 2**53).
NUMBER_MAX = 2**53


class SubjectField(serializers.CharField):
    """Whom an agent's memory is about: a user id, or null for the agent's own ("" stored).
    ``local`` and ``memsvc`` too, which no API takes since they became memsvc's own (the
    owners of its agents): what was kept about users so named before is the agent's, and its
    export was refused by its own import (review). Being a memory's subject gives no access."""

    def __init__(self, **kwargs):
        super().__init__(
            allow_null=True, allow_blank=True, max_length=PRINCIPAL_MAX_LENGTH, **kwargs
        )

    def run_validation(self, data=serializers.empty):
        value = super().run_validation(data)
        problem = user_id_problem(value) if value and value not in SERVICE_OWNERS else None
        if problem:
            raise serializers.ValidationError(problem)
        return value or ""

    def to_representation(self, value):
        return value or None


class PrincipalField(serializers.CharField):
    """Who did something: a user id (``user_id_problem``, as every API takes one) or, where
    an agent may stand (``agents``), ``agent:<id>`` (stored in its canonical form). A
    document's "eve\u200b", "\u202eecila" or a user named ``agent:...`` was imported as it
    was given (review)."""

    def __init__(self, *, agents: bool = True, **kwargs):
        self.agents = agents
        # (min_length: the schema says that a blank one is refused; review)
        super().__init__(min_length=1, max_length=PRINCIPAL_MAX_LENGTH, **kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if self.agents and value.startswith(AGENT_PRINCIPAL_PREFIX):
            if agent_uuid_of(value) is None:
                raise serializers.ValidationError("must be agent:<the agent's id>")
            return stored_principal_id(value)
        if self.agents and value in SERVICE_OWNERS:  # (memsvc's own agents' owner: no user)
            return value
        problem = user_id_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


class Record(InputSerializer):
    # Read back as a request body is (``InputSerializer``): of the JSON types the export's
    # schema says (a limit "5000" was taken as 5000; review), and no field it does not know
    # (one was stored without it, where the API refuses it: review). A record keeps its text
    # as it is (no trimming): what comes back is what went out. (A comment: drf-spectacular
    # would copy a docstring into every record's schema.)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            if isinstance(field, serializers.CharField):
                field.trim_whitespace = False


class ConversationRecord(Record):
    id = serializers.UUIDField()
    conversationGroupId = serializers.UUIDField(source="group_id")
    title = TitleField(restored=True)
    metadata = MetadataField()
    forkedAtConversationId = serializers.UUIDField(
        source="forked_at_conversation_id", allow_null=True
    )
    forkedAtMessageId = serializers.UUIDField(source="forked_at_message_id", allow_null=True)
    createdAt = MomentField(source="created_at")
    updatedAt = MomentField(source="updated_at")
    seenAt = MomentField(
        source="seen_at",
        required=False,
        help_text="Its latest change that its users see (absent: updatedAt).",
    )

    class Meta:
        ref_name = "ExportedConversation"


class MembershipRecord(Record):
    conversationGroupId = serializers.UUIDField(source="group_id")
    userId = PrincipalField(source="principal_id")
    accessLevel = ChoiceField(source="access_level", choices=AccessLevel.choices)
    createdAt = MomentField(source="created_at")

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
    seq = serializers.IntegerField(
        min_value=1,
        max_value=NUMBER_MAX,
        help_text="The message's place in the order of all messages.",
    )
    role = ChoiceField(choices=Role.choices)
    channel = ChoiceField(choices=Channel.choices)
    visibility = ChoiceField(choices=Visibility.choices)
    authorPrincipal = PrincipalField(source="author_principal")
    authorName = serializers.CharField(
        source="author_name", allow_blank=True, max_length=PRINCIPAL_MAX_LENGTH
    )
    content = MessageContentField()
    metadata = MetadataField()
    parentMessageId = serializers.UUIDField(source="parent_message_id", allow_null=True)
    createdAt = MomentField(source="created_at")
    writtenFor = SubjectField(
        source="written_for",
        required=False,
        help_text="The user whose turn an agent recorded (null: none; absent: decided on "
        "import by the conversation's members).",
    )

    class Meta:
        ref_name = "ExportedMessage"

    def validate(self, data):
        # What an agent's context reads of a summary (``conversations.selectors``): the id
        # of the message it covers up to, or null when every message it covered is gone.
        if data["channel"] == Channel.SUMMARY:
            metadata = data["metadata"]
            until = metadata.get("untilMessageId") if isinstance(metadata, dict) else None
            if not isinstance(metadata, dict) or (until is not None and as_uuid(until) is None):
                raise serializers.ValidationError(
                    {"metadata": ["a summary's untilMessageId: a message id, or null"]}
                )
        return data


class TransferRecord(Record):
    id = serializers.UUIDField()
    conversationGroupId = serializers.UUIDField(source="group_id")
    conversationId = serializers.UUIDField(source="conversation_id")
    fromUserId = PrincipalField(source="from_principal", agents=False)
    toUserId = PrincipalField(source="to_principal", agents=False)
    status = ChoiceField(choices=TransferStatus.choices)
    createdAt = MomentField(source="created_at")
    resolvedAt = MomentField(source="resolved_at", allow_null=True)

    class Meta:
        ref_name = "ExportedOwnershipTransfer"


class MemoryRecord(Record):
    id = serializers.UUIDField()
    agentId = serializers.UUIDField(source="agent_id")
    userId = SubjectField(source="user_id", help_text="null: the agent's own memory")
    content = MessageContentField()
    summary = TextField(allow_blank=True, max_length=10_000)
    importance = ImportanceField()
    tags = TagsField(rules=TagsField.AS_STORED)
    metadata = MetadataField()
    # Absent from exports made before memories cited messages.
    messageIds = MessageIdsField(source="message_ids", required=False, default=list)
    source = ChoiceField(choices=MemorySource.choices)
    accessCount = serializers.IntegerField(source="access_count", min_value=0, max_value=2**31 - 1)
    lastAccessedAt = MomentField(source="last_accessed_at", allow_null=True)
    expiresAt = MomentField(source="expires_at")
    createdAt = MomentField(source="created_at")
    updatedAt = MomentField(source="updated_at")

    class Meta:
        ref_name = "ExportedMemory"


class MemorySettingRecord(Record):
    """Whether the user lets agents remember them (``UserMemorySetting``; no record: on)."""

    memoryEnabled = serializers.BooleanField(source="memory_enabled")
    updatedAt = MomentField(source="updated_at")

    class Meta:
        ref_name = "ExportedMemorySetting"


class MemoryBlockRevisionRecord(Record):
    value = TextField(allow_blank=True)
    actor = PrincipalField(source="actor_principal")
    createdAt = MomentField(source="created_at")

    class Meta:
        ref_name = "ExportedMemoryBlockRevision"


class MemoryBlockRecord(Record):
    id = serializers.IntegerField(
        min_value=1, max_value=NUMBER_MAX, help_text="Letta's routes show it (block-<id>)."
    )
    # (Made again with a new one, the local API's id of a block changed: review.)
    publicId = serializers.UUIDField(
        source="public_id", required=False, help_text="The local API shows it (its id)."
    )
    agentId = serializers.UUIDField(source="agent_id")
    userId = SubjectField(source="user_id", help_text="null: the agent's own block")
    label = LabelField(restored=True)
    value = TextField(allow_blank=True)
    description = BlockDescriptionField()
    limit = BlockLimitField()
    readOnly = serializers.BooleanField(source="read_only")
    createdAt = MomentField(source="created_at")
    updatedAt = MomentField(source="updated_at")
    revisions = MemoryBlockRevisionRecord(
        many=True, source="exported_revisions", help_text="Every change, oldest first."
    )

    class Meta:
        ref_name = "ExportedMemoryBlock"

    def validate(self, data):
        if len(data["value"]) > data["limit"]:
            raise serializers.ValidationError(
                {"value": [f"longer than its limit ({data['limit']})"]}
            )
        return data


class AgentMetadataRecordField(JSONObjectField):
    """An agent's metadata: an object without NUL, its Letta settings (``"letta"``) as the
    Letta API keeps them (``LettaSettingsIn``). As large as a request may make it (a Letta
    agent's ``system`` prompt is kept there)."""

    def __init__(self, **kwargs):
        super().__init__(max_bytes=settings.MEMSVC_MAX_BODY_BYTES, **kwargs)

    def to_internal_value(self, data):
        # What the check made of them is what is kept: a kept {"tags": null} made every
        # Letta list a 500.
        return letta_settings_checked(super().to_internal_value(data))


class AgentRecord(Record):
    id = serializers.UUIDField()
    name = TextField(max_length=AGENT_NAME_MAX_CHARS, validators=[*NAME_RULES])
    description = serializers.CharField(allow_blank=True, max_length=AGENT_DESCRIPTION_MAX_CHARS)
    metadata = AgentMetadataRecordField()
    ownerPrincipal = PrincipalField(source="owner_principal")
    createdAt = MomentField(source="created_at")
    # (An agent the local API made for a keyless loopback caller, made again by an import,
    # was reached with a key only: its caller was refused; review.)
    loopbackTrusted = serializers.BooleanField(
        source="loopback_trusted",
        required=False,
        default=False,
        help_text="Reached without a key from loopback in local mode (an agent the local "
        "API made for a keyless caller, before it got a key).",
    )

    class Meta:
        ref_name = "ExportedAgent"


class ToolRecordRecord(Record):
    id = serializers.UUIDField(help_text="The trace id.")
    agentId = serializers.UUIDField(source="agent_id")
    userId = SubjectField(
        source="user_id",
        required=False,
        default="",
        help_text="The user the agent acted for when it made it; null: the agent's own.",
    )
    conversationId = serializers.UUIDField(source="conversation_id", allow_null=True)
    taskId = TaskIdField(source="task_id", allow_blank=True)
    step = StepField()
    toolName = TextField(source="tool_name", max_length=200)
    input = JSONObjectField(source="raw_input", max_bytes=TOOL_JSON_MAX_BYTES)
    output = JSONValueField(source="raw_output", max_bytes=TOOL_JSON_MAX_BYTES)
    summary = TextField(max_length=10_000)
    summarySource = ChoiceField(source="summary_source", choices=SummarySource.choices)
    createdAt = MomentField(source="created_at")

    class Meta:
        ref_name = "ExportedToolRecord"
