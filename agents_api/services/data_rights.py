"""A user's right to be forgotten: everything kept about them, erased in one transaction."""

from dataclasses import dataclass, replace
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from agents_api.models import MemoryBlock, UserErasure, UserMemorySetting
from agents_api.selectors import memories_of, tool_records_kept_about
from agents_api.services.memories import memories_delete, memory_citations_forget
from agents_api.services.tool_records import tool_records_delete
from conversations.selectors import conversations_owned_by
from conversations.services import user_conversations_erase
from memsvc.api.errors import InvalidInput
from memsvc.api.idempotency import idempotency_keys_forget
from memsvc.api.principals import Principal
from memsvc.db import hold_users


@dataclass(frozen=True)
class Erased:
    conversations: int
    messages: int
    memberships: int
    ownership_transfers: int
    memories: int
    memory_blocks: int
    tool_records: int


@transaction.atomic
def user_erase(actor: Principal, *, confirm: str) -> Erased:
    """Erase what is kept about the acting user: the conversations they own (with everyone's
    messages in them), their messages and memberships elsewhere, the transfers they made or
    were offered, and what every agent keeps about them (memories, blocks and their
    revisions, tool records made for them or in the conversations they own, which would
    otherwise outlive those), the Idempotency-Keys they sent, and their login to the web
    pages (an operator's, staff, is the admin's to remove). Others' memories that cited a
    message erased cite it no more (``memory_citations_forget``). Their memory switch goes
    too, unless it is off: that row says only that agents must not remember them, and is
    kept so that they do not start again. That they were erased, and when, and the ids of
    the conversations erased with them, is kept (``UserErasure``): no import of an older
    document brings back their turns in another's conversations, nor an agent's records of
    their conversations. ``confirm`` must be their id: this cannot be undone. All or
    nothing."""
    if confirm != actor.id:
        raise InvalidInput.for_field(
            "confirm", "must be your own user id: erasing your data cannot be undone"
        )
    # Before anything: the writes about them in flight end first (and are erased here), and
    # those that come later wait for the erase.
    hold_users([actor.id], alone=True)
    owned = list(conversations_owned_by(actor.id).values_list("id", flat=True))
    erased = user_traces_erase(actor.id)
    memories = memories_delete(actor, memories=memories_of(user_id=actor.id, with_expired=True))
    _, deleted = MemoryBlock.objects.filter(user_id=actor.id).delete()
    UserMemorySetting.objects.filter(user_id=actor.id, memory_enabled=True).delete()
    idempotency_keys_forget(actor.id)
    get_user_model().objects.filter(username=actor.id, is_staff=False).delete()
    erasure, made = UserErasure.objects.get_or_create(
        user_id=actor.id, defaults={"erased_at": timezone.now(), "conversation_ids": owned}
    )
    if not made:  # (erased again: what an erase took stays taken, once gone)
        erasure.erased_at, erasure.restored_at = timezone.now(), None
        erasure.conversation_ids = sorted({*erasure.conversation_ids, *owned})
        erasure.save()
    return replace(erased, memories=memories, memory_blocks=deleted.get(MemoryBlock._meta.label, 0))


def user_traces_erase(user_id: str, *, within=None, made_before: datetime | None = None) -> Erased:
    """What a user left in conversations, erased (``user_conversations_erase``), with the
    tool records about them (before the conversations, which would leave their records
    unlinked rather than gone), and others' memories forget the messages erased. No memory
    or block (0 of each). The caller holds the user (``hold_users``).

    ``within`` (group ids) and ``made_before``: only what is of those groups (tool records:
    of their conversations) and was made before then: what an import's document brought
    back of someone erased since it was made (``importing._erased_again``; a user's
    document holds the records of their own conversations only: one elsewhere, made for
    the erased user, was taken too, though the document never held it; review)."""
    records = tool_records_kept_about(user_id)
    if within is not None:
        records = records.filter(conversation__group_id__in=within)
    if made_before is not None:
        records = records.filter(created_at__lt=made_before)
    tool_records = tool_records_delete(Principal.user(user_id), records=records)
    conversations = user_conversations_erase(user_id, within=within, made_before=made_before)
    memory_citations_forget(conversations.message_ids)
    return Erased(
        conversations=conversations.conversations,
        messages=conversations.messages,
        memberships=conversations.memberships,
        ownership_transfers=conversations.ownership_transfers,
        memories=0,
        memory_blocks=0,
        tool_records=tool_records,
    )
