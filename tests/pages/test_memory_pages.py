"""The memory pages: per agent that serves the person, the memory blocks about them (edit,
revisions) and the memories about them (search, delete, clear), and the memory switch."""

import re
from datetime import timedelta
from urllib.parse import urljoin, urlsplit

import pytest
from django.urls import reverse
from django.utils import timezone

from agents_api.models import Memory, MemoryBlock, UserMemorySetting
from agents_api.services import memories_prune, memory_block_create, memory_save
from conversations import services as conversation_services
from conversations.models import Message
from memsvc.api.principals import Principal
from tests.agents_api.conftest import make_agent
from tests.pages.conftest import conversation_of
from tests.pages.html import forms, unlabelled_controls

pytestmark = pytest.mark.django_db


def remember(agent, user_id, content):
    return memory_save(agent.as_principal(), agent=agent, user_id=user_id, content=content)[0]


@pytest.fixture
def helper():
    return make_agent("helper").agent


@pytest.fixture
def rival():
    return make_agent("rival").agent


def agent_page(agent) -> str:
    return reverse("pages:agent_memory", args=[agent.id])


def test_the_agents_that_serve_the_person_are_listed(alice_page, helper, rival):
    make_agent("stranger")
    remember(helper, "alice", "Alice is allergic to peanuts")
    conversation = conversation_of("alice", "With rival")
    conversation_services.membership_create(
        Principal.user("alice"),
        conversation=conversation,
        principal_id=rival.principal_id,
        access_level="writer",
    )
    html = alice_page.get("/app/memory/").content.decode()
    assert agent_page(helper) in html and agent_page(rival) in html
    assert "stranger" not in html
    assert unlabelled_controls(html) == []


def test_a_block_of_emoji_within_its_limit_is_saved_from_its_page(alice_page, helper):
    """The browser counts a text's length in UTF-16 units, the service in characters: a
    block of 40 emoji of a limit of 60 was 80 long to the textarea's ``maxlength``, and no
    edit of it could be sent (review). The service alone holds the limit."""
    memory_block_create(
        helper.as_principal(),
        agent=helper,
        user_id="alice",
        label="mood",
        value="😀" * 40,
        limit=60,
    )
    page = alice_page.get(reverse("pages:agent_memory", args=[helper.id])).content.decode()
    [textarea] = re.findall(r"<textarea[^>]*>", page)
    assert "maxlength" not in textarea
    saved = alice_page.post(
        reverse("pages:block_update", args=[helper.id]), {"label": "mood", "value": "😀" * 39}
    )
    assert saved.status_code == 302
    assert MemoryBlock.objects.get(label="mood").value == "😀" * 39
    back = alice_page.get(saved["Location"]).content.decode()
    assert (
        '<p class="done" role="status" tabindex="-1" autofocus>The block mood was saved.</p>'
        in back
    )
    switched = alice_page.post(reverse("pages:memory_switch"), {})
    said = alice_page.get(switched["Location"]).content.decode()
    assert "autofocus>Memory turned off.</p>" in said


def test_blocks_about_the_person_are_edited_with_revisions(alice_page, helper):
    block = memory_block_create(
        helper.as_principal(),
        agent=helper,
        user_id="alice",
        label="human",
        value="Likes tea",
        limit=40,
    )
    memory_block_create(
        helper.as_principal(), agent=helper, user_id="bob", label="human", value="Bob's"
    )
    memory_block_create(
        helper.as_principal(),
        agent=helper,
        user_id="alice",
        label="persona",
        value="Fixed",
        read_only=True,
    )
    html = alice_page.get(agent_page(helper)).content.decode()
    assert "Likes tea" in html and "Bob&#x27;s" not in html
    assert unlabelled_controls(html) == []
    update = reverse("pages:block_update", args=[helper.id])
    assert alice_page.post(update, {"label": "human", "value": "Likes coffee"}).status_code == 302
    block.refresh_from_db()
    assert block.value == "Likes coffee"
    html = alice_page.get(agent_page(helper)).content.decode()
    assert (
        "of human</span> (2)</summary>" in html and "Likes tea" in html
    )  # the old value, among revisions
    # The block's limit and read-only hold here as in the API.
    assert alice_page.post(update, {"label": "human", "value": "x" * 41}).status_code == 400
    assert alice_page.post(update, {"label": "persona", "value": "Changed"}).status_code == 403
    assert alice_page.post(update, {"label": "nope", "value": "x"}).status_code == 404
    assert alice_page.post(update, {"value": "x"}).status_code == 400
    assert MemoryBlock.objects.get(user_id="bob").value == "Bob's"


def test_a_text_typed_on_the_pages_keeps_its_line_breaks_as_the_apis(alice_page, helper):
    """A browser sends a textarea's line breaks as CRLF: a block saved unchanged was rewritten
    (a revision more), a text within its limit as typed went past it, and messages were kept
    with "\r\n" (review)."""
    block = memory_block_create(
        helper.as_principal(),
        agent=helper,
        user_id="alice",
        label="human",
        value="Name: Alice\nLikes: Kyoto",
        limit=24,
    )
    update = reverse("pages:block_update", args=[helper.id])
    sent = {"label": "human", "value": "Name: Alice\r\nLikes: Kyoto"}  # 25 as sent, 24 typed
    assert alice_page.post(update, sent).status_code == 302
    block.refresh_from_db()
    assert block.value == "Name: Alice\nLikes: Kyoto"
    assert block.revisions.count() == 1  # (saved unchanged: no revision)
    conversation = conversation_of("alice", "Notes")
    append = reverse("pages:append", args=[conversation.id])
    assert alice_page.post(append, {"content": "one\r\ntwo"}).status_code == 302
    assert Message.objects.get(conversation=conversation).content == "one\ntwo"


@pytest.mark.parametrize("label", ["..", ".", "%2e%2e", "a?b", "a/b"])
def test_a_block_of_any_label_is_edited_from_its_page(alice_page, helper, label):
    """(A block labelled ".." or "." could not be saved: a browser drops the dot segments of
    an address, "%2E" too, and the label was the last segment of the form's. One labelled
    "a/b", which the API refuses to make but which could be stored before that rule, made
    the whole page a 500.)"""
    block = MemoryBlock.objects.create(agent=helper, user_id="alice", label=label, value="Old")
    url = "http://testserver" + agent_page(helper)
    page = alice_page.get(agent_page(helper))
    assert page.status_code == 200
    (form,) = [f for f in forms(page.content) if f["fields"].get("label") == label]
    path = urlsplit(urljoin(url, form["action"])).path  # as a browser resolves it
    assert alice_page.post(path, {**form["fields"], "value": "New"}).status_code == 302
    block.refresh_from_db()
    assert block.value == "New"


def test_a_revision_by_an_agent_names_it(alice_page, helper):
    """(It was shown as agent:<uuid>, an id the person never sees elsewhere.)"""
    memory_block_create(
        helper.as_principal(), agent=helper, user_id="alice", label="human", value="Likes tea"
    )
    alice_page.post(
        reverse("pages:block_update", args=[helper.id]), {"label": "human", "value": "Tea"}
    )
    html = alice_page.get(agent_page(helper)).content.decode()
    assert helper.principal_id not in html
    assert f"· agent {helper.name}</span>" in html and "· alice</span>" in html


def test_memories_are_searched_deleted_and_cleared(alice_page, bob_page, helper, rival):
    peanuts = remember(helper, "alice", "Alice is allergic to peanuts")
    nurse = remember(helper, "alice", "Alice works as a nurse in Boston")
    nurse.summary = "Her <job>"  # (a memory's summary was never shown: review)
    nurse.save(update_fields=["summary"])
    bobs = remember(helper, "bob", "Bob is allergic to cats")
    remember(rival, "alice", "Alice is vegetarian")

    html = alice_page.get(agent_page(helper)).content.decode()
    assert "allergic to peanuts" in html and "nurse" in html
    assert '<p class="summary">Her &lt;job&gt;</p>' in html
    assert "Bob" not in html and "vegetarian" not in html
    found = alice_page.get(
        agent_page(helper), {"q": "what allergy?"}, headers={"HX-Request": "true"}
    )
    assert "allergic to peanuts" in found.content.decode()
    assert "cats" not in found.content.decode() and "<html" not in found.content.decode()
    # Only spaces: nothing found, as on the conversations' search (it was a 400 page).
    for headers in ({}, {"HX-Request": "true"}):
        blank = alice_page.get(agent_page(helper), {"q": "   "}, headers=headers)
        assert blank.status_code == 200
        assert "No memory found" in blank.content.decode()

    # Bob cannot delete Alice's memory; Alice can, by htmx or by a plain form.
    delete = reverse("pages:memory_delete", args=[peanuts.id])
    assert bob_page.post(delete).status_code == 404
    assert bob_page.post(reverse("pages:memory_delete", args=[bobs.id])).status_code == 302
    response = alice_page.post(delete, headers={"HX-Request": "true"})
    assert response.status_code == 200 and b"Deleted" in response.content
    assert not Memory.objects.filter(id=peanuts.id).exists()

    alice_page.post(reverse("pages:memories_clear", args=[helper.id]))
    assert list(Memory.objects.values_list("content", flat=True)) == ["Alice is vegetarian"]
    alice_page.post(reverse("pages:memories_clear_all"))
    assert not Memory.objects.exists()


def test_memories_expired_but_kept_are_deleted_with_every_memory(alice_page, helper):
    """An expired memory is in no list, but one used often is kept and lives again at the
    next prune. (The overview hid "Delete every memory" when no agent showed one: such a
    memory could not be deleted from the pages, and came back.)"""
    popular = remember(helper, "alice", "Alice is allergic to peanuts")
    Memory.objects.filter(id=popular.id).update(
        expires_at=timezone.now() - timedelta(seconds=1), access_count=10
    )
    overview = alice_page.get(reverse("pages:memory")).content.decode()
    assert "allergic" not in overview and "helper" not in overview
    assert alice_page.get(agent_page(helper)).status_code == 404  # it keeps nothing shown
    assert "Delete every memory any agent keeps about you" in overview
    assert alice_page.post(reverse("pages:memories_clear_all")).status_code == 302
    assert memories_prune().extended == 0
    assert not Memory.objects.exists()
    # So on the page of an agent that serves her (a block), for what it keeps.
    memory_block_create(helper.as_principal(), agent=helper, user_id="alice", label="human")
    popular = remember(helper, "alice", "Alice is allergic to peanuts")
    Memory.objects.filter(id=popular.id).update(
        expires_at=timezone.now() - timedelta(seconds=1), access_count=10
    )
    page = alice_page.get(agent_page(helper)).content.decode()
    assert "allergic" not in page and "No memories about you" in page
    assert "Delete every memory helper keeps about you" in page
    alice_page.post(reverse("pages:memories_clear", args=[helper.id]))
    assert not Memory.objects.exists()
    overview = alice_page.get(reverse("pages:memory")).content.decode()
    assert "Delete every memory" not in overview  # nothing left to delete


def test_a_later_page_emptied_meanwhile_does_not_say_there_are_no_memories(alice_page, helper):
    """(Its memories deleted before it was asked for: "No memories about you." was added
    below the memories shown.)"""
    saved = [remember(helper, "alice", f"Fact number {n:02d}") for n in range(51)]
    html = alice_page.get(agent_page(helper)).content.decode()
    cursor = html.split('href="?after=')[1].split('"')[0]
    alice_page.post(reverse("pages:memory_delete", args=[saved[0].id]))  # the next page's
    rest = alice_page.get(f"{agent_page(helper)}?after={cursor}", HTTP_HX_REQUEST="true")
    assert rest.status_code == 200 and "<html" not in rest.content.decode()
    assert "No memories about you" not in rest.content.decode()
    # Opened on its own, it says so, with the way back: it was a blank section (review).
    alone = alice_page.get(f"{agent_page(helper)}?after={cursor}").content.decode()
    assert "No more memories here" in alone
    assert f'<a href="{agent_page(helper)}">The first page</a>' in alone


def test_the_switch_turns_memory_off_and_on(alice_page, helper):
    remember(helper, "alice", "Alice is allergic to peanuts")
    assert alice_page.post("/app/memory/switch", {}).status_code == 302
    assert UserMemorySetting.objects.get(user_id="alice").memory_enabled is False
    html = alice_page.get("/app/memory/").content.decode()
    assert "Memory is <strong>off</strong>" in html
    found = alice_page.get(agent_page(helper), {"q": "peanuts"}).content.decode()
    assert "No memory found" in found and "(memory is off)" in found
    alice_page.post("/app/memory/switch", {"enabled": "on"})
    assert UserMemorySetting.objects.get(user_id="alice").memory_enabled is True
    assert (
        "allergic to peanuts"
        in alice_page.get(agent_page(helper), {"q": "peanuts"}).content.decode()
    )


def test_the_switch_goes_back_to_its_own_site_only_and_never_fails_on_next(alice_page):
    """(A ``next`` that was no address, a bare word, was looked up as a view's name: a 500.)"""
    for target, location in [
        ("/app/memory/", "/app/memory/"),
        ("https://evil.example/app/", reverse("pages:memory")),
        ("//evil.example/", reverse("pages:memory")),
        ("memory", "memory"),  # relative to the switch's address, on this site
        ("javascript:alert(1)", reverse("pages:memory")),
    ]:
        response = alice_page.post("/app/memory/switch", {"enabled": "on", "next": target})
        assert response.status_code == 302 and response["Location"] == location, target
    # Over https, never back to this site over plain http.
    response = alice_page.post(
        "/app/memory/switch", {"next": "http://testserver/app/"}, secure=True
    )
    assert response["Location"] == reverse("pages:memory")
    assert UserMemorySetting.objects.get(user_id="alice").memory_enabled is False


def test_a_nul_in_a_block_label_is_refused_and_changes_nothing(alice_page, helper):
    """(A NUL in the label, which PostgreSQL cannot compare, was a 500.)"""
    block = memory_block_create(
        helper.as_principal(), agent=helper, user_id="alice", label="human", value="Likes tea"
    )
    update = reverse("pages:block_update", args=[helper.id])
    response = alice_page.post(update, {"label": "human\x00", "value": "Likes coffee"})
    assert response.status_code == 400
    assert "must not contain NUL characters" in response.content.decode()
    block.refresh_from_db()
    assert block.value == "Likes tea"


def test_a_block_edit_without_a_value_is_refused_and_changes_nothing(alice_page, helper):
    """(It emptied the block, where the API's PUT requires a value: review.)"""
    block = memory_block_create(
        helper.as_principal(), agent=helper, user_id="alice", label="human", value="Likes tea"
    )
    update = reverse("pages:block_update", args=[helper.id])
    response = alice_page.post(update, {"label": "human"})
    assert response.status_code == 400
    assert "Value: This field is required." in response.content.decode()
    block.refresh_from_db()
    assert block.value == "Likes tea"


def test_a_search_too_long_is_refused_naming_the_search_box(alice_page, helper):
    """The search box is ``?q=``: its refusal said "query: ...", then "q: ...", fields the
    person never saw (reviews): it names the box by its label."""
    remember(helper, "alice", "Alice likes tea")
    for address, label in (
        ("/app/search/", "Search words"),
        (agent_page(helper), "Search memories"),
    ):
        response = alice_page.get(address, {"q": "tea " * 1000})
        assert response.status_code == 400, address
        assert f"{label}: Ensure this field has no more than 2000 characters." in (
            response.content.decode()
        ), address
        # A NUL, refused before the page reads the box, too (it said "q: ...": review).
        for htmx in ({}, {"HX-Request": "true"}):
            response = alice_page.get(address, {"q": "tea\x00"}, headers=htmx)
            assert response.status_code == 400, address
            assert f"{label}: must not contain NUL characters" in response.content.decode()


def test_an_agent_that_keeps_nothing_about_the_person_is_not_found(alice_page, helper, rival):
    """(Any agent's page showed its name to anyone who had its id.)"""
    remember(rival, "bob", "Bob is allergic to cats")
    assert alice_page.get("/app/memory/00000000-0000-0000-0000-000000000000/").status_code == 404
    response = alice_page.get(agent_page(rival))
    assert response.status_code == 404 and b"rival" not in response.content
    clear = alice_page.post(reverse("pages:memories_clear", args=[rival.id]))
    assert clear.status_code == 404
    assert Memory.objects.filter(agent=rival).count() == 1

    # Once it has forgotten everything about her, clearing goes back to the overview.
    remember(helper, "alice", "Alice is allergic to peanuts")
    assert alice_page.get(agent_page(helper)).status_code == 200
    clear = alice_page.post(reverse("pages:memories_clear", args=[helper.id]))
    assert clear.status_code == 302 and clear["Location"] == reverse("pages:memory")


def test_a_block_value_refused_is_kept_on_its_own_block(alice_page, helper):
    """(A refusal was a page of its own, and going back lost the text; review.)"""
    from tests.pages.test_conversation_pages import _field

    for label in ("human", "notes"):
        memory_block_create(
            helper.as_principal(), agent=helper, label=label, value="v", limit=10, user_id="alice"
        )
    page = reverse("pages:agent_memory", args=[helper.id])
    refused = alice_page.post(
        reverse("pages:block_update", args=[helper.id]),
        {"label": "notes", "value": "n" * 11},
        HTTP_REFERER=f"http://testserver{page}",
    )
    assert refused.status_code == 302
    html = alice_page.get(page).content.decode()
    assert html.count('aria-invalid="true"') == 1
    notes = _field(html[html.index("<h3>notes</h3>") :], "block-2")
    assert 'aria-invalid="true"' in notes and "n" * 11 in notes
    assert MemoryBlock.objects.get(label="notes").value == "v"
