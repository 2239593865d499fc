"""The conversations pages with the Django test client: what each person sees and may do,
and every refusal (a stranger's 404, a reader's 403, bad input's 400), with nothing changed."""

import re
import uuid
from urllib.parse import quote, urljoin, urlsplit

import pytest
from django.urls import resolve, reverse
from django.utils.html import escape

from conversations.models import (
    AccessLevel,
    Channel,
    Conversation,
    Membership,
    Message,
    OwnershipTransfer,
    Visibility,
)
from conversations.services import (
    NewMessage,
    conversation_delete,
    conversation_fork,
    messages_append,
    messages_delete,
)
from memsvc.api.pagination import ANOTHER_LIST
from memsvc.api.principals import Principal
from search.services import embed_pending
from tests.pages.conftest import conversation_of
from tests.pages.html import forms, inline_scripts, unlabelled_controls

pytestmark = pytest.mark.django_db


def page_of(conversation) -> str:
    return reverse("pages:conversation", args=[conversation.id])


def snapshot():
    return (
        sorted(Conversation.objects.values_list("id", "title", "forked_at_conversation_id")),
        sorted(Membership.objects.values_list("group_id", "principal_id", "access_level")),
        sorted(Message.objects.values_list("id", "content")),
        sorted(OwnershipTransfer.objects.values_list("id", "status")),
    )


# --- login -----------------------------------------------------------------------------------


def test_pages_need_a_login_and_the_login_page_logs_in(client, alice_page):
    response = client.get("/app/")
    assert response.status_code == 302
    assert response["Location"].startswith("/app/login/?next=/app/")
    login_page = client.get("/app/login/")
    assert login_page.status_code == 200
    assert unlabelled_controls(login_page.content) == []
    refused = client.post("/app/login/", {"username": "alice", "password": "wrong"})
    assert refused.status_code == 200
    assert b"did not match" in refused.content
    assert b'value="alice"' in refused.content  # (the name typed kept: review)
    # Both fields said invalid and described by the refusal (review: neither was).
    assert refused.content.count(b'aria-invalid="true" aria-describedby="login-refused"') == 2
    assert b'role="alert" id="login-refused"' in refused.content
    assert b"aria-invalid" not in login_page.content
    logged_in = client.post(
        "/app/login/", {"username": "alice", "password": "a long enough password"}
    )
    assert logged_in.status_code == 302 and logged_in["Location"] == "/app/"
    assert client.get("/app/").status_code == 200
    assert client.post("/app/logout/").status_code == 302
    assert client.get("/app/").status_code == 302


def test_a_request_of_a_page_whose_session_ended_goes_to_the_login_page_whole(client):
    """htmx (a "More" link, a search) and the chat's script follow a redirect inside the
    request: the login page came back as the fragment, and was put into the list (review).
    They are told where to send the browser (``HX-Redirect``: htmx goes there, and so does
    the script), and the login then comes back to the page the person was on; a form's POST
    comes back to the page it was sent from (this site's only), not to its own address."""
    conversation = f"/app/c/{uuid.uuid4()}/"
    fragment = client.get(
        "/app/search/",
        {"q": "plans"},
        HTTP_HX_REQUEST="true",
        HTTP_HX_CURRENT_URL=f"http://testserver{conversation}?at=5",
    )
    assert fragment.status_code == 200 and fragment.content == b""
    assert fragment["HX-Redirect"] == f"/app/login/?next={quote(conversation)}%3Fat%3D5"

    chat = client.post(
        f"{conversation}messages",
        {"content": "hello"},
        HTTP_HX_REQUEST="true",
        HTTP_REFERER=f"http://testserver{conversation}",
    )
    assert chat["HX-Redirect"] == f"/app/login/?next={quote(conversation)}"
    for referer in ("https://elsewhere.example/", None):
        headers = {"HTTP_REFERER": referer} if referer else {}
        form = client.post(f"{conversation}rename", {"title": "x"}, **headers)
        assert (form.status_code, form["Location"]) == (302, "/app/login/?next=/app/")
    assert client.get("/app/search/?q=x")["Location"] == "/app/login/?next=/app/search/%3Fq%3Dx"


def test_pages_count_against_the_persons_rate_limit_as_their_api_calls_do(
    alice_page, bob_page, alice, settings
):
    settings.MEMSVC_RATE_LIMIT = 3
    assert alice_page.get("/app/").status_code == 200
    assert alice_page.get("/app/search/", {"q": "plans"}).status_code == 200
    assert alice_page.get("/v1/user/conversations", **alice.auth_headers()).status_code == 200
    refused = alice_page.get("/app/")
    assert refused.status_code == 429 and 1 <= int(refused["Retry-After"]) <= 60
    assert b"rate limit of 3 requests a minute exceeded" in refused.content
    assert bob_page.get("/app/").status_code == 200  # another person, another count


# --- the list --------------------------------------------------------------------------------


def test_the_list_shows_only_what_the_person_may_see_with_their_role(alice_page, bob_page):
    conversation_of("alice", "Alice's own", "hello")
    conversation_of("alice", "Shared with Bob", "hi bob", shared=[("bob", "reader")])
    conversation_of("charlie", "Charlie's secret", "psst")

    alice = alice_page.get("/app/").content.decode()
    assert "Alice&#x27;s own" in alice and "Shared with Bob" in alice
    assert "Charlie" not in alice
    bob = bob_page.get("/app/").content.decode()
    assert "Shared with Bob" in bob and ">reader<" in bob
    assert "Alice&#x27;s own" not in bob and "Charlie" not in bob


def test_the_list_is_paged_latest_first(alice_page):
    for n in range(52):
        conversation_of("alice", f"Conversation number {n:02d}")
    first = alice_page.get("/app/").content.decode()
    assert "Conversation number 51" in first and "Conversation number 02" in first
    assert "Conversation number 01" not in first
    assert "More conversations" in first
    cursor = first.split('href="?after=')[1].split('"')[0]
    # htmx asks for the next rows only.
    rest = alice_page.get(f"/app/?after={cursor}", headers={"HX-Request": "true"})
    assert "<html" not in rest.content.decode()
    assert "Conversation number 01" in rest.content.decode()
    assert "Conversation number 00" in rest.content.decode()
    assert "More conversations" not in rest.content.decode()


def test_a_later_page_emptied_meanwhile_does_not_say_there_are_no_conversations(
    alice_page, bob_page
):
    """(The rows of the next page deleted before it was asked for: "No conversations yet."
    was added below the conversations shown.)"""
    conversations = [conversation_of("alice", f"Conversation number {n:02d}") for n in range(51)]
    first = alice_page.get("/app/").content.decode()
    cursor = first.split('href="?after=')[1].split('"')[0]
    # The one the next page held.
    conversation_delete(Principal.user("alice"), conversation=conversations[0])
    rest = alice_page.get(f"/app/?after={cursor}", headers={"HX-Request": "true"})
    assert rest.status_code == 200
    assert "No conversations yet" not in rest.content.decode()
    assert "No conversations yet" in bob_page.get("/app/").content.decode()
    # Opened on its own (a link opened in a tab), it says so, with the way back: it was a
    # blank section (review).
    alone = alice_page.get(f"/app/?after={cursor}").content.decode()
    assert "No more conversations here" in alone and '<a href="/app/">The first page</a>' in alone


def test_an_earlier_page_emptied_meanwhile_does_not_say_there_are_no_messages(alice_page):
    """(As for the list: "No messages yet." was added above the messages shown.)"""
    texts = [f"message number {n:03d}" for n in range(51)]
    conversation = conversation_of("alice", "Long", *texts)
    html = alice_page.get(page_of(conversation)).content.decode()
    cursor = html.split('href="?before=')[1].split('"')[0]
    messages_delete(Principal.user("ops"), messages=Message.objects.filter(content=texts[0]))
    earlier = alice_page.get(f"{page_of(conversation)}?before={cursor}", HTTP_HX_REQUEST="true")
    assert earlier.status_code == 200 and "<html" not in earlier.content.decode()
    assert "No messages yet" not in earlier.content.decode()
    assert "No messages yet" in alice_page.get(page_of(conversation_of("alice"))).content.decode()


def test_create_a_conversation(alice_page):
    response = alice_page.post("/app/conversations/new", {"title": "Holiday"})
    conversation = Conversation.objects.get(title="Holiday")
    assert response["Location"] == page_of(conversation)
    assert Membership.objects.get(group=conversation.group).principal_id == "alice"
    too_long = alice_page.post("/app/conversations/new", {"title": "x" * 100_000})
    assert too_long.status_code == 400
    assert Conversation.objects.count() == 1


@pytest.mark.parametrize("title", ["   ", "\ufeff", "\u200b "])
def test_a_title_of_spaces_is_shown_as_untitled_not_as_an_empty_link(alice_page, title):
    """(The form took "   " as a title: the list showed a link with no text to click; one
    of invisible characters too: review.)"""
    conversation = conversation_of("alice", title, "hello")
    link = f'<a class="title" href="{page_of(conversation)}">Untitled</a>'
    assert link in alice_page.get("/app/").content.decode()
    html = alice_page.get(page_of(conversation)).content.decode()
    assert '<h1 id="conversation-title">Untitled</h1>' in html
    assert '<span aria-current="page" class="current">Untitled</span>' in html


def test_a_title_is_isolated_from_the_text_around_it(alice_page):
    """A title holding a right-to-left override turned the author and the date after it
    around in a hit's link, and could pass a message off as someone else's (review): it is
    isolated (a ``<bdi>``), its own isolates left out so none ends that early."""
    conversation = conversation_of("alice", "\u202eevil\u2069\u2029\u202e", "zanzibar spice market")
    title = "\u202eevil \u202e"  # (a paragraph's end ends every isolate: a space)
    found = alice_page.get("/app/search/?q=zanzibar").content.decode()
    assert f"<bdi>{title}</bdi>: alice, " in found
    listed = alice_page.get("/app/").content.decode()
    assert f'href="{page_of(conversation)}"><bdi>{title}</bdi></a>' in listed
    html = alice_page.get(page_of(conversation)).content.decode()
    assert f'<h1 id="conversation-title"><bdi>{title}</bdi></h1>' in html
    # Where no element may be, by FSI ... PDI.
    assert f"<title>\u2068{title}\u2069 · memsvc</title>" in html
    assert f'data-confirm="Delete “\u2068{title}\u2069”' in html


def test_texts_are_laid_out_in_the_direction_of_their_own_script(alice_page):
    """An Arabic or Hebrew message was laid out left to right, its last full stop at its
    start (review): each text, and each box one is typed in, takes its own direction."""
    arabic = "\u0645\u0631\u062d\u0628\u0627 \u0628\u0643."
    conversation = conversation_of("alice", "Salam", arabic)
    html = alice_page.get(page_of(conversation)).content.decode()
    assert f'<div class="content" dir="auto">{arabic}</div>' in html
    assert '<textarea id="append-content" name="content" rows="3" dir="auto"' in html
    assert f'<p class="preview" dir="auto">{arabic}</p>' in alice_page.get("/app/").content.decode()
    found = alice_page.get("/app/search/?q=" + arabic.split()[0]).content.decode()
    assert '<p class="snippet" dir="auto">' in found


def test_search_finds_what_the_person_may_see_and_links_to_the_message(alice_page, bob_page):
    mine = conversation_of("alice", "Pets", "My dog Rex loves the beach")
    conversation_of("charlie", "Charlie", "Charlie's dog loves the beach too")
    response = alice_page.get("/app/search/", {"q": "dog beach"})
    html = response.content.decode()
    message = Message.objects.get(conversation=mine)
    assert f"{page_of(mine)}?at={message.id}#m-{message.id}" in html
    assert "<mark>dog</mark>" in html or "<mark>beach</mark>" in html
    # Named by its conversation too, and counted (review: "alice, <date>" three times).
    assert f"><bdi>Pets</bdi>: alice, {message.created_at:%Y-%m-%d}" in html
    assert "1 message found for “dog beach”" in html
    assert "Charlie" not in html
    assert "Nothing found" in bob_page.get("/app/search/", {"q": "dog beach"}).content.decode()
    # The link opens the conversation at that message, marked for a screen reader too (a
    # ring marked it only; review).
    opened = alice_page.get(page_of(mine), {"at": str(message.id)}).content.decode()
    assert (
        f'class="message user target" id="m-{message.id}" tabindex="-1" aria-current="true"'
        in opened
    )
    assert "The message you were looking for:" in opened


@pytest.mark.parametrize("query", ["   ", "\u200b\u2060"])
def test_a_search_with_nothing_to_read_is_no_search(alice_page, query):
    """As blank: the page without results, not the API's refusal of an empty query."""
    conversation_of("alice", "Pets", "My dog Rex loves the beach")
    response = alice_page.get("/app/search/", {"q": query})
    assert response.status_code == 200
    assert "Rex" not in response.content.decode()


def test_a_search_shows_only_what_is_relevant_itself(alice_page):
    """Any word showed the 20 messages nearest it, however unrelated (review): a hit needs a
    relevance of ``PAGE_MIN_SCORE`` (the API's ``minScore``)."""
    conversation_of("alice", "Pets", "My dog Rex loves the beach", "We bought oat milk")
    embed_pending()
    found = alice_page.get("/app/search/", {"q": "dog"}).content.decode()
    assert "Rex" in found and "oat milk" not in found
    nothing = alice_page.get("/app/search/", {"q": "quantum chromodynamics"}).content.decode()
    assert "Nothing found for" in nothing and "Rex" not in nothing


def test_a_page_and_its_htmx_fragment_share_an_address_and_say_they_vary_on_it(alice_page):
    """The list's search pushes /app/search/?q= (htmx): the browser must not keep its
    fragment as the page of that address (going back would show the bare fragment)."""
    conversation_of("alice", "Pets", "My dog Rex loves the beach")
    fragment = alice_page.get("/app/search/", {"q": "dog"}, headers={"HX-Request": "true"})
    whole = alice_page.get("/app/search/", {"q": "dog"})
    assert "<html" not in fragment.content.decode() and "<html" in whole.content.decode()
    refused = alice_page.get("/app/search/", {"q": "\x00"}, headers={"HX-Request": "true"})
    for response in (fragment, whole, refused):
        assert "HX-Request" in response["Vary"]
    # A refused search puts no address into the history (review).
    assert refused["HX-Push-Url"] == "false" and "HX-Push-Url" not in fragment


# --- one conversation ------------------------------------------------------------------------


def test_messages_in_order_users_channel_only(alice_page):
    conversation = conversation_of("alice", "Chat", "first", "second")
    messages_append(
        Principal.user("alice"),
        conversation=conversation,
        messages=[
            NewMessage(content="an agent's note", channel=Channel.MEMORY),
            NewMessage(content="hidden thoughts", visibility=Visibility.AGENT),
            NewMessage(content="third"),
        ],
    )
    html = alice_page.get(page_of(conversation)).content.decode()
    assert html.index("first") < html.index("second") < html.index("third")
    assert "an agent&#x27;s note" not in html and "hidden thoughts" not in html
    assert "No assistant is configured" in html


def test_a_long_conversation_opens_on_its_latest_messages_and_pages_back(alice_page):
    conversation = conversation_of("alice", "Long", *[f"message number {n:03d}" for n in range(60)])
    html = alice_page.get(page_of(conversation)).content.decode()
    assert "message number 010" in html and "message number 009" not in html
    assert html.index("message number 010") < html.index("message number 059")
    cursor = html.split('href="?before=')[1].split('"')[0]
    rest = alice_page.get(page_of(conversation), {"before": cursor}, headers={"HX-Request": "true"})
    earlier = rest.content.decode()
    assert "<html" not in earlier and "Earlier messages" not in earlier
    assert earlier.index("message number 000") < earlier.index("message number 009")
    assert "message number 010" not in earlier
    # Without the script, the earlier page is a whole one, which leads back to the latest
    # (it led nowhere but further back: review).
    whole = alice_page.get(page_of(conversation), {"before": cursor}).content.decode()
    assert f'<a href="{page_of(conversation)}">To the latest messages</a>' in whole
    # Opened at a message (a search hit), it pages on from there.
    middle = Message.objects.get(content="message number 005")
    at = alice_page.get(page_of(conversation), {"at": str(middle.id)}).content.decode()
    assert "message number 004" not in at and "message number 054" in at
    # ... and back to the turns before it (it could not: review).
    before = at.split('href="?before=')[1].split('"')[0]
    back = alice_page.get(page_of(conversation), {"before": before}).content.decode()
    assert "message number 000" in back and "message number 004" in back
    assert "message number 005" not in back
    cursor = at.split('href="?after=')[1].split('"')[0]
    later = alice_page.get(page_of(conversation), {"after": cursor}).content.decode()
    assert "message number 055" in later and "message number 059" in later
    # A cursor that is not one of ours opens the conversation at its latest messages,
    # saying so (it was a 400 page in the API's words, with no way back: review).
    opened = alice_page.get(page_of(conversation), {"before": "garbage"}, follow=True)
    assert opened.redirect_chain == [(page_of(conversation), 302)]
    html = opened.content.decode()
    assert "no longer there: here is its start" in html and "message number 059" in html
    # Its fragment, for htmx, is refused: the page around it holds the list already.
    fragment = alice_page.get(page_of(conversation), {"before": "garbage"}, HTTP_HX_REQUEST="true")
    assert fragment.status_code == 400
    assert "before: malformed cursor" in fragment.content.decode()


def test_a_message_cursor_of_the_other_way_or_of_another_conversation_is_refused(alice_page):
    """A cursor held only a message's place (its seq): a later page's given as ``before``,
    or one of another conversation, read as a place there, and showed the wrong messages
    (review)."""
    conversation = conversation_of("alice", "Long", *[f"message number {n:03d}" for n in range(60)])
    other = conversation_of("alice", "Other", *[f"other number {n:03d}" for n in range(60)])
    middle = Message.objects.get(content="message number 005")
    at = alice_page.get(page_of(conversation), {"at": str(middle.id)}).content.decode()
    later = at.split('href="?after=')[1].split('"')[0]
    earlier = at.split('href="?before=')[1].split('"')[0]
    for opened, params in [
        (conversation, {"before": later}),
        (other, {"after": later}),
        (other, {"before": earlier}),
    ]:
        refused = alice_page.get(page_of(opened), params, HTTP_HX_REQUEST="true")
        [(field, _)] = params.items()
        assert refused.status_code == 400, (params, refused.content)
        assert f"{field}: {ANOTHER_LIST}" in refused.content.decode()
        # As a page of its own: the conversation's latest messages (code review).
        page = alice_page.get(page_of(opened), params)
        assert (page.status_code, page["Location"]) == (302, page_of(opened))
    # The list of conversations alike, its other parameters kept.
    home = alice_page.get("/app/", {"after": later, "q": "Long"})
    assert (home.status_code, home["Location"]) == (302, "/app/?q=Long")


@pytest.mark.parametrize("path", ["/app/c/not-a-uuid/", "/app/nowhere/"])
def test_a_path_no_page_takes_is_a_page_with_a_way_back(alice_page, client, path):
    """(Django's bare "Not Found" page, with no way back: review.) Elsewhere, Django's."""
    for person in (alice_page, client):
        response = person.get(path)
        assert response.status_code == 404
        assert "There is no such page here." in response.content.decode()
        assert f'href="{reverse("pages:home")}"' in response.content.decode()
    assert "no such page" not in client.get("/static/nothing.css").content.decode()


def test_a_stranger_gets_404_and_learns_nothing(charlie_page):
    conversation = conversation_of("alice", "Alice's secret plans", "the secret")
    before = snapshot()
    response = charlie_page.get(page_of(conversation))
    assert response.status_code == 404
    assert b"secret" not in response.content
    message = Message.objects.get()
    for path, data in [
        (reverse("pages:append", args=[conversation.id]), {"content": "hi"}),
        (reverse("pages:fork", args=[conversation.id, message.id]), {"content": "hi"}),
        (reverse("pages:rename", args=[conversation.id]), {"title": "mine"}),
        (
            reverse("pages:share", args=[conversation.id]),
            {"userId": "charlie", "accessLevel": "reader"},
        ),
        (reverse("pages:transfer", args=[conversation.id]), {"newOwnerUserId": "charlie"}),
        (reverse("pages:delete", args=[conversation.id]), {}),
        (reverse("pages:membership_delete", args=[conversation.id]), {"userId": "alice"}),
    ]:
        assert charlie_page.post(path, data).status_code == 404, path
    assert snapshot() == before


def test_a_reader_sees_no_controls_and_cannot_post_share_or_fork(bob_page):
    conversation = conversation_of("alice", "Read only", "hello", shared=[("bob", "reader")])
    message = Message.objects.get()
    html = bob_page.get(page_of(conversation)).content.decode()
    assert "hello" in html
    for control in [
        'id="append"',
        'id="share"',
        "Fork from here",
        "Rename",
        "Transfer",
        "Delete this",
    ]:
        assert control not in html, control
    assert "Leave" in html  # a reader may leave
    before = snapshot()
    for path, data in [
        (reverse("pages:append", args=[conversation.id]), {"content": "hi"}),
        (reverse("pages:fork", args=[conversation.id, message.id]), {"content": "hi"}),
        (reverse("pages:rename", args=[conversation.id]), {"title": "mine"}),
        (
            reverse("pages:share", args=[conversation.id]),
            {"userId": "dave", "accessLevel": "reader"},
        ),
        (reverse("pages:transfer", args=[conversation.id]), {"newOwnerUserId": "bob"}),
        (reverse("pages:delete", args=[conversation.id]), {}),
        (reverse("pages:membership_delete", args=[conversation.id]), {"userId": "alice"}),
    ]:
        response = bob_page.post(path, data)
        assert response.status_code == 403, path
        assert b"needs" in response.content or b"owner" in response.content
    assert snapshot() == before


def test_a_writer_appends_forks_and_renames_but_does_not_share(bob_page):
    conversation = conversation_of(
        "alice", "Plans", "Let's go to Rome", "Or Paris?", shared=[("bob", "writer")]
    )
    html = bob_page.get(page_of(conversation)).content.decode()
    assert 'id="append"' in html and "Fork from here" in html and 'id="share"' not in html
    response = bob_page.post(reverse("pages:append", args=[conversation.id]), {"content": "Rome!"})
    assert response.status_code == 302
    assert (
        Message.objects.filter(conversation=conversation).order_by("seq").last().content == "Rome!"
    )
    assert (
        bob_page.post(reverse("pages:append", args=[conversation.id]), {"content": ""}).status_code
        == 400
    )

    paris = Message.objects.get(content="Or Paris?")
    forked = bob_page.post(
        reverse("pages:fork", args=[conversation.id, paris.id]), {"content": "Or London?"}
    )
    fork = Conversation.objects.get(forked_at_conversation=conversation)
    assert forked["Location"] == page_of(fork)
    fork_html = bob_page.get(page_of(fork)).content.decode()
    assert "Let&#x27;s go to Rome" in fork_html and "Or London?" in fork_html
    assert "Or Paris?" not in fork_html
    # The tree links every branch; the current one is marked, not linked.
    assert page_of(conversation) in fork_html and 'aria-current="page"' in fork_html
    # Branches of one title are told apart by their last message.
    tree = fork_html[fork_html.index('<ul class="tree">') :]
    assert "“Rome!”" in tree and "“Or London?”" in tree

    bob_page.post(reverse("pages:rename", args=[conversation.id]), {"title": "Rome or Paris"})
    assert Conversation.objects.get(id=conversation.id).title == "Rome or Paris"


def _branches(html: str) -> list[tuple[int, str]]:
    """The branches' list of a page: (how many lists deep, the title) of each entry; the
    lists and items it opens all closed."""
    from html.parser import HTMLParser

    class Branches(HTMLParser):
        def __init__(self):
            super().__init__()
            self.open, self.entries, self.naming = [], [], False

        def handle_starttag(self, tag, attrs):
            if tag == "bdi":  # (a title's, isolated: ``shown_title``)
                return
            if tag in {"ul", "li"}:
                self.open.append(tag)
            self.naming = tag == "a" or ("aria-current", "page") in attrs

        def handle_endtag(self, tag):
            if tag == "bdi":
                return
            if tag in {"ul", "li"}:
                assert self.open.pop() == tag
            self.naming = False

        def handle_data(self, data):
            if self.naming and data.strip():
                self.entries.append((self.open.count("ul"), data.strip()))

    nav = html[html.index('<nav aria-label="Branches">') :]
    parser = Branches()
    parser.feed(nav[: nav.index("</nav>")])
    assert parser.open == []
    return parser.entries


def test_the_branches_are_drawn_nested_however_deep_the_forks_go(alice_page):
    root = conversation_of("alice", "root", "hello")
    alice = Principal.user("alice")

    def fork_of(conversation, title):
        at = Message.objects.filter(conversation=conversation).order_by("seq").last()
        return conversation_fork(
            alice, conversation=conversation, message=at, title=title, new_message={"content": "x"}
        )

    a = fork_of(root, "a")
    a1 = fork_of(a, "a1")
    fork_of(a1, "a11")
    fork_of(root, "b")
    assert _branches(alice_page.get(page_of(a1)).content.decode()) == [
        (1, "root"),
        (2, "a"),
        (3, "a1"),
        (4, "a11"),
        (2, "b"),
    ]
    # A chain of 100 forks (a person editing a message again and again): the template that
    # included itself for each level reached Python's recursion limit at about 70, and no
    # page of the group opened (500; review).
    deepest = a1
    for depth in range(100):
        deepest = fork_of(deepest, f"d{depth}")
    response = alice_page.get(page_of(deepest))
    assert response.status_code == 200
    drawn = _branches(response.content.decode())
    assert len(drawn) == 105 and drawn[-2:] == [(103, "d99"), (2, "b")]


def test_a_manager_shares_changes_and_removes_members_but_never_the_owner(alice_page, bob_page):
    conversation = conversation_of("alice", "Team", "hi", shared=[("bob", "manager")])
    share = reverse("pages:share", args=[conversation.id])
    assert bob_page.post(share, {"userId": "carol", "accessLevel": "reader"}).status_code == 302
    assert bob_page.post(share, {"userId": "carol", "accessLevel": "reader"}).status_code == 409
    assert bob_page.post(share, {"userId": "dave", "accessLevel": "owner"}).status_code == 403
    assert bob_page.post(share, {"userId": "dave", "accessLevel": "boss"}).status_code == 400
    level = reverse("pages:membership_update", args=[conversation.id])
    assert bob_page.post(level, {"userId": "carol", "accessLevel": "writer"}).status_code == 302
    assert Membership.objects.get(principal_id="carol").access_level == AccessLevel.WRITER
    assert bob_page.post(level, {"userId": "alice", "accessLevel": "reader"}).status_code == 403
    assert bob_page.post(level, {"userId": "nobody", "accessLevel": "reader"}).status_code == 404
    assert bob_page.post(level, {"accessLevel": "reader"}).status_code == 400
    remove = reverse("pages:membership_delete", args=[conversation.id])
    assert bob_page.post(remove, {"userId": "alice"}).status_code == 403
    assert bob_page.post(remove, {"userId": "carol"}).status_code == 302
    assert sorted(Membership.objects.values_list("principal_id", flat=True)) == ["alice", "bob"]


def test_a_nul_in_a_members_id_is_refused_and_changes_nothing(alice_page):
    """(A NUL in a member's id, which PostgreSQL cannot compare, was a 500.)"""
    conversation = conversation_of("alice", "Team", "hi", shared=[("bob", "writer")])
    before = snapshot()
    for name in ["membership_update", "membership_delete"]:
        path = reverse(f"pages:{name}", args=[conversation.id])
        response = alice_page.post(path, {"userId": "bob\x00", "accessLevel": "reader"})
        assert response.status_code == 400, path
        assert "must not contain NUL characters" in response.content.decode()
    refused = alice_page.post(
        reverse("pages:membership_delete", args=[conversation.id]),
        {"userId": "\x00"},
        headers={"HX-Request": "true"},
    )
    assert refused.status_code == 400 and "<html" not in refused.content.decode()
    assert snapshot() == before


def test_a_user_id_typed_with_spaces_around_it_names_that_user(alice_page, bob_page):
    """(A phone keyboard's completion adds a space after a word: sharing with "bob " made a
    member "bob " that looked like bob and was someone else, and so did an offer.)"""
    conversation = conversation_of("alice", "Team", "hi")
    share = reverse("pages:share", args=[conversation.id])
    assert alice_page.post(share, {"userId": "bob ", "accessLevel": "reader"}).status_code == 302
    assert Membership.objects.filter(principal_id="bob").exists()
    assert "Team" in bob_page.get("/app/").content.decode()
    assert alice_page.post(share, {"userId": "  ", "accessLevel": "reader"}).status_code == 400
    transfer = reverse("pages:transfer", args=[conversation.id])
    assert alice_page.post(transfer, {"newOwnerUserId": " bob\t"}).status_code == 302
    assert OwnershipTransfer.objects.get().to_principal == "bob"
    assert sorted(Membership.objects.values_list("principal_id", flat=True)) == ["alice", "bob"]


def member_forms(page_client, conversation, member: str) -> dict:
    """The forms of the conversation's page about one member, by where they post (as a
    browser resolves their address, dot segments dropped)."""
    url = "http://testserver" + page_of(conversation)
    found = {}
    for form in forms(page_client.get(page_of(conversation)).content):
        if form["fields"].get("userId") == member:
            path = urlsplit(urljoin(url, form["action"])).path
            found[resolve(path).url_name] = (path, form["fields"])
    return found


@pytest.mark.parametrize("member", ["..", ".", "../../delete", "evil/x", "%2e%2e", "a?b#c"])
def test_a_member_of_any_id_is_changed_and_removed_from_the_page(alice_page, member):
    """An identity provider's ``sub`` may hold anything. (A member "evil/x" made the page a
    500; one shared as "../../delete" had Remove post to the conversation's delete; one of
    ".." or "." could not be changed or removed: a browser drops the dot segments of an
    address, "%2E" too, and the id was the last segment of the forms' addresses.)"""
    conversation = conversation_of("alice", "Team", "hi", shared=[(member, "reader")])
    found = member_forms(alice_page, conversation, member)
    assert set(found) == {"membership_update", "membership_delete"}
    path, fields = found["membership_update"]
    assert alice_page.post(path, {**fields, "accessLevel": "writer"}).status_code == 302
    assert Membership.objects.get(principal_id=member).access_level == AccessLevel.WRITER
    path, fields = found["membership_delete"]
    assert alice_page.post(path, fields).status_code == 302
    assert Conversation.objects.filter(id=conversation.id).exists()
    assert not Membership.objects.filter(principal_id=member).exists()


def test_a_member_whose_id_holds_a_slash_is_reached_by_the_api(api, alice):
    conversation = conversation_of("alice", "Team", "hi", shared=[("evil/x", "reader")])
    path = f"/v1/user/conversations/{conversation.id}/memberships/evil/x"
    assert api.patch(path, {"accessLevel": "writer"}, as_=alice).status_code == 200
    assert Membership.objects.get(principal_id="evil/x").access_level == AccessLevel.WRITER
    assert api.delete(path, as_=alice).status_code == 204
    assert not Membership.objects.filter(principal_id="evil/x").exists()


def test_sharing_makes_the_conversation_appear_for_the_other_person(alice_page, bob_page):
    conversation = conversation_of("alice", "For Bob soon", "hello")
    assert bob_page.get(page_of(conversation)).status_code == 404
    alice_page.post(
        reverse("pages:share", args=[conversation.id]), {"userId": "bob", "accessLevel": "reader"}
    )
    assert "For Bob soon" in bob_page.get("/app/").content.decode()
    assert bob_page.get(page_of(conversation)).status_code == 200


def test_an_offer_to_someone_not_yet_a_member_names_the_conversation_without_a_link(
    alice_page, bob_page
):
    """Its link led the one offered it to a 404: they may not open it before they accept."""
    conversation = conversation_of("alice", "Handover", "hi")
    transfer = reverse("pages:transfer", args=[conversation.id])
    assert alice_page.post(transfer, {"newOwnerUserId": "bob"}).status_code == 302
    bob_sees = bob_page.get("/app/").content.decode()
    assert "alice</strong> offers you “<bdi>Handover</bdi>”." in bob_sees
    assert page_of(conversation) not in bob_sees
    assert f'You offered <a href="{page_of(conversation)}">“<bdi>Handover</bdi>”</a> to' in (
        alice_page.get("/app/").content.decode()
    )


def test_ownership_transfer_offered_accepted_and_declined(alice_page, bob_page, charlie_page):
    conversation = conversation_of(
        "alice", "Handover", "hi", shared=[("bob", "writer"), ("charlie", "reader")]
    )
    transfer = reverse("pages:transfer", args=[conversation.id])
    assert "Transfer ownership to" in alice_page.get(page_of(conversation)).content.decode()
    assert alice_page.post(transfer, {"newOwnerUserId": "bob"}).status_code == 302
    assert alice_page.post(transfer, {"newOwnerUserId": "charlie"}).status_code == 409
    offer = OwnershipTransfer.objects.get()
    # Each sees the offer by the conversation's title, on the list and on its page, with
    # what they may do about it; a third member sees nothing of it.
    assert "alice</strong> offers you <a" in bob_page.get("/app/").content.decode()
    assert "“<bdi>Handover</bdi>”" in bob_page.get("/app/").content.decode()
    assert "You offered <a" in alice_page.get("/app/").content.decode()
    assert "“<bdi>Handover</bdi>”" in alice_page.get("/app/").content.decode()
    bob_sees = bob_page.get(page_of(conversation)).content.decode()
    assert "offers you this conversation" in bob_sees
    assert reverse("pages:transfer_resolve", args=[offer.id, "accept"]) in bob_sees
    alice_sees = alice_page.get(page_of(conversation)).content.decode()
    assert "You offered this conversation to <strong>bob</strong>" in alice_sees
    assert reverse("pages:transfer_resolve", args=[offer.id, "cancel"]) in alice_sees
    assert "Transfer ownership to" not in alice_sees  # one offer at a time
    charlie_sees = charlie_page.get(page_of(conversation)).content.decode()
    assert "Ownership offer" not in charlie_sees and "/transfers/" not in charlie_sees
    # Only the recipient accepts; a stranger does not even see the offer.
    assert (
        alice_page.post(reverse("pages:transfer_resolve", args=[offer.id, "accept"])).status_code
        == 403
    )
    assert (
        charlie_page.post(reverse("pages:transfer_resolve", args=[offer.id, "accept"])).status_code
        == 404
    )
    assert (
        bob_page.post(reverse("pages:transfer_resolve", args=[offer.id, "steal"])).status_code
        == 404
    )
    assert (
        bob_page.post(reverse("pages:transfer_resolve", args=[offer.id, "accept"])).status_code
        == 302
    )
    levels = dict(Membership.objects.values_list("principal_id", "access_level"))
    assert levels == {"alice": "manager", "bob": "owner", "charlie": "reader"}
    # A second offer, declined.
    bob_page.post(transfer, {"newOwnerUserId": "alice"})
    second = OwnershipTransfer.objects.get(status="pending")
    alice_page.post(reverse("pages:transfer_resolve", args=[second.id, "decline"]))
    second.refresh_from_db()
    assert second.status == "declined"


@pytest.mark.parametrize("verb", ["cancel", "decline", "accept"])
def test_an_offer_resolved_on_the_conversations_page_comes_back_to_it(alice_page, bob_page, verb):
    """(Each of its buttons went to the list of conversations: review.)"""
    conversation = conversation_of("alice", "Handover", "hi", shared=[("bob", "writer")])
    alice_page.post(reverse("pages:transfer", args=[conversation.id]), {"newOwnerUserId": "bob"})
    offer = OwnershipTransfer.objects.get()
    person = alice_page if verb == "cancel" else bob_page
    html = person.get(page_of(conversation)).content.decode()
    assert f'<input type="hidden" name="next" value="{page_of(conversation)}">' in html
    resolved = person.post(
        reverse("pages:transfer_resolve", args=[offer.id, verb]), {"next": page_of(conversation)}
    )
    assert resolved["Location"] == page_of(conversation)
    offer.refresh_from_db()
    assert (
        offer.status == {"cancel": "cancelled", "decline": "declined", "accept": "accepted"}[verb]
    )


def test_only_the_owner_deletes(alice_page, bob_page):
    conversation = conversation_of("alice", "Doomed", "bye", shared=[("bob", "manager")])
    delete = reverse("pages:delete", args=[conversation.id])
    assert bob_page.post(delete).status_code == 403
    assert alice_page.get(delete).status_code == 405
    assert alice_page.post(delete)["Location"] == "/app/"
    assert not Conversation.objects.exists()


@pytest.mark.parametrize("name", ["local", "memsvc"])
def test_a_login_named_as_memsvcs_own_acts_as_no_one(db, name):
    """``local`` and ``memsvc`` own memsvc's own agents; a login so named, made before that
    rule (an upgrade), made conversations as their owner (review)."""
    from tests.pages.conftest import login

    person = login(name)
    for response in (person.get("/app/"), person.post("/app/conversations/new", {"title": "x"})):
        assert response.status_code == 403
        assert "This login cannot use the pages" in response.content.decode()
    assert not Conversation.objects.exists()


def test_a_forms_address_opened_in_the_browser_is_a_page_that_says_so(client, alice_page):
    """An empty 405, which the browser showed as an error page of its own (a bookmark, or
    Enter in the address bar after a refused form left it on the form's address; review)."""
    conversation = conversation_of("alice", "Kept", "hi")
    addresses = [
        reverse("pages:logout"),
        reverse("pages:conversation_create"),
        reverse("pages:delete", args=[conversation.id]),
    ]
    for browser in (alice_page, client):
        for address in addresses:
            response = browser.get(
                address, HTTP_REFERER=f"http://testserver{page_of(conversation)}"
            )
            assert response.status_code == 405, address
            assert response["Allow"] in ("POST", "POST, OPTIONS")
            assert "takes a form&#x27;s answer" in response.content.decode(), address
            assert f'href="http://testserver{page_of(conversation)}"' in response.content.decode()
    assert Conversation.objects.filter(pk=conversation.pk).exists()
    assert alice_page.get(page_of(conversation)).status_code == 200  # (still logged in)


def test_a_page_sent_to_is_405_not_the_page(alice_page):
    """A POST, PUT or DELETE of a page's address was answered with the page, 200 (review)."""
    conversation = conversation_of("alice", "Kept", "hi")
    for path in ["/app/", page_of(conversation), "/app/memory/", "/app/search/?q=hi"]:
        for method in ("post", "put", "delete"):
            response = getattr(alice_page, method)(path)
            assert response.status_code == 405, (method, path)
            assert response["Allow"] == "GET, HEAD"
            assert "nothing is sent to it" in response.content.decode()
    assert alice_page.head(page_of(conversation)).status_code == 200
    assert Conversation.objects.filter(pk=conversation.pk).exists()


def test_an_address_under_the_pages_no_route_takes_carries_their_headers(alice_page):
    """Their 404 page, with the person's name and the logout form, had no policy and could
    be kept (review)."""
    response = alice_page.get("/app/no-such-page/")
    assert response.status_code == 404
    assert "script-src 'self'" in response["Content-Security-Policy"]
    assert "no-store" in response["Cache-Control"]


def test_a_refused_page_leads_back_to_the_page_it_was_asked_from(bob_page):
    """A refused form (a manager may not delete) offered only the way home: the person lost
    the conversation they were in (review R3). Back goes to this site's pages only."""
    conversation = conversation_of("alice", "Doomed", "bye", shared=[("bob", "manager")])
    delete = reverse("pages:delete", args=[conversation.id])
    came_from = f"http://testserver{page_of(conversation)}"

    refused = bob_page.post(delete, HTTP_REFERER=came_from)
    assert refused.status_code == 403
    assert f'<a href="{came_from}">Back to the page you were on</a>' in refused.text
    assert 'href="/app/">Your conversations</a>' in refused.text
    for elsewhere in ("https://elsewhere.example/app/", "javascript:alert(1)", delete):
        refused = bob_page.post(delete, HTTP_REFERER=elsewhere)
        assert refused.status_code == 403
        assert "Back to the page you were on" not in refused.text, elsewhere
        assert 'href="/app/">Your conversations</a>' in refused.text
    # A form's own ``next`` comes first.
    refused = bob_page.post(delete, {"next": page_of(conversation)}, HTTP_REFERER="/app/")
    assert f'<a href="{page_of(conversation)}">Back to the page you were on</a>' in refused.text


def test_the_delete_button_says_when_branches_go_with_the_conversation(alice_page):
    """Deleting a branch deletes the branches forked at its own messages too; its button
    says so (it said so only on the first conversation, which it also said of one without
    branches). One forked from it at its parent's message stays, and is not counted."""
    from conversations.services import conversation_fork, message_append

    alice = Principal.user("alice")
    root = conversation_of("alice", "Tree", "one", "two")
    branch = conversation_fork(alice, conversation=root, message=Message.objects.get(content="two"))
    conversation_of("alice", "Alone", "hi")
    kept = conversation_fork(alice, conversation=branch, message=Message.objects.get(content="two"))
    assert delete_button_of(alice_page, branch) == "Delete this conversation"
    for text in ("three", "four"):
        message_append(alice, conversation=branch, content=text)
    leaf = conversation_fork(
        alice, conversation=branch, message=Message.objects.get(content="four")
    )

    def delete_button(conversation) -> str:
        return delete_button_of(alice_page, conversation)

    assert delete_button(root) == "Delete this conversation and its branches"
    assert delete_button(branch) == "Delete this conversation and its branches"
    assert delete_button(leaf) == "Delete this conversation"
    assert delete_button(Conversation.objects.get(title="Alone")) == "Delete this conversation"
    alice_page.post(reverse("pages:delete", args=[branch.id]))
    assert set(Conversation.objects.filter(group=root.group)) == {root, kept}


def delete_button_of(alice_page, conversation) -> str:
    html = alice_page.get(page_of(conversation)).content.decode()
    return " ".join(html.split('class="danger">')[1].split("</button>")[0].split())


# --- safety ----------------------------------------------------------------------------------


def test_a_message_with_markup_shows_as_text_everywhere(alice_page):
    attack = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    conversation = conversation_of("alice", f"Title {attack}", f"look {attack} here")
    for html in [
        alice_page.get("/app/").content.decode(),
        alice_page.get(page_of(conversation)).content.decode(),
    ]:
        assert "<script>alert" not in html and "<img src=x" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert inline_scripts(html) == []
    # A search snippet (PostgreSQL's ts_headline) is escaped too; only its marks stay.
    found = alice_page.get("/app/search/", {"q": "look here alert"}).content.decode()
    assert "&lt;img src=x onerror=<mark>alert</mark>(2)&gt;" in found
    assert "<script>alert" not in found and "<img src=x" not in found
    assert inline_scripts(found) == []


def test_a_message_that_writes_bold_markup_shows_it_in_a_search_hit_as_written(alice_page):
    """A hit's extract marks its matches (``<mark>``), and showed a message's own "<b>" bold
    too (review R3): only the matches are bold."""
    conversation_of("alice", "Markup", "wrap it in <b>bold</b> tags, or <i>Köln</i> 東京")
    found = alice_page.get("/app/search/", {"q": "tags koln 東"}).content.decode()
    assert (
        "wrap it in &lt;b&gt;bold&lt;/b&gt; <mark>tags</mark>, or &lt;i&gt;<mark>Köln</mark>"
        in found
    )
    assert "&lt;/i&gt; <mark>東</mark>京" in found
    assert "<b>bold</b>" not in found and "<mark>bold</mark>" not in found


def test_every_form_needs_the_csrf_token(db):
    from tests.pages.conftest import login

    strict = login("alice", enforce_csrf_checks=True)
    conversation = conversation_of("alice", "Guarded", "hi")
    before = snapshot()
    for path, data in [
        ("/app/conversations/new", {"title": "forged"}),
        (reverse("pages:append", args=[conversation.id]), {"content": "forged"}),
        (reverse("pages:delete", args=[conversation.id]), {}),
        (
            reverse("pages:share", args=[conversation.id]),
            {"userId": "eve", "accessLevel": "manager"},
        ),
        ("/app/memory/switch", {}),
    ]:
        refused = strict.post(path, data)
        assert refused.status_code == 403, path
        assert "The page was out of date" in refused.content.decode(), path
        # The chat's script and htmx (a token a login in another tab renewed): the whole
        # browser loads the page again, with the new token (Django's own page was put into
        # the chat's form, or a memory's row; review).
        sent_from = page_of(conversation)
        again = strict.post(path, data, headers={"HX-Request": "true", "HX-Current-URL": sent_from})
        assert again["HX-Redirect"] == sent_from, path
    assert snapshot() == before
    # With the token the page gave, the same form goes through.
    page = strict.get(page_of(conversation)).content.decode()
    token = page.split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]
    response = strict.post(
        reverse("pages:append", args=[conversation.id]),
        {"content": "real", "csrfmiddlewaretoken": token},
    )
    assert response.status_code == 302


def test_pages_carry_the_csp_and_refuse_framing(alice_page):
    conversation = conversation_of("alice", "Headers", "hi")
    for path in ["/app/", page_of(conversation), "/app/memory/", "/app/search/?q=hi"]:
        response = alice_page.get(path)
        policy = response["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy
        assert "frame-ancestors 'none'" in policy
        assert response["X-Frame-Options"] == "DENY"
        # Someone's conversations are not kept for the back button after a logout.
        assert "no-store" in response["Cache-Control"] and "private" in response["Cache-Control"]
        assert inline_scripts(response.content) == []
        assert unlabelled_controls(response.content) == [], path
    # The page loads htmx from this site, not a CDN.
    assert "/static/django_htmx/htmx-2.min.js" in alice_page.get("/app/").content.decode()
    assert alice_page.get("/static/django_htmx/htmx-2.min.js").status_code == 200


def test_the_icon_browsers_ask_for_is_there(client, alice_page):
    icon = "/static/pages/icon.svg"
    assert f'<link rel="icon" href="{icon}"' in alice_page.get("/app/").content.decode()
    asked = client.get("/favicon.ico")  # the admin's pages and the API docs link none
    assert asked.status_code == 301 and asked["Location"] == icon
    served = client.get(icon)
    assert served.status_code == 200 and served["Content-Type"].startswith("image/svg+xml")


def test_a_page_costs_the_same_queries_whatever_it_shows(alice_page):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries(path) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert alice_page.get(path).status_code == 200
        return len(captured)

    small = conversation_of("alice", "Small", "one", shared=[("bob", "reader")])
    few_list, few_messages = queries("/app/"), queries(page_of(small))
    for n in range(30):
        conversation_of("alice", f"More {n}", f"message {n}")
    big = conversation_of(
        "alice",
        "Big",
        *[f"turn {n}" for n in range(60)],
        shared=[("bob", "reader"), ("carol", "writer")],
    )
    messages_append(
        Principal.user("alice"),
        conversation=big,
        messages=[NewMessage(content="a fork point")],
    )
    from conversations.services import conversation_fork

    conversation_fork(
        Principal.user("alice"), conversation=big, message=Message.objects.get(content="turn 3")
    )
    assert queries("/app/") == few_list
    assert queries(page_of(big)) == few_messages


def test_an_agent_member_is_shown_by_its_name(alice_page):
    """(It was shown as agent:<uuid>.)"""
    from conversations.services import membership_create
    from tests.agents_api.conftest import make_agent

    helper = make_agent("trip-helper").agent
    conversation = conversation_of("alice", "Trip", shared=[("bob", "reader")])
    membership_create(
        Principal.user("alice"),
        conversation=conversation,
        principal_id=helper.principal_id,
        access_level="writer",
    )
    html = alice_page.get(page_of(conversation)).content.decode()
    assert '<span class="member" title="agent:' in html
    # (Said to be an agent: one named bob was the user bob beside it; review.)
    assert ">agent trip-helper</span>" in html and '"bob">bob</span>' in html
    assert 'aria-label="Remove agent trip-helper"' in html
    assert unlabelled_controls(html) == []


def test_a_turn_an_agent_signed_with_another_name_says_which_agent_wrote_it(alice_page):
    """An agent of the conversation may record a user's turn signed with their name; it was
    shown as that person's own (and another agent's signed "alice" too; review). Its own
    turns are its, renamed since or not (code review)."""
    from conversations.services import membership_create
    from tests.agents_api.conftest import make_agent

    relay = make_agent("relay").agent
    conversation = conversation_of("alice", "Team", "hi from alice")
    membership_create(
        Principal.user("alice"),
        conversation=conversation,
        principal_id=relay.principal_id,
        access_level="writer",
    )
    messages_append(
        relay.as_principal(),
        conversation=conversation,
        messages=[
            NewMessage(role="user", content="I agree to everything", author_name="alice"),
            NewMessage(role="assistant", content="Noted."),
        ],
    )
    html = alice_page.get(page_of(conversation)).content.decode()
    who = {
        content: row.split('<p class="who">', 1)[1].split("</p>", 1)[0]
        for row in html.split('<li class="message')[1:]
        for content in ("hi from alice", "I agree to everything", "Noted.")
        if f">{content}</div>" in row
    }
    assert "written by" not in who["hi from alice"]
    assert "<strong>alice</strong>" in who["I agree to everything"]
    assert "written by agent relay" in who["I agree to everything"]
    assert "<strong>relay</strong>" in who["Noted."] and "written by" not in who["Noted."]
    relay.name = "relay2"
    relay.save(update_fields=["name"])
    html = alice_page.get(page_of(conversation)).content.decode()
    assert "written by agent relay2" in html and html.count("written by") == 1
    embed_pending()
    found = alice_page.get(reverse("pages:search"), {"q": "agree to everything"})
    assert "alice (written by agent relay2)," in found.content.decode()


def test_a_refused_share_or_transfer_names_the_fields_by_their_labels(alice_page):
    """(The refusals named the form's fields, "userId: ...", which no one sees on the page.)"""
    conversation = conversation_of("alice", "Team", "hi")
    share = reverse("pages:share", args=[conversation.id])
    refused = alice_page.post(share, {"userId": "b" * 300, "accessLevel": "reader"})
    assert refused.status_code == 400
    assert "Share with: " in refused.content.decode()
    assert "userId" not in refused.content.decode()
    refused = alice_page.post(share, {"userId": "bob", "accessLevel": "boss"})
    assert "Access: " in refused.content.decode()
    transfer = reverse("pages:transfer", args=[conversation.id])
    refused = alice_page.post(transfer, {"newOwnerUserId": "alice"})
    assert refused.status_code == 400
    assert "Transfer ownership to: you already own this conversation" in refused.content.decode()
    assert "newOwnerUserId" not in refused.content.decode()


def test_every_form_refusal_names_the_field_by_its_label(alice_page):
    """Only share and transfer did: the chat box, the fork box, a title and a member's
    access were named "content", "title", "accessLevel" (review)."""
    conversation = conversation_of("alice", "Team", "hi", shared=[("bob", "reader")])
    message = Message.objects.get(conversation=conversation)
    asked = [
        (reverse("pages:append", args=[conversation.id]), {"content": "  "}, "Your message: "),
        (
            reverse("pages:fork", args=[conversation.id, message.id]),
            {"content": "  "},
            "A new version of this message: ",
        ),
        (reverse("pages:rename", args=[conversation.id]), {"title": "x" * 501}, "New title: "),
        (reverse("pages:conversation_create"), {"title": "x" * 501}, "Title: "),
        (
            reverse("pages:membership_update", args=[conversation.id]),
            {"userId": "bob", "accessLevel": "boss"},
            "Access: ",
        ),
    ]
    for path, form, label in asked:
        refused = alice_page.post(path, form).content.decode()
        assert label in refused, (path, refused[-600:])


def test_a_refusal_after_logging_in_as_another_does_not_lead_back_to_the_login(bob_page):
    """Bob logged in on alice's login page, whose ``next`` was her conversation: its 404's
    way back was the login page, which sends a logged-in person straight back (review)."""
    conversation = conversation_of("alice", "Team", "hi")
    login = f"{reverse('pages:login')}?next={page_of(conversation)}"
    refused = bob_page.get(page_of(conversation), headers={"Referer": f"http://testserver{login}"})
    assert refused.status_code == 404
    assert reverse("pages:login") not in refused.content.decode()


def _field(html: str, field_id: str) -> str:
    """The tag of the form control ``field_id`` (a textarea with its text)."""
    start = html.index(f'id="{field_id}"')
    start = html.rindex("<", 0, start)
    end = html.index("</textarea>", start) if html[start:].startswith("<textarea") else None
    return html[start:end] if end else html[start : html.index(">", start) + 1]


def test_a_form_refused_goes_back_to_its_page_with_what_was_typed_and_why(alice_page):
    """A refusal was a page of its own: the person left the form, and going back to it
    lost their text; the refused POST's address, reloaded, posted it again (reviews). The
    page it was sent from shows it once, on the field, with the text typed."""
    conversation = conversation_of("alice", "Team", "hi", shared=[("bob", "reader")])
    message = Message.objects.get(conversation=conversation)
    came_from = f"http://testserver{page_of(conversation)}"
    asked = [
        ("pages:rename", [conversation.id], {"title": "t" * 501}, "rename-title"),
        (
            "pages:share",
            [conversation.id],
            {"userId": "b" * 300, "accessLevel": "writer"},
            "share-user",
        ),
        ("pages:transfer", [conversation.id], {"newOwnerUserId": "alice"}, "transfer-to"),
        ("pages:fork", [conversation.id, message.id], {"content": "  "}, f"fork-{message.id}"),
        ("pages:append", [conversation.id], {"content": " \u200b "}, "append-content"),
    ]
    before = snapshot()
    for name, args, form, field_id in asked:
        refused = alice_page.post(reverse(name, args=args), form, HTTP_REFERER=came_from)
        assert (refused.status_code, refused["Location"]) == (302, came_from), name
        html = alice_page.get(page_of(conversation)).content.decode()
        field = _field(html, field_id)
        assert 'aria-invalid="true" aria-describedby="refusal" autofocus' in field, field
        typed = next(value for key, value in form.items() if key != "accessLevel")
        assert escape(typed) in field, field
        alert = html[html.index('id="refusal"') :].split("</p>")[0]
        assert 'role="alert"' in html[html.rindex("<p", 0, html.index('id="refusal"')) :]
        assert ": " in alert and len(alert) > 20, alert
        # Once: shown again, the page is as it was.
        again = alice_page.get(page_of(conversation)).content.decode()
        assert 'id="refusal"' not in again and "aria-invalid" not in again
    assert snapshot() == before
    # The access chosen with the refused share stays chosen; a fork's box stays open.
    alice_page.post(
        reverse("pages:share", args=[conversation.id]),
        {"userId": "b" * 300, "accessLevel": "writer"},
        HTTP_REFERER=came_from,
    )
    html = alice_page.get(page_of(conversation)).content.decode()
    assert '<option value="writer" selected>' in html
    alice_page.post(
        reverse("pages:fork", args=[conversation.id, message.id]),
        {"content": ""},
        HTTP_REFERER=came_from,
    )
    assert '<details class="fork" open>' in alice_page.get(page_of(conversation)).content.decode()
    # Refusals of who asked, not what the form said, keep their own page.
    assert bob_page_refused(conversation, came_from) == 403


def bob_page_refused(conversation, came_from) -> int:
    from tests.pages.conftest import login

    return (
        login("bob")
        .post(
            reverse("pages:rename", args=[conversation.id]), {"title": "x"}, HTTP_REFERER=came_from
        )
        .status_code
    )


def test_a_refusal_is_shown_on_the_page_it_came_from_not_the_next_one_loaded(alice_page):
    """Popped by whichever page loaded next: another conversation showed it, and its own
    page then nothing (code review)."""
    a = conversation_of("alice", "A", "hi")
    b = conversation_of("alice", "B", "hi")
    alice_page.post(
        reverse("pages:rename", args=[a.id]),
        {"title": "t" * 501},
        HTTP_REFERER=f"http://testserver{page_of(a)}",
    )
    assert 'id="refusal"' not in alice_page.get(page_of(b)).content.decode()
    assert 'id="refusal"' in alice_page.get(page_of(a)).content.decode()


def test_a_refused_fork_comes_back_to_a_page_that_shows_its_message(alice_page):
    """The message a fork is of may be on an earlier page ("Earlier messages", loaded in
    place): the conversation's page, which the browser names, has no form of it, and what
    was typed was lost (code review)."""
    conversation = conversation_of("alice", "Long", *[f"m{n}" for n in range(60)])
    oldest = Message.objects.filter(conversation=conversation).order_by("seq").first()
    refused = alice_page.post(
        reverse("pages:fork", args=[conversation.id, oldest.id]),
        {"content": "  ", "next": f"{page_of(conversation)}?at={oldest.id}"},
        HTTP_REFERER=f"http://testserver{page_of(conversation)}",
    )
    assert refused["Location"] == f"{page_of(conversation)}?at={oldest.id}"
    html = alice_page.get(refused["Location"]).content.decode()
    assert 'aria-invalid="true"' in _field(html, f"fork-{oldest.id}")
    # The fork's form names that page (no "#m-": the browser focused the message, not the
    # refused field; review).
    assert f'name="next" value="{page_of(conversation)}?at={oldest.id}"' in html


def test_refusals_on_two_pages_wait_each_for_its_own(alice_page):
    """One slot a session: a second tab's refusal took the first's place (review)."""
    a = conversation_of("alice", "A", "hi")
    b = conversation_of("alice", "B", "hi")
    for conversation in (a, b):
        alice_page.post(
            reverse("pages:rename", args=[conversation.id]),
            {"title": f"{conversation.title}" * 501},
            HTTP_REFERER=f"http://testserver{page_of(conversation)}",
        )
    for conversation in (b, a):
        html = alice_page.get(page_of(conversation)).content.decode()
        assert conversation.title * 501 in _field(html, "rename-title")


def test_a_new_conversation_refused_after_a_search_comes_back_to_its_form(alice_page):
    """htmx's search had pushed its address: the browser named the search page, which has
    no such form, and the title typed was lost (review)."""
    home = alice_page.get("/app/").content.decode()
    assert 'name="next" value="/app/"' in home
    refused = alice_page.post(
        reverse("pages:conversation_create"),
        {"title": "Z" * 501, "next": "/app/"},
        HTTP_REFERER="http://testserver/app/search/?q=question",
    )
    assert refused["Location"] == "/app/"
    assert "Z" * 501 in _field(alice_page.get("/app/").content.decode(), "new-title")


def test_a_refused_search_clears_the_last_searchs_count_and_title(alice_page):
    refused = alice_page.get("/app/search/", {"q": "q" * 2001}, headers={"HX-Request": "true"})
    html = refused.content.decode()
    assert refused.status_code == 400
    assert '<p id="search-status" hx-swap-oob="innerHTML"></p>' in html
    assert "<title>Search · memsvc</title>" in html


def said_done(page_client, response) -> list[str]:
    """The notices of what a form did on the page its POST goes back to (followed)."""
    assert response.status_code == 302, response.content
    html = page_client.get(response["Location"]).content.decode()
    return re.findall(r'<p class="done" role="status" tabindex="-1" autofocus>([^<]*)</p>', html)


def test_what_a_form_did_is_said_once_on_the_page_it_goes_back_to(alice_page, bob_page):
    """A rename, a share, a change of access, a removal, an offer and its answer reloaded
    the page with nothing said of them and the focus on the page's start (review): a screen
    reader user could not tell the form had done anything. Each is said, focused, once."""
    conversation = conversation_of("alice", "Team", "hi", shared=[("bob", "writer")])
    at = [conversation.id]
    rename = alice_page.post(reverse("pages:rename", args=at), {"title": "Trip"})
    assert said_done(alice_page, rename) == ["Title saved."]
    assert said_done(alice_page, rename) == []  # (once)
    # A refusal is no notice: the refusal is said, on its field.
    refused = alice_page.post(
        reverse("pages:share", args=at), {"userId": "", "accessLevel": "reader"}
    )
    assert refused.status_code == 400 and 'class="done"' not in refused.content.decode()
    share = alice_page.post(
        reverse("pages:share", args=at), {"userId": "carol", "accessLevel": "reader"}
    )
    assert said_done(alice_page, share) == ["Shared with carol, as a reader."]
    level = alice_page.post(
        reverse("pages:membership_update", args=at), {"userId": "carol", "accessLevel": "writer"}
    )
    assert said_done(alice_page, level) == ["carol is now a writer."]
    removed = alice_page.post(reverse("pages:membership_delete", args=at), {"userId": "carol"})
    assert said_done(alice_page, removed) == ["carol was removed."]
    offered = alice_page.post(reverse("pages:transfer", args=at), {"newOwnerUserId": "bob"})
    assert said_done(alice_page, offered) == ["Ownership offered to bob: theirs once they accept."]
    # (The offer's Cancel names its conversation, as Accept and Decline do: a11y review.)
    listed = alice_page.get(reverse("pages:home")).content.decode()
    assert 'Cancel the offer<span class="visually-hidden"> of “<bdi>Trip</bdi>”</span>' in listed
    transfer = OwnershipTransfer.objects.get()
    accepted = bob_page.post(reverse("pages:transfer_resolve", args=[transfer.id, "accept"]))
    assert said_done(bob_page, accepted) == ["The conversation is yours now."]
    deleted = bob_page.post(reverse("pages:delete", args=at))
    assert said_done(bob_page, deleted) == ["The conversation was deleted."]
