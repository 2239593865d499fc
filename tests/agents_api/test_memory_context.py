"""Long-term memories in an agent's context:
``GET /v1/agent/conversations/{id}/context?memories=N``."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents_api.models import Agent, Memory
from agents_api.selectors import LOCAL_OWNER, keeps_memories, local_agent
from agents_api.services import memory_save
from conversations.models import AccessLevel, Conversation
from tests.agents_api.test_api import agent_conversation, append, context
from tests.factories import AgentFactory, MembershipFactory

pytestmark = pytest.mark.django_db

MEMORY_FIELDS = {
    "id",
    "agentId",
    "userId",
    "content",
    "summary",
    "importance",
    "tags",
    "metadata",
    "messageIds",
    "source",
    "accessCount",
    "lastAccessedAt",
    "expiresAt",
    "createdAt",
    "updatedAt",
}


def remember(credential, content: str, user_id: str = "") -> Memory:
    agent = credential.agent
    memory, _ = memory_save(agent.as_principal(), agent=agent, user_id=user_id, content=content)
    return memory


def user_says(api, credential, conversation_id, *texts):
    response = append(
        api, credential, conversation_id, *[{"role": "user", "content": t} for t in texts]
    )
    assert response.status_code == 201, response.content


@pytest.fixture
def kept(helper, rival):
    """What the helper (and a rival) keep: about alice, bob, and the helper itself."""
    return {
        "alice": remember(helper, "Alice's favourite programming language is Python", "alice"),
        "alice_cat": remember(helper, "Alice has a cat called Tom", "alice"),
        "bob": remember(helper, "Bob's favourite programming language is Go", "bob"),
        "own": remember(helper, "The agent's favourite programming language is Haskell"),
        "rival": remember(rival, "Alice's favourite programming language is Rust", "alice"),
    }


def test_memories_about_the_owner_relevant_to_what_they_said_last(api, helper, kept):
    conversation = agent_conversation(api, helper.acting_for("alice"))
    user_says(api, helper, conversation["id"], "Hi there!")
    append(api, helper, conversation["id"], {"role": "assistant", "content": "Hello, Alice."})
    user_says(api, helper, conversation["id"], "Which programming language do I like?")

    body = context(api, helper, conversation["id"], memories="5")
    assert [m["content"] for m in body["memories"]] == [kept["alice"].content]
    [memory] = body["memories"]
    assert set(memory) == MEMORY_FIELDS
    assert memory["userId"] == "alice"
    assert memory["agentId"] == str(helper.agent.id)
    # The messages are the context's as ever.
    assert [m["content"] for m in body["messages"]] == [
        "Hi there!",
        "Hello, Alice.",
        "Which programming language do I like?",
    ]
    # Put in a prompt is a use.
    kept["alice"].refresh_from_db()
    assert kept["alice"].access_count == 1
    assert Memory.objects.filter(access_count__gt=0).count() == 1


def test_no_memories_unless_asked(api, helper, kept):
    conversation = agent_conversation(api, helper.acting_for("alice"))
    user_says(api, helper, conversation["id"], "Which programming language do I like?")
    assert context(api, helper, conversation["id"])["memories"] == []
    assert context(api, helper, conversation["id"], memories="0")["memories"] == []
    assert not Memory.objects.filter(access_count__gt=0).exists()


def test_at_most_the_number_asked_for_best_first(api, helper):
    for language in ("Python", "Go", "Rust"):
        remember(helper, f"Alice writes {language} code at work", "alice")
    conversation = agent_conversation(api, helper.acting_for("alice"))
    user_says(api, helper, conversation["id"], "What code do I write at work?")
    assert len(context(api, helper, conversation["id"], memories="3")["memories"]) == 3
    assert len(context(api, helper, conversation["id"], memories="2")["memories"]) == 2


def test_acting_for_a_user_gives_that_users_memories(api, helper, kept):
    conversation = agent_conversation(api, helper.acting_for("alice"))
    group = Conversation.objects.get(id=conversation["id"]).group
    MembershipFactory(group=group, principal_id="bob", access_level=AccessLevel.WRITER)
    user_says(api, helper, conversation["id"], "Which programming language do I like?")

    body = context(api, helper.acting_for("bob"), conversation["id"], memories="5")
    assert [m["content"] for m in body["memories"]] == [kept["bob"].content]


def test_in_a_conversation_the_agent_owns_its_own_memories(api, helper, kept):
    conversation = agent_conversation(api, helper)
    user_says(api, helper, conversation["id"], "Which programming language do I like?")
    body = context(api, helper, conversation["id"], memories="5")
    assert [m["content"] for m in body["memories"]] == [kept["own"].content]
    assert body["memories"][0]["userId"] is None


def test_without_user_messages_there_is_nothing_to_search_with(api, helper, kept):
    conversation = agent_conversation(api, helper.acting_for("alice"))
    append(api, helper, conversation["id"], {"role": "assistant", "content": "programming?"})
    assert context(api, helper, conversation["id"], memories="5")["memories"] == []


@pytest.mark.parametrize("value", ["-1", "21", "many", "1.5"])
def test_a_bad_number_of_memories_is_400_naming_it(api, helper, value):
    conversation = agent_conversation(api, helper)
    response = api.get(
        f"/v1/agent/conversations/{conversation['id']}/context", as_=helper, memories=value
    )
    assert response.status_code == 400
    assert response.json()["code"] == "validation_error"
    assert "memories" in response.json()["details"]


def memories_read(sql: str) -> int:
    """How many memories the statement's plan read (those its scans returned and those
    they filtered out), as EXPLAIN ANALYZE counts them."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
        [[plan]] = cursor.fetchall()

    def read(node: dict) -> float:
        own = 0
        if node.get("Relation Name") == "memory":
            own = node["Actual Rows"] * node["Actual Loops"] + node.get("Rows Removed by Filter", 0)
        return own + sum(read(child) for child in node.get("Plans", []))

    return int(read(plan[0]["Plan"]))


def test_whether_an_agent_keeps_a_live_memory_reads_an_entry_however_the_table_is_skewed():
    """An agent whose many memories had all expired (not pruned yet) beside another's many
    live ones: the EXISTS of its live memories was planned as a walk of them all, 125-130
    ms each keyed context request and search of the agent, and 60 ms for the busy one
    (200,000 memories each; docs/benchmarks.md). A plan that reads the rows is what such a
    skew makes; here it is counted in rows read, on 4,000 memories."""
    lapsed, busy = AgentFactory(name="lapsed"), AgentFactory(name="busy")
    for agent, expiry in [(lapsed, "-1 hour"), (busy, "30 days")]:
        with connection.cursor() as cursor:
            cursor.execute(
                """INSERT INTO memory (id, agent_id, user_id, content, content_hash, summary,
                tags, importance, metadata, source, access_count, expires_at, created_at,
                updated_at, message_ids, embedding_model)
                SELECT gen_random_uuid(), %s, 'u' || (g %% 50), 'fact ' || g, md5(g::text),
                '', '{}', 0.5, '{}', 'api', 0, now() + %s::interval, now(), now(), '{}', ''
                FROM generate_series(1, 2000) g""",
                [agent.id, expiry],
            )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memory")
    LOCAL = {"owner_principal": LOCAL_OWNER, "loopback_trusted": True}
    Agent.objects.filter(pk__in=[lapsed.pk, busy.pk]).update(**LOCAL)

    for agent, keeps in [(lapsed, False), (busy, True)]:
        with CaptureQueriesContext(connection) as keyed:
            assert keeps_memories(agent) is keeps  # (an agent read from its key)
        with CaptureQueriesContext(connection) as keyless:
            assert local_agent(None, agent.name, memories=True).keeps_memory is keeps
        for query in [*keyed.captured_queries, *keyless.captured_queries]:
            assert memories_read(query["sql"]) <= 1, query["sql"]
