"""The JSON of the agent API (camelCase), in and out."""

import functools
from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from rest_framework import serializers

from agents_api.models import (
    BLOCK_DESCRIPTION_MAX_CHARS,
    DEFAULT_BLOCK_LIMIT,
    GIVEN_NAME_RULES,
    MEMORY_MAX_MESSAGES,
    MEMORY_MAX_TAGS,
    MEMORY_TAG_MAX_LENGTH,
    MemorySource,
    Scope,
)
from agents_api.selectors import MEMORY_ORDERS, PREFETCH_MAX_SENTENCES
from agents_api.services import NewMemory
from conversations.api.serializers import MessageOut
from conversations.models import Channel, Role, Visibility
from memsvc.api.fields import (
    ChoiceField,
    InputSerializer,
    JSONObjectField,
    JSONValueField,
    ListField,
    MessageContentField,
    MetadataField,
    MomentField,
    PathSegmentField,
    TextField,
    TitleField,
    UserIdField,
    something_to_read,
)
from memsvc.api.schema import listed, paged
from search.engine import MODES

MAX_BULK_MESSAGES = 100
CLOCK_SKEW = timedelta(seconds=60)


class MeOut(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    principalId = serializers.CharField(source="principal_id")
    scopes = serializers.ListField(child=ChoiceField(choices=Scope.choices))

    class Meta:
        ref_name = "Agent"


class CreateAgentConversationIn(InputSerializer):
    title = TitleField(required=False)
    metadata = MetadataField(required=False)

    class Meta:
        ref_name = "CreateAgentConversationRequest"


class CreateAgentMessageIn(InputSerializer):
    role = ChoiceField(choices=Role.choices)
    visibility = ChoiceField(choices=Visibility.choices, default=Visibility.USER)
    channel = ChoiceField(choices=[Channel.HISTORY, Channel.MEMORY], default=Channel.HISTORY)
    content = MessageContentField()
    metadata = MetadataField(required=False)
    parentMessageId = serializers.UUIDField(required=False, allow_null=True)
    # The speaker's name, shown and searched with the turn: a name's rules ("\u202eecila" or
    # "alice\nbob" were taken: review).
    authorName = TextField(
        required=False, max_length=255, allow_blank=False, validators=[*GIVEN_NAME_RULES]
    )
    createdAt = MomentField(required=False, help_text="Not in the future.")

    class Meta:
        ref_name = "CreateAgentMessageRequest"

    def validate_createdAt(self, value):
        return _not_future(value)


class BulkMessagesIn(InputSerializer):
    messages = CreateAgentMessageIn(many=True, allow_empty=False, max_length=MAX_BULK_MESSAGES)

    class Meta:
        ref_name = "AppendAgentMessagesRequest"


MessageList = listed(MessageOut, "MessageList")


class SummaryIn(InputSerializer):
    # (Required, a blank one wiped the title the user gave: review.)
    title = TitleField(
        required=False,
        allow_null=True,
        help_text="The conversation's title from now on; left out, null or blank, it stays as it is",
    )
    summary = MessageContentField()
    untilMessageId = serializers.UUIDField(
        help_text="The last message the summary covers: a message of the conversation's view, "
        "not another summary."
    )
    summarizedAt = MomentField(help_text="Not in the future.")

    class Meta:
        ref_name = "CreateSummaryRequest"

    def validate_summarizedAt(self, value):
        return _not_future(value)


class MemoryBlockOut(serializers.Serializer):
    label = serializers.CharField()
    value = serializers.CharField()
    description = serializers.CharField()
    limit = serializers.IntegerField()
    readOnly = serializers.BooleanField(source="read_only")
    userId = serializers.CharField(source="user_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")

    class Meta:
        ref_name = "MemoryBlock"

    def to_representation(self, instance):
        data = super().to_representation(instance)
        data["userId"] = data["userId"] or None
        return data


class MemoryBlockRevisionOut(serializers.Serializer):
    value = serializers.CharField()
    actor = serializers.CharField(source="actor_principal")
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        ref_name = "MemoryBlockRevision"


class LabelField(PathSegmentField):
    """A block's label as it is given (made or renamed), whichever API gives it: a name
    (``GIVEN_NAME_RULES``) and a segment of its routes. ``restored``: one a document brings back
    as it was stored, held to the rules of its routes only (one stored before the name
    rule was reached, and exported, and its import refused: review)."""

    def __init__(self, *, restored: bool = False, **kwargs):
        super().__init__(max_length=100, allow_blank=False, **kwargs)
        if not restored:
            self.validators += GIVEN_NAME_RULES


class BlockLimitField(serializers.IntegerField):
    def __init__(self, **kwargs):
        super().__init__(min_value=1, max_value=1_000_000, **kwargs)


class BlockDescriptionField(TextField):
    """A block's description, whichever API (or import) gives it."""

    def __init__(self, **kwargs):
        super().__init__(allow_blank=True, max_length=BLOCK_DESCRIPTION_MAX_CHARS, **kwargs)


# A block's text, as the service holds it (the limit is the block's own, or the new one given).
BLOCK_VALUE_RULE = "At most the block's limit, in characters."


class CreateMemoryBlockIn(InputSerializer):
    label = LabelField()
    value = TextField(required=False, allow_blank=True, default="", help_text=BLOCK_VALUE_RULE)
    description = BlockDescriptionField(required=False, default="")
    limit = BlockLimitField(required=False, default=DEFAULT_BLOCK_LIMIT)
    readOnly = serializers.BooleanField(required=False, default=False)

    class Meta:
        ref_name = "CreateMemoryBlockRequest"


class PutMemoryBlockIn(InputSerializer):
    value = TextField(allow_blank=True, help_text=BLOCK_VALUE_RULE)
    description = BlockDescriptionField(required=False)
    limit = BlockLimitField(required=False)

    class Meta:
        ref_name = "ReplaceMemoryBlockRequest"


class ReplaceTextIn(InputSerializer):
    old = TextField(allow_blank=False)
    new = TextField(allow_blank=True)

    class Meta:
        ref_name = "MemoryBlockReplace"


class PatchMemoryBlockIn(InputSerializer):
    value = TextField(required=False, allow_blank=True, help_text=BLOCK_VALUE_RULE)
    # (A line of blanks appended made a block of blanks: review.)
    append = TextField(required=False, allow_blank=False, validators=[something_to_read])
    replace = ReplaceTextIn(required=False)
    description = BlockDescriptionField(required=False)
    limit = BlockLimitField(required=False)

    class Meta:
        ref_name = "UpdateMemoryBlockRequest"

    # What validate() enforces, for the schema (memsvc.api.schema.state_enforced_constraints).
    schema_rules = {
        "description": "At most one of `value`, `append` and `replace`.",
        "not": {
            "anyOf": [
                {"required": ["value", "append"]},
                {"required": ["value", "replace"]},
                {"required": ["append", "replace"]},
            ]
        },
    }

    def validate(self, attrs):
        edits = [name for name in ("value", "append", "replace") if name in attrs]
        if len(edits) > 1:
            raise serializers.ValidationError(
                {edits[1]: [f"give one of value, append, replace (got {', '.join(edits)})"]}
            )
        return attrs


# --- long-term memories ----------------------------------------------------------------------

MAX_BATCH_MEMORIES = 100


class MemoryOut(serializers.Serializer):
    id = serializers.UUIDField()
    agentId = serializers.UUIDField(source="agent_id")
    userId = serializers.SerializerMethodField(help_text="null: the agent's own memory")
    content = serializers.CharField()
    summary = serializers.CharField()
    importance = serializers.FloatField()
    tags = serializers.ListField(child=serializers.CharField())
    metadata = serializers.DictField()
    messageIds = serializers.ListField(
        source="message_ids",
        child=serializers.UUIDField(),
        help_text=(
            "The messages it rests on: a search of messages also ranks them by it. A user is "
            "shown those of them they may read."
        ),
    )
    source = ChoiceField(choices=MemorySource.choices)  # (the spec said any string: review)
    accessCount = serializers.IntegerField(source="access_count")
    lastAccessedAt = serializers.DateTimeField(source="last_accessed_at", allow_null=True)
    expiresAt = serializers.DateTimeField(source="expires_at")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")

    class Meta:
        ref_name = "Memory"

    def get_userId(self, memory) -> str | None:
        return memory.user_id or None


class MemoryHitOut(MemoryOut):
    score = serializers.FloatField(help_text="The rank: relevance with importance and recency.")
    relevance = serializers.FloatField(
        help_text="How well it answers the query (0..1): cosine similarity or keyword coverage."
    )

    class Meta:
        ref_name = "MemorySearchResult"

    @functools.cached_property
    def _memory(self) -> MemoryOut:
        # One for every hit: a serializer copies its fields when it is made.
        return MemoryOut()

    def to_representation(self, hit):
        return {
            **self._memory.to_representation(hit.memory),
            "score": hit.score,
            "relevance": hit.relevance,
        }


MemoryList = listed(MemoryOut, "MemoryList")
MemoryPage = paged(MemoryOut, "MemoryPage")
MemoryHitList = listed(MemoryHitOut, "MemorySearchResults")


class MemorySettingOut(serializers.Serializer):
    memoryEnabled = serializers.BooleanField(
        source="memory_enabled",
        help_text="Whether agents may keep new memories and memory blocks about you.",
    )
    updatedAt = serializers.DateTimeField(
        source="updated_at", allow_null=True, help_text="null: never changed (on)."
    )

    class Meta:
        ref_name = "MemorySetting"


class MemorySettingIn(InputSerializer):
    memoryEnabled = serializers.BooleanField()

    class Meta:
        ref_name = "SetMemorySettingRequest"


class DeletedOut(serializers.Serializer):
    deleted = serializers.IntegerField()

    class Meta:
        ref_name = "DeletedCount"


class TagsField(ListField):
    """Tags, each held to ``rules``: by default, something to read (" " was kept as a tag,
    where a memory of it is refused; review) and a name as it is given now (" a " and "a"
    were two tags that look one: review). A search's filter looks tags up (``LOOKED_UP``):
    one stored before the name rules is found; a document brings them back as they were
    stored (``AS_STORED``)."""

    GIVEN = (something_to_read, *GIVEN_NAME_RULES)
    LOOKED_UP = (something_to_read,)
    AS_STORED = ()

    def __init__(self, *, rules=GIVEN, **kwargs):
        super().__init__(
            child=TextField(max_length=MEMORY_TAG_MAX_LENGTH, validators=list(rules)),
            max_length=MEMORY_MAX_TAGS,
            **kwargs,
        )


class MessageIdsField(ListField):
    def __init__(self, **kwargs):
        super().__init__(
            child=serializers.UUIDField(),
            max_length=MEMORY_MAX_MESSAGES,
            help_text="The messages it rests on (the agent must see them): a search of "
            "messages also ranks the turns the most relevant memories cite.",
            **kwargs,
        )


class ImportanceField(serializers.FloatField):
    def __init__(self, **kwargs):
        super().__init__(min_value=0.0, max_value=1.0, **kwargs)


def _not_future(value):
    """A time something happened (a message written, a summary made): not later than now,
    give or take the clocks' skew (``CLOCK_SKEW``)."""
    if value > timezone.now() + CLOCK_SKEW:
        raise serializers.ValidationError("must not be in the future")
    return value


def _future(value):
    if value is not None and value <= timezone.now():
        raise serializers.ValidationError("must be in the future")
    return value


class NewMemoryIn(InputSerializer):
    content = MessageContentField()
    summary = TextField(required=False, allow_blank=True, max_length=10_000)
    importance = ImportanceField(required=False)
    tags = TagsField(required=False)
    metadata = MetadataField(required=False)
    messageIds = MessageIdsField(required=False)
    expiresAt = MomentField(required=False, help_text="In the future; default: 15 days from now.")

    class Meta:
        ref_name = "NewMemory"

    def validate_expiresAt(self, value):
        return _future(value)

    @staticmethod
    def new_memory(data: dict) -> NewMemory:
        """A parsed memory (this serializer's validated data) as ``services.memory_save``
        takes it."""
        return NewMemory(
            content=data["content"],
            summary=data.get("summary", ""),
            importance=data.get("importance"),
            tags=data.get("tags", ()),
            metadata=data.get("metadata", {}),
            expires_at=data.get("expiresAt"),
            message_ids=data.get("messageIds", ()),
        )


class CreateMemoryIn(NewMemoryIn):
    userId = UserIdField(required=False, help_text="default: the agent's own memory")

    class Meta:
        ref_name = "CreateMemoryRequest"


class BatchMemoriesIn(InputSerializer):
    userId = UserIdField(required=False, help_text="default: the agent's own memories")
    memories = NewMemoryIn(many=True, allow_empty=False, max_length=MAX_BATCH_MEMORIES)

    class Meta:
        ref_name = "BatchMemoriesRequest"


class UpdateMemoryIn(InputSerializer):
    content = MessageContentField(required=False)
    summary = TextField(required=False, allow_blank=True, max_length=10_000)
    importance = ImportanceField(required=False)
    tags = TagsField(required=False)
    metadata = MetadataField(required=False)
    messageIds = MessageIdsField(required=False)
    expiresAt = MomentField(required=False, help_text="In the future.")

    class Meta:
        ref_name = "UpdateMemoryRequest"

    def validate_expiresAt(self, value):
        return _future(value)


class SearchMemoriesIn(InputSerializer):
    query = TextField(max_length=2000)
    # (The operator's result counts, as every search's: the local API's, MCP's.)
    limit = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=settings.MEMORY_MAX_SEARCH_LIMIT,
        default=settings.MEMORY_DEFAULT_SEARCH_LIMIT,
    )
    tags = TagsField(
        required=False, rules=TagsField.LOOKED_UP, help_text="Only memories with any of these tags."
    )
    minScore = serializers.FloatField(
        required=False,
        min_value=0.0,
        max_value=1.0,
        default=0.3,
        help_text="The least relevance (cosine similarity or keyword coverage) of a result.",
    )
    mode = ChoiceField(choices=MODES, default="hybrid")
    prefetch = serializers.BooleanField(
        required=False,
        default=False,
        help_text=f"Search each of the query's first {PREFETCH_MAX_SENTENCES} sentences.",
    )

    def validate_query(self, value):
        return something_to_read(value)


class AgentSearchMemoriesIn(SearchMemoriesIn):
    userId = UserIdField(required=False, help_text="default: the agent's own memories")

    class Meta:
        ref_name = "SearchMemoriesRequest"


class UserSearchMemoriesIn(SearchMemoriesIn):
    agentId = serializers.UUIDField(required=False, help_text="Only what this agent keeps.")

    class Meta:
        ref_name = "UserSearchMemoriesRequest"


MEMORY_ORDER_CHOICES = tuple(MEMORY_ORDERS)


# --- tool records (the memory bank) ----------------------------------------------------------

# A tool's raw input and output are kept whole, up to this size each (serialized JSON).
TOOL_JSON_MAX_BYTES = 1024 * 1024
TOOL_RECORD_MAX_TOP_K = 20


TASK_ID_MAX_LENGTH = 255


class ToolNameField(TextField):
    """A tool's name as a record gives it: something to read (one of spaces was kept;
    review), a name (``GIVEN_NAME_RULES``: "a\nb" and " t" were kept; review)."""

    def __init__(self, **kwargs):
        super().__init__(
            max_length=200, validators=[something_to_read, *GIVEN_NAME_RULES], **kwargs
        )


class TaskIdField(TextField):
    """A task's id as it is looked up (or restored by an import)."""

    def __init__(self, **kwargs):
        super().__init__(max_length=TASK_ID_MAX_LENGTH, **kwargs)


class NewTaskIdField(TaskIdField):
    """A task's id as a record gives it: a name (``GIVEN_NAME_RULES``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.validators += GIVEN_NAME_RULES


class StepField(serializers.IntegerField):
    """A step of a task: what PostgreSQL's ``integer`` column holds."""

    def __init__(self, **kwargs):
        super().__init__(min_value=0, max_value=2**31 - 1, allow_null=True, **kwargs)


class CreateToolRecordIn(InputSerializer):
    taskId = NewTaskIdField(
        required=False, help_text="The caller's task: what search and delete narrow to."
    )
    conversationId = serializers.UUIDField(
        required=False, allow_null=True, help_text="A conversation the agent sees."
    )
    step = StepField(required=False)
    toolName = ToolNameField()
    input = JSONObjectField(
        max_bytes=TOOL_JSON_MAX_BYTES,
        required=False,
        help_text=f"The tool's arguments, at most {TOOL_JSON_MAX_BYTES} bytes as compact JSON.",
    )
    output = JSONValueField(
        max_bytes=TOOL_JSON_MAX_BYTES,
        help_text="The tool's answer, any JSON, kept whole (the fact store): at most "
        f"{TOOL_JSON_MAX_BYTES} bytes as compact JSON.",
    )
    summary = TextField(
        required=False,
        allow_blank=True,
        max_length=10_000,
        help_text="default: the observer's (the LLM's when configured, else one made from "
        "the output's identifiers and sizes)",
    )

    class Meta:
        ref_name = "CreateToolRecordRequest"


class ToolRecordOut(serializers.Serializer):
    traceId = serializers.UUIDField(source="id")
    taskId = serializers.SerializerMethodField()
    conversationId = serializers.UUIDField(source="conversation_id", allow_null=True)
    step = serializers.IntegerField(allow_null=True)
    toolName = serializers.CharField(source="tool_name")
    input = serializers.DictField(source="raw_input")
    output = serializers.JSONField(source="raw_output")
    summary = serializers.CharField()
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        ref_name = "ToolRecord"

    def get_taskId(self, record) -> str | None:
        return record.task_id or None


class ToolRecordHitOut(ToolRecordOut):
    score = serializers.FloatField(help_text="The hybrid engine's fused score (0..1).")

    class Meta:
        ref_name = "ToolRecordSearchResult"

    @functools.cached_property
    def _record(self) -> ToolRecordOut:
        return ToolRecordOut()  # one for every hit, as ``MemoryHitOut._memory``

    def to_representation(self, hit):
        return {**self._record.to_representation(hit.record), "score": hit.score}


class SearchToolRecordsIn(InputSerializer):
    query = TextField(max_length=2000)
    taskId = TaskIdField(required=False, help_text="Only this task's records.")
    topK = serializers.IntegerField(
        required=False, min_value=1, max_value=TOOL_RECORD_MAX_TOP_K, default=3
    )

    class Meta:
        ref_name = "SearchToolRecordsRequest"

    validate_query = SearchMemoriesIn.validate_query


ToolRecordPage = paged(ToolRecordOut, "ToolRecordPage")
ToolRecordHitList = listed(ToolRecordHitOut, "ToolRecordSearchResults")


# --- context for an LLM call -----------------------------------------------------------------


class ContextOut(serializers.Serializer):
    conversationId = serializers.UUIDField()
    messages = MessageOut(many=True)
    nextAfterMessageId = serializers.UUIDField(allow_null=True)
    nextCursor = serializers.CharField(
        allow_null=True,
        help_text="Where this page ended, for `?after=` (null on the last page); unlike "
        "`nextAfterMessageId`, it outlives the message.",
    )
    resumeCursor = serializers.CharField(
        allow_null=True,
        help_text="Where this page ended, on the last page too (the `after` given, when the "
        "page is empty; null only when there is nothing to read yet): come back with it as "
        "`?after=` for what is written later.",
    )
    memories = MemoryOut(
        many=True, help_text="The memories asked for with `?memories=`, best first (else [])."
    )

    class Meta:
        ref_name = "ConversationContext"
