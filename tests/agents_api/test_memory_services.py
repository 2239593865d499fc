"""The long-term memory services: one fact is one row, and the database refuses bad rows.

Vectors come from the real local model, so "near-duplicate" means what it will mean in use.
"""

import threading
import uuid
from dataclasses import replace

import numpy as np
import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from agents_api.models import Memory, UserMemorySetting, claims, same_words
from agents_api.selectors import memory_off_for
from agents_api.services import (
    NewMemory,
    memories_embed_pending,
    memories_reembed_all,
    memories_save,
    memory_delete,
    memory_save,
    memory_update,
    user_erase,
)
from conversations.models import Conversation, Message
from memsvc.api.errors import Conflict, InvalidInput, NotFound
from memsvc.api.principals import Principal
from memsvc.db import locked_row
from search.tuning import DEFAULT_TUNING
from tests.db import refused, while_held
from tests.factories import (
    AgentFactory,
    ConversationFactory,
    MembershipFactory,
    MessageFactory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent():
    return AgentFactory(name="helper")


def save(agent, content, user_id="alice", **fields):
    return memory_save(
        agent.as_principal(), agent=agent, user_id=user_id, content=content, **fields
    )


def test_the_same_words_in_another_case_and_spacing_are_one_memory(agent):
    first, created = save(agent, "Alice likes  Python", importance=0.4, tags=["lang", "pref"])
    assert created
    again, created = save(agent, "  alice LIKES python\n", importance=0.9, tags=["pref", "work"])
    assert not created
    assert again.id == first.id
    stored = Memory.objects.get()
    assert stored.content == "Alice likes  Python"  # the first wording stays
    assert stored.importance == 0.9
    assert stored.tags == ["lang", "pref", "work"]
    # Saving it again with a lower importance keeps the higher one.
    save(agent, "alice likes python", importance=0.1)
    assert Memory.objects.get().importance == 0.9


def test_a_memory_deleted_by_another_request_since_it_was_read_is_not_found(agent):
    """Three DELETEs of one memory at once each answered 204 (review): the first deletes
    it, the others find it gone."""
    memory, _ = save(agent, "Alice likes tea")
    Memory.objects.filter(pk=memory.pk).delete()  # (another request's, committed first)
    with pytest.raises(NotFound, match="memory not found"):
        memory_delete(agent.as_principal(), memory=memory)


def test_a_near_duplicate_is_merged_into_the_memory_it_repeats(agent):
    first, _ = save(agent, "Alice's favourite colour is blue.", tags=["colour"])
    again, created = save(agent, "Alice's favorite colour is blue", importance=0.8, tags=["pref"])
    assert not created
    assert again.id == first.id
    assert Memory.objects.get().tags == ["colour", "pref"]


@pytest.mark.parametrize(
    ("kept", "correction"),
    [
        ("The user is allergic to peanuts", "The user is not allergic to peanuts"),
        ("The user's phone number is 555-1234", "The user's phone number is 555-9876"),
        ("User's wifi password is hunter2", "User's wifi password is hunter3"),
        ("Alice doesn't drink coffee", "Alice drinks coffee"),
        ("Henry has two children", "Henry has three children"),  # (review)
        ("Alice is allergic to peanuts", "Alice is allergic to peanuts twice"),
        # (These were merged into the fact they corrected: review.)
        ("Alice is allergic to peanuts", "Alice isn\u2019t allergic to peanuts"),
        ("Alice should take the pill at night", "Alice shouldn\u2019t take the pill at night"),
        ("The flight is at 5pm", "The flight is at 5am"),
        ("Alice has a meeting on Monday", "Alice has a meeting on Tuesday"),
        ("Alice is a smoker", "Alice is a non-smoker"),
        ("Alice is left-handed", "Alice is right-handed"),
        ("Alice exercises before work", "Alice exercises after work"),
        (
            "Alice ist allergisch gegen Erdn\u00fcsse",
            "Alice ist nicht allergisch gegen Erdn\u00fcsse",
        ),
        # (Both merged into the fact they corrected: review.)
        ("Alice's email is alice@example.com", "Alice's email is alice@example.org"),
        ("Alice is allowed to deploy", "Alice is disallowed to deploy"),
        # (Merged into the present they corrected: review.)
        ("Lena is vegetarian", "Lena was vegetarian"),
        ("Lena is vegetarian", "Lena used to be vegetarian"),
        ("Lena isn't vegetarian", "Lena wasn't vegetarian"),  # (code review)
        ("Lena doesn't eat meat", "Lena didn't eat meat"),
        # (Words the model cannot read, one vector for both: merged, the new fact lost; review.)
        (
            "Pim eats \u0e02\u0e49\u0e32\u0e27\u0e1c\u0e31\u0e14 daily",
            "Pim eats \u0e15\u0e49\u0e21\u0e22\u0e33 daily",
        ),
        (
            "Gina's favourite flag is \U0001f1ef\U0001f1f5",
            "Gina's favourite flag is \U0001f1eb\U0001f1f7",
        ),
        ("The wifi password is \U0001f431\U0001f436", "The wifi password is \U0001f98a\U0001f43b"),
    ],
)
def test_a_correction_near_the_fact_it_corrects_is_kept_beside_it(agent, kept, correction):
    """A cosine similarity of 0.95 or more took a changed number or a negation for the same
    fact: the correction was answered with the old fact and never stored."""
    old, _ = save(agent, kept)
    new, created = save(agent, correction)
    assert created and new.id != old.id
    # In one batch alike, and a repeat of either still merges.
    batch = memories_save(
        agent.as_principal(),
        agent=agent,
        user_id="bob",
        memories=[NewMemory(kept), NewMemory(correction), NewMemory(correction + ".")],
    )
    assert [created for _, created in batch] == [True, True, False]
    assert Memory.objects.filter(user_id="bob").count() == 2


@pytest.mark.parametrize(
    "repeat",
    [
        "Jane works as a nurse in Oslo!!",
        "jane works as a nurse in oslo?",
        "Jane works, as a nurse, in Oslo...",
    ],
)
def test_the_same_words_but_for_their_punctuation_are_a_repeat(agent, repeat):
    """Saved again with "!!" (cosine 0.90) it was kept as a second memory (review)."""
    first, _ = save(agent, "Jane works as a nurse in Oslo")
    again, created = save(agent, repeat)
    assert (again.id, created) == (first.id, False)


def test_words_the_model_cannot_read_repeat_a_fact_only_as_they_were(agent):
    """A fact in a script the model has no letters for is told apart by those words (the
    model gave "eats ข้าวผัด" and "eats ต้มยำ" one vector: review), and a repeat of
    the same words in other words around them still merges."""
    first, _ = save(agent, "Pim eats \u0e02\u0e49\u0e32\u0e27\u0e1c\u0e31\u0e14 every day.")
    again, created = save(agent, "Pim eats \u0e02\u0e49\u0e32\u0e27\u0e1c\u0e31\u0e14 daily")
    assert (again.id, created) == (first.id, False)


def test_punctuation_is_ignored_in_a_batch_too_but_no_sign_of_meaning_is(agent):
    # In one batch alike (code review: both were kept).
    batch = [NewMemory("Jane lives in Oslo"), NewMemory("Jane lives in Oslo!!")]
    saved = memories_save(agent.as_principal(), agent=agent, user_id="carol", memories=batch)
    assert [created for _, created in saved] == [True, False]
    assert saved[0][0].id == saved[1][0].id
    # A number's punctuation is its claim: "3.5 km" is no "35 km".
    ran, _ = save(agent, "Jane ran 3.5 km today")
    other, created = save(agent, "Jane ran 35 km today")
    assert created and other.id != ran.id
    # Only sentence punctuation at a word's ends: any other sign is part of the word (a
    # first rule read only letters and digits, and merged these: code review).
    for text, other in [
        ("Bob codes in C#", "Bob codes in C"),
        ("Alice prefers C++", "Alice prefers C"),
        ("blood type A+", "blood type A-"),
        ("The rent is $500", "The rent is €500"),
        ("balance is -50 EUR", "balance is 50 EUR"),
        ("tea > coffee", "tea < coffee"),
        ("!!!", "???"),
        ("वह दिन याद है", "वह दान याद है"),  # (a vowel sign is no letter to \w)
        ("Dose is .5 mg", "Dose is 5 mg"),  # (punctuation that touches a digit: code review)
        ("He is 6' tall", 'He is 6" tall'),
    ]:
        assert not same_words(text, other), text


@pytest.mark.parametrize(
    ("kept", "repeat"),
    [
        ("Dave has two children", "Dave has 2 children"),  # (review)
        ("Dave has 2 children", "Dave has two children"),
        ("Erin has 2 cats and three dogs", "Erin has two cats and 3 dogs"),
    ],
)
def test_a_number_in_digits_or_in_words_is_the_same_number(agent, kept, repeat):
    """A near-duplicate had to write its numbers as the memory it repeats did: "2 children"
    was kept beside "two children" (review)."""
    old, _ = save(agent, kept)
    again, created = save(agent, repeat)
    assert (again.id, created) == (old.id, False)
    assert claims("3 cats and two dogs") != claims("2 cats and three dogs")  # (in order)
    # A fullwidth digit is its number; an invisible character inside one, nothing.
    assert claims("\uff13 cats") == claims("3 cats") == claims("3\u200b cats")
    assert claims("13 cats") != claims("1\u200b 3 cats")
    # An address at the end of a sentence is the address; a trivial variant of a text is the
    # same claims (a hyphenated word, "U.S.", a time or a length written apart: each kept a
    # repeat apart, code review); a word its prefix negates, another address, handle or
    # path, or another compound where both hold one, are not (each merged: code review).
    for text, variant in [
        ("Mail alice@example.com.", "mail (Alice@example.com)"),
        ("a part-time job by e-mail", "a part time job by email"),
        ("lives in the U.S., e.g. Ohio", "lives in the US, eg Ohio"),
        ("ran 3.5km at 5:30pm", "ran 3.5 km at 5:30 pm"),
    ]:
        assert claims(text) == claims(variant), text
    for text, correction in [
        ("site: alice.dev", "site: alice.io"),
        ("is able to swim", "is unable to swim"),
        ("Alice can swim", "Alice is unable to swim"),
        ("notifications are enabled", "notifications are disabled"),
        ("Alice like coffee", "Alice dislikes coffee"),
        ("code at github.com/alice", "code at github.com/bob"),
        ("handle alice_smith", "handle alice_smyth"),
        ("a part-time job", "a full-time job"),
    ]:
        assert claims(text) != claims(correction), text


@pytest.mark.parametrize("way", ["exact", "hnsw"])
def test_a_near_duplicate_is_found_in_a_small_or_a_large_store(agent, settings, way):
    # A large scope (an agent's own store of many memories) is searched on the HNSW graph,
    # a small one exactly: both find the fact the new memory repeats.
    exact = way == "exact"
    settings.SEARCH_TUNING = replace(
        DEFAULT_TUNING,
        exact_search_below=10**9 if exact else 0,
        hnsw_cost_per_exact=10**9 if exact else 0,
    )
    for index, colour in enumerate(["red", "green", "yellow", "purple"]):
        save(agent, f"Fact {index}: the user's car is {colour}.", user_id="")
    first, _ = save(agent, "Alice's favourite colour is blue.", user_id="")
    again, created = save(agent, "Alice's favorite colour is blue", user_id="")
    assert (again.id, created) == (first.id, False)


def test_a_different_fact_in_similar_words_is_kept_apart(agent):
    save(agent, "Alice's favourite colour is blue.")
    _, created = save(agent, "Alice's favourite colour is green.")
    assert created
    assert Memory.objects.count() == 2


def test_a_long_text_alike_in_its_first_words_is_another_fact(agent):
    """A vector reads a text's first 256 tokens: two texts alike in their first 250 words were
    one near-duplicate (cosine 1.0), and the second's fact was dropped (review). A long text
    repeats another only in the same words (here up to case and spacing)."""
    routine = " ".join(
        ["Yara wakes early, walks her dog along the river, reads the news and joins a call."] * 20
    )
    first, created = save(agent, routine + " Her favourite food is sushi.")
    assert created
    second, created = save(agent, routine + " She is severely allergic to shellfish.")
    assert created and second.pk != first.pk
    again, created = save(agent, routine.upper() + "  HER FAVOURITE FOOD IS SUSHI.")
    assert not created and again.pk == first.pk
    assert Memory.objects.count() == 2
    # Fewer characters, more tokens: a Hangul syllable is two or three of them (code review).
    korean = "유나는 아침 일찍 일어나서 강가를 따라 개를 산책시키고 뉴스를 읽습니다. " * 4
    assert len(korean) < 200
    allergy, created = save(agent, korean + "그리고 땅콩 알레르기가 있습니다")
    assert created
    cats, created = save(agent, korean + "그리고 고양이를 좋아합니다")
    assert created and cats.pk != allergy.pk


def test_a_text_of_one_long_word_is_read_in_time(agent):
    """The claims' patterns were tried at every letter of a run: a word of 20,000 letters
    took 7 s, one of 100,000 its web worker's life, while the agent's other saves waited for
    its lock (review). (Milliseconds now; the bound only tells linear from quadratic.)"""
    import time

    for text in ("y" * 100_000, "a." * 50_000, "a-" * 50_000, "x@" * 50_000):
        started = time.monotonic()
        claims(text)
        assert time.monotonic() - started < 2, text[:4]
    memory, created = save(agent, "dna " + "acgt" * 24_000)
    assert created and memory.content.startswith("dna acgt")


def test_memories_of_other_users_or_other_agents_never_merge(agent):
    other_agent = AgentFactory(name="other")
    results = [
        save(agent, "Likes tea", user_id="alice"),
        save(agent, "Likes tea", user_id="bob"),
        save(agent, "Likes tea", user_id=""),  # the agent's own
        save(other_agent, "Likes tea", user_id="alice"),
        # Near-duplicates across users do not merge either.
        save(agent, "Alice's favourite colour is blue.", user_id="alice"),
        save(agent, "Alice's favorite colour is blue", user_id="bob"),
    ]
    assert all(created for _, created in results)
    assert Memory.objects.count() == 6


def test_a_batch_that_repeats_itself_is_merged_inside(agent):
    saved = memories_save(
        agent.as_principal(),
        agent=agent,
        user_id="alice",
        memories=[
            NewMemory("Works at ACME", importance=0.3, tags=["job"]),
            NewMemory("Has a dog called Rex"),
            NewMemory("works at  acme", importance=0.7, tags=["company"]),
            NewMemory("Alice's favourite colour is blue."),
            NewMemory("Alice's favorite colour is blue"),
        ],
    )
    assert [created for _, created in saved] == [True, True, False, True, False]
    assert saved[2][0].id == saved[0][0].id
    assert saved[4][0].id == saved[3][0].id
    assert Memory.objects.count() == 3
    acme = Memory.objects.get(content="Works at ACME")
    assert (acme.importance, acme.tags) == (0.7, ["job", "company"])


def test_a_batch_costs_the_same_statements_whatever_its_size(agent):
    """A batch is looked up, checked for near-duplicates and inserted in a few statements,
    not several per memory (a hundred memories were 700 statements: half a batch's time)."""
    memory_save(agent.as_principal(), agent=agent, user_id="alice", content="Alice keeps bees")

    things = ["tea", "chess", "Lisbon", "violins", "rain", "Rust", "bees", "tango", "oats"]

    def statements_to_save(count, start):
        batch = [
            NewMemory(f"{things[n % 9]} and {things[n // 9 % 9]}, {things[n // 81]} ({n})")
            for n in range(start, start + count)
        ]
        with CaptureQueriesContext(connection) as saved:
            memories_save(agent.as_principal(), agent=agent, user_id="alice", memories=batch)
        return len(saved.captured_queries)

    few = statements_to_save(3, 0)
    # (One more when some are farther but might say the same words: their texts read at
    # once, ``_stored_near_duplicates``.)
    assert statements_to_save(60, 3) in (few, few + 1)
    # (Texts that differ only in their number are not near-duplicates: ``claims``.)
    assert Memory.objects.count() == 1 + 3 + 60


def test_a_text_repeating_an_earlier_new_fact_and_a_stored_one_joins_the_nearer(agent):
    stored, _ = save(agent, "Alice's favourite colour is blue.")
    saved = memories_save(
        agent.as_principal(),
        agent=agent,
        user_id="alice",
        memories=[
            NewMemory("Alice's favourite colour is blue!!! (she said so twice)"),
            NewMemory("Alice's favorite colour is blue"),
        ],
    )
    # The second is nearer to the stored memory than to the batch's first text (itself a
    # new fact: it said more): each joins the one it repeats.
    [(first, first_created), (second, second_created)] = saved
    assert first_created and first.id != stored.id
    assert (second.id, second_created) == (stored.id, False)


@pytest.mark.django_db(transaction=True)
def test_a_batch_whose_new_text_was_committed_meanwhile_merges_into_that_row():
    """An update gives a memory the words a batch is storing (the batch's insert waits on
    it, then collides): the batch's saves of those words, twice, are merged into that row,
    and the batch's other fact is stored."""
    agent = AgentFactory(name="busy")
    coffee, _ = save(agent, "Likes coffee", importance=0.2)
    with transaction.atomic():
        memory_update(agent.as_principal(), memory=coffee, content="Likes tea")
        saver, saving = saved_meanwhile(agent, "likes TEA", "Has a cat", "LIKES tea")
        saver.join(timeout=1.0)
        assert saver.is_alive()  # its insert waits on the updated row's words
    saver.join(timeout=10)
    tea, cat, tea_again = saving["saved"]
    assert (tea[0].id, tea[1]) == (coffee.id, False)
    assert (tea_again[0].id, tea_again[1]) == (coffee.id, False)
    assert cat[1]
    assert sorted(Memory.objects.values_list("content", flat=True)) == ["Has a cat", "Likes tea"]


def test_saved_memories_carry_a_vector_of_the_configured_model(agent):
    memory, _ = save(agent, "Alice lives in Lisbon")
    memory.refresh_from_db()
    assert memory.embedding_model == "all-MiniLM-L6-v2@int8"
    assert len(memory.embedding) == 384
    assert memory.embedded_at is not None


@pytest.mark.django_db(transaction=True)
def test_the_same_fact_saved_twice_at_once_is_one_memory():
    """The second save waits on the unique content hash until the first commits, then
    merges into the row it can now see; neither fails."""
    agent = AgentFactory(name="busy")
    outcome = {}

    def save_again():
        try:
            outcome["second"] = save(agent, "likes TEA", importance=0.9, tags=["drink"])
        except Exception as exc:  # the test's point: it must not fail
            outcome["second"] = exc
        finally:
            connection.close()

    with transaction.atomic():
        first, created = save(agent, "Likes tea", tags=["pref"])
        assert created
        second_save = threading.Thread(target=save_again)
        second_save.start()
        second_save.join(timeout=1.0)
        assert second_save.is_alive()  # waiting for the first save's row
    second_save.join(timeout=10)

    memory, created = outcome["second"]
    assert (memory.id, created) == (first.id, False)
    stored = Memory.objects.get()
    assert (stored.importance, stored.tags) == (0.9, ["pref", "drink"])


def saved_meanwhile(agent, *contents) -> tuple[threading.Thread, dict]:
    """A batch of ``contents`` saved on another connection, started now."""
    outcome = {}

    def save_batch():
        try:
            outcome["saved"] = memories_save(
                agent.as_principal(),
                agent=agent,
                user_id="alice",
                memories=[NewMemory(content=content) for content in contents],
            )
        except Exception as exc:  # the test's point: it must not fail
            outcome["saved"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=save_batch)
    thread.start()
    return thread, outcome


@pytest.mark.django_db(transaction=True)
def test_two_batches_of_the_same_facts_in_another_order_both_succeed():
    """Saved row by row, each batch would hold one fact's row and wait for the other's (a
    deadlock: one of them failed). Saves of one agent's memories about one user take turns."""
    agent = AgentFactory(name="busy")
    with transaction.atomic():
        save(agent, "Alice likes tea")
        other, outcome = saved_meanwhile(agent, "Alice likes jazz", "Alice likes tea")
        other.join(timeout=1.0)
        assert other.is_alive()  # its turn comes when this transaction ends
        save(agent, "Alice likes jazz")
    other.join(timeout=10)
    assert [created for _, created in outcome["saved"]] == [False, False]
    assert sorted(Memory.objects.values_list("content", flat=True)) == [
        "Alice likes jazz",
        "Alice likes tea",
    ]


@pytest.mark.django_db(transaction=True)
def test_a_change_and_a_save_into_the_same_memory_take_their_locks_in_one_order():
    """A save holds the user's memory setting, then the memory it merges into; a change of
    that memory took its row first, then the setting: each held what the other waited for
    (a deadlock: one of them a 503; code review). Here this transaction is a save between
    its two locks, and the change must not hold the row meanwhile."""
    agent = AgentFactory(name="busy")
    first, _ = save(agent, "Alice drinks green tea")
    UserMemorySetting.objects.create(user_id="alice", memory_enabled=True)  # (off, then on)
    outcome = {}

    def change():
        try:
            outcome["changed"] = memory_update(agent.as_principal(), memory=first, importance=0.7)
        except Exception as exc:  # the test's point: it must not fail
            outcome["changed"] = exc
        finally:
            connection.close()

    with transaction.atomic():
        memory_off_for(["alice"], lock=True)  # (a save's first lock)
        other = threading.Thread(target=change)
        other.start()
        other.join(timeout=1.0)
        assert other.is_alive()  # waiting for the setting
        locked_row(
            Memory.objects, first.pk, missing="gone"
        )  # (a save's next: the memory it merges into)
    other.join(timeout=10)
    assert outcome["changed"].importance == 0.7
    assert Memory.objects.get().importance == 0.7


@pytest.mark.django_db(transaction=True)
def test_a_near_duplicate_saved_at_the_same_time_is_one_memory():
    agent = AgentFactory(name="busy")
    with transaction.atomic():
        first, _ = save(agent, "Carol's favourite colour is green.")
        other, outcome = saved_meanwhile(agent, "Carol's favourite colour is green!")
        other.join(timeout=1.0)
        assert other.is_alive()
    other.join(timeout=10)
    [(memory, created)] = outcome["saved"]
    assert (memory.id, created) == (first.id, False)
    assert Memory.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_near_duplicate_of_a_memory_deleted_meanwhile_is_saved_as_new():
    """The memory it repeats is deleted (by its user, or the prune) while the save waits for
    its row: the fact is stored anew, not a 500 (it was ``Memory.DoesNotExist``)."""
    agent = AgentFactory(name="busy")
    first, _ = save(agent, "Carol's favourite colour is green.")
    with transaction.atomic():
        Memory.objects.filter(id=first.id).delete()
        other, outcome = saved_meanwhile(agent, "Carol's favourite colour is green!")
        other.join(timeout=1.0)
        assert other.is_alive()  # waiting for the deleted row
    other.join(timeout=10)
    [(memory, created)] = outcome["saved"]
    assert created and memory.id != first.id
    assert list(Memory.objects.values_list("content", flat=True)) == [
        "Carol's favourite colour is green!"
    ]


@pytest.mark.django_db(transaction=True)
def test_a_near_duplicate_of_a_memory_changed_meanwhile_is_measured_again():
    """The memory it repeats gets another content (a PATCH) while the save waits for its
    row: the save was merged into whatever the row had become, answered with that
    unrelated text, and its own fact stored nowhere (review: 27 of 60 tries). Now the row
    is measured as it is once locked: no longer near, the fact is new."""
    agent = AgentFactory(name="busy")
    first, _ = save(agent, "Carol's favourite colour is green.")
    with transaction.atomic():
        memory_update(agent.as_principal(), memory=first, content="Quantum harmonica orbit")
        other, outcome = saved_meanwhile(agent, "Carol's favourite colour is green!")
        other.join(timeout=1.0)
        assert other.is_alive()  # waiting for the row being changed
    other.join(timeout=10)
    [(memory, created)] = outcome["saved"]
    assert created and memory.id != first.id, memory
    assert sorted(Memory.objects.values_list("content", "tags")) == [
        ("Carol's favourite colour is green!", []),
        ("Quantum harmonica orbit", []),
    ]


@pytest.mark.parametrize(
    ("fields", "constraint"),
    [
        ({"content": "fine", "importance": 1.5}, "memory_importance_0_1"),
        ({"content": "fine", "importance": -0.1}, "memory_importance_0_1"),
        ({"content": ""}, "memory_content_not_empty"),
    ],
)
def test_the_database_refuses_what_the_api_should_have(agent, fields, constraint):
    # The API validates first; these reach the database only through a bug, and stop there.
    with refused(IntegrityError, match=constraint):
        save(agent, **fields)
    assert Memory.objects.count() == 0


def test_merging_an_invalid_importance_is_refused_too(agent):
    save(agent, "Likes tea", importance=0.5)
    with refused(IntegrityError, match="memory_importance_0_1"):
        save(agent, "likes tea", importance=2.0)
    assert Memory.objects.get().importance == 0.5


def test_an_update_to_content_the_agent_already_keeps_is_a_conflict(agent):
    save(agent, "Likes tea")
    coffee, _ = save(agent, "Likes coffee")
    with pytest.raises(Conflict):
        memory_update(agent.as_principal(), memory=coffee, content="likes TEA")
    with refused(IntegrityError, match="memory_importance_0_1"):
        memory_update(agent.as_principal(), memory=coffee, importance=3.0)
    assert Memory.objects.get(pk=coffee.pk).content == "Likes coffee"


def test_a_fact_found_again_and_again_keeps_its_newest_citations(agent):
    conversation = ConversationFactory(group__owner="alice")
    MembershipFactory(group=conversation.group, principal_id=agent.as_principal().id)
    turns = [MessageFactory(conversation=conversation).id for _ in range(101)]
    first, _ = save(agent, "Alice likes tea", message_ids=turns[:100])
    again, created = save(agent, "alice likes tea", message_ids=[turns[100], turns[5]])
    assert not created and again.id == first.id
    assert Memory.objects.get(id=first.id).message_ids == turns[1:]


def test_a_re_embedding_never_gives_a_memory_the_vector_of_its_old_content(agent):
    """`memsvc reindex --all` embeds a batch, then writes it: a memory changed meanwhile (a
    PATCH with its own new vector) kept the vector of the words it had before."""
    from search.embeddings import configured_backend

    memory, _ = save(agent, "Alice keeps bees")
    model = configured_backend()

    class ChangedMeanwhile:
        """The model, while the memory's content is changed by someone else."""

        def __init__(self):
            self.model = model.model

        def embed(self, texts):
            vectors = model.embed(texts)
            memory_update(agent.as_principal(), memory=memory, content="Alice sails boats")
            return vectors

    memories_reembed_all(backend=ChangedMeanwhile())
    memory.refresh_from_db()
    [sails] = model.embed(["Alice sails boats"])
    assert memory.content == "Alice sails boats"
    assert float(np.dot(memory.embedding, sails)) > 0.99


@pytest.mark.django_db(transaction=True)
def test_an_update_embeds_its_new_content_outside_its_transaction(monkeypatch):
    """The model's time held the memory's row lock (and the user's setting's): a change of
    content is embedded first, as a save is, and written with the vector of its words."""
    from search.embeddings import configured_backend

    agent = AgentFactory(name="busy")
    memory, _ = save(agent, "Alice keeps bees")
    model = configured_backend()
    in_transaction = []

    class Watched:
        """The model (outside memsvc), noting whether it is called inside a transaction."""

        def __init__(self):
            self.model = model.model

        def embed(self, texts):
            in_transaction.append(connection.in_atomic_block)
            return model.embed(texts)

    monkeypatch.setattr("search.services.configured_backend", lambda: Watched())
    updated = memory_update(agent.as_principal(), memory=memory, content="Alice sails boats")
    assert in_transaction == [False]
    [sails] = model.embed(["Alice sails boats"])
    assert (updated.content, updated.embedding_model) == ("Alice sails boats", model.model)
    assert float(np.dot(updated.embedding, sails)) > 0.99


def test_an_update_whose_memory_changed_since_it_was_read_leaves_the_vector_to_the_sweep(
    agent,
):
    """The caller read the memory holding the words it asks for, so nothing was embedded;
    another request changed them meanwhile: the words asked for are written, without the
    other words' vector, and the sweep embeds them."""
    from search.embeddings import configured_backend

    memory, _ = save(agent, "Alice keeps bees")
    as_read = Memory.objects.get(pk=memory.pk)
    memory_update(agent.as_principal(), memory=memory, content="Alice sails boats")
    updated = memory_update(agent.as_principal(), memory=as_read, content="Alice keeps bees")
    assert (updated.content, updated.embedding, updated.embedded_at) == (
        "Alice keeps bees",
        None,
        None,
    )
    assert memories_embed_pending() == 1
    updated.refresh_from_db()
    [bees] = configured_backend().embed(["Alice keeps bees"])
    assert float(np.dot(updated.embedding, bees)) > 0.99


@pytest.mark.django_db(transaction=True)
def test_a_save_whose_colliding_row_vanishes_before_the_merge_stores_the_fact(monkeypatch):
    """Three requests at once: an update gives memory X the words a save is storing (the
    save's insert waits on X, then collides with it), and a delete of X takes X's row
    before the save can lock it to merge. The save found nothing to merge into (a 500:
    ``_merge(None)``): it stores the fact.

    When the update commits, PostgreSQL wakes the save and the delete in an order of its
    own: the save's look for the colliding row waits here until the delete has taken it
    (had the save been woken second, its insert waits on the delete instead; the fact
    must be stored either way)."""
    from agents_api.services import memories

    agent = AgentFactory(name="busy")
    coffee, _ = save(agent, "Likes coffee")
    deleting = {}
    deleted = threading.Event()
    commit_delete = threading.Event()
    live_by_hash = memories._live_by_hash

    def after_the_delete(*args):
        deleted.wait(timeout=10)
        return live_by_hash(*args)

    monkeypatch.setattr(memories, "_live_by_hash", after_the_delete)

    def delete_coffee():
        try:
            with transaction.atomic():
                deleting["count"] = Memory.objects.filter(id=coffee.id).delete()[0]
                deleted.set()
                commit_delete.wait(timeout=10)
        finally:
            connection.close()

    with transaction.atomic():
        memory_update(agent.as_principal(), memory=coffee, content="Likes tea")
        saver, saving = saved_meanwhile(agent, "likes TEA")
        saver.join(timeout=1.0)
        assert saver.is_alive()  # its insert waits on the updated row's words
        deleter = threading.Thread(target=delete_coffee)
        deleter.start()
        deleter.join(timeout=1.0)
        assert deleter.is_alive()  # waiting for the updated row
    # The update commits: the delete takes the row first (the save's collision comes back
    # to it as an error, then it looks for the row), and holds it until told.
    assert deleted.wait(timeout=10)
    saver.join(timeout=1.0)
    assert saver.is_alive()  # waiting for the deleted row
    commit_delete.set()
    deleter.join(timeout=10)
    saver.join(timeout=10)
    assert deleting["count"] == 1
    [(memory, created)] = saving["saved"]
    assert created and memory.content == "likes TEA"
    assert list(Memory.objects.values_list("content", flat=True)) == ["likes TEA"]


def alice_turn_seen_by(agent):
    """A turn of Alice's, in her conversation, which ``agent`` (a member) may cite."""
    with transaction.atomic():  # (a group has its owner by the time it commits)
        conversation = ConversationFactory(group__owner="alice")
        MembershipFactory(group=conversation.group, principal_id=agent.as_principal().id)
        return MessageFactory(conversation=conversation, author_principal="alice")


def cite(agent, turn, way: str, kept: Memory | None):
    """The agent's own memory citing ``turn``: saved anew, or ``kept`` updated to cite it;
    the refusal, if it is one."""
    try:
        if way == "save":
            return save(agent, "Alice asked about bees", user_id="", message_ids=[turn.id])
        return memory_update(agent.as_principal(), memory=kept, message_ids=[turn.id])
    except InvalidInput as exc:
        return exc


def citing_a_missing_message() -> list:
    """The memories citing a message that is gone (an erase strips them: none may be left)."""
    existing = set(Message.objects.values_list("id", flat=True))
    return [m.id for m in Memory.objects.all() if set(m.message_ids) - existing]


@pytest.mark.parametrize("way", ["save", "update"])
@pytest.mark.django_db(transaction=True)
def test_a_memory_citing_a_turn_erased_meanwhile_is_refused(way):
    """Alice's erase has deleted her turn, not yet committed, when the agent cites it: the
    write saw the turn (checked before its transaction) and stored its id after the erase
    had stripped it from every memory (``memory_citations_forget``): a memory cited a
    message that no longer exists. The write waits for the erase, then finds the turn
    gone: 400 ``messageIds``, nothing written."""
    agent = AgentFactory(name="busy")
    turn = alice_turn_seen_by(agent)
    kept = save(agent, "Alice asked about wasps", user_id="")[0] if way == "update" else None

    cited = while_held(
        lambda: user_erase(Principal.user("alice"), confirm="alice"),
        lambda: cite(agent, turn, way, kept),
    )
    assert citing_a_missing_message() == []
    assert isinstance(cited, InvalidInput), cited
    assert cited.details == {"messageIds": [f"no such message: {turn.id}"]}
    assert list(Memory.objects.values_list("content", "message_ids")) == (
        [("Alice asked about wasps", [])] if kept else []
    )


@pytest.mark.parametrize("way", ["save", "update"])
@pytest.mark.django_db(transaction=True)
def test_an_erase_waits_for_a_memory_citing_its_turn_then_strips_the_citation(way):
    """The other order: the agent's write citing Alice's turn has not committed when she
    erases her data. The erase's cleanup could not see the memory (not yet committed) and
    left it citing the deleted turn. The erase waits for the write (the turn is held), then
    strips the citation; the memory, the agent's own, stays."""
    agent = AgentFactory(name="busy")
    turn = alice_turn_seen_by(agent)
    kept = save(agent, "Alice asked about bees", user_id="")[0] if way == "update" else None
    written = {}

    def write():
        written["memory"] = cite(agent, turn, way, kept)

    erased = while_held(write, lambda: user_erase(Principal.user("alice"), confirm="alice"))
    assert citing_a_missing_message() == []
    assert erased.messages == 1
    memory = written["memory"] if kept else written["memory"][0]
    assert list(Memory.objects.values_list("id", "message_ids")) == [(memory.id, [])]


@pytest.mark.django_db(transaction=True)
def test_a_memory_citing_turns_of_two_conversations_and_their_erase_both_succeed():
    """A memory cites Alice's turn in Bob's conversation and one in hers. Her erase deleted
    her conversation's turns, then waited for Bob's conversation (here, another writer in
    it) before locking her turn there; the save, meanwhile, held that turn and waited for
    the other: each waited for the other (a deadlock, one of them a 503). The erase locks
    every turn it deletes at once, in the order the save holds them: the save goes first,
    and the erase then strips its citations."""
    agent = AgentFactory(name="busy")
    principal = agent.as_principal().id
    with transaction.atomic():
        bobs = ConversationFactory(group__owner="bob")
        MembershipFactory(group=bobs.group, principal_id="alice", access_level="writer")
        MembershipFactory(group=bobs.group, principal_id=principal)
        hers = ConversationFactory(group__owner="alice")
        MembershipFactory(group=hers.group, principal_id=principal)
        # Ids in the order the save holds them: the turn in Bob's conversation first.
        in_bobs = MessageFactory(id=uuid.UUID(int=1), conversation=bobs)
        in_hers = MessageFactory(id=uuid.UUID(int=2**128 - 1), conversation=hers)
    outcome = {}

    def run(name, work):
        try:
            outcome[name] = work()
        except Exception as exc:  # the test's point: neither fails
            outcome[name] = exc
        finally:
            connection.close()

    erase = threading.Thread(
        target=run, args=("erase", lambda: user_erase(Principal.user("alice"), confirm="alice"))
    )
    saving = threading.Thread(
        target=run,
        args=(
            "save",
            lambda: save(agent, "Alice and Bob", "", message_ids=[in_bobs.id, in_hers.id]),
        ),
    )
    with transaction.atomic():
        list(Conversation.objects.select_for_update().filter(pk=bobs.pk))  # Bob writes
        erase.start()
        erase.join(timeout=1.0)
        assert erase.is_alive()  # waiting for Bob's conversation
        saving.start()
        saving.join(timeout=1.5)
    erase.join(timeout=10)
    saving.join(timeout=10)
    assert not isinstance(outcome["erase"], Exception), outcome["erase"]
    assert not isinstance(outcome["save"], Exception), outcome["save"]
    assert outcome["erase"].messages == 2
    assert citing_a_missing_message() == []
    assert list(Memory.objects.values_list("message_ids", flat=True)) == [[]]
