"""Every write of the agents app, one module per kind of thing (the acting principal comes
first). Callers use ``agents_api.services.<name>``."""

from agents_api.services.agents import (
    agent_get_or_create,
    api_key_create,
    api_key_revoke,
)
from agents_api.services.blocks import (
    memory_block_create,
    memory_block_delete,
    memory_block_update,
)
from agents_api.services.data_rights import Erased, user_erase
from agents_api.services.letta import (
    letta_agent_create,
    letta_agent_delete,
    letta_agent_update,
    letta_block_attach,
    letta_block_create,
    letta_capture,
    letta_sleeptime_update,
)
from agents_api.services.memories import (
    NEAR_DUPLICATE_SIMILARITY,
    POPULAR_ACCESS_COUNT,
    NewMemory,
    PruneResult,
    memories_delete,
    memories_embed,
    memories_embed_pending,
    memories_prune,
    memories_reembed_all,
    memories_save,
    memories_touch,
    memory_delete,
    memory_save,
    memory_setting_update,
    memory_update,
)
from agents_api.services.messages import (
    agent_messages_append,
    local_conversation_for,
    local_message_append,
    local_messages_append,
)
from agents_api.services.tool_records import (
    NewToolRecord,
    tool_record_observe,
    tool_records_create,
    tool_records_delete,
    tool_records_embed,
    tool_records_embed_pending,
    tool_records_reembed_all,
)

__all__ = [
    "NEAR_DUPLICATE_SIMILARITY",
    "POPULAR_ACCESS_COUNT",
    "Erased",
    "NewMemory",
    "NewToolRecord",
    "PruneResult",
    "agent_get_or_create",
    "agent_messages_append",
    "api_key_create",
    "api_key_revoke",
    "letta_agent_create",
    "letta_agent_delete",
    "letta_agent_update",
    "letta_block_attach",
    "letta_block_create",
    "letta_capture",
    "letta_sleeptime_update",
    "local_conversation_for",
    "local_message_append",
    "local_messages_append",
    "memories_delete",
    "memories_embed",
    "memories_embed_pending",
    "memories_prune",
    "memories_reembed_all",
    "memories_save",
    "memories_touch",
    "memory_block_create",
    "memory_block_delete",
    "memory_block_update",
    "memory_delete",
    "memory_save",
    "memory_setting_update",
    "memory_update",
    "tool_record_observe",
    "tool_records_create",
    "tool_records_delete",
    "tool_records_embed",
    "tool_records_embed_pending",
    "tool_records_reembed_all",
    "user_erase",
]
