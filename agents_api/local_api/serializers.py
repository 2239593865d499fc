"""The JSON of the local compatibility API: the seed's snake_case shapes."""

from django.conf import settings
from rest_framework import serializers

from agents_api.api.serializers import (
    TOOL_JSON_MAX_BYTES,
    TOOL_RECORD_MAX_TOP_K,
    LabelField,
    NewTaskIdField,
    SearchToolRecordsIn,
    StepField,
    TaskIdField,
    ToolNameField,
)
from agents_api.models import (
    AGENT_NAME_MAX_CHARS,
    GIVEN_NAME_RULES,
    NAME_RULES,
    Agent,
    MemoryBlock,
)
from agents_api.selectors import MemoryHit, ToolRecordHit
from agents_api.services.letta import LETTA_METADATA_KEY, letta_metadata
from conversations.models import Message, Role
from conversations.services import within_message_limit
from memsvc.api.fields import (
    ChoiceField,
    InputSerializer,
    JSONObjectField,
    JSONValueField,
    ListField,
    MessageContentField,
    MetadataField,
    PathSegmentField,
    TextField,
    datetime_text,
    something_to_read,
)

# The most records a tool record search may be told to leave out.
MAX_EXCLUDED_TRACE_IDS = 1000


def agent_out(agent: Agent, *, reads: bool = True) -> dict:
    """An agent as the local API shows it; to a caller that may not read (a write-only
    key entering a ``capture_only`` block), only its id and name."""
    if not reads:
        return {"id": str(agent.id), "name": agent.name}
    return {
        "id": str(agent.id),
        "name": agent.name,
        "created_at": datetime_text(agent.created_at),
        "metadata": letta_metadata(agent) or None,  # (not memsvc's Letta settings)
    }


def message_out(message: Message, agent: Agent, *, similarity: float | None = None) -> dict:
    return {
        "id": str(message.id),
        "agent_id": str(agent.id),
        "role": message.role,
        "content": message.content,
        "created_at": datetime_text(message.created_at),
        "metadata": message.metadata or None,
        "similarity": similarity,
    }


def block_out(block: MemoryBlock) -> dict:
    return {
        "id": str(block.public_id),
        "agent_id": str(block.agent_id),
        "label": block.label,
        "value": block.value,
        "created_at": datetime_text(block.created_at),
        "updated_at": datetime_text(block.updated_at),
    }


def memory_out(hit: MemoryHit) -> dict:
    """A long-term memory in a context response; ``score`` ranks it, ``relevance`` is how
    well it answers the query (0..1)."""
    memory = hit.memory
    return {
        "id": str(memory.id),
        "agent_id": str(memory.agent_id),
        "content": memory.content,
        "summary": memory.summary or None,
        "importance": memory.importance,
        "tags": list(memory.tags),
        "source": memory.source,
        "created_at": datetime_text(memory.created_at),
        "updated_at": datetime_text(memory.updated_at),
        "score": hit.score,
        "relevance": hit.relevance,
    }


def tool_record_out(record, *, score: float | None = None) -> dict:
    """A tool record of the memory bank (``/tool-records``), snake_case."""
    return {
        "trace_id": str(record.id),
        "agent_id": str(record.agent_id),
        "task_id": record.task_id or None,
        "step": record.step,
        "tool_name": record.tool_name,
        "input": record.raw_input,
        "output": record.raw_output,
        "summary": record.summary,
        "created_at": datetime_text(record.created_at),
        "score": score,
    }


def tool_record_hit_out(hit: ToolRecordHit) -> dict:
    return tool_record_out(hit.record, score=hit.score)


def validation_detail(detail, path=("body",)) -> list[dict]:
    """DRF's errors as FastAPI's 422 ``detail``: ``[{"type", "loc", "msg"}, ...]``."""
    issues = []
    if isinstance(detail, dict):
        for key, sub in detail.items():
            # (The body as a whole, ``InputSerializer``'s "body": named once, not body.body.)
            whole = key == "non_field_errors" or (path == ("body",) and key == "body")
            issues += validation_detail(sub, path if whole else (*path, key))
    elif isinstance(detail, list):
        for item in detail:
            issues += validation_detail(item, path)
    else:
        code = getattr(detail, "code", "value_error")
        issues.append(
            {
                "type": "missing" if code == "required" else code,
                "loc": list(path),
                "msg": str(detail),
            }
        )
    return issues


class LocalInput(InputSerializer):
    # The seed's pydantic models ignore fields they do not know, and convert "10" to 10; so
    # do these.
    ignore_unknown_fields = True
    json_types_strict = False


class AgentNameField(PathSegmentField):
    """An agent's name (the local API's, Letta's, ``memsvc apikey create``'s), as the model
    takes it (``GIVEN_NAME_RULES``), and a segment of its routes. ``given`` False: a name
    that looks an agent up, held to the rules of names of every time (``NAME_RULES``): an
    agent an import brought back, named by older rules, was read by its path but refused
    in a body (review)."""

    default_error_messages = {
        # (said after "agent name" by the command line, which printed DRF's sentence there:
        # "agent name Ensure this field has no more than 200 characters."; review)
        "max_length": "must be at most {max_length} characters",
    }

    def __init__(self, *, given: bool = True, **kwargs):
        super().__init__(max_length=AGENT_NAME_MAX_CHARS, **kwargs)
        self.validators += GIVEN_NAME_RULES if given else NAME_RULES


class AgentMetadataField(MetadataField):
    """An agent's own metadata as a client gives it (the local API's, Letta's:
    ``services.letta.letta_metadata``), beside the key under which memsvc keeps its Letta
    settings. (The local API stored ``{"letta": {"tags": 5}}``, and every Letta list of a key
    of that agent was a 500.)"""

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if LETTA_METADATA_KEY in value:
            raise serializers.ValidationError(
                f"the key {LETTA_METADATA_KEY!r} is memsvc's (where it keeps Letta's settings)"
            )
        return value


class CreateAgentIn(LocalInput):
    # "Create or return": a lookup first (an agent an import brought back, named by older
    # rules, was refused, and learning() could not enter its block: review), held to the
    # rules of a new name when there is none (``NewAgentIn``).
    name = AgentNameField(given=False)
    metadata = AgentMetadataField(required=False, allow_null=True)


class NewAgentIn(LocalInput):
    name = AgentNameField()


class CreateMessageIn(LocalInput):
    agent_name = AgentNameField(given=False)  # (a lookup)
    role = ChoiceField(choices=[Role.USER, Role.ASSISTANT, Role.SYSTEM])
    # Kept to its first MEMSVC_MAX_MESSAGE_CHARS characters, not refused: a turn learning()
    # records (the seed's server took any length). With a lower limit set, learning()'s
    # turns were refused, and the exchange lost (review).
    content = MessageContentField(max_length=None)
    metadata = MetadataField(required=False, allow_null=True)

    def validate_content(self, value):
        # (what is kept must hold something to read too: 50 spaces were stored, review)
        return something_to_read(within_message_limit(value))


# The longest query a search takes.
SEARCH_QUERY_MAX_CHARS = 2000


class SearchIn(LocalInput):
    agent_name = AgentNameField(given=False)  # (a lookup)
    query = TextField(max_length=SEARCH_QUERY_MAX_CHARS)
    limit = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=settings.MEMORY_MAX_SEARCH_LIMIT,
        default=settings.MEMORY_DEFAULT_SEARCH_LIMIT,
    )
    # (``/v1``'s ``minScore``, in the seed's spelling: ``similarity`` is a hybrid score that
    # no threshold bounds, so a search that matched nothing well answered its best anyway.)
    min_score = serializers.FloatField(required=False, min_value=0.0, max_value=1.0, default=0.0)

    # (One of blanks answered the agent's messages in no order: review.)
    validate_query = SearchToolRecordsIn.validate_query


class CreateBlockIn(LocalInput):
    agent_name = AgentNameField(given=False)  # (a lookup)
    label = LabelField()
    value = TextField(allow_blank=True)


class UpdateBlockIn(LocalInput):
    value = TextField(allow_blank=True)


class ContextIn(LocalInput):
    # The path names the agent; the seed's clients send it in the body too.
    agent_name = AgentNameField(required=False, given=False)  # (a lookup, not read)
    # The seed's clients (learning() too) send the user's whole message, however long (the
    # body's cap bounds it): it is searched by its start, as much as a search query holds.
    query = TextField(allow_blank=True)

    def validate_query(self, value):
        return value[:SEARCH_QUERY_MAX_CHARS]


# --- tool records (the memory bank of ``learning(strategy="memory_bank")``) -------------------

MAX_TOOL_RECORDS = 100


class NewToolRecordIn(LocalInput):
    step = StepField(required=False)
    tool_name = ToolNameField()
    input = JSONObjectField(max_bytes=TOOL_JSON_MAX_BYTES, required=False)
    output = JSONValueField(max_bytes=TOOL_JSON_MAX_BYTES)
    summary = TextField(required=False, allow_blank=True, max_length=10_000)


class CreateToolRecordsIn(LocalInput):
    agent_name = AgentNameField(given=False)  # (a lookup)
    task_id = NewTaskIdField(required=False)
    records = NewToolRecordIn(many=True, allow_empty=False, max_length=MAX_TOOL_RECORDS)


class ToolRecordSearchIn(LocalInput):
    agent_name = AgentNameField(given=False)  # (a lookup)
    query = TextField(max_length=2000)
    task_id = TaskIdField(required=False)
    top_k = serializers.IntegerField(
        required=False, min_value=1, max_value=TOOL_RECORD_MAX_TOP_K, default=3
    )
    # The records the caller holds already (the memory bank: the last step's, sent whole):
    # asked for the best of the others, it was given them, all 20 filtered out (review).
    exclude_trace_ids = ListField(
        child=serializers.UUIDField(), required=False, max_length=MAX_EXCLUDED_TRACE_IDS
    )

    validate_query = SearchToolRecordsIn.validate_query
