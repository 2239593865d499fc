"""Writes of memory blocks: every change checked against the block's limit and kept as a revision."""

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from agents_api.models import (
    DEFAULT_BLOCK_LIMIT,
    Agent,
    MemoryBlock,
    MemoryBlockRevision,
)
from agents_api.services.memories import refuse_if_memory_off
from memsvc.api.errors import Conflict, Forbidden, InvalidInput, NotFound
from memsvc.api.principals import Principal
from memsvc.db import held_keys, hold_users, locked_row
from memsvc.text import shows_nothing


def _check_fits(value: str, limit: int, field: str) -> None:
    """A block's value as a write leaves it: within its limit."""
    if len(value) > limit:
        raise InvalidInput.for_field(
            field, f"the block would hold {len(value)} characters; its limit is {limit}"
        )


def check_readable(value: str, field: str) -> None:
    """A block's value as a write gives it: something to read, or nothing at all (one of
    blanks only, spaces or a zero-width space, was kept, and headed every prompt: review).
    Values stored before this rule are kept, and come back with an import."""
    if value and shows_nothing(value):
        raise InvalidInput.for_field(field, "the block would hold nothing but blanks")


def _refuse_an_agent_if_memory_off(actor: Principal, user_id: str) -> None:
    """An agent writes nothing new about a user who turned memory off (409, as for memories);
    the user may still change or empty their own blocks (the memory pages)."""
    if actor.id != user_id:
        refuse_if_memory_off(user_id, lock=True)


def _record(block: MemoryBlock, actor: Principal) -> None:
    """Keep the block's new value as a revision (``revisions_trim``)."""
    MemoryBlockRevision.objects.create(block=block, value=block.value, actor_principal=actor.id)
    revisions_trim([block.id])


def revisions_trim(block_ids) -> None:
    """Only the newest ``MEMSVC_BLOCK_REVISIONS_KEPT`` revisions of each of these blocks
    are kept (0: every one): after a write, and after an import, whose document may hold
    more (review: 120 of a block were listed, with the setting at 50)."""
    kept = settings.MEMSVC_BLOCK_REVISIONS_KEPT
    if kept:
        older = (
            MemoryBlockRevision.objects.filter(block_id__in=block_ids)
            .annotate(
                place=Window(
                    RowNumber(),
                    partition_by=F("block_id"),
                    order_by=list(MemoryBlockRevision.NEWEST_FIRST),
                )
            )
            .filter(place__gt=kept)
            .values("id")
        )
        MemoryBlockRevision.objects.filter(id__in=older).delete()


@transaction.atomic
def memory_block_create(
    actor: Principal,
    *,
    agent: Agent,
    user_id: str = "",
    label: str,
    value: str = "",
    description: str = "",
    limit: int = DEFAULT_BLOCK_LIMIT,
    read_only: bool = False,
    awaiting_attach: bool = False,
) -> MemoryBlock:
    hold_users([user_id])
    check_readable(value, "value")
    _check_fits(value, limit, "value")
    _refuse_an_agent_if_memory_off(actor, user_id)
    # The agent held as the block's foreign key will hold it at commit, but before the
    # block is written: an attach of a block of this label, which locks the agent first,
    # then waits for this insert's label (``services.letta_block_attach``), ends first or
    # waits for this one, rather than the two waiting for each other (a deadlock, a 503);
    # an agent deleted meanwhile is a 404, not a foreign key violated at commit.
    if not held_keys(Agent, [agent.pk]):
        raise NotFound("Agent not found")
    try:
        with transaction.atomic():
            block = MemoryBlock.objects.create(
                agent=agent,
                user_id=user_id,
                label=label,
                value=value,
                description=description,
                limit=limit,
                read_only=read_only,
                awaiting_attach=awaiting_attach,
            )
    except IntegrityError:
        raise Conflict(f"a memory block labelled {label!r} already exists") from None
    _record(block, actor)
    return block


@transaction.atomic
def memory_block_update(
    actor: Principal,
    *,
    block: MemoryBlock,
    value: str | None = None,
    append: str | None = None,
    replace: tuple[str, str] | None = None,
    description: str | None = None,
    limit: int | None = None,
    label: str | None = None,
) -> MemoryBlock:
    """Change a block: set its value, ``append`` a line, or ``replace`` (old, new) text;
    and its description, limit or ``label`` (one its agent keeps for that user already is
    a conflict).

    The row is locked for the whole change, so concurrent appends never lose text.
    Refused changes (read-only, over the limit, ``old`` not found, a label taken) store
    nothing. A block's user never changes: held before its row (``hold_users``), the one
    the erase of that user waits for, with the revision this adds.
    """
    hold_users([block.user_id])
    block = locked_row(MemoryBlock.objects, block.pk, missing="memory block not found")
    _refuse_an_agent_if_memory_off(actor, block.user_id)
    if block.read_only:
        raise Forbidden(f"memory block {block.label!r} is read-only")
    new_value = block.value
    field = "value"
    if value is not None:
        new_value = value
    if append is not None:
        field = "append"
        new_value = f"{new_value}\n{append}" if new_value else append
    if replace is not None:
        field = "replace"
        old, new = replace
        if not old or old not in new_value:
            raise Conflict("the text to replace is not in the block")
        new_value = new_value.replace(old, new, 1)
    if new_value != block.value:
        check_readable(new_value, field)
    new_limit = block.limit if limit is None else limit
    _check_fits(new_value, new_limit, field if limit is None else "limit")
    if (new_value, new_limit) == (block.value, block.limit) and all(
        given in (None, now)
        for given, now in ((description, block.description), (label, block.label))
    ):
        return block  # nothing changes, not even ``updatedAt`` (as a conversation's)
    changed = new_value != block.value
    block.value = new_value
    block.limit = new_limit
    if description is not None:
        block.description = description
    if label is not None:
        block.label = label
    block.updated_at = timezone.now()
    try:
        with transaction.atomic():
            block.save(update_fields=["value", "limit", "description", "label", "updated_at"])
    except IntegrityError:
        if label is None:  # (the label's uniqueness is the one rule not checked above)
            raise
        raise Conflict(f"a memory block labelled {label!r} already exists") from None
    if changed:
        _record(block, actor)
    return block


@transaction.atomic
def memory_block_delete(actor: Principal, *, block: MemoryBlock) -> None:
    """Delete a block with its revisions. Locked first, as a change locks it: a change in
    progress (and the revision it adds) ends before the block's revisions are collected."""
    block = locked_row(MemoryBlock.objects, block.pk, missing="memory block not found")
    if block.read_only:
        raise Forbidden(f"memory block {block.label!r} is read-only")
    block.delete()
