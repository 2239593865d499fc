"""Memories beside messages: a memory cites the turns it rests on, and a hybrid search of
messages ranks those turns by the memories most relevant to the query, within what the
searcher may see."""

import pytest

from agents_api.models import Memory
from agents_api.services import memory_setting_update
from conversations.models import Visibility
from memsvc.api.principals import Principal
from search import ranking
from search.services import embed_pending
from tests.agents_api.conftest import make_agent
from tests.factories import ConversationFactory, MembershipFactory, MessageFactory
from tests.search.test_search import contents, search, tuned

pytestmark = pytest.mark.django_db

AGENT_SEARCH = "/v1/agent/search/messages"
QUESTION = "Did she adopt a kitten?"
# The turn that answers it says nothing of kittens: only the memory drawn from it does.
ANSWER = "We drove there after lunch."


def test_the_best_citing_row_gives_its_turns_about_a_whole_score():
    shares = ranking.cited_shares([["a", "b"], ["c", "a"], ["d"], ["e"]], weight=1.0, places=3)
    # The best memory citing a turn decides its share; the fourth memory gives nothing.
    assert shares == pytest.approx({"a": 1.0, "b": 1.0, "c": 2 / 3, "d": 1 / 3})
    assert ranking.with_shares({"a": 0.5, "x": 0.9}, {"a": 1.0, "d": 0.2}) == pytest.approx(
        {"a": 1.5, "x": 0.9, "d": 0.2}
    )


@pytest.fixture
def helper(db):
    return make_agent("helper")


@pytest.fixture
def chat(alice, helper):
    """Alice's conversation with the helper agent, embedded."""
    conversation = ConversationFactory(group__owner=alice.id, title="Weekend")
    MembershipFactory(group=conversation.group, principal_id=helper.agent.as_principal().id)
    turns = {}
    for text in [
        "How was your weekend?",
        "Cats are lovely pets to keep",
        ANSWER,
        "The weather in Paris is rainy today",
        "We should book flights to Tokyo",
        "I like pasta with tomato sauce",
        "My brother plays the guitar in a band",
    ]:
        turns[text] = MessageFactory(conversation=conversation, author_name="alice", content=text)
    embed_pending()
    return conversation, turns


def remember(api, helper, content, cited, user_id="alice"):
    response = api.post(
        "/v1/agent/memories",
        {"content": content, "userId": user_id, "messageIds": [str(m.id) for m in cited]},
        as_=helper,
    )
    assert response.status_code == 201, response.content
    return response.json()


def agent_search(api, helper, query, conversation, **body):
    response = api.post(
        AGENT_SEARCH,
        {"query": query, "conversationIds": [str(conversation.id)], **body},
        as_=helper,
    )
    assert response.status_code == 200, response.content
    return contents(response.json()["data"])


def test_a_turn_a_relevant_memory_cites_comes_first(api, helper, alice, chat, settings):
    conversation, turns = chat
    assert agent_search(api, helper, QUESTION, conversation, topK=1) != [ANSWER]
    assert contents(search(api, alice, QUESTION, topK=1)) != [ANSWER]

    memory = remember(api, helper, "Alice adopted a grey kitten called Luna", [turns[ANSWER]])
    assert memory["messageIds"] == [str(turns[ANSWER].id)]
    assert agent_search(api, helper, QUESTION, conversation, topK=1) == [ANSWER]
    # Alice's own search reads what agents keep about her.
    assert contents(search(api, alice, QUESTION, topK=1)) == [ANSWER]
    # Hybrid only: each measure alone is what it was.
    assert agent_search(api, helper, QUESTION, conversation, topK=1, mode="keyword") != [ANSWER]

    # The cheaper option finds the memory by its vector alone.
    tuned(settings, citation_mode="semantic", citation_min_relevance=0.0)
    assert agent_search(api, helper, QUESTION, conversation, topK=1) == [ANSWER]

    tuned(settings, citation_weight=0.0)
    assert agent_search(api, helper, QUESTION, conversation, topK=1) != [ANSWER]


def test_a_memory_less_relevant_than_the_floor_moves_nothing(api, helper, chat, settings):
    conversation, turns = chat
    # Relevant to the question only by its meaning, and not much.
    remember(api, helper, "Luna sleeps on the sofa", [turns[ANSWER]])
    tuned(settings, citation_min_relevance=0.0)
    assert agent_search(api, helper, QUESTION, conversation, topK=1) == [ANSWER]
    tuned(settings, citation_min_relevance=0.9)
    assert agent_search(api, helper, QUESTION, conversation, topK=1) != [ANSWER]


def test_a_cited_turn_the_searcher_may_not_see_is_never_found(api, helper, alice, bob, chat):
    conversation, _ = chat
    # Bob's conversation with the helper, and a turn of Alice's chat only agents see.
    elsewhere = ConversationFactory(group__owner=bob.id, title="Bob and the helper")
    MembershipFactory(group=elsewhere.group, principal_id=helper.agent.as_principal().id)
    bobs = MessageFactory(conversation=elsewhere, author_name="bob", content="Noted, thanks.")
    hidden = MessageFactory(
        conversation=conversation,
        author_name="helper",
        content="Noted for later.",
        visibility=Visibility.AGENT,
    )
    embed_pending()
    remember(api, helper, "Alice adopted a grey kitten called Luna", [bobs, hidden])

    found = contents(search(api, alice, QUESTION, topK=10))
    assert found and "Noted, thanks." not in found and "Noted for later." not in found
    # The agent sees both conversations: both turns are found for it.
    response = api.post(AGENT_SEARCH, {"query": QUESTION, "topK": 3}, as_=helper)
    assert {"Noted, thanks.", "Noted for later."} <= set(contents(response.json()["data"]))


def test_memories_about_a_user_who_turned_memory_off_cite_nothing(api, helper, alice, chat):
    conversation, turns = chat
    remember(api, helper, "Alice adopted a grey kitten called Luna", [turns[ANSWER]])
    assert contents(search(api, alice, QUESTION, topK=1)) == [ANSWER]
    memory_setting_update(Principal.user("alice"), enabled=False)
    assert Memory.objects.filter(user_id="alice").exists()
    assert agent_search(api, helper, QUESTION, conversation, topK=1) != [ANSWER]
    assert contents(search(api, alice, QUESTION, topK=1)) != [ANSWER]


def test_only_the_searching_agents_memories_about_whom_it_acts_for_count(api, helper, chat):
    conversation, turns = chat
    other = make_agent("other", scopes=("read", "write", "impersonate"))
    MembershipFactory(group=conversation.group, principal_id=other.agent.as_principal().id)
    acting = make_agent("acting", scopes=("read", "write", "impersonate"))
    MembershipFactory(group=conversation.group, principal_id=acting.agent.as_principal().id)
    # Another agent's memory, and the acting agent's memory about someone else.
    remember(api, other, "Alice adopted a grey kitten called Luna", [turns[ANSWER]])
    remember(api, acting, "Alice adopted a grey kitten called Luna", [turns[ANSWER]], "bob")
    assert agent_search(api, helper, QUESTION, conversation, topK=1) != [ANSWER]
    assert agent_search(api, acting.acting_for("alice"), QUESTION, conversation, topK=1) != [ANSWER]
    # Its own memory about the user it acts for does.
    remember(api, acting, "Alice adopted a grey kitten called Luna", [turns[ANSWER]])
    assert agent_search(api, acting.acting_for("alice"), QUESTION, conversation, topK=1) == [ANSWER]
    assert agent_search(api, other, QUESTION, conversation, topK=1) == [ANSWER]
