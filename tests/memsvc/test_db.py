"""Small database helpers shared by the apps (``memsvc.db``)."""

import pytest

from agents_api.models import Agent, MemoryBlock
from agents_api.selectors import LOCAL_OWNER, local_agent, memory_blocks
from memsvc import db
from tests.factories import AgentFactory

pytestmark = pytest.mark.django_db


def test_a_queryset_compiled_once_finds_what_the_queryset_finds():
    first, second = AgentFactory(name="first"), AgentFactory(name="second")
    for agent in (first, second):
        named = Agent.objects.filter(name=agent.name)
        [found] = db.compiled_once("test_agent_named", named, [agent.name])
        assert (found.pk, found.metadata, found.created_at) == (
            agent.pk,
            agent.metadata,
            Agent.objects.get(pk=agent.pk).created_at,
        )
    assert "test_agent_named" in db._COMPILED_SQL


def test_parameters_other_than_the_sql_takes_keep_nothing_and_answer_right():
    agent = AgentFactory(name="plain")
    named = Agent.objects.filter(name="plain", owner_principal=agent.owner_principal)
    # (Given in the wrong order: the SQL takes the name first.)
    [found] = db.compiled_once("test_wrong_order", named, [agent.owner_principal, "plain"])
    assert found.pk == agent.pk
    assert "test_wrong_order" not in db._COMPILED_SQL


def test_the_local_agent_and_its_blocks_are_read_by_sql_compiled_once():
    agent = AgentFactory(name="local-one", owner_principal=LOCAL_OWNER, loopback_trusted=True)
    MemoryBlock.objects.create(agent=agent, label="persona", value="calm")
    MemoryBlock.objects.create(agent=agent, label="human", value="Ana", awaiting_attach=True)
    assert local_agent(None, "local-one").pk == agent.pk
    assert [block.label for block in memory_blocks(agent, user_id="")] == ["persona"]
    # Kept: their parameters are given as their SQL takes them (a change of the querysets
    # that moved them would make every request compile them again, silently).
    assert {"local_agent", "memory_blocks"} <= db._COMPILED_SQL.keys()
