"""examples/chat-frontend in Chromium, served from a second origin, against a live memsvc that
grants that origin (CORS): list, create, append, fork and switch branch, share, search, and the
API's error messages; a page from an origin memsvc does not grant cannot use the API. And what
the a11y review asked of it: labels, focus, announcements, reflow at a phone's width."""

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from conversations.models import Conversation, Membership
from search.embeddings import configured_backend

FRONTEND = Path(__file__).resolve().parents[2] / "examples" / "chat-frontend"


@pytest.fixture
def frontend(static_site, live_server, settings):
    """The example on its own origin, which memsvc grants."""
    url = static_site(FRONTEND)
    settings.CORS_ALLOWED_ORIGINS = [url]
    return url


@pytest.fixture
def embedding_model_loaded():
    """Appends and searches embed in the server (tasks run inline in tests): the model's first
    load takes seconds, which would fall on whichever click comes first."""
    configured_backend().embed(["warm up"])


def connect(page, frontend_url, server_url, token):
    page.goto(f"{frontend_url}/index.html")
    page.fill("#server", server_url)
    page.fill("#token", token)
    page.click("#connect button[type=submit]")


def messages(page):
    return page.locator("#messages li .content")


def open_new_conversation(page, title, *contents):
    """Create ``title`` and append ``contents`` to it, each shown before the next."""
    page.fill("#new-title", title)
    page.click("#new-conversation button")
    expect(page.locator("#conversation-title")).to_have_text(title)
    for content in contents:
        page.fill("#append-content", content)
        page.click("#append button")
        expect(messages(page).last).to_have_text(content)


def test_a_chat_session_from_another_origin(
    page, frontend, live_server, alice, embedding_model_loaded
):
    connect(page, frontend, live_server.url, alice.auth_headers()["HTTP_AUTHORIZATION"][7:])
    expect(page.locator("#who")).to_have_text("connected")
    expect(page.locator("#conversations li")).to_have_count(0)

    page.fill("#new-title", "Trip planning")
    page.click("#new-conversation button")
    expect(page.locator("#conversations li")).to_have_text(["Trip planning"])
    expect(page.locator("#conversation-title")).to_have_text("Trip planning")

    for text in ("I want to visit Kyoto in autumn", "Which temples should I see?"):
        page.fill("#append-content", text)
        page.click("#append button")
        expect(messages(page).last).to_have_text(text)
    expect(messages(page)).to_have_text(
        ["I want to visit Kyoto in autumn", "Which temples should I see?"]
    )

    # Fork at the second message: a new branch where it is replaced.
    page.locator("#messages li").nth(1).locator("button.fork").click()
    page.fill("#fork-content", "Which gardens should I see?")
    page.click("#fork button[type=submit]")
    expect(messages(page)).to_have_text(
        ["I want to visit Kyoto in autumn", "Which gardens should I see?"]
    )
    branches = page.locator("#branches option")
    expect(branches).to_have_count(2)
    fork_id = page.locator("#branches").input_value()

    # Switch back to the original branch, and to the fork again.
    original = next(v for v in branches.evaluate_all("os => os.map(o => o.value)") if v != fork_id)
    page.select_option("#branches", original)
    page.get_by_role("button", name="Open branch").click()
    expect(messages(page)).to_have_text(
        ["I want to visit Kyoto in autumn", "Which temples should I see?"]
    )
    page.select_option("#branches", fork_id)
    page.get_by_role("button", name="Open branch").click()
    expect(messages(page).last).to_have_text("Which gardens should I see?")

    page.fill("#share-user", "bob")
    page.click("#share button")
    expect(page.locator("#members li")).to_contain_text(["bob: reader"])
    assert Membership.objects.filter(principal_id="bob", access_level="reader").count() == 1

    page.fill("#search-query", "Kyoto")
    page.click("#search button")
    expect(page.locator("#results li").first).to_have_text("I want to visit Kyoto in autumn")

    # The API's own error message reaches the page (a 400 answer, read across origins).
    page.fill("#share-user", "agent:someone")
    page.click("#share button")
    # (with the request's id, which the server's log names it by)
    expect(page.locator("#error")).to_have_text(
        re.compile(r"^userId: no such agent \[400 validation_error\] \(request [0-9a-f]{32}\)$")
    )
    page.fill("#search-query", "gardens")
    page.click("#search button")
    expect(page.locator("#error")).to_be_empty()


def test_a_bad_token_shows_the_401_message_on_the_token_field(page, frontend, live_server, alice):
    """Said on the token field too (invalid, described by the alert), until the next try: only
    the alert said it (a11y review)."""
    connect(page, frontend, live_server.url, "not-a-token")
    expect(page.locator("#error")).to_contain_text("401 unauthorized")
    expect(page.locator("#who")).to_be_empty()
    token, server = page.get_by_label("Token"), page.get_by_label("Server")
    expect(token).to_have_attribute("aria-invalid", "true")
    expect(token).to_have_accessible_description(re.compile(r"401 unauthorized"))
    expect(server).not_to_have_attribute("aria-invalid", "true")

    token.fill(alice.auth_headers()["HTTP_AUTHORIZATION"][7:])
    page.click("#connect button[type=submit]")
    expect(page.locator("#who")).to_have_text("connected")
    expect(token).not_to_have_attribute("aria-invalid", "true")
    expect(token).to_have_accessible_description("")


def test_an_origin_memsvc_does_not_grant_cannot_use_the_api(
    page, frontend, static_site, live_server, alice
):
    stranger = static_site(FRONTEND)  # the same page on another port: another origin
    console = []
    page.on("console", lambda message: console.append(message.text))
    connect(page, stranger, live_server.url, alice.auth_headers()["HTTP_AUTHORIZATION"][7:])
    expect(page.locator("#error")).to_contain_text(
        f"is {stranger} in its MEMSVC_CORS_ALLOWED_ORIGINS"
    )
    assert any("CORS policy" in line for line in console), console
    expect(page.locator("#who")).to_be_empty()


def test_a_create_whose_answer_was_lost_is_sent_again_with_its_key_and_made_once(
    page, frontend, live_server, alice
):
    """The connection dropped after the server made the conversation: pressing Create again
    made a second one (review). The retry carries the first try's Idempotency-Key."""
    connect(page, frontend, live_server.url, alice.auth_headers()["HTTP_AUTHORIZATION"][7:])
    expect(page.locator("#who")).to_have_text("connected")
    keys = []

    def lose_the_first_answer(route):
        if route.request.method != "POST":
            return route.continue_()
        keys.append(route.request.headers.get("idempotency-key"))
        if len(keys) > 1:
            return route.continue_()
        route.fetch()  # made by the server...
        route.abort()  # ...and its answer lost on the way

    page.route("**/v1/user/conversations", lose_the_first_answer)
    page.fill("#new-title", "Once only")
    page.click("#new-conversation button")
    expect(page.locator("#error")).to_contain_text("Cannot reach")
    page.click("#new-conversation button")
    expect(page.locator("#conversation-title")).to_have_text("Once only")
    assert keys[0] and keys == [keys[0], keys[0]]
    assert Conversation.objects.filter(title="Once only").count() == 1


def test_connecting_as_another_user_leaves_nothing_of_the_last_one(
    page, frontend, live_server, alice, bob
):
    """(Alice's conversation stayed on the page, and the next message went to it as the new
    user: review.)"""
    connect(page, frontend, live_server.url, alice.auth_headers()["HTTP_AUTHORIZATION"][7:])
    page.fill("#new-title", "Alice's plans")
    page.click("#new-conversation button")
    expect(page.locator("#conversation-title")).to_have_text("Alice's plans")
    page.fill("#token", bob.auth_headers()["HTTP_AUTHORIZATION"][7:])
    page.click("#connect button[type=submit]")
    expect(page.locator("#who")).to_have_text("connected")
    expect(page.locator("#conversation")).to_be_hidden()
    expect(page.locator("#conversations li")).to_have_count(0)
    expect(page.locator("#members li")).to_have_count(0)


def test_the_conversation_opened_last_is_shown_whichever_answer_comes_last(
    page, frontend, live_server, alice
):
    """One conversation's answers came after the next one's had been shown: the page showed
    the first, and the next message went to it (review)."""
    from conversations.models import Message

    connect(page, frontend, live_server.url, alice.auth_headers()["HTTP_AUTHORIZATION"][7:])
    for title in ("First", "Second"):
        page.fill("#new-title", title)
        page.click("#new-conversation button")
        expect(page.locator("#conversation-title")).to_have_text(title)
    first, second = (Conversation.objects.get(title=t) for t in ("First", "Second"))
    held = []
    page.route(f"**/v1/user/conversations/{first.id}", lambda route: held.append(route))
    page.get_by_role("button", name="First", exact=True).click()
    while not held:
        page.wait_for_timeout(20)
    page.get_by_role("button", name="Second", exact=True).click()
    expect(page.locator("#conversation-title")).to_have_text("Second")
    held[0].continue_()  # the first's answer, last
    page.wait_for_timeout(1000)
    expect(page.locator("#conversation-title")).to_have_text("Second")
    page.fill("#append-content", "Meant for the second")
    page.click("#append button")
    expect(page.locator("#messages li .content")).to_have_text(["Meant for the second"])
    assert Message.objects.get(content="Meant for the second").conversation_id == second.id


def test_every_field_has_a_label_and_the_page_a_title_heading(
    page, frontend, live_server, alice, embedding_model_loaded
):
    """Some fields were named only by their placeholder, the fork's box and the access level
    not at all, and the page had no <h1> (a11y review)."""
    connect(page, frontend, live_server.url, alice.auth_headers()["HTTP_AUTHORIZATION"][7:])
    open_new_conversation(page, "Labels", "Name every field")
    # Each fork button named by its message (each was "Fork here" alone: a11y review).
    expect(
        page.get_by_role("button", name="Fork here: Name every field", exact=True)
    ).to_have_count(1)
    page.get_by_role("button", name="Fork here").click()
    for label, field_id in [
        ("Server", "server"),
        ("Token", "token"),
        ("New conversation title", "new-title"),
        ("Search messages", "search-query"),
        ("Branch", "branches"),
        ("Your message", "append-content"),
        ("Fork: a new branch where this message is replaced by:", "fork-content"),
        ("Share with user id", "share-user"),
        ("Access level", "share-level"),
    ]:
        expect(page.get_by_label(label, exact=True)).to_have_id(field_id)
    expect(page.get_by_role("heading", level=1)).to_have_text("memsvc chat")
    expect(page.get_by_role("heading", level=2)).to_have_text(["Conversations", "Labels"])


def test_focus_after_a_fork_and_after_its_editor_is_closed(
    page, frontend, live_server, alice, embedding_model_loaded
):
    """Cancel, and the fork the editor made, hid the editor with focus in it: focus fell to
    <body> (a11y review). Escape closes it too."""
    connect(page, frontend, live_server.url, alice.auth_headers()["HTTP_AUTHORIZATION"][7:])
    open_new_conversation(page, "Focus", "First question", "Second question")
    second = page.locator("#messages li").nth(1).get_by_role("button", name="Fork here")
    editor, box = page.locator("#fork"), page.locator("#fork-content")

    second.click()
    expect(box).to_be_focused()
    page.get_by_role("button", name="Cancel").click()
    expect(editor).to_be_hidden()
    expect(second).to_be_focused()

    second.press("Enter")
    expect(box).to_be_focused()
    box.press("Escape")
    expect(editor).to_be_hidden()
    expect(second).to_be_focused()

    second.click()
    box.fill("Another second question")
    box.press("Tab")  # to the editor's own button, which the fork then hides
    expect(page.locator("#fork button[type=submit]")).to_be_focused()
    page.keyboard.press("Enter")
    expect(messages(page)).to_have_text(["First question", "Another second question"])
    expect(page.locator("#conversation-title")).to_be_focused()


def test_opening_a_conversation_moves_focus_to_its_heading(page, frontend, live_server, alice):
    """Opening one said nothing (a11y review)."""
    connect(page, frontend, live_server.url, alice.auth_headers()["HTTP_AUTHORIZATION"][7:])
    for title in ("First", "Second"):
        open_new_conversation(page, title)
    heading = page.get_by_role("heading", level=2, name="Second")
    expect(heading).to_be_focused()

    page.get_by_role("button", name="First", exact=True).click()
    heading = page.get_by_role("heading", level=2, name="First")
    expect(heading).to_be_focused()
    expect(heading).to_have_id("conversation-title")


def test_a_branch_is_opened_when_asked_not_while_choosing(
    page, frontend, live_server, alice, embedding_model_loaded
):
    """Every arrow key in the branch list opened the branch it came to (a11y review): only
    the Open branch button does."""
    connect(page, frontend, live_server.url, alice.auth_headers()["HTTP_AUTHORIZATION"][7:])
    open_new_conversation(page, "Branches", "The original")
    page.get_by_role("button", name="Fork here").click()
    page.fill("#fork-content", "The fork")
    page.click("#fork button[type=submit]")
    expect(messages(page)).to_have_text(["The fork"])
    branches = page.locator("#branches")
    fork_id = branches.input_value()
    original = Conversation.objects.exclude(id=fork_id).get(title="Branches")

    opened = []
    page.on("request", lambda request: opened.append(request.url))
    # The keyboard's way through the list, which fires a change at every step.
    values = branches.locator("option").evaluate_all("os => os.map(o => o.value)")
    step_to_original = values.index(str(original.id)) - values.index(fork_id)
    branches.press("ArrowDown" if step_to_original > 0 else "ArrowUp")
    expect(branches).to_have_value(str(original.id))
    page.wait_for_timeout(1000)
    assert not [url for url in opened if str(original.id) in url]
    expect(messages(page)).to_have_text(["The fork"])

    page.get_by_role("button", name="Open branch").click()
    expect(messages(page)).to_have_text(["The original"])
    expect(page.locator("#conversation-title")).to_be_focused()


def test_a_search_says_how_many_it_found(
    page, frontend, live_server, alice, embedding_model_loaded
):
    """The hits only appeared: nothing said a search had ended, or what it found (a11y
    review). A hit opened puts focus on its conversation's heading."""
    connect(page, frontend, live_server.url, alice.auth_headers()["HTTP_AUTHORIZATION"][7:])
    open_new_conversation(page, "Kyoto", "I want to visit Kyoto in autumn")
    open_new_conversation(page, "Other", "Nothing to do with it")
    status = page.get_by_role("status")
    page.fill("#search-query", "Kyoto")
    page.get_by_role("button", name="Search").click()
    expect(status).to_have_text(re.compile(r"^\d+ messages? found$"))
    found = page.locator("#results li").count()
    assert found >= 1
    expect(status).to_have_text(f"{found} message{'' if found == 1 else 's'} found")

    page.locator("#results li").get_by_role("button", name="I want to visit Kyoto").click()
    expect(page.get_by_role("heading", level=2, name="Kyoto")).to_be_focused()


def test_the_page_fits_a_phone_width_in_one_column(page, frontend, live_server, alice):
    """At 375 px (or 400% zoom) the conversation had 87 px beside the 18rem list (a11y
    review): under 40rem the page is one column, and nothing is wider than the screen."""
    connect(page, frontend, live_server.url, alice.auth_headers()["HTTP_AUTHORIZATION"][7:])
    open_new_conversation(page, "Narrow")
    for width in (375, 320):
        page.set_viewport_size({"width": width, "height": 800})
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        # Nor scrolls sideways within a part of it.
        for part in ("header", "aside", "main"):
            sizes = page.locator(part).evaluate("e => [e.scrollWidth, e.clientWidth]")
            assert sizes[0] <= sizes[1], (width, part, sizes)
        assert page.locator("#append-content").bounding_box()["width"] > 200


def test_a_refused_share_is_said_on_its_field_until_the_next_one(
    page, frontend, live_server, alice
):
    """Only the alert said it (a11y review): the field is invalid and described by it."""
    connect(page, frontend, live_server.url, alice.auth_headers()["HTTP_AUTHORIZATION"][7:])
    open_new_conversation(page, "Shared")
    user = page.locator("#share-user")
    user.fill("agent:someone")
    page.get_by_role("button", name="Share", exact=True).click()
    expect(page.locator("#error")).to_contain_text("userId: no such agent")
    expect(user).to_have_attribute("aria-invalid", "true")
    expect(user).to_have_accessible_description(re.compile(r"^userId: no such agent"))
    expect(page.locator("#share-level")).not_to_have_attribute("aria-invalid", "true")

    user.fill("bob")
    page.get_by_role("button", name="Share", exact=True).click()
    expect(page.locator("#members li")).to_contain_text(["bob: reader"])
    expect(user).not_to_have_attribute("aria-invalid", "true")
    expect(user).to_have_accessible_description("")
