import pytest
from django.db import IntegrityError, models, transaction
from django.db.models.sql import InsertQuery

from agents_api.models import MemoryBlock, MemoryExtraction
from tests.db import refused
from tests.factories import (
    AgentFactory,
    ConversationFactory,
    MemoryBlockFactory,
    MemoryBlockRevisionFactory,
)

pytestmark = pytest.mark.django_db


def test_a_label_is_unique_per_agent_and_user():
    agent = AgentFactory()
    MemoryBlockFactory(agent=agent, label="persona", user_id="alice")
    MemoryBlockFactory(agent=agent, label="persona", user_id="bob")
    MemoryBlockFactory(agent=agent, label="persona")  # the agent-wide block
    with pytest.raises(IntegrityError, match="memory_block_unique_label"), transaction.atomic():
        MemoryBlockFactory(agent=agent, label="persona", user_id="alice")
    with pytest.raises(IntegrityError, match="memory_block_unique_label"), transaction.atomic():
        MemoryBlockFactory(agent=agent, label="persona")
    assert MemoryBlock.objects.filter(agent=agent).count() == 3


def test_the_same_label_is_fine_for_another_agent():
    MemoryBlockFactory(label="human")
    MemoryBlockFactory(label="human")
    assert MemoryBlock.objects.filter(label="human").count() == 2


def test_a_value_longer_than_the_limit_cannot_be_stored():
    block = MemoryBlockFactory(limit=10, value="short")
    block.value = "x" * 11
    with refused(IntegrityError, match="memory_block_value_within_limit"):
        block.save(update_fields=["value"])
    block.refresh_from_db()
    assert block.value == "short"


def test_agent_names_are_unique_per_owner():
    AgentFactory(owner_principal="alice", name="helper")
    AgentFactory(owner_principal="bob", name="helper")
    with refused(IntegrityError, match="agent_name_unique_per_owner"):
        AgentFactory(owner_principal="alice", name="helper")


def test_revisions_belong_to_their_block():
    revision = MemoryBlockRevisionFactory()
    revision.block.delete()
    assert not type(revision).objects.filter(pk=revision.pk).exists()


def test_an_agent_is_a_principal():
    agent = AgentFactory()
    assert agent.principal_id == f"agent:{agent.id}"


def inserted_without(instance, *columns: str) -> None:
    """``instance`` inserted as a process of the release before a column writes it: an
    INSERT naming every column but ``columns`` (and the generated key)."""
    model = type(instance)
    fields = [
        field
        for field in model._meta.concrete_fields
        if field.name not in columns and not isinstance(field, models.AutoField)
    ]
    query = InsertQuery(model)
    query.insert_values(fields, [instance])
    query.get_compiler(using="default").execute_sql()


def test_a_process_of_the_release_before_inserts_blocks_and_extractions():
    """The columns of the last migrations have database defaults (README: "a process of the
    release before keeps working while the next release's migrations are applied"): a
    block's ``public_id`` had none, and an old process's block creates failed (review)."""
    agent = AgentFactory()
    inserted_without(MemoryBlock(agent=agent, label="human", value="A"), "public_id")
    assert MemoryBlock.objects.get(label="human").public_id is not None
    conversation = ConversationFactory()
    inserted_without(MemoryExtraction(agent=agent, conversation=conversation), "unread", "taken")
    assert MemoryExtraction.objects.get().unread == []
    assert MemoryExtraction.objects.get().taken == []
