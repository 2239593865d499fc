"""With an LLM configured (the stand-in OpenAI-compatible server), an agent answers in a
conversation with an agent's context, streamed; without one the page is a log."""

import json
import time

import pytest
from django.core.signals import request_finished
from django.db import close_old_connections
from django.urls import reverse

from agents_api.assistant import pages_assistant
from agents_api.services import agent_get_or_create, memory_block_create, memory_save
from conversations.models import Conversation, Message
from memsvc.api.principals import Principal
from tests.fake_openai import FakeOpenAI
from tests.local_http import LocalHttpServer, Reply

pytestmark = pytest.mark.django_db

HTMX = {"headers": {"HX-Request": "true"}}  # the page's script asking


@pytest.fixture
def llm(settings):
    with FakeOpenAI(reply="Rex would love Brittany, Alice.") as fake:
        settings.MEMSVC_LLM_BASE_URL = fake.base_url
        settings.MEMSVC_LLM_MODEL = "gpt-test"
        yield fake


@pytest.fixture
def chat(alice_page, llm):
    """A conversation of alice's made on the page with the assistant, which remembers her."""
    alice_page.post("/app/conversations/new", {"title": "Holidays", "assistant": "on"})
    assistant = pages_assistant()
    principal = assistant.as_principal()
    memory_block_create(
        principal, agent=assistant, user_id="alice", label="human", value="Name: Alice"
    )
    memory_save(principal, agent=assistant, user_id="alice", content="Alice has a dog named Rex")
    return Conversation.objects.get(title="Holidays")


def test_without_a_script_the_answer_comes_with_the_page(alice_page, chat, llm):
    response = alice_page.post(
        reverse("pages:append", args=[chat.id]), {"content": "Where should my dog and I go?"}
    )
    assert response.status_code == 302
    said = list(
        Message.objects.filter(conversation=chat)
        .order_by("seq")
        .values_list("role", "author_name", "content")
    )
    assert said == [
        ("user", "alice", "Where should my dog and I go?"),
        ("assistant", "assistant", "Rex would love Brittany, Alice."),
    ]
    # The model got the agent's context: its block, its memory of her, then the turn.
    [request] = llm.requests_containing("Where should my dog")
    system = request["messages"][0]
    assert system["role"] == "system"
    assert "Name: Alice" in system["content"] and "Alice has a dog named Rex" in system["content"]
    assert request["messages"][-1] == {"role": "user", "content": "Where should my dog and I go?"}
    html = alice_page.get(reverse("pages:conversation", args=[chat.id])).content.decode()
    assert "assistant answers here" in html and "Rex would love Brittany" in html


def test_a_new_version_of_a_message_on_a_fork_is_answered(alice_page, chat, llm):
    """ "Fork from here" in a conversation with the assistant opened a branch that ended on
    the person's unanswered message (review)."""
    alice_page.post(reverse("pages:append", args=[chat.id]), {"content": "Kyoto in May?"})
    asked = Message.objects.get(conversation=chat, content="Kyoto in May?")
    forked = alice_page.post(
        reverse("pages:fork", args=[chat.id, asked.id]), {"content": "Nara in May?"}
    )
    assert forked.status_code == 302
    fork = Conversation.objects.exclude(id=chat.id).get(group=chat.group)
    said = list(
        Message.objects.filter(conversation=fork).order_by("seq").values_list("role", "content")
    )
    assert said == [("user", "Nara in May?"), ("assistant", "Rex would love Brittany, Alice.")]
    assert llm.requests_containing("Nara in May?")


def test_the_script_gets_the_new_row_then_the_answer_streamed(alice_page, chat):
    row = alice_page.post(
        reverse("pages:append", args=[chat.id]),
        {"content": "Hello"},
        headers={"HX-Request": "true"},
    )
    assert row.status_code == 200 and b"<html" not in row.content and b"Hello" in row.content
    streamed = alice_page.post(reverse("pages:reply", args=[chat.id]))
    assert streamed.streaming and streamed["Content-Type"].startswith("text/plain")
    assert "no-store" in streamed["Cache-Control"]
    pieces = [piece.decode() for piece in streamed.streaming_content]
    assert len(pieces) > 1 and "".join(pieces) == "Rex would love Brittany, Alice."
    assert Message.objects.filter(conversation=chat, role="assistant").count() == 1
    # Asked again (a second tab, a request sent again), with nothing new to answer: it
    # answered the answered turn once more, and kept it (review).
    again = alice_page.post(reverse("pages:reply", args=[chat.id]))
    assert again.status_code == 409
    assert "the latest turn has its answer" in again.content.decode()
    assert Message.objects.filter(conversation=chat, role="assistant").count() == 1


def test_an_answer_longer_than_a_message_is_streamed_as_far_as_it_is_kept(
    alice_page, chat, llm, settings
):
    """A model that sent 200 MB had it all streamed to the page, and held in the web
    process, of which the first ``MEMSVC_MAX_MESSAGE_CHARS`` were kept (review)."""
    settings.MEMSVC_MAX_MESSAGE_CHARS = 30
    llm.reply = " ".join(f"word{n}" for n in range(5_000))
    alice_page.post(reverse("pages:append", args=[chat.id]), {"content": "Hello"}, **HTMX)
    streamed = alice_page.post(reverse("pages:reply", args=[chat.id]))
    pieces = [piece.decode() for piece in streamed.streaming_content]
    kept = Message.objects.get(conversation=chat, role="assistant").content
    assert "".join(pieces) == kept == llm.reply[:30]
    assert len(pieces) < 10  # (the model's stream left there, not read to its end)


def test_two_tabs_asking_at_once_keep_one_answer(alice_page, chat):
    """Both asked before either answer was kept: both looked at an unanswered turn, both
    streamed, and both answers were kept (review). The second to finish is refused."""
    alice_page.post(reverse("pages:append", args=[chat.id]), {"content": "Hello"}, **HTMX)
    first = alice_page.post(reverse("pages:reply", args=[chat.id]))
    second = alice_page.post(reverse("pages:reply", args=[chat.id]))
    assert first.status_code == second.status_code == 200
    assert b"".join(first.streaming_content).decode() == "Rex would love Brittany, Alice."
    late = b"".join(second.streaming_content).decode()
    assert late.endswith(
        "\x1eThe answer could not be kept: nothing to answer: the latest turn has its answer"
    )
    kept = Message.objects.filter(conversation=chat, role="assistant")
    assert list(kept.values_list("content", flat=True)) == ["Rex would love Brittany, Alice."]


def test_an_answer_overtaken_by_a_newer_turn_is_not_kept_after_it(alice_page, chat, llm):
    """Tab 1's answer, still streaming when a newer message came (tab 2), was kept after
    that message, which it never saw, and tab 2's answer to it refused (review). An answer
    is kept only while the turn its prompt ended on is the latest."""
    alice_page.post(reverse("pages:append", args=[chat.id]), {"content": "Hello"}, **HTMX)
    first = alice_page.post(reverse("pages:reply", args=[chat.id]))
    first_pieces = iter(first.streaming_content)
    next(first_pieces)  # (its prompt is built: it ends on "Hello")
    alice_page.post(reverse("pages:append", args=[chat.id]), {"content": "And Rome?"}, **HTMX)
    second = alice_page.post(reverse("pages:reply", args=[chat.id]))
    assert (
        b"".join(first_pieces)
        .decode()
        .endswith(
            "\x1eThe answer could not be kept: a newer turn came meanwhile: the answer to it answers it"
        )
    )
    assert b"".join(second.streaming_content).decode() == "Rex would love Brittany, Alice."
    said = list(
        Message.objects.filter(conversation=chat).order_by("seq").values_list("role", "content")
    )
    assert said == [
        ("user", "Hello"),
        ("user", "And Rome?"),
        ("assistant", "Rex would love Brittany, Alice."),
    ]
    # The model was asked with both turns for the answer that was kept.
    assert llm.requests_containing("And Rome?")


def test_the_models_own_failure_mark_is_taken_out_of_its_answer(alice_page, chat, llm):
    """The mark that ends a failed answer (ANSWER_FAILED, which the chat's script reads) is
    never in an answer that did not fail."""
    llm.then("one\x1etwo")
    alice_page.post(reverse("pages:append", args=[chat.id]), {"content": "Hello"}, **HTMX)
    said = b"".join(alice_page.post(reverse("pages:reply", args=[chat.id])).streaming_content)
    assert said.decode() == "onetwo"
    kept = Message.objects.get(conversation=chat, role="assistant")
    assert kept.content == "onetwo"  # (as streamed: a reload showed another text; code review)


def test_a_stream_cut_by_a_broken_event_says_so_in_the_persons_words(alice_page, chat, llm):
    """The JSON parser's own words were shown on the page (review)."""
    llm.answer("Hello", Reply(events=["{not json"]))
    alice_page.post(reverse("pages:append", args=[chat.id]), {"content": "Hello"}, **HTMX)
    said = b"".join(alice_page.post(reverse("pages:reply", args=[chat.id])).streaming_content)
    assert said.decode() == (
        "\x1eThe assistant could not answer: its model's answer could not be read; "
        "the server's log says more"
    )
    assert not Message.objects.filter(conversation=chat, role="assistant").exists()


def test_an_answer_that_cannot_be_kept_says_so_at_the_streams_end(alice_page, chat):
    """The conversation deleted while the answer streams: the store's refusal (404) ended
    the response unhandled, cut short, without a word (review)."""
    alice_page.post(
        reverse("pages:append", args=[chat.id]),
        {"content": "Hello"},
        headers={"HX-Request": "true"},
    )
    streamed = alice_page.post(reverse("pages:reply", args=[chat.id]))
    pieces = iter(streamed.streaming_content)
    first = next(pieces).decode()
    Conversation.objects.filter(id=chat.id).delete()
    rest = b"".join(pieces).decode()
    assert (first + rest).startswith("Rex would love")
    # (The mark the chat's script reads: a refusal, not the assistant's answer; review.)
    assert rest.endswith("\x1eThe answer could not be kept: conversation not found")
    assert not Message.objects.filter(role="assistant").exists()


def test_a_failing_model_writes_nothing_and_says_so(alice_page, chat, llm, caplog):
    """In the person's words: the model's server's own (a key, a host) only in the log
    (review: the page quoted them)."""
    leaked = "upstream key sk-proj-abc at llm.internal:9000"
    llm.answer("Hello", Reply(status=500, payload={"error": {"message": leaked}}))
    response = alice_page.post(
        reverse("pages:append", args=[chat.id]), {"content": "Hello"}, follow=True
    )
    page = response.content.decode()
    assert "The assistant could not answer: its model failed (InternalServerError)" in page
    assert "sk-proj" not in page
    streamed = alice_page.post(reverse("pages:reply", args=[chat.id]))
    text = b"".join(streamed.streaming_content).decode()
    assert "could not answer: its model failed" in text and "sk-proj" not in text
    assert not Message.objects.filter(role="assistant").exists()
    assert caplog.text.count(leaked) == 2  # (the operator's to read)


@pytest.mark.parametrize(
    "answer",
    [
        "   ",  # nothing but whitespace
        # Not a stream: what a server that is no OpenAI-compatible one answers.
        Reply(payload=b"<html>It works!</html>", headers={"Content-Type": "text/html"}),
    ],
)
def test_an_empty_answer_writes_nothing_and_says_so(alice_page, chat, llm, answer):
    """(A review's finding: the empty reply was appended, which the database refused: a 500.)"""
    if isinstance(answer, Reply):
        llm.answer("Hello", answer)
    else:
        llm.then(answer)
    response = alice_page.post(
        reverse("pages:append", args=[chat.id]), {"content": "Hello"}, follow=True
    )
    assert "The assistant could not answer: the model answered nothing" in (
        response.content.decode()
    )
    assert not Message.objects.filter(role="assistant").exists()


def test_an_answer_is_kept_without_what_postgresql_cannot_hold(alice_page, chat, llm):
    """A NUL and a lone surrogate in the streamed answer: the page was a 500 and nothing was
    kept (a review's finding)."""
    llm.then("Rex\x00 loves \ud800 Brittany.")
    alice_page.post(reverse("pages:append", args=[chat.id]), {"content": "Hello"}, **HTMX)
    streamed = alice_page.post(reverse("pages:reply", args=[chat.id]))
    assert b"".join(streamed.streaming_content).decode() == "Rex loves ? Brittany."
    assert Message.objects.get(role="assistant").content == "Rex loves ? Brittany."


def test_a_reader_cannot_ask_and_a_log_has_no_assistant(alice_page, bob_page, llm):
    alice_page.post("/app/conversations/new", {"title": "Just a log"})
    log = Conversation.objects.get(title="Just a log")
    assert alice_page.post(reverse("pages:reply", args=[log.id])).status_code == 409
    assert (
        "No agent answers"
        in alice_page.get(reverse("pages:conversation", args=[log.id])).content.decode()
    )
    assert bob_page.post(reverse("pages:reply", args=[log.id])).status_code == 404


def test_in_a_conversation_others_read_the_context_holds_only_what_they_all_may_read(
    api, alice_page, bob, bob_page, chat, llm
):
    """(A security audit's finding: the answer carried alice's private conversation, her
    memories and her block into bob's conversation, which bob reads.)"""
    secret = "Note to self: my bank PIN is 4321"
    alice_page.post(reverse("pages:append", args=[chat.id]), {"content": secret})
    bob_page.post("/app/conversations/new", {"title": "Bob's plans", "assistant": "on"})
    shared = Conversation.objects.get(title="Bob's plans")
    response = api.post(
        f"/v1/user/conversations/{shared.id}/memberships",
        {"userId": "alice", "accessLevel": "writer"},
        as_=bob,
    )
    assert response.status_code == 201, response.content
    question = "What is my bank PIN, and where does my dog go?"
    alice_page.post(reverse("pages:append", args=[shared.id]), {"content": question})

    page = alice_page.get(reverse("pages:conversation", args=[shared.id])).content.decode()
    assert "with what everyone here may read" in page
    [request] = llm.requests_containing("What is my bank PIN")
    prompt = json.dumps(request["messages"])
    assert "4321" not in prompt
    assert "Alice has a dog named Rex" not in prompt and "Name: Alice" not in prompt
    # In her own conversation, the assistant still knows her.
    alice_page.post(reverse("pages:append", args=[chat.id]), {"content": "My PIN again?"})
    [own] = llm.requests_containing("My PIN again?")
    assert "4321" in json.dumps(own["messages"]) and "Name: Alice" in json.dumps(own["messages"])


def test_a_conversation_another_persons_agent_reads_holds_only_what_everyone_may_read(
    alice_page, chat, llm
):
    """Carol's agent reads what it is shared into, and carol through its key: shared with
    it, alice's conversation with the assistant was given her memories, block and other
    conversations, which carol's key then read back (review). Her own agent is hers."""
    from conversations.services import membership_create

    secret = "Note to self: my bank PIN is 4321"
    alice_page.post("/app/conversations/new", {"title": "Private", "assistant": "on"})
    private = Conversation.objects.get(title="Private")
    alice_page.post(reverse("pages:append", args=[private.id]), {"content": secret})
    for owner, name in (("alice", "alices-bot"), ("carol", "carolbot")):
        agent = agent_get_or_create(owner_principal=owner, name=name)[0]
        membership_create(
            Principal.user("alice"),
            conversation=chat,
            principal_id=agent.principal_id,
            access_level="reader",
        )
        question = f"What is my bank PIN? ({name})"
        alice_page.post(reverse("pages:append", args=[chat.id]), {"content": question})
        [request] = llm.requests_containing(question)
        prompt = json.dumps(request["messages"])
        mine = owner == "alice"
        assert ("4321" in prompt) is mine, name
        assert ("Alice has a dog named Rex" in prompt) is mine, name


def test_the_assistant_is_the_first_agent_that_may_write_found_in_two_queries(
    django_assert_num_queries,
):
    """The agents among the members are read in one query (it was one per agent member)."""
    from agents_api.assistant import assistant_of
    from agents_api.models import Agent
    from conversations.services import membership_create
    from tests.pages.conftest import conversation_of

    conversation = conversation_of("alice", "Trip")
    agents = [
        agent_get_or_create(owner_principal="alice", name=name)[0]
        for name in ("reader-bot", "gone", "first", "second")
    ]
    for agent, level in zip(agents, ("reader", "writer", "writer", "manager"), strict=True):
        membership_create(
            Principal.user("alice"),
            conversation=conversation,
            principal_id=agent.principal_id,
            access_level=level,
        )
    Agent.objects.filter(pk=agents[1].pk).delete()  # its membership stays, naming no agent
    with django_assert_num_queries(2):
        assert assistant_of(conversation, asked_by="alice") == agents[2]


def test_only_the_pages_assistant_or_the_persons_own_agent_answers_on_the_pages(alice_page, llm):
    """Any agent may be shared into a conversation; on the pages it answered as itself, its
    owner's blocks in the prompt the person wrote, and kept what it was told (review)."""
    from conversations.services import membership_create
    from tests.agents_api.conftest import make_agent
    from tests.pages.conftest import conversation_of

    theirs = make_agent("support-bot").agent  # owned by "ops"
    memory_block_create(
        theirs.as_principal(), agent=theirs, label="persona", value="internal discount code Z9"
    )
    conversation = conversation_of("alice", "Trip")
    membership_create(
        Principal.user("alice"),
        conversation=conversation,
        principal_id=theirs.principal_id,
        access_level="writer",
    )
    page = alice_page.get(reverse("pages:conversation", args=[conversation.id])).content.decode()
    assert "No agent answers" in page
    assert alice_page.post(reverse("pages:reply", args=[conversation.id])).status_code == 409
    alice_page.post(reverse("pages:append", args=[conversation.id]), {"content": "Hi there"})
    assert llm.requests_containing("Hi there") == []
    assert not Message.objects.filter(conversation=conversation, role="assistant").exists()

    # Her own agent answers her.
    own = agent_get_or_create(owner_principal="alice", name="my-bot")[0]
    membership_create(
        Principal.user("alice"),
        conversation=conversation,
        principal_id=own.principal_id,
        access_level="writer",
    )
    streamed = alice_page.post(reverse("pages:reply", args=[conversation.id]))
    assert b"".join(streamed.streaming_content).decode() == "Rex would love Brittany, Alice."
    assert Message.objects.get(conversation=conversation, role="assistant").author_name == (
        "my-bot"
    )
    assert "discount code" not in json.dumps(llm.requests_containing("Hi there"))


def _slow_answer(words: int, every: float, *, pings: int = 0):
    """A model writing one word every ``every`` seconds (chat completion chunks); after the
    first word, ``pings`` keep-alive comments as often instead of words."""

    def events():
        for index in range(words):
            time.sleep(every)
            if index == 1:
                for _ in range(pings):
                    yield b": ping\n\n"
                    time.sleep(every)
            delta = {"content": f"word{index} "}
            yield json.dumps(
                {
                    "id": "chatcmpl-slow",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": "gpt-test",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
                }
            )
        yield "[DONE]"

    return Reply(events=events())


@pytest.mark.parametrize(
    "model",
    [
        _slow_answer(words=30, every=0.1),  # still writing
        # Comments reset the client's read timeout and yield no piece at which to look at
        # the time: such an answer ran on for as long as the model sent them.
        _slow_answer(words=3, every=0.1, pings=50),
    ],
    ids=["writing", "keep-alive comments"],
)
def test_an_answer_still_written_after_its_time_is_given_up(alice_page, chat, llm, settings, model):
    """A slow model held a web request thread for as long as it wrote (review: 8 slow
    answers stopped the API for 29 s)."""
    settings.MEMSVC_PAGES_ANSWER_SECONDS = 1
    llm.answer("Hello", model)
    alice_page.post(reverse("pages:append", args=[chat.id]), {"content": "Hello"}, **HTMX)
    started = time.monotonic()
    streamed = alice_page.post(reverse("pages:reply", args=[chat.id]))
    text = b"".join(streamed.streaming_content).decode()
    assert time.monotonic() - started < 3
    assert text.startswith("word0 ")
    assert text.endswith(
        "\x1eThe assistant could not answer: the model was still answering after 1 s"
    )
    assert not Message.objects.filter(role="assistant").exists()


def test_a_model_that_never_answers_is_given_up_after_the_answers_time_once(
    alice_page, chat, settings
):
    """The client's own retries each waited the whole time for a model that took the
    request and sent nothing: three times the time, and after the reader had gone (review:
    46 s for 15). One try, or more, within the answer's time in all."""
    asked = []

    def silent(method, path, body):
        asked.append(time.monotonic())
        time.sleep(5)
        return Reply(payload={})

    with LocalHttpServer(silent) as model:
        settings.MEMSVC_LLM_BASE_URL = f"{model.url}/v1"
        settings.MEMSVC_PAGES_ANSWER_SECONDS = 1
        alice_page.post(reverse("pages:append", args=[chat.id]), {"content": "Hi"}, **HTMX)
        started = time.monotonic()
        streamed = alice_page.post(reverse("pages:reply", args=[chat.id]))
        text = b"".join(streamed.streaming_content).decode()
        took = time.monotonic() - started
    assert took < 2.5, took
    assert "could not answer" in text
    assert len(asked) == 1
    assert not Message.objects.filter(role="assistant").exists()


def test_answers_at_once_are_capped_and_a_finished_one_gives_its_place_back(
    alice_page, chat, llm, settings
):
    """Beyond MEMSVC_PAGES_ANSWERS_AT_ONCE answers in a process, a 429 at once (the script's
    stream and the page without a script alike): the other request threads stay free."""
    settings.MEMSVC_PAGES_ANSWERS_AT_ONCE = 1
    alice_page.post(reverse("pages:append", args=[chat.id]), {"content": "Hello"}, **HTMX)
    first = alice_page.post(reverse("pages:reply", args=[chat.id]))
    pieces = iter(first.streaming_content)
    assert next(pieces).decode() == "Rex"

    second = alice_page.post(reverse("pages:reply", args=[chat.id]))
    assert second.status_code == 429 and int(second["Retry-After"]) >= 1
    assert "answering too many people at once" in second.content.decode()
    for headers in ({}, HTMX):  # without the page's script, and with it
        plain = alice_page.post(
            reverse("pages:append", args=[chat.id]), {"content": "And then?"}, **headers
        )
        assert plain.status_code == 429
        assert not Message.objects.filter(content="And then?").exists()  # refused: not kept

    assert b"".join(pieces).decode().endswith("Brittany, Alice.")
    alice_page.post(reverse("pages:append", args=[chat.id]), {"content": "And then?"}, **HTMX)
    third = alice_page.post(reverse("pages:reply", args=[chat.id]))
    assert b"".join(third.streaming_content).decode() == "Rex would love Brittany, Alice."
    assert Message.objects.filter(conversation=chat, role="assistant").count() == 2


def test_a_stream_closed_unread_gives_its_place_back(alice_page, chat, llm, settings):
    settings.MEMSVC_PAGES_ANSWERS_AT_ONCE = 1
    alice_page.post(reverse("pages:append", args=[chat.id]), {"content": "Hello"}, **HTMX)
    unread = alice_page.post(reverse("pages:reply", args=[chat.id]))
    assert alice_page.post(reverse("pages:reply", args=[chat.id])).status_code == 429
    # Closed unread, as the server closes it when its client has gone (``memsvc.asgi``);
    # without the signal that ends a request's database connection, as the test client
    # closes a response it has read.
    request_finished.disconnect(close_old_connections)
    try:
        unread.close()
    finally:
        request_finished.connect(close_old_connections)
    assert alice_page.post(reverse("pages:reply", args=[chat.id])).status_code == 200


def test_an_unanswered_turn_may_be_answered_again_after_a_reload(alice_page, chat, llm):
    """The model failed and the page was reloaded (or left): the turn stayed unanswered and
    nothing offered to ask again (review)."""
    page = reverse("pages:conversation", args=[chat.id])
    assert "Ask for the answer again" not in alice_page.get(page).content.decode()
    llm.answer("Hello", Reply(status=400, payload={"error": {"message": "too long"}}))
    alice_page.post(reverse("pages:append", args=[chat.id]), {"content": "Hello"}, **HTMX)
    b"".join(alice_page.post(reverse("pages:reply", args=[chat.id])).streaming_content)
    assert "Ask for the answer again" in alice_page.get(page).content.decode()
    del llm.answers["Hello"]
    b"".join(alice_page.post(reverse("pages:reply", args=[chat.id])).streaming_content)
    assert "Ask for the answer again" not in alice_page.get(page).content.decode()
