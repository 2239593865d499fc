"""What a query says besides its words (``search.queries``), and how search uses it: a
question asking several things is searched part by part, a date it names favours the
messages written then, a person it names the turns they wrote (and weighs less in its
vector), and the turns next to a match may join the results."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from conversations.models import Visibility
from memsvc.db import TEXT_SEARCH_CONFIG
from search import engine, ranking
from search.queries import (
    STOP_WORDS,
    exclusions,
    names,
    parts,
    periods,
    within,
    without_names,
    words,
)
from search.services import embed_pending
from search.tuning import DEFAULT_TUNING, FEEDBACK_TUNING, configured_tuning
from tests.factories import ConversationFactory, MessageFactory
from tests.search.test_search import contents, search, tuned

NOW = datetime(2026, 11, 23, 15, 30, tzinfo=UTC)  # a Monday


def days(first: datetime, end: datetime) -> tuple:
    return first.date(), end.date()


def test_a_dash_before_a_word_or_phrase_excludes_it_as_websearch_reads_it():
    assert exclusions("cake -chocolate") == ("cake", ["chocolate"])
    assert exclusions('well-known -"birthday cake" party') == (
        "well-known party",
        ['"birthday cake"'],
    )
    assert exclusions('"ls -la" options -verbose') == ('"ls -la" options', ["verbose"])
    # A number's sign, a dash standing alone or inside a quoted phrase, and a query of
    # exclusions alone exclude nothing.
    for text in ["-5 degrees in Oslo", "a - b", "-chocolate", 'run "ls -la"']:
        assert exclusions(text) == (text, [])
    # Read as the words index reads it: a zero-width space before the dash draws nothing.
    assert exclusions("information \u200b-desk") == ("information", ["desk"])
    # A run of "-" is one, as PostgreSQL is given it.
    for text in ["cake --chocolate", "cake -\u200b-chocolate", "cake - -chocolate"]:
        assert exclusions(text) == ("cake", ["chocolate"]), text


def test_a_question_splits_into_its_sentences_and_clauses():
    assert parts("Where did Anna go on holiday? What did Ben cook?") == [
        "Where did Anna go on holiday?",
        "What did Ben cook?",
    ]
    assert parts("Where did Anna go on holiday, and what did Ben cook for dinner?") == [
        "Where did Anna go on holiday",
        "and what did Ben cook for dinner?",
    ]
    assert parts("What did Anna cook for Ben?") == ["What did Anna cook for Ben?"]
    # A fragment too short to ask anything stays with the part before it.
    assert parts("What did Anna cook? And why?") == ["What did Anna cook? And why?"]
    assert parts("Anna cooked rice ; Ben cooked pasta") == ["Anna cooked rice", "Ben cooked pasta"]


def test_a_long_text_is_split_in_a_time_its_length_bounds():
    """The text of a context is someone's message, up to 100,000 characters: its clause
    breaks were looked for from every blank of a run, 80,000 spaces took 20 s (review).
    (Milliseconds now; the bound only tells linear from quadratic.)"""
    import time

    for text in ("a" + " " * 80_000 + "b", "May 2020 " + "\t" * 80_000 + "x"):
        started = time.monotonic()
        parts(text)
        assert time.monotonic() - started < 2


def test_a_long_text_naming_months_again_and_again_is_read_in_time():
    """Each year was looked for among every month named before it, and every month named
    again made its spans again: a context's text (someone's message) of "May 2020" 9,000
    times took 4.5 s, and each row ranked was looked for in thousands of spans (review)."""
    import time

    started = time.monotonic()
    assert len(periods("May 2020, " * 9_000 + "in 2021", NOW)) == 2
    assert len(periods("in may " * 12_000, NOW)) == 11  # (a May of each of eleven years)
    assert time.monotonic() - started < 2


def test_relative_dates_resolve_against_the_moment_of_the_search():
    assert [days(*p) for p in periods("what did we say yesterday", NOW)] == [
        (datetime(2026, 11, 22).date(), datetime(2026, 11, 23).date())
    ]
    # Last week: Monday to Monday before this week's.
    assert [days(*p) for p in periods("Where did we go last week?", NOW)] == [
        (datetime(2026, 11, 16).date(), datetime(2026, 11, 23).date())
    ]
    assert [days(*p) for p in periods("the talk 3 days ago", NOW)] == [
        (datetime(2026, 11, 19).date(), datetime(2026, 11, 22).date())
    ]
    assert [days(*p) for p in periods("What did Nate win in November 2022?", NOW)] == [
        (datetime(2022, 11, 1).date(), datetime(2022, 12, 1).date())
    ]
    june = periods("When did Melanie go camping in June?", NOW)
    assert (datetime(2023, 6, 1, tzinfo=UTC), datetime(2023, 7, 1, tzinfo=UTC)) in june
    assert all(start.month == 6 for start, _ in june)
    assert periods("Caroline may go camping", NOW) == []  # the verb
    # Month names that are words too count as months only as months are written (review).
    for word in (
        "May I ask about Kyoto?",
        "I will march on",
        "Do you jan",
        "I saw a dec",
        "What did Jan say about Dec?",  # (names)
    ):
        assert periods(word, NOW) == [], word
    for month, said in [
        (5, "What did we plan for May?"),
        (5, "what happened in may"),
        (3, "Anything about March?"),
        (12, "the party in dec"),
        (12, "Dec 2022 plans"),
        (1, "Jan. meetings"),
        (9, "the Sept. trip"),
        (1, "the Jan 5th meeting"),
        (1, "What happened in Jan?"),
    ]:
        found = periods(said, NOW)
        assert found and all(start.month == month for start, _ in found), said
    assert periods("What did Anna cook?", NOW) == []
    # Before any message (and before the calendar, for Python's dates): no time at all.
    for far in ("3000000 days ago", "999999999 weeks ago", "100000 years ago"):
        assert periods(f"what did we say {far}", NOW) == []
    assert len(periods("what did we say 150 years ago", NOW)) == 1


def test_a_moment_within_a_period_or_its_slack_after_it():
    [june] = periods("in June 2023", NOW)
    assert within(datetime(2023, 6, 30, tzinfo=UTC), [june], slack=timedelta(0))
    assert not within(datetime(2023, 7, 3, tzinfo=UTC), [june], slack=timedelta(0))
    assert within(datetime(2023, 7, 3, tzinfo=UTC), [june], slack=timedelta(days=7))
    assert not within(None, [june], slack=timedelta(days=7))


def test_the_turn_next_to_a_match_joins_with_a_share_of_its_score():
    scores = {"b": 1.0, "x": 0.5}
    neighbours = {"b": ("a", "c"), "x": ("c", None)}
    expanded = ranking.with_neighbours(scores, neighbours, weight=0.2, expansion=0.5)
    assert expanded["a"] == pytest.approx(0.5)
    assert expanded["c"] == pytest.approx(0.5)  # the best of its two candidate neighbours
    assert expanded["b"] == pytest.approx(1.0)
    assert "a" not in ranking.with_neighbours(scores, neighbours, weight=0.2)


def test_the_best_of_several_rankings_weighted():
    assert ranking.best_of([{"a": 1.0, "b": 0.2}, {"b": 0.9}], [1.0, 0.5]) == {
        "a": 1.0,
        "b": pytest.approx(0.45),
    }


HOLIDAY = [
    "Anna spent her summer holiday in Lisbon, walking the old town every day",
    "Anna said the holiday in Lisbon was the best holiday she ever had",
    "Anna posted holiday photos from Lisbon and the beaches near it",
    "Anna wants to go back to Lisbon for another holiday next summer",
]
DINNER = "Ben made a mushroom risotto"


@pytest.mark.django_db
def test_the_words_that_name_no_one_are_those_the_keyword_index_drops():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT w FROM unnest(%s::text[]) w WHERE to_tsvector(%s, w) <> ''::tsvector",
            [sorted(STOP_WORDS), TEXT_SEARCH_CONFIG],
        )
        assert cursor.fetchall() == []
        cursor.execute("SELECT to_tsvector(%s, 'doctor') <> ''::tsvector", [TEXT_SEARCH_CONFIG])
        assert cursor.fetchone() == (True,)


def alices_turns(alice, *texts: str) -> None:
    """A conversation of alice's holding ``texts`` as her turns, embedded."""
    conversation = ConversationFactory(group__owner=alice.id)
    for text in texts:
        MessageFactory(conversation=conversation, author_name="alice", content=text)
    embed_pending()


@pytest.mark.django_db
def test_a_question_in_two_parts_finds_the_evidence_of_both(api, alice, settings):
    alices_turns(alice, *HOLIDAY, "The weather was grey all week", DINNER, "Nothing else happened")
    question = "Where did Anna spend her summer holiday? What did Ben cook for dinner?"
    # (Seven turns: every word is in fewer rows than the privacy floor of the weights, which
    # would weigh them all alike; in a service of any size the floor is far below them.)
    tuned(settings, query_parts=0, document_count_floor=0)
    assert DINNER not in contents(search(api, alice, question, topK=3))
    tuned(settings, query_parts=3, document_count_floor=0)
    found = contents(search(api, alice, question, topK=3))
    assert HOLIDAY[0] in found and DINNER in found


@pytest.mark.django_db
def test_a_relative_date_favours_the_messages_written_then(api, alice, settings):
    conversation = ConversationFactory(group__owner=alice.id)
    for text in ["I bought new running shoes", "The cat slept all afternoon"]:
        MessageFactory(conversation=conversation, author_name="alice", content=text)
    now = timezone.now()
    monday = now - timedelta(days=now.weekday())
    older = MessageFactory(
        conversation=conversation,
        author_name="alice",
        content="We went swimming in the lake again",
        created_at=monday - timedelta(days=40),
    )
    last_week = MessageFactory(
        conversation=conversation,
        author_name="alice",
        content="We went swimming in the lake",
        created_at=monday - timedelta(days=4),
    )
    embed_pending()
    question = "Where did we go swimming last week?"
    tuned(settings, date_weight=0.0)
    assert contents(search(api, alice, question, topK=1)) == [older.content]
    settings.SEARCH_TUNING = DEFAULT_TUNING  # dates count by default
    assert contents(search(api, alice, question, topK=1)) == [last_week.content]


@pytest.mark.django_db
def test_context_expansion_never_shows_a_turn_outside_the_scope(api, alice, settings):
    conversation = ConversationFactory(group__owner=alice.id)
    MessageFactory(conversation=conversation, content="Did you see the zebra?")
    MessageFactory(conversation=conversation, content="agent note", visibility=Visibility.AGENT)
    MessageFactory(conversation=conversation, content="yes, a big one")
    embed_pending()
    tuned(settings, expansion_weight=0.9)
    found = contents(search(api, alice, "zebra", topK=5))
    assert "Did you see the zebra?" in found
    assert "agent note" not in found


def test_a_query_names_an_author_by_every_word_of_the_name():
    asked = words("What did Melanie's friend Ann Lee paint?")
    assert names("Melanie", asked) and names("ann lee", asked) and names("Ann  Lee", asked)
    assert not names("Ann Smith", asked)
    assert not names("", asked) and not names(None, asked)
    assert not names("Mel", asked)  # a word, not a prefix
    # Words that name no one: an author called "What did" is not named by every question.
    assert not names("What did", asked) and not names("I", words("what did I say?"))
    assert names("The Doctor", words("what did the doctor say?"))
    assert names("Will", words("what will Will bring?"))  # a stop word, and a name


@pytest.mark.django_db
def test_a_turn_by_the_person_a_query_names_ranks_higher(api, alice, settings):
    conversation = ConversationFactory(group__owner=alice.id)
    for author, text in [
        # Names Melanie too (the author's name is in a turn's words as well).
        ("Caroline", "Melanie and I painted the lake at sunset"),
        ("Melanie", "I painted some flowers"),
        ("Caroline", "The weather was lovely"),
    ]:
        MessageFactory(conversation=conversation, author_name=author, content=text)
    embed_pending()
    question = "What did Melanie paint at the lake?"
    tuned(settings, author_weight=0.0)
    assert contents(search(api, alice, question, topK=1)) == [
        "Melanie and I painted the lake at sunset"
    ]
    tuned(settings, author_weight=1.0)
    assert contents(search(api, alice, question, topK=1)) == ["I painted some flowers"]
    # Hybrid only: keyword search is what it was.
    found = search(api, alice, question, topK=1, mode="keyword")
    assert contents(found) == ["Melanie and I painted the lake at sunset"]


def test_a_query_without_its_names_keeps_every_other_word():
    assert without_names("What did Melanie paint?") == "What did paint?"
    assert without_names("What is Caroline's identity?") == "What is identity?"
    assert (
        without_names("What do Jon and Gina both have in common?")
        == "What do and both have in common?"
    )
    # Words that begin a sentence, and capitals that are no name's: kept.
    assert without_names("Melanie painted what?") == "Melanie painted what?"
    assert (
        without_names("Where did I go? Then what did Ben cook")
        == "Where did I go? Then what did cook"
    )
    assert without_names("What does LGBTQ mean to McDonald") == "What does LGBTQ mean to McDonald"
    text = "what  did melanie paint"  # (lower case: no name found, the text itself)
    assert without_names(text) is text


def test_a_vector_mixed_with_a_share_of_another_is_of_unit_length():
    assert ranking.mixed_vector([3.0, 0.0], [0.0, 1.0], 0.0) == [1.0, 0.0]
    mixed = ranking.mixed_vector([3.0, 0.0], [0.0, 2.0], 1.0)  # each of unit length first
    assert mixed == pytest.approx([0.5**0.5, 0.5**0.5])
    assert ranking.mixed_vector([1.0, 0.0], [0.0, 1.0], 2.0) == pytest.approx(
        [1 / 5**0.5, 2 / 5**0.5]
    )


@pytest.mark.django_db
def test_a_name_weighs_less_in_the_vector_of_a_query_with_an_unnamed_share(api, alice, settings):
    answer = "Painted a lake at sunset last weekend"
    alices_turns(
        alice,
        "Melanie has two kids",  # says the name, not what is asked
        "Melanie is Caroline's friend from school",
        answer,
        "The weather was grey all week",
    )
    question = "What did Melanie paint?"
    assert DEFAULT_TUNING.unnamed_vector_share == 0  # off by default
    engine.query_vector.cache_clear()
    # By meaning alone, the vector of the question leans on the name.
    tuned(settings, unnamed_vector_share=0.0)
    assert contents(search(api, alice, question, topK=1, mode="semantic")) == [
        "Melanie has two kids"
    ]
    tuned(settings, unnamed_vector_share=1.0)
    assert contents(search(api, alice, question, topK=1, mode="semantic")) == [answer]
    # A query that names no one keeps its own vector.
    vector = engine.query_vector("m", "what did she paint?", 1.0)
    assert vector == engine.query_vector("m", "what did she paint?")
    engine.query_vector.cache_clear()


def test_feedback_words_are_the_best_rows_rare_words_the_query_lacks():
    idf = {"kitten": 2.0, "miso": 1.5, "shelter": 1.0, "day": 0.1}
    rows = [
        (1.0, ["kitten", "miso", "shelter", "day"]),
        (0.5, ["miso", "day", "day"]),  # a word counts once per row
        (0.2, ["unknown"]),  # no weight: never chosen
    ]
    chosen = ranking.feedback_words(rows, idf, known={"kitten"}, count=2)
    assert chosen == ["miso", "shelter"]  # (1.0 + 0.5) x 1.5, then 1.0 x 1.0
    assert ranking.feedback_words(rows, idf, known={"kitten"}, count=10) == [
        "miso",
        "shelter",
        "day",
    ]
    assert ranking.feedback_words([], idf, known=set(), count=3) == []
    # The candidates' scores grow by the words they hold, each once.
    assert ranking.keyword_score(["miso", "miso", "x"], idf) == 1.5


@pytest.mark.django_db
def test_keyword_feedback_finds_the_turn_that_answers_in_other_words(api, alice, bob, settings):
    # Bob's turn holds the feedback words too; Alice's search never reaches it.
    MessageFactory(
        conversation=ConversationFactory(group__owner=bob.id),
        content="Miso, our adopted puppy, named by the shelter",
    )
    answer = "Miso, my adopted shelter rascal, knocked the blue vase off the shelf"
    alices_turns(
        alice,
        "I adopted a kitten named Miso from the shelter",
        "Spring break tickets for the concert are sold out",
        "Home loan interest rates rose again",
        "The home office is finally painted",
        answer,
        "The weather was grey all week",
    )
    question = "What did my kitten break at home?"
    assert DEFAULT_TUNING.feedback_words == 0  # off by default
    # Three candidates from each retriever: the answer is none of them at first, and is
    # found by the words of the best turn ("Miso", "adopted").
    few = {"min_candidates": 3, "candidates_per_result": 1}
    tuned(settings, feedback_words=0, **few)
    before = contents(search(api, alice, question, topK=3))
    tuned(settings, feedback_words=10, feedback_rows=1, feedback_weight=1.0, **few)
    after = contents(search(api, alice, question, topK=3))
    assert answer not in before and answer in after, (before, after)
    assert not any("puppy" in text for text in after)
    # Hybrid only: keyword search is what it was.
    keyword = contents(search(api, alice, question, topK=6, mode="keyword"))
    assert answer not in keyword


def test_memsvc_search_feedback_turns_keyword_feedback_on(settings):
    assert configured_tuning() == DEFAULT_TUNING
    settings.MEMSVC_SEARCH_FEEDBACK = True
    assert configured_tuning() == FEEDBACK_TUNING
    assert FEEDBACK_TUNING.feedback_words > 0
    changed = {
        name
        for name, value in vars(FEEDBACK_TUNING).items()
        if getattr(DEFAULT_TUNING, name) != value
    }
    assert all(name.startswith("feedback_") for name in changed)  # nothing else changes
