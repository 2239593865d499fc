"""Letta's JSON: its inputs (snake_case, unknown fields ignored as Letta's server does) and
its objects (``AgentState``, ``Block``, ``Group``, messages) built from memsvc's rows, with
Letta's prefixed ids (``agent-<uuid>``, ``block-<uuid>``, ``group-<agent uuid>``,
``message-<uuid>``). Letta's clients parse answers leniently; every field they require is
here, the optional ones memsvc has nothing for are left out."""

import re
import uuid

from django.conf import settings
from django.db.models import Q
from rest_framework import serializers

from agents_api.api.serializers import BlockDescriptionField, BlockLimitField, LabelField
from agents_api.local_api.serializers import AgentMetadataField, AgentNameField, LocalInput
from agents_api.models import (
    AGENT_DESCRIPTION_MAX_CHARS,
    AGENT_SYSTEM_MAX_CHARS,
    DEFAULT_BLOCK_LIMIT,
    Agent,
    MemoryBlock,
)
from agents_api.services.letta import (
    LETTA_METADATA_KEY,
    MAX_TAGS,
    letta_metadata,
    letta_settings,
    sleeptime_frequency,
)
from conversations.models import Message, Role
from memsvc.api.converters import AnyCaseUuidConverter
from memsvc.api.errors import NotFound
from memsvc.api.fields import ListField, TextField, datetime_text

AGENT_ID_PREFIX = "agent-"
BLOCK_ID_PREFIX = "block-"
GROUP_ID_PREFIX = "group-"
MESSAGE_ID_PREFIX = "message-"
# Letta's context window for a model it does not know; memsvc does not run the model.
DEFAULT_CONTEXT_WINDOW = 128_000
EMBEDDING_ENDPOINT_TYPES = {"local": "hugging-face", "ollama": "ollama", "openai": "openai"}


def _time(value) -> str | None:
    return datetime_text(value) if value else None


_UUID = AnyCaseUuidConverter.regex


def parse_uuid_id(raw: str, prefix: str, what: str) -> uuid.UUID:
    """``agent-<uuid>`` -> the uuid; anything else names no such object (404): a uuid
    without its prefix, in braces or as a URN (``uuid.UUID`` takes them all) is no id
    memsvc gives (review)."""
    if not (raw.startswith(prefix) and re.fullmatch(_UUID, raw[len(prefix) :])):
        raise NotFound(f"{what} not found")
    return uuid.UUID(raw[len(prefix) :])


def parse_block_id(raw: str) -> Q:
    """``block-<uuid>`` (the block's ``public_id``, as the local API names it) -> the block's
    lookup; ``block-<number>`` too, the table's counter, which named blocks before (Letta
    clients keep the ids they were given). Anything else names no block (404)."""
    digits = raw.removeprefix(BLOCK_ID_PREFIX)
    # ASCII digits only: str.isdigit() takes "²" (which int() refuses) and int() takes
    # other scripts' digits ("١٤١" is 141), so neither would do alone.
    if raw.startswith(BLOCK_ID_PREFIX) and digits.isascii() and digits.isdigit():
        if len(digits) > 18:
            raise NotFound("Block not found")
        return Q(pk=int(digits))
    return Q(public_id=parse_uuid_id(raw, BLOCK_ID_PREFIX, "Block"))


def agent_id(agent: Agent) -> str:
    return f"{AGENT_ID_PREFIX}{agent.id}"


def block_out(block: MemoryBlock) -> dict:
    return {
        "id": f"{BLOCK_ID_PREFIX}{block.public_id}",
        "label": block.label,
        "value": block.value,
        "description": block.description,
        "limit": block.limit,
        "read_only": block.read_only,
        "metadata": {},
        "is_template": False,
        "hidden": False,
    }


def group_out(agent: Agent) -> dict:
    """The sleeptime group Letta makes with an agent. memsvc's observer is a task, not a
    second agent: the group names the agent itself."""
    return {
        "id": f"{GROUP_ID_PREFIX}{agent.id}",
        "agent_ids": [agent_id(agent)],
        "description": f"sleeptime memory of {agent.name}",
        "manager_type": "sleeptime",
        "manager_agent_id": agent_id(agent),
        "sleeptime_agent_frequency": sleeptime_frequency(agent),
    }


def agent_out(agent: Agent, blocks: list[MemoryBlock]) -> dict:
    letta = letta_settings(agent)
    model = letta.get("model") or "unknown"
    provider, _, model_name = model.rpartition("/")
    blocks_out = [block_out(block) for block in blocks]
    group = group_out(agent) if letta.get("enable_sleeptime") else None
    return {
        "id": agent_id(agent),
        "name": agent.name,
        "agent_type": letta.get("agent_type") or "letta_v1_agent",
        "system": letta.get("system") or "",
        "description": letta.get("description") or agent.description,
        "tags": list(letta.get("tags", [])),
        "metadata": letta_metadata(agent),
        "model": model,
        "embedding": letta.get("embedding"),
        "enable_sleeptime": bool(letta.get("enable_sleeptime")),
        "llm_config": {
            "model": model_name or model,
            "model_endpoint_type": provider or "openai",
            "context_window": DEFAULT_CONTEXT_WINDOW,
        },
        # What memsvc embeds with, whatever the SDK asked for.
        "embedding_config": {
            "embedding_model": settings.MEMORY_EMBEDDING_MODEL,
            "embedding_endpoint_type": EMBEDDING_ENDPOINT_TYPES[settings.MEMORY_EMBEDDING_BACKEND],
            "embedding_dim": settings.MEMORY_EMBEDDING_DIMENSION,
        },
        "memory": {"blocks": blocks_out, "file_blocks": []},
        "blocks": blocks_out,
        "tools": [],
        "sources": [],
        "multi_agent_group": group,
        "managed_group": group,
        "created_at": _time(agent.created_at),
    }


MESSAGE_TYPES = {
    Role.USER: "user_message",
    Role.ASSISTANT: "assistant_message",
    Role.SYSTEM: "system_message",
}


def message_out(message: Message, agent: Agent) -> dict:
    return {
        "id": f"{MESSAGE_ID_PREFIX}{message.id}",
        "message_type": MESSAGE_TYPES.get(message.role, "assistant_message"),
        "content": message.content,
        "date": _time(message.created_at),
        "name": message.author_name or None,
        "sender_id": agent_id(agent) if message.role == Role.ASSISTANT else None,
        "seq_id": message.seq,
    }


# --- inputs ----------------------------------------------------------------------------------


class LettaInput(LocalInput):
    """A Letta request body: Letta's server ignores what it does not use; so does this. A
    null for a field that may be left out is as if it were left out, as Letta's
    ``Optional`` fields take it: the default on a create, unchanged on an update (the SDK's
    ``agents.update(agent, model=None)`` keeps the model). A required field's null is a 422."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            data = {
                name: value
                for name, value in data.items()
                if value is not None or (name in self.fields and self.fields[name].required)
            }
        return super().to_internal_value(data)


class BlockIn(LettaInput):
    label = LabelField()
    value = TextField(allow_blank=True, required=False, default="")
    description = BlockDescriptionField(required=False, default="")
    limit = BlockLimitField(required=False, default=DEFAULT_BLOCK_LIMIT)
    # Letta's "the agent has read-only access": memsvc's read-only block, as /v1/agent's
    # ``readOnly`` makes it (no write changes or deletes it, the observer's included).
    read_only = serializers.BooleanField(required=False, default=False)
    metadata = serializers.DictField(required=False)

    def validate_metadata(self, metadata):
        # (Passed over, a block's metadata was lost and the write said 200: review.)
        if metadata:
            raise serializers.ValidationError("memsvc keeps no metadata on a block")
        return metadata

    def validate(self, attrs):
        attrs.pop("metadata", None)  # (an empty one: nothing to keep)
        return attrs


class BlockUpdateIn(LettaInput):
    label = LabelField(required=False)
    value = TextField(allow_blank=True, required=False)
    description = BlockDescriptionField(required=False)
    limit = BlockLimitField(required=False)
    read_only = serializers.BooleanField(required=False)  # (only as it is: ``views``)
    metadata = serializers.DictField(required=False)
    validate_metadata = BlockIn.validate_metadata
    validate = BlockIn.validate


class TagsField(ListField):
    """An agent's tags (``MAX_TAGS``, of up to 100 characters each), on create as on update."""

    def __init__(self, **kwargs):
        super().__init__(child=TextField(max_length=100), max_length=MAX_TAGS, **kwargs)


class LettaTexts(LettaInput):
    # An agent's texts among its settings, as it is made or changed.
    system = TextField(allow_blank=True, required=False, max_length=AGENT_SYSTEM_MAX_CHARS)
    description = TextField(
        allow_blank=True, required=False, max_length=AGENT_DESCRIPTION_MAX_CHARS
    )


class LettaSettingsFields(LettaTexts):
    # The settings an agent is made with (``services.letta.LETTA_SETTINGS``).
    agent_type = TextField(max_length=100, required=False)
    model = TextField(max_length=200, required=False)
    embedding = TextField(max_length=200, required=False)
    enable_sleeptime = serializers.BooleanField(required=False)


class AgentIn(LettaSettingsFields):
    name = AgentNameField()
    tags = TagsField(required=False, default=list)
    memory_blocks = serializers.ListField(child=BlockIn(), required=False, default=list)
    metadata = AgentMetadataField(required=False)

    def validate_memory_blocks(self, blocks):
        # (A second block of a label was dropped, its value lost, and the create said 200:
        # review. A label the agent has already is kept as it is: a create asked again.)
        seen = set()
        for index, block in enumerate(blocks):
            if block["label"] in seen:
                problem = f"block {block['label']!r} is given twice"
                raise serializers.ValidationError({index: {"label": [problem]}})
            seen.add(block["label"])
        return blocks


class AgentUpdateIn(LettaTexts):
    name = AgentNameField(required=False)
    model = TextField(max_length=200, required=False)
    enable_sleeptime = serializers.BooleanField(required=False)
    metadata = AgentMetadataField(required=False)
    tags = TagsField(required=False)


class SleeptimeFrequencyIn(LettaInput):
    """Every how many captured turns the sleeptime agent runs (``agents_api.sleeptime``):
    set through a group's manager config, kept in the agent's Letta settings."""

    sleeptime_agent_frequency = serializers.IntegerField(
        required=False, min_value=1, max_value=1000
    )


class ManagerConfigIn(SleeptimeFrequencyIn):
    manager_type = TextField(max_length=50, required=False)

    def validate_manager_type(self, manager_type):
        # (Another was passed over, and the group stayed a sleeptime group: review.)
        if manager_type != "sleeptime":
            raise serializers.ValidationError("memsvc's groups are sleeptime groups")
        return manager_type


class LettaSettingsIn(LettaSettingsFields, SleeptimeFrequencyIn):
    """The Letta settings kept in an agent's metadata (``services.letta.letta_settings``):
    what an imported agent may bring there. (A forged ``{"letta": {"tags": 5}}`` was
    imported, and every Letta list of its owner's agents was a 500 after.)"""

    tags = TagsField(required=False)


def letta_settings_checked(metadata: dict) -> dict:
    """An agent's ``metadata`` (an import's, the admin's) with its Letta settings as the Letta
    API keeps them (``LettaSettingsIn``: a null is read as left out, as the check read it);
    ``ValidationError`` naming what is wrong."""
    letta = metadata.get(LETTA_METADATA_KEY)
    if letta is None:
        return metadata
    if not isinstance(letta, dict):
        raise serializers.ValidationError({LETTA_METADATA_KEY: ["must be an object"]})
    try:
        return {**metadata, LETTA_METADATA_KEY: dict(LettaSettingsIn.parse(letta))}
    except serializers.ValidationError as exc:
        raise serializers.ValidationError({LETTA_METADATA_KEY: exc.detail}) from None


class GroupUpdateIn(LettaInput):
    manager_config = ManagerConfigIn(required=False)


class CaptureIn(LettaInput):
    provider = TextField(max_length=100, required=False, allow_blank=True, default="")
    model = TextField(max_length=200, required=False, allow_blank=True, default="")
    request_messages = ListField(
        child=serializers.DictField(), required=False, default=list, max_length=1000
    )
    response_dict = serializers.DictField(required=False, default=dict)
