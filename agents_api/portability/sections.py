"""What a document holds, section by section: one list for a user's data, one for an
agent's memory. Another kind of record is one more entry."""

from agents_api import selectors as agent_selectors
from agents_api.portability import records, restore
from agents_api.portability.export import Section
from conversations import selectors
from memsvc.api.principals import Principal


def _memories(agent=None, user_id=None):
    # Not the expired ones: gone everywhere (``models.LIVE``), whether the prune has
    # reclaimed their rows yet or not (the erase takes those rows too).
    return agent_selectors.memories_of(agent, user_id=user_id).order_by(
        "agent_id", "user_id", "created_at", "id"
    )


# Everything kept about a user (``/v1/user/export``, ``memsvc export user``).
USER_SECTIONS = [
    Section(
        "conversations",
        records.ConversationRecord,
        selectors.conversations_owned_by,
        restore.restore_conversations,
    ),
    Section(
        "memberships",
        records.MembershipRecord,
        selectors.memberships_of_owned,
        restore.restore_memberships,
    ),
    Section(
        "messages", records.MessageRecord, selectors.messages_owned_by, restore.restore_messages
    ),
    Section(
        "ownershipTransfers",
        records.TransferRecord,
        selectors.transfers_of_owned,
        restore.restore_transfers,
    ),
    Section(
        "membershipsElsewhere",
        records.MembershipElsewhereRecord,
        selectors.memberships_elsewhere,
        restore.restore_memberships_elsewhere,
    ),
    Section(
        "messagesElsewhere",
        records.MessageRecord,
        selectors.messages_elsewhere,
        restore.restore_messages_elsewhere,
    ),
    Section(
        "ownershipTransfersElsewhere",
        records.TransferRecord,
        selectors.transfers_elsewhere,
        restore.restore_transfers_elsewhere,
    ),
    Section(
        "memories",
        records.MemoryRecord,
        lambda user_id: _memories(user_id=user_id),
        restore.restore_memories,
        # the messages they cite, as far as the user sees them (as /v1/user/memories)
        shown=lambda user_id, memories: agent_selectors.citations_shown_to(
            Principal.user(user_id), memories
        ),
    ),
    Section(
        "memoryBlocks",
        records.MemoryBlockRecord,
        lambda user_id: agent_selectors.memory_blocks_with_revisions(user_id=user_id),
        restore.restore_memory_blocks,
    ),
    Section(
        "toolRecords",
        records.ToolRecordRecord,
        agent_selectors.tool_records_kept_about,
        restore.restore_tool_records,
    ),
    # Last: an import puts back what agents kept about the user before their memory may be
    # turned off again.
    Section(
        "memorySetting",
        records.MemorySettingRecord,
        agent_selectors.memory_setting_of,
        restore.restore_memory_setting,
    ),
]

# An agent's memory (``memsvc export agent``): blocks and memories about every user and
# its own, and its tool records.
AGENT_SECTIONS = [
    Section(
        "memoryBlocks",
        records.MemoryBlockRecord,
        agent_selectors.memory_blocks_with_revisions,
        restore.restore_memory_blocks,
    ),
    Section("memories", records.MemoryRecord, _memories, restore.restore_memories),
    Section(
        "toolRecords",
        records.ToolRecordRecord,
        lambda agent: agent_selectors.tool_records_of(agent).order_by("created_at", "id"),
        restore.restore_tool_records,
    ),
]
