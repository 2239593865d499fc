"""The web pages in a real Chromium: two people log in; one creates a conversation, posts,
forks and switches branch, shares it, and the other then sees it; search; a memory deleted;
keyboard only; 375 px wide; no Content-Security-Policy violation on the way.

With ``MEMSVC_SCREENSHOTS=1`` each page is saved into ``docs/screenshots/`` (the README
shows them); otherwise into the test's temporary folder.
"""

import os
import re
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from agents_api.services import agent_get_or_create, memory_block_create, memory_save
from tests.waiting import wait_until

PASSWORD = "a long enough password"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


@pytest.fixture
def shots(tmp_path):
    folder = DOCS if os.environ.get("MEMSVC_SCREENSHOTS") == "1" else tmp_path

    def shoot(page, name: str) -> None:
        page.screenshot(path=str(folder / f"{name}.png"))

    return shoot


@pytest.fixture(scope="module", autouse=True)
def loaded_model():
    """The embedding model loaded before the browser waits on a page: the live server embeds
    each new message in its request (tasks run inline in tests), and the first load of the
    model takes seconds on a busy machine."""
    from search.embeddings import configured_backend

    configured_backend().embed(["warm up"])


@pytest.fixture
def people(transactional_db):
    for name in ("alice", "bob"):
        get_user_model().objects.create_user(username=name, password=PASSWORD)


@pytest.fixture
def csp_violations(page):
    """What the browser refused under the page's Content-Security-Policy."""
    seen = []
    page.on(
        "console",
        lambda message: (
            seen.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    return seen


def log_in(page, live_server, name: str) -> None:
    page.goto(f"{live_server.url}/app/login/")
    page.get_by_label("User name").fill(name)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Conversations", exact=True)).to_be_visible()


def shown(page, text: str):
    """The messages on the page that say ``text``."""
    return page.locator("#messages .content", has_text=text)


def send(page, text: str) -> None:
    page.get_by_label("Your message").fill(text)
    page.get_by_role("button", name="Send").click()
    expect(shown(page, text)).to_be_visible()


def test_create_post_fork_switch_share_search(
    browser, page, live_server, people, shots, csp_violations
):
    page.set_viewport_size({"width": 1100, "height": 760})
    page.goto(f"{live_server.url}/app/login/")
    shots(page, "login")
    log_in(page, live_server, "alice")

    page.get_by_label("Title").fill("Trip to Rome")
    page.get_by_role("button", name="Create").click()
    expect(page.get_by_role("heading", name="Trip to Rome")).to_be_visible()
    send(page, "Which museums should we see in Rome?")
    send(page, "And where do we eat <b>tonight</b>?")  # shown as text
    expect(page.locator("#messages b")).to_have_count(0)

    # Fork from the second message with another question: a new branch, same beginning.
    second = page.locator("#messages li.message").nth(1)
    second.get_by_text("Fork from here").click()
    second.get_by_role("textbox").fill("And where is the best gelato?")
    second.get_by_role("button", name="Fork").click()
    expect(shown(page, "And where is the best gelato?")).to_be_visible()
    expect(shown(page, "tonight")).to_have_count(0)
    expect(shown(page, "Which museums")).to_be_visible()
    fork_url = page.url

    # Switch back to the first branch through the tree.
    branches = page.get_by_role("navigation", name="Branches")
    expect(branches.locator("[aria-current=page]")).to_have_count(1)
    branches.get_by_role("link", name="Trip to Rome").click()
    expect(shown(page, "tonight")).to_be_visible()
    assert page.url != fork_url

    # Share with bob as a reader.
    page.get_by_label("Share with").fill("bob")
    page.get_by_label("Access", exact=True).select_option("reader")
    page.get_by_role("button", name="Share").click()
    expect(page.locator(".members .member").get_by_text("bob", exact=True)).to_be_visible()
    # What the form did is said, and the focus is there (it was on the page's start: review).
    expect(
        page.get_by_role("status").filter(has_text="Shared with bob, as a reader.")
    ).to_be_focused()
    shots(page, "conversation")

    # Search across her conversations: the hit links to its message.
    page.get_by_role("link", name="Conversations").click()
    page.get_by_label("Search words").fill("museums Rome")
    page.get_by_role("button", name="Search").click()
    hit = page.locator("#search-results li.card a").first
    expect(hit).to_be_visible()
    expect(hit).to_contain_text("Trip to Rome: alice")  # the conversation named (review)
    expect(page.locator("#search-results mark").first).to_be_visible()  # highlighted words
    expect(page.get_by_role("status").filter(has_text="found for")).to_be_visible()
    expect(page).to_have_title(re.compile("^Search: museums Rome"))
    shots(page, "conversations")
    hit.click()
    expect(page.locator("#messages li.target")).to_contain_text("Which museums")
    expect(page.locator("#messages li.target")).to_be_focused()  # (a ring alone: review)

    # Bob, in a browser of his own, sees it, reads it, and has no controls to write.
    bobs = browser.new_context()
    bob = bobs.new_page()
    log_in(bob, live_server, "bob")
    # Both branches are shared (a group shares its members); he opens the first one.
    expect(bob.locator("#conversation-list .branch")).to_have_count(1)
    bob.locator("#conversation-list li", has_text="where do we eat").get_by_role("link").click()
    expect(shown(bob, "Which museums")).to_be_visible()
    expect(bob.get_by_label("Your message")).to_have_count(0)
    expect(bob.get_by_text("Fork from here")).to_have_count(0)
    bobs.close()
    assert csp_violations == []


def test_memory_page_deletes_a_memory_and_turns_memory_off(
    page, live_server, people, shots, csp_violations
):
    helper, _ = agent_get_or_create(owner_principal="ops", name="travel-helper")
    principal = helper.as_principal()
    memory_block_create(
        principal, agent=helper, user_id="alice", label="human", value="Name: Alice\nLikes: museums"
    )
    for fact in ["Alice is allergic to peanuts", "Alice prefers window seats"]:
        memory_save(principal, agent=helper, user_id="alice", content=fact)
    page.set_viewport_size({"width": 1100, "height": 760})
    log_in(page, live_server, "alice")
    page.get_by_role("link", name="Memory").click()
    shots(page, "memory")
    page.get_by_role("link", name="travel-helper").click()
    expect(page.get_by_text("Alice is allergic to peanuts")).to_be_visible()
    shots(page, "agent-memory")

    # Delete one memory, asked first (htmx swaps the row; no page load).
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    page.get_by_role("button", name=re.compile("Delete the memory “Alice is allergic")).click()
    expect(page.get_by_text("Deleted.")).to_be_visible()
    assert asked == [
        "Delete the memory “\u2068Alice is allergic to peanuts\u2069”? This cannot be undone."
    ]
    expect(page.get_by_text("Alice is allergic to peanuts")).to_have_count(0)

    # Search finds the other; with memory off, nothing.
    page.get_by_label("Search memories").fill("seat on the plane")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("#memory-hits")).to_contain_text("window seats")
    page.get_by_role("button", name="Turn memory off (private chat)").click()
    expect(page.get_by_text("Memory turned off.")).to_be_focused()
    expect(page.get_by_text("Memory is off (private chat")).to_be_visible()
    page.get_by_label("Search memories").fill("seat on the plane")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("#memory-hits")).to_contain_text("No memory found")
    assert csp_violations == []


def test_deleting_a_conversation_asks_first(page, live_server, people, csp_violations):
    from conversations.models import Conversation
    from conversations.services import conversation_create
    from memsvc.api.principals import Principal

    conversation = conversation_create(Principal.user("alice"), title="Tax papers")
    log_in(page, live_server, "alice")
    page.goto(f"{live_server.url}/app/c/{conversation.id}/")
    asked = []

    def answer(dialog, accept: bool) -> None:
        asked.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    page.once("dialog", lambda dialog: answer(dialog, False))
    page.get_by_role("button", name="Delete this conversation").click()
    page.wait_for_timeout(300)  # time for a form sent anyway to land
    expect(page.get_by_role("heading", name="Tax papers")).to_be_visible()
    # (The title isolated from the text around it: FSI ... PDI.)
    assert asked == ["Delete “\u2068Tax papers\u2069” for everyone in it? This cannot be undone."]
    assert Conversation.objects.filter(pk=conversation.pk).exists()

    page.once("dialog", lambda dialog: answer(dialog, True))
    page.get_by_role("button", name="Delete this conversation").click()
    expect(page.get_by_role("heading", name="Conversations", exact=True)).to_be_visible()
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert csp_violations == []


def test_removing_a_member_and_leaving_ask_first(page, live_server, people, csp_violations):
    """Neither can be undone by who does it (a reader who leaves cannot come back alone);
    both were done at the first click (review)."""
    from conversations.models import Membership
    from tests.pages.conftest import conversation_of

    conversation = conversation_of("alice", "Plans", "hi", shared=[("bob", "reader")])
    asked = []

    def answer(dialog, accept: bool) -> None:
        asked.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    def member(name: str) -> bool:
        return Membership.objects.filter(group=conversation.group, principal_id=name).exists()

    for person, button in [("alice", "Remove bob"), ("bob", "Leave")]:
        if person == "bob":
            page.context.clear_cookies()
            Membership.objects.create(
                group=conversation.group, principal_id="bob", access_level="reader"
            )
        log_in(page, live_server, person)
        page.goto(f"{live_server.url}/app/c/{conversation.id}/")
        page.once("dialog", lambda dialog: answer(dialog, False))
        page.get_by_role("button", name=button, exact=True).click()
        page.wait_for_timeout(300)  # time for a form sent anyway to land
        assert member("bob"), person
        page.once("dialog", lambda dialog: answer(dialog, True))
        with page.expect_navigation():
            page.get_by_role("button", name=button, exact=True).click()
        assert not member("bob"), person
    assert asked == [
        "Remove bob from this conversation?",
        "Remove bob from this conversation?",
        "Leave this conversation? Only someone who manages it can share it with you again.",
        "Leave this conversation? Only someone who manages it can share it with you again.",
    ]
    assert csp_violations == []


def test_members_and_blocks_whose_names_are_dot_segments_are_changed(page, live_server, people):
    """(The browser dropped the dot segments of the Remove form's address: beside a member
    shared as "../../delete", Remove deleted the conversation, without asking; a member
    "..", or a block labelled "..", could not be changed at all.)"""
    from agents_api.models import MemoryBlock
    from conversations.models import Conversation, Membership
    from tests.pages.conftest import conversation_of

    members = [("../../delete", "reader"), ("..", "reader"), (".", "reader")]
    conversation = conversation_of("alice", "Team", "hi", shared=members)
    log_in(page, live_server, "alice")
    page.goto(f"{live_server.url}/app/c/{conversation.id}/")
    page.get_by_label("Access of ..", exact=True).select_option("writer")
    with page.expect_navigation():
        page.locator("li", has=page.get_by_label("Access of ..", exact=True)).get_by_role(
            "button", name="Change"
        ).click()
    expect(page.get_by_role("heading", name="Team")).to_be_visible()
    assert Membership.objects.get(principal_id="..").access_level == "writer"
    page.on("dialog", lambda dialog: dialog.accept())  # ("Remove ... from this conversation?")
    for member, _ in members:
        with page.expect_navigation():
            page.get_by_role("button", name=f"Remove {member}", exact=True).click()
        expect(page.get_by_role("heading", name="Team")).to_be_visible()
        assert not Membership.objects.filter(principal_id=member).exists()
    assert Conversation.objects.filter(pk=conversation.pk).exists()

    helper, _ = agent_get_or_create(owner_principal="ops", name="helper")
    memory_block_create(
        helper.as_principal(), agent=helper, user_id="alice", label="..", value="Old"
    )
    page.goto(f"{live_server.url}/app/memory/{helper.id}/")
    page.get_by_label(re.compile(r"^Value")).fill("New")
    with page.expect_navigation():
        page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("heading", name="helper")).to_be_visible()
    assert MemoryBlock.objects.get(label="..").value == "New"


def test_a_text_that_begins_with_a_newline_is_shown_and_saved_as_it_is(page, live_server, people):
    """A browser drops a newline right after ``<textarea>``: a block's value shown without
    its first newline was saved so, a revision no one made, by a Save that changed nothing
    (and a message's "Fork from here" began without it; review)."""
    from agents_api.models import MemoryBlock, MemoryBlockRevision
    from tests.pages.conftest import conversation_of

    helper, _ = agent_get_or_create(owner_principal="ops", name="helper")
    value = "\n\nstarts with two newlines"
    memory_block_create(
        helper.as_principal(), agent=helper, user_id="alice", label="notes", value=value
    )
    log_in(page, live_server, "alice")
    page.goto(f"{live_server.url}/app/memory/{helper.id}/")
    assert page.get_by_label(re.compile(r"^Value")).input_value() == value
    revisions = MemoryBlockRevision.objects.count()
    with page.expect_navigation():
        page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("heading", name="helper")).to_be_visible()
    assert MemoryBlock.objects.get(label="notes").value == value
    assert MemoryBlockRevision.objects.count() == revisions

    conversation = conversation_of("alice", "Lines", "\nHello")
    page.goto(f"{live_server.url}/app/c/{conversation.id}/")
    page.get_by_text("Fork from here").click()
    assert page.get_by_label("A new version of this message").input_value() == "\nHello"


def test_a_long_word_does_not_stretch_the_admins_pages(page, live_server, people):
    """A title of 500 "W" made a conversation's admin page 9,163 px wide in a window of
    1,280 (its delete confirmation 2,277 px; review)."""
    from tests.pages.conftest import conversation_of

    get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)
    conversation = conversation_of("alice", "W" * 500, "hi")
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{live_server.url}/admin/login/")
    page.get_by_label("Username").fill("ops")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    base = f"{live_server.url}/admin/conversations/conversation"
    for address in (
        f"{base}/{conversation.id}/change/",
        f"{base}/{conversation.id}/delete/",
        f"{base}/",
    ):
        page.goto(address)
        expect(page.locator("#content")).to_be_visible()
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 1280, (address, width)


def test_the_focus_stays_where_htmx_swapped_in_what_was_asked_for(page, live_server, people):
    """A keyboard user who opens the next page of the list, or deletes a memory, goes on
    from there, not from the top of the page."""
    from conversations.services import conversation_create
    from memsvc.api.principals import Principal
    from memsvc.pages.views.common import PAGE_SIZE

    for n in range(PAGE_SIZE + 1):
        conversation_create(Principal.user("alice"), title=f"Chat {n:02d}")
    helper, _ = agent_get_or_create(owner_principal="ops", name="keeper")
    memory_save(helper.as_principal(), agent=helper, user_id="alice", content="Likes tea")
    log_in(page, live_server, "alice")

    page.get_by_role("link", name="More conversations").focus()
    page.keyboard.press("Enter")
    expect(page.locator(":focus")).to_have_text("Chat 00")  # the oldest: the next page

    page.goto(f"{live_server.url}/app/memory/{helper.id}/")
    page.get_by_role("button", name=re.compile("Delete the memory “Likes tea")).focus()
    page.once("dialog", lambda dialog: dialog.accept())
    page.keyboard.press("Enter")
    expect(page.locator(":focus")).to_have_text("Deleted.")

    # Earlier messages: their first control a keyboard can reach (the first button found was
    # in a closed "Fork from here", and the focus fell to the page; review).
    from conversations.services import message_append

    long = conversation_create(Principal.user("alice"), title="Long")
    for n in range(PAGE_SIZE + 3):
        message_append(Principal.user("alice"), conversation=long, content=f"turn {n}")
    page.goto(f"{live_server.url}/app/c/{long.id}/")
    page.get_by_role("link", name="Earlier messages").focus()
    page.keyboard.press("Enter")
    expect(page.locator(":focus")).to_have_text(re.compile("^Fork from here"))
    assert page.evaluate("document.activeElement.tagName") == "SUMMARY"

    # Logging out leaves no copy of a page htmx kept in the tab (review).
    page.evaluate("sessionStorage.setItem('htmx-history-cache', '[]')")
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("button", name="Log in")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('htmx-history-cache')") is None


def test_more_conversations_shows_each_conversation_once_the_newest_row(page, live_server, people):
    """After a walk of the list reaches its end, the conversations with activity since it
    began are listed again (``activity_page``): one shown already was then shown twice, its
    old row above and its new one below."""
    from conversations.services import conversation_create, message_append
    from memsvc.api.principals import Principal
    from memsvc.pages.views.common import PAGE_SIZE

    alice = Principal.user("alice")
    chats = [conversation_create(alice, title=f"Chat {n:02d}") for n in range(PAGE_SIZE + 1)]
    log_in(page, live_server, "alice")
    rows = page.locator("#conversation-list li.card")
    expect(rows).to_have_count(PAGE_SIZE)
    message_append(alice, conversation=chats[30], content="Back to this one")
    for _ in range(5):  # the walk's pages, then those of its catch-up passes
        more = page.get_by_role("link", name="More conversations")
        if not more.count():
            break
        href = more.get_attribute("href")
        more.click()
        # Swapped for the next page's rows (and a link of its own to the page after).
        expect(page.locator(f'#conversation-list a[href="{href}"]')).to_have_count(0)
    expect(rows).to_have_count(PAGE_SIZE + 1)
    titles = rows.locator(".title").all_text_contents()
    assert sorted(titles) == [f"Chat {n:02d}" for n in range(PAGE_SIZE + 1)]
    expect(rows.filter(has_text="Chat 30")).to_contain_text("Back to this one")


def test_keyboard_only_at_375_px(page, live_server, people, shots, csp_violations):
    page.set_viewport_size({"width": 375, "height": 740})
    log_in(page, live_server, "alice")
    # Create a conversation and post in it with the keyboard alone.
    page.get_by_label("Title").focus()
    page.keyboard.type("Typed only")
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Typed only")).to_be_visible()
    page.get_by_label("Your message").focus()
    page.keyboard.type("Hello from the keyboard")
    page.keyboard.press("Tab")  # to the Send button
    assert page.evaluate("document.activeElement.textContent.trim()") == "Send"
    page.keyboard.press("Enter")
    expect(shown(page, "Hello from the keyboard")).to_be_visible()
    conversation_url = page.url
    # The skip link is the first stop and leads to the content.
    page.goto(f"{live_server.url}/app/")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent.trim()") == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    # Nothing wider than the screen.
    for path in ["/app/", conversation_url, "/app/memory/"]:
        page.goto(path if path.startswith("http") else f"{live_server.url}{path}")
        assert page.evaluate("document.documentElement.scrollWidth") <= 375, path
    page.goto(f"{live_server.url}/app/")
    shots(page, "conversations-375px")
    assert csp_violations == []


def test_the_assistants_answer_is_streamed_into_the_page(
    page, live_server, people, settings, shots, csp_violations
):
    from tests.fake_openai import FakeOpenAI

    with FakeOpenAI(reply="Start with the Vatican Museums, then the Borghese Gallery.") as llm:
        settings.MEMSVC_LLM_BASE_URL = llm.base_url
        settings.MEMSVC_LLM_MODEL = "gpt-test"
        page.set_viewport_size({"width": 1100, "height": 760})
        log_in(page, live_server, "alice")
        page.get_by_label("Title").fill("Ask the assistant")
        expect(page.get_by_label("with the assistant")).to_be_checked()
        page.get_by_role("button", name="Create").click()
        expect(page.get_by_text("assistant answers here")).to_be_visible()
        conversation_url = page.url
        send(page, "Which museums first?")
        answer = page.locator("#messages li.message.assistant .content")
        expect(answer).to_have_text("Start with the Vatican Museums, then the Borghese Gallery.")
        expect(page.locator("#messages li.streaming")).to_have_count(0)  # the stream ended
        assert page.url == conversation_url  # streamed into the page, not a new page
        assert len(llm.requests_containing("Which museums first?")) == 1
        shots(page, "assistant")
        # Kept as the agent's message: there after a reload too.
        page.reload()
        expect(answer).to_have_text("Start with the Vatican Museums, then the Borghese Gallery.")
    assert csp_violations == []


def test_back_to_a_search_made_on_the_list_shows_the_whole_page(page, live_server, people):
    """The list's search swaps its results in and pushes /app/search/?q=...; coming back to
    that address from a hit is the search page, not the fragment the browser kept for it."""
    from conversations import services
    from memsvc.api.principals import Principal

    alice = Principal.user("alice")
    conversation = services.conversation_create(alice, title="Trip to Rome")
    services.message_append(alice, conversation=conversation, content="Which museums in Rome?")
    log_in(page, live_server, "alice")
    page.get_by_label("Search words").fill("museums")
    page.get_by_role("button", name="Search").click()
    expect(page).to_have_url(re.compile(r"/app/search/\?q=museums$"))
    page.locator("#search-results li.card a").first.click()
    expect(shown(page, "Which museums")).to_be_visible()
    page.go_back()
    expect(page).to_have_url(re.compile(r"/app/search/\?q=museums$"))
    expect(page.get_by_role("heading", name="Search", exact=True)).to_be_visible()
    expect(page.get_by_label("Search words")).to_have_value("museums")
    expect(page.locator("#search-results li.card")).to_have_count(1)


@pytest.fixture
def assistant_llm(settings):
    """The stand-in LLM the pages' assistant asks."""
    from tests.fake_openai import FakeOpenAI

    with FakeOpenAI(reply="Start with the Vatican Museums.") as llm:
        settings.MEMSVC_LLM_BASE_URL = llm.base_url
        settings.MEMSVC_LLM_MODEL = "gpt-test"
        yield llm


@pytest.fixture
def assistant_chat(page, live_server, people, assistant_llm):
    """Alice on a new conversation of hers where the pages' assistant (``assistant_llm``)
    answers; yields the conversation."""
    from conversations.models import Conversation

    log_in(page, live_server, "alice")
    page.get_by_label("Title").fill("Ask the assistant")
    page.get_by_role("button", name="Create").click()
    expect(page.get_by_text("assistant answers here")).to_be_visible()
    return Conversation.objects.get(title="Ask the assistant")


def test_an_answer_the_model_failed_to_write_is_asked_for_again(
    page, assistant_chat, assistant_llm
):
    """The model failed: the stream ended with why, shown as the assistant's answer, and
    only sending the message again asked again (review R9). The page says why as a refusal
    and offers to ask for the answer alone."""
    from conversations.models import Message
    from tests.local_http import Reply

    failure = Reply(status=400, payload={"error": {"message": "context too long"}})
    assistant_llm.answer("Which museums first?", failure)
    send(page, "Which museums first?")
    form = page.locator("form#append")
    expect(form.get_by_role("alert")).to_contain_text("The assistant could not answer")
    expect(page.locator("#messages li.assistant")).to_have_count(0)
    del assistant_llm.answers["Which museums first?"]  # the model is well again
    form.get_by_role("button", name="Ask for the answer again").click()
    expect(page.locator("#messages li.message.assistant .content")).to_have_text(
        "Start with the Vatican Museums."
    )
    # The text is shown as it streams; the answer is kept once the stream has ended.
    expect(page.locator("#messages li.streaming")).to_have_count(0)
    expect(form.get_by_role("alert")).to_have_count(0)
    expect(form.get_by_role("button", name="Ask for the answer again")).to_have_count(0)
    said = Message.objects.filter(conversation=assistant_chat).order_by("seq")
    assert list(said.values_list("role", flat=True)) == ["user", "assistant"]


def test_an_answer_refused_after_the_message_is_sent_says_why(page, assistant_chat):
    """The person's message is kept, then the answer is refused (the assistant was removed
    meanwhile, in another tab): the page says why, as for a refused message, and does not
    show the refusal page's HTML as the assistant's answer."""
    from agents_api.assistant import assistant_of
    from conversations import selectors, services
    from memsvc.api.principals import Principal

    assistant = assistant_of(assistant_chat, asked_by="alice").as_principal()
    services.membership_delete(
        Principal.user("alice"), membership=selectors.membership_of(assistant_chat, assistant.id)
    )
    send(page, "Which museums first?")
    expect(page.locator("form#append").get_by_role("alert")).to_have_text(
        "no assistant answers in this conversation"
    )
    expect(page.locator("#messages li.assistant")).to_have_count(0)
    expect(page.locator("#messages")).not_to_contain_text("<")


def test_an_answer_refused_as_too_many_at_once_is_asked_for_again(page, assistant_chat, settings):
    """The assistant was free when the message was sent and full when its answer was asked
    for (others' answers took the places between the two requests): the message was kept
    unanswered, and only sending it again asked again (review R7). The page offers to ask
    for the answer alone."""
    from agents_api.assistant import answering
    from conversations.models import Message

    # (An earlier test's answer gives its place back when the server has closed its stream,
    # which a busy machine does after the test: its place refused this test's message.)
    wait_until(lambda: answering.now == 0, "the earlier answers' places given back")
    settings.MEMSVC_PAGES_ANSWERS_AT_ONCE = 1
    taken = []

    def full_as_it_goes(route):
        if not taken:  # the first ask: every place taken meanwhile, by someone else
            taken.append(answering.take())
        route.continue_()

    page.route("**/reply", full_as_it_goes)
    send(page, "Which museums first?")
    form = page.locator("form#append")
    expect(form.get_by_role("alert")).to_have_text(
        "the assistant is answering too many people at once; ask again shortly"
    )
    expect(page.locator("#messages li.assistant")).to_have_count(0)
    taken[0]()  # the other answer ends
    form.get_by_role("button", name="Ask for the answer again").click()
    expect(page.locator("#messages li.message.assistant .content")).to_have_text(
        "Start with the Vatican Museums."
    )
    expect(page.locator("#messages li.streaming")).to_have_count(0)  # the stream ended: kept
    expect(form.get_by_role("alert")).to_have_count(0)
    expect(form.get_by_role("button", name="Ask for the answer again")).to_have_count(0)
    assert list(
        Message.objects.filter(conversation=assistant_chat)
        .order_by("seq")
        .values_list("role", "content")
    ) == [("user", "Which museums first?"), ("assistant", "Start with the Vatican Museums.")]


def test_an_answer_refused_by_the_servers_cap_on_streams_is_said_and_asked_for_again(
    page, assistant_chat
):
    """A web process sends at most MEMSVC_WEB_STREAMS streamed answers at once (memsvc.asgi;
    the live server of these tests is not that process): its refusal is a plain-text 503,
    said as the refusal it is, not put into the page as HTML, and the answer may be asked
    for again."""
    from conversations.models import Message

    why = "too many streamed answers (exports, the assistant's answers) are being sent at once"
    refused = []

    def refused_once(route):
        if refused:
            route.continue_()
            return
        refused.append(1)
        route.fulfill(
            status=503,
            content_type="text/plain",
            headers={"Retry-After": "5"},
            body=f"{why} <b>; try again shortly",
        )

    page.route("**/reply", refused_once)
    send(page, "Which museums first?")
    form = page.locator("form#append")
    expect(form.get_by_role("alert")).to_have_text(f"{why} <b>; try again shortly")
    expect(page.locator("#messages li.assistant")).to_have_count(0)
    form.get_by_role("button", name="Ask for the answer again").click()
    expect(page.locator("#messages li.message.assistant .content")).to_have_text(
        "Start with the Vatican Museums."
    )
    expect(form.get_by_role("alert")).to_have_count(0)
    assert Message.objects.filter(conversation=assistant_chat, role="assistant").count() == 1


def test_a_refused_message_is_said_once_and_no_more_once_one_is_sent(page, assistant_chat):
    """Said on the box too (invalid, described by the refusal), as every form's refusal is:
    the script only inserted it above the box (review)."""
    form, box = page.locator("form#append"), page.get_by_label("Your message")
    for _ in range(2):
        box.fill(" ")
        page.get_by_role("button", name="Send").click()
        expect(form.get_by_role("alert")).to_have_count(1)
        expect(form.get_by_role("alert")).to_have_text("Your message: must not be empty")
        expect(box).to_have_attribute("aria-invalid", "true")
        expect(box).to_have_accessible_description("Your message: must not be empty")
        expect(box).to_be_focused()
    send(page, "Which museums first?")
    expect(page.locator("#messages li.message.assistant .content")).to_have_text(
        "Start with the Vatican Museums."
    )
    expect(form.get_by_role("alert")).to_have_count(0)
    expect(box).not_to_have_attribute("aria-invalid", "true")
    expect(box).to_have_accessible_description("")


def test_a_memory_deleted_among_the_search_hits_leaves_the_list_too(page, live_server, people):
    """The agent's page shows a memory found by a search twice: among the hits and in the
    list of all its memories. Deleted from either, it is gone from both."""
    helper, _ = agent_get_or_create(owner_principal="ops", name="travel-helper")
    for fact in ["Alice is allergic to peanuts", "Alice prefers window seats"]:
        memory_save(helper.as_principal(), agent=helper, user_id="alice", content=fact)
    script_errors = []
    page.on("pageerror", lambda error: script_errors.append(str(error)))
    page.on(  # what htmx logs (not the browser's own line for each failed request)
        "console",
        lambda message: (
            script_errors.append(message.text)
            if message.type == "error" and not message.text.startswith("Failed to load")
            else None
        ),
    )
    page.on("dialog", lambda dialog: dialog.accept())  # (each deletion asks first)
    log_in(page, live_server, "alice")
    page.get_by_role("link", name="Memory").click()
    page.get_by_role("link", name="travel-helper").click()
    page.get_by_label("Search memories").fill("window seat")
    page.get_by_role("button", name="Search").click()
    hits, listed = page.locator("#memory-hits"), page.locator("#memory-list")
    expect(hits).to_contain_text("window seats")
    hits.get_by_role("button", name=re.compile("window seats")).click()
    expect(hits.get_by_role("status")).to_have_text("Deleted.")
    expect(listed.get_by_role("status")).to_have_text("Deleted.")
    expect(page.get_by_text("Alice prefers window seats")).to_have_count(0)
    # And from the list: the hit goes with it.
    page.get_by_label("Search memories").fill("peanut allergy")
    page.get_by_role("button", name="Search").click()
    expect(hits).to_contain_text("allergic to peanuts")
    listed.get_by_role("button", name=re.compile("allergic to peanuts")).click()
    expect(page.get_by_text("Alice is allergic to peanuts")).to_have_count(0)
    expect(page.get_by_role("status").filter(has_text="Deleted.")).to_have_count(3)
    assert script_errors == []


def test_a_memory_search_is_kept_in_the_address_for_reload_and_back(page, live_server, people):
    """(The agent's page swapped its hits in and kept no ``?q=``: a reload showed the plain
    list, and Back left the page; review.)"""
    helper, _ = agent_get_or_create(owner_principal="ops", name="travel-helper")
    memory_save(helper.as_principal(), agent=helper, user_id="alice", content="Alice likes kiwis")
    log_in(page, live_server, "alice")
    page.get_by_role("link", name="Memory").click()
    page.get_by_role("link", name="travel-helper").click()
    agent_page = page.url
    page.get_by_label("Search memories").fill("kiwi fruit")
    page.get_by_role("button", name="Search").click()
    expect(page).to_have_url(re.compile(r"\?q=kiwi(\+|%20)fruit$"))
    expect(page.locator("#memory-hits")).to_contain_text("Alice likes kiwis")
    page.reload()
    expect(page.get_by_label("Search memories")).to_have_value("kiwi fruit")
    expect(page.locator("#memory-hits")).to_contain_text("Alice likes kiwis")
    page.go_back()
    expect(page).to_have_url(agent_page)
    expect(page.get_by_role("heading", name="Long-term memories about you")).to_be_visible()


def test_a_chat_whose_server_cannot_be_reached_says_so_and_lets_the_person_go_on(
    page, assistant_chat
):
    """A fetch that failed, or never ended (a frozen server: it has a time limit now), left
    the Send button off for good and said nothing (review)."""
    page.route("**/messages", lambda route: route.abort())
    page.get_by_label("Your message").fill("Which museums first?")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_role("alert")).to_have_text("The server could not be reached. Try again.")
    assert page.get_by_role("button", name="Send").get_attribute("aria-disabled") is None
    expect(page.get_by_role("button", name="Ask for the answer again")).to_have_count(0)
    page.unroute("**/messages")
    # The answer that could not come may be asked for again (the message, still in its
    # box, is sent now).
    page.route("**/reply", lambda route: route.abort())
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_role("alert")).to_have_text("The server could not be reached. Try again.")
    page.unroute("**/reply")
    page.get_by_role("button", name="Ask for the answer again").click()
    expect(page.locator("#messages li.message.assistant .content")).to_have_text(
        "Start with the Vatican Museums."
    )


def test_after_sending_with_the_keyboard_the_focus_is_back_in_the_message_box(page, assistant_chat):
    """The Send button is off while the answer streams in (``aria-disabled``: a disabled one
    took the focus off it, to the page, for as long as the answer took; review); then the
    focus is back in the message box, and a screen reader hears the answer once, whole (the
    row was a live region read again from its start at every piece; review)."""
    page.get_by_label("Your message").focus()
    page.keyboard.type("Which museums first?")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    expect(page.locator("#messages li.message.assistant .content")).to_have_text(
        "Start with the Vatican Museums."
    )
    expect(page.locator("#messages li.streaming")).to_have_count(0)
    expect(page.get_by_label("Your message")).to_be_focused()
    status = page.locator("form#append [role=status]")
    expect(status).to_have_text(re.compile(r": Start with the Vatican Museums\.$"))
    assert page.locator("#messages [aria-live]").count() == 0
    assert page.get_by_role("button", name="Send").get_attribute("aria-disabled") is None


def sent_once_the_session_ended(page, text: str) -> None:
    """Alice sends ``text`` from the conversation page once her session ended (logged out in
    another tab), goes through the login page, and is back on the conversation page with
    ``text`` in its box."""
    conversation_page = page.url
    page.context.clear_cookies(name="sessionid")  # (the CSRF cookie stays, as on a logout)
    page.get_by_label("Your message").fill(text)
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_role("button", name="Log in")).to_be_visible()
    page.get_by_label("User name").fill("alice")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_label("Your message")).to_have_value(text)
    assert page.url == conversation_page


def test_a_message_sent_once_the_session_ended_goes_to_the_login_page(page, assistant_chat):
    """Logged out in another tab: the chat's script followed the redirect inside its
    request and put the login page into the conversation as a message (review). The browser
    goes to the login page, which comes back here; nothing was kept, and the message is back
    in its box, to send again (it was lost: review)."""
    from conversations.models import Message

    sent_once_the_session_ended(page, "Which museums first?")
    assert not Message.objects.filter(conversation=assistant_chat).exists()
    page.reload()  # (given back once)
    expect(page.get_by_label("Your message")).to_have_value("")


def test_a_message_sent_once_the_session_ended_is_back_in_its_box_without_an_assistant(
    page, live_server, people
):
    """No LLM, so no assistant: the form was posted as without the script, and the message
    was lost at the login page (review). The script sends it, as when an assistant answers."""
    from conversations.models import Message
    from conversations.services import conversation_create
    from memsvc.api.principals import Principal

    conversation = conversation_create(Principal.user("alice"), title="Notes")
    log_in(page, live_server, "alice")
    page.goto(f"{live_server.url}/app/c/{conversation.id}/")
    send(page, "First note")  # (shown without a page load, then the box is empty again)
    expect(page.get_by_label("Your message")).to_have_value("")
    sent_once_the_session_ended(page, "Second note")
    assert list(Message.objects.values_list("content", flat=True)) == ["First note"]


def test_a_fragment_asked_once_the_session_ended_goes_to_the_login_page(page, live_server, people):
    """htmx (here the list's search) swapped the login page in as the fragment."""
    log_in(page, live_server, "alice")
    page.context.clear_cookies()
    page.get_by_role("searchbox").fill("plans")
    page.get_by_role("searchbox").press("Enter")
    expect(page.get_by_role("button", name="Log in")).to_be_visible()
    expect(page.get_by_role("heading", name="Conversations", exact=True)).to_have_count(0)


def long_conversation(pages: int):
    """Alice's conversation of ``pages`` pages of messages and one more: "turn 0" first."""
    from conversations.services import NewMessage, conversation_create, messages_append
    from memsvc.api.principals import Principal
    from memsvc.pages.views.common import PAGE_SIZE

    alice = Principal.user("alice")
    conversation = conversation_create(alice, title="Long talk")
    messages_append(
        alice,
        conversation=conversation,
        messages=[NewMessage(content=f"turn {i}") for i in range(pages * PAGE_SIZE + 1)],
    )
    return conversation


def test_a_message_sent_from_a_page_back_opened_on_its_own_goes_after_the_latest(
    page, live_server, people
):
    """A page back opened as a page of its own (a link opened in a tab) had no way on to the
    later turns, and the chat put the message sent there after its last row, turns before
    it that came after (review). The page links on; the message sent is kept and the page
    opens on the latest messages, the new one last."""
    from conversations.models import Message

    conversation = long_conversation(pages=2)
    log_in(page, live_server, "alice")
    page.goto(f"{live_server.url}/app/c/{conversation.id}/")
    back = page.get_by_role("link", name="Earlier messages").get_attribute("href")
    page.goto(f"{live_server.url}/app/c/{conversation.id}/{back}")
    expect(page.get_by_role("link", name="Later messages")).to_be_visible()
    page.get_by_label("Your message").fill("Sent from a page back")
    page.get_by_role("button", name="Send").click()
    expect(page).to_have_url(f"{live_server.url}/app/c/{conversation.id}/")
    expect(page.locator("#messages .message .content").last).to_have_text("Sent from a page back")
    assert Message.objects.order_by("-seq").first().content == "Sent from a page back"


def test_a_message_sent_from_a_search_hit_once_the_session_ended_is_back_in_its_box(
    page, live_server, people
):
    """Opened at a search hit, the chat posted the form without its script: once the session
    had ended, the message was lost at the login page (review)."""
    from conversations.models import Message

    conversation = long_conversation(pages=2)
    hit = Message.objects.get(content="turn 3")
    log_in(page, live_server, "alice")
    page.goto(f"{live_server.url}/app/c/{conversation.id}/?at={hit.id}")
    expect(page.get_by_role("link", name="Later messages")).to_be_visible()
    count = Message.objects.count()
    sent_once_the_session_ended(page, "Unsent from a search hit")
    assert Message.objects.count() == count


def test_an_answer_to_a_message_sent_from_a_search_hit_is_streamed_on_the_latest_page(
    page, live_server, assistant_chat
):
    """Sent from a page that is not the latest, the message goes after the latest turns and
    the page opens there: the assistant's answer is asked for and streamed on that page."""
    from conversations.models import Message
    from conversations.services import NewMessage, messages_append
    from memsvc.api.principals import Principal
    from memsvc.pages.views.common import PAGE_SIZE

    messages_append(
        Principal.user("alice"),
        conversation=assistant_chat,
        messages=[NewMessage(content=f"turn {i}") for i in range(PAGE_SIZE + 5)],
    )
    hit = Message.objects.get(content="turn 1")
    page.goto(f"{live_server.url}/app/c/{assistant_chat.id}/?at={hit.id}")
    page.get_by_label("Your message").fill("Which museums first?")
    page.get_by_role("button", name="Send").click()
    expect(page).to_have_url(f"{live_server.url}/app/c/{assistant_chat.id}/")
    answer = page.locator("#messages li.message.assistant .content").last
    expect(answer).to_have_text("Start with the Vatican Museums.")
    assert Message.objects.filter(content="Which museums first?").count() == 1
