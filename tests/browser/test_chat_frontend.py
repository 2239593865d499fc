"""examples/chat-frontend in Chromium, served from a second origin, against a live memsvc that
grants that origin (CORS): list, create, append, fork and switch branch, share, search, and the
API's error messages; a page from an origin memsvc does not grant cannot use the API."""

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
    expect(messages(page)).to_have_text(
        ["I want to visit Kyoto in autumn", "Which temples should I see?"]
    )
    page.select_option("#branches", fork_id)
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


def test_a_bad_token_shows_the_401_message(page, frontend, live_server):
    connect(page, frontend, live_server.url, "not-a-token")
    expect(page.locator("#error")).to_contain_text("401 unauthorized")
    expect(page.locator("#who")).to_be_empty()


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
