"""Memory blocks through the agent API: limits, read-only blocks, append / replace, revisions."""

import threading
from urllib.parse import quote

import httpx
import pytest
from django.db import connection, transaction

from agents_api.models import MemoryBlock, MemoryBlockRevision
from agents_api.services import memory_block_create, memory_block_delete, memory_block_update
from memsvc.api.errors import NotFound
from memsvc.validators import DOT_SEGMENT_PROBLEM
from tests.agents_api.conftest import make_agent
from tests.api import another_list

pytestmark = pytest.mark.django_db

BLOCKS = "/v1/agent/memory-blocks"


def create_block(api, credential, user_id=None, **body):
    path = BLOCKS + (f"?userId={user_id}" if user_id else "")
    response = api.post(path, body, as_=credential)
    assert response.status_code == 201, response.content
    return response.json()


def stored(helper, label, user_id=""):
    return MemoryBlock.objects.get(agent=helper.agent, user_id=user_id, label=label)


def test_create_read_list_and_delete(api, helper):
    block = create_block(api, helper, label="persona", value="I am helpful.", limit=100)
    assert block == {
        "label": "persona",
        "value": "I am helpful.",
        "description": "",
        "limit": 100,
        "readOnly": False,
        "userId": None,
        "createdAt": block["createdAt"],
        "updatedAt": block["updatedAt"],
    }
    assert api.get(f"{BLOCKS}/persona", as_=helper).json()["value"] == "I am helpful."
    assert [b["label"] for b in api.get(BLOCKS, as_=helper).json()["data"]] == ["persona"]
    assert api.delete(f"{BLOCKS}/persona", as_=helper).status_code == 204
    assert api.get(f"{BLOCKS}/persona", as_=helper).status_code == 404


def test_a_delete_with_a_misspelt_user_is_400_and_deletes_no_block(api, helper):
    """``?userid=alice`` read as no user would delete the agent's own block of that label."""
    create_block(api, helper, label="human", value="the agent's own")
    create_block(api, helper, user_id="alice", label="human", value="about Alice")
    response = api.delete(f"{BLOCKS}/human?userid=alice", as_=helper)
    assert response.status_code == 400
    assert list(response.json()["details"]) == ["userid"]
    assert MemoryBlock.objects.count() == 2


@pytest.mark.parametrize(
    "method, body",
    [("PATCH", {"append": "probe"}), ("PATCH", {}), ("PUT", {"value": "new"})],
)
def test_a_write_only_key_cannot_read_a_block_by_changing_it(api, helper, method, body):
    """A change answers with the whole block (an append: all it held before); a key that
    may not read it (GET: 403) read it that way (review)."""
    create_block(api, helper, label="human", value="The secret line", description="private")
    writer = make_agent("helper", scopes=["write"])
    assert api.get(f"{BLOCKS}/human", as_=writer).status_code == 403
    response = api.call(method, f"{BLOCKS}/human", as_=writer, body=body)
    assert response.status_code == 403, response.content
    assert "secret" not in response.content.decode()
    assert stored(helper, "human").value == "The secret line"
    # A new block answers with what the key sent only, and a delete with nothing.
    assert api.post(BLOCKS, {"label": "notes", "value": "x"}, as_=writer).status_code == 201
    assert api.delete(f"{BLOCKS}/human", as_=writer).status_code == 204


def test_a_duplicate_label_is_a_conflict(api, helper):
    create_block(api, helper, label="human")
    response = api.post(BLOCKS, {"label": "human", "value": "again"}, as_=helper)
    assert response.status_code == 409
    assert stored(helper, "human").value == ""


INVISIBLE = "must not contain invisible characters (a zero-width space or joiner)"


@pytest.mark.parametrize(
    ("label", "problem"),
    [
        ("a/b", 'must not contain "/" (it names it in URLs)'),
        (".", DOT_SEGMENT_PROBLEM),
        ("..", DOT_SEGMENT_PROBLEM),
        ("..\\x", DOT_SEGMENT_PROBLEM),  # (browsers read "\\" as "/": review R4)
        ("\u202ehuman", "must not contain bidirectional control characters"),
        ("human ", "must not begin or end with a space"),
        ("hu\tman", "must not contain control characters"),
        ("human\u200b", "must not begin or end with a space"),  # (zero-width: review)
        ("human\u3164", "must not begin or end with a space"),  # (a Hangul filler)
        ("hu\u2028man", "must be one line"),  # a line separator
        # Inside, listed as "human" beside it (review):
        *[(f"hu{c}man", INVISIBLE) for c in ["\u200b", "\u200d", "\u00ad", "\u2060", "\ufe0f"]],
        # ... and where a joiner or a selector shapes nothing (code review): a non-joiner in
        # a Russian name, a joiner between ideographs, a run of joiners, a selector after a
        # letter, tags after a letter.
        *[
            (label, INVISIBLE)
            for label in [
                "\u0414\u043c\u0438\u200c\u0442\u0440\u0438\u0439",
                "\u6771\u200d\u4eac",
                "\u00e9\u200d\u200d\u00e9",
                "Jos\u00e9\ufe0f Luis",
                "\u044f\U000e0041\U000e0042\u044f",
            ]
        ],
        # "zoë" (U+00EB) beside it: two labels that look one (review)
        ("zoe\u0308", "must be written with its letters composed (NFC): 'zo\u00eb'"),
    ],
)
def test_a_label_no_url_reaches_is_refused_through_every_door(api, client, helper, label, problem):
    """A label names its block in URLs (/v1/agent/memory-blocks/<label>, the local API's, the
    pages'): one with "/" could be made and then reached by none of them; "." and ".." are
    dropped from a path by clients (curl, httpx, browsers) before they send it. And it heads
    its block's section of the prompt and its form in the pages, shown as what it is, as an
    agent's name: "\u202ehuman" showed as "human" reversed, "human " as a second "human"."""
    response = api.post(BLOCKS, {"label": label}, as_=helper)
    assert response.status_code == 400
    assert response.json()["details"] == {"label": [problem]}
    letta = api.post("/v1/blocks/", {"label": label}, as_=helper)
    assert letta.status_code == 422
    local = client.post(
        "/memory-blocks",
        {"agent_name": "mine", "label": label, "value": "x"},
        content_type="application/json",
        REMOTE_ADDR="127.0.0.1",
    )
    assert local.status_code == 422
    named = client.post(
        "/agents", {"name": label}, content_type="application/json", REMOTE_ADDR="127.0.0.1"
    )
    assert named.status_code == 422
    assert not MemoryBlock.objects.filter(label=label).exists()


@pytest.mark.parametrize(
    "label",
    [
        "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # a family: three emoji joined
        "\u2764\ufe0f\u200d\U0001f525",  # a heart on fire, in emoji style
        "step 1\ufe0f\u20e3",  # a keycap
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian, with its non-joiner
        # (Each refused as ending in a blank, or hidden inside: code review.)
        "I \u2764\ufe0f",  # a heart in emoji style, last
        "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",  # Scotland
        "\u182c\u1820\u1837\u180e\u1820",  # Mongolian, with its vowel separator
        "\u845b\U000e0100\u57ce",  # an ideograph's variant (a Japanese place's name)
        "\u0915\u094d\u200d\u0937",  # Devanagari, a joiner shaping a conjunct
        "\u0600\u0661\u0662",  # an Arabic number sign, drawn
    ],
)
def test_a_joiner_inside_an_emoji_or_a_word_that_needs_it_is_part_of_a_label(api, helper, label):
    create_block(api, helper, label=label)
    assert api.get(f"{BLOCKS}/{quote(label)}", as_=helper).json()["label"] == label


def test_a_write_that_changes_nothing_leaves_the_block_as_it_was(api, helper):
    """(Each moved ``updatedAt``, with no revision to say what changed; review.)"""
    block = create_block(api, helper, label="notes", value="v1", description="d")
    path = f"{BLOCKS}/notes"
    for method, body in [
        ("PATCH", {}),
        ("PUT", {"value": "v1"}),
        ("PATCH", {"value": "v1", "description": "d", "limit": block["limit"]}),
    ]:
        response = api.call(method, path, as_=helper, body=body)
        assert response.status_code == 200, response.content
        assert response.json()["updatedAt"] == block["updatedAt"], (method, body)
    assert api.get(f"{path}/revisions", as_=helper).json()["data"][0]["value"] == "v1"
    changed = api.patch(path, {"description": "other"}, as_=helper).json()
    assert changed["updatedAt"] > block["updatedAt"]


def test_a_label_stored_before_the_name_rule_is_still_reached(api, helper):
    """Only a label given is held to the rule, not one a route looks up: a block stored
    before it (or by the admin's shell) is read, written and deleted as ever."""
    label = "\u202ehuman"
    MemoryBlock.objects.create(agent=helper.agent, label=label, value="old")
    path = f"{BLOCKS}/{quote(label)}"
    assert api.get(path, as_=helper).json()["value"] == "old"
    assert api.call("PUT", path, as_=helper, body={"value": "new"}).status_code == 200
    assert stored(helper, label).value == "new"
    assert api.delete(path, as_=helper).status_code == 204
    assert not MemoryBlock.objects.exists()


def test_blocks_per_user_are_separate(api, helper):
    create_block(api, helper, user_id="alice", label="human", value="Alice likes Python")
    create_block(api, helper, user_id="bob", label="human", value="Bob likes Go")
    alice_block = api.get(f"{BLOCKS}/human?userId=alice", as_=helper).json()
    assert alice_block["value"] == "Alice likes Python"
    assert alice_block["userId"] == "alice"
    assert api.get(f"{BLOCKS}/human", as_=helper).status_code == 404  # no agent-wide block
    # Acting for alice reaches alice's blocks only.
    as_alice = helper.acting_for("alice")
    assert api.get(f"{BLOCKS}/human", as_=as_alice).json()["value"] == "Alice likes Python"
    assert api.get(f"{BLOCKS}/human?userId=bob", as_=as_alice).status_code == 403


def test_an_agent_never_sees_another_agents_blocks(api, helper, rival):
    create_block(api, helper, label="secret", value="helper only")
    assert api.get(f"{BLOCKS}/secret", as_=rival).status_code == 404
    assert api.get(BLOCKS, as_=rival).json()["data"] == []
    assert api.delete(f"{BLOCKS}/secret", as_=rival).status_code == 404
    assert stored(helper, "secret").value == "helper only"


@pytest.mark.parametrize(
    ("method", "body", "field"),
    [
        ("PUT", {"value": "x" * 11}, "value"),
        ("PATCH", {"value": "x" * 11}, "value"),
        ("PATCH", {"append": "y" * 10}, "append"),
        ("PATCH", {"replace": {"old": "short", "new": "much too long"}}, "replace"),
        ("PATCH", {"limit": 3}, "limit"),
    ],
)
def test_the_limit_holds_on_every_write_path(api, helper, method, body, field):
    create_block(api, helper, label="tiny", value="short", limit=10)
    response = api.call(method, f"{BLOCKS}/tiny", as_=helper, body=body)
    assert response.status_code == 400
    assert response.json()["code"] == "validation_error"
    assert field in response.json()["details"]
    assert stored(helper, "tiny").value == "short"
    assert MemoryBlockRevision.objects.filter(block__label="tiny").count() == 1


def test_creating_over_the_limit_is_refused(api, helper):
    response = api.post(BLOCKS, {"label": "big", "value": "x" * 11, "limit": 10}, as_=helper)
    assert response.status_code == 400
    assert not MemoryBlock.objects.exists()


def test_read_only_blocks_refuse_writes(api, helper):
    create_block(api, helper, label="rules", value="Be kind.", readOnly=True)
    for method, body in [
        ("PUT", {"value": "Be rude."}),
        ("PATCH", {"append": "Be rude."}),
        ("PATCH", {"replace": {"old": "kind", "new": "rude"}}),
        ("DELETE", None),
    ]:
        response = api.call(method, f"{BLOCKS}/rules", as_=helper, body=body)
        assert response.status_code == 403, method
    assert stored(helper, "rules").value == "Be kind."


def test_append_and_replace(api, helper):
    create_block(api, helper, label="human", value="Name: Alice")
    appended = api.patch(f"{BLOCKS}/human", {"append": "Likes: Python"}, as_=helper).json()
    assert appended["value"] == "Name: Alice\nLikes: Python"
    replaced = api.patch(
        f"{BLOCKS}/human", {"replace": {"old": "Python", "new": "Rust"}}, as_=helper
    ).json()
    assert replaced["value"] == "Name: Alice\nLikes: Rust"

    missing = api.patch(f"{BLOCKS}/human", {"replace": {"old": "Go", "new": "Zig"}}, as_=helper)
    assert missing.status_code == 409
    assert stored(helper, "human").value == "Name: Alice\nLikes: Rust"

    both = api.patch(f"{BLOCKS}/human", {"value": "a", "append": "b"}, as_=helper)
    assert both.status_code == 400


@pytest.mark.parametrize("blank", ["   ", "\n\t", "\u200b"])
def test_an_append_of_nothing_to_read_is_refused(api, helper, blank):
    """(It added a line of blanks: review.)"""
    create_block(api, helper, label="human", value="Name: Alice")
    refused = api.patch(f"{BLOCKS}/human", {"append": blank}, as_=helper)
    assert refused.status_code == 400
    assert refused.json()["details"] == {"append": ["must not be empty"]}
    assert stored(helper, "human").value == "Name: Alice"


@pytest.mark.parametrize(
    ("method", "body", "field"),
    [
        ("PUT", {"value": "   "}, "value"),
        ("PATCH", {"value": "\n\n"}, "value"),
        ("PATCH", {"replace": {"old": "Name: Alice", "new": "\u200b"}}, "replace"),
    ],
)
def test_a_change_that_leaves_nothing_but_blanks_is_refused(api, helper, method, body, field):
    """A value of blanks only was kept and headed every prompt (review); empty is fine."""
    create_block(api, helper, label="human", value="Name: Alice")
    refused = api.call(method, f"{BLOCKS}/human", as_=helper, body=body)
    assert refused.status_code == 400
    assert refused.json()["details"] == {field: ["the block would hold nothing but blanks"]}
    assert stored(helper, "human").value == "Name: Alice"
    assert MemoryBlockRevision.objects.filter(block__label="human").count() == 1


def test_a_block_of_blanks_is_not_made_but_an_empty_one_and_blanks_within_are(api, helper):
    refused = api.post(BLOCKS, {"label": "notes", "value": "\u200b  "}, as_=helper)
    assert refused.status_code == 400
    assert refused.json()["details"] == {"value": ["the block would hold nothing but blanks"]}
    assert not MemoryBlock.objects.filter(label="notes").exists()
    create_block(api, helper, label="notes", value="a b")
    spaced = {"replace": {"old": "b", "new": "  "}}
    assert api.patch(f"{BLOCKS}/notes", spaced, as_=helper).json()["value"] == "a   "
    assert api.call("PUT", f"{BLOCKS}/notes", as_=helper, body={"value": ""}).status_code == 200
    assert stored(helper, "notes").value == ""


def test_a_block_of_blanks_stored_before_the_rule_takes_other_changes(api, helper):
    create_block(api, helper, label="old", value="x")
    MemoryBlock.objects.filter(label="old").update(value="   ")
    changed = api.patch(f"{BLOCKS}/old", {"limit": 100, "description": "kept"}, as_=helper)
    assert changed.status_code == 200, changed.content
    assert (changed.json()["value"], changed.json()["limit"]) == ("   ", 100)


def test_every_change_keeps_a_revision(api, helper):
    create_block(api, helper, label="notes", value="v1")
    api.call("PUT", f"{BLOCKS}/notes", as_=helper, body={"value": "v2"})
    api.patch(f"{BLOCKS}/notes", {"append": "v3"}, as_=helper)
    api.patch(f"{BLOCKS}/notes", {"description": "no value change"}, as_=helper)
    revisions = api.get(f"{BLOCKS}/notes/revisions", as_=helper).json()["data"]
    assert [r["value"] for r in revisions] == ["v2\nv3", "v2", "v1"]
    assert {r["actor"] for r in revisions} == {helper.agent.principal_id}


def test_revisions_are_paged_newest_first(api, helper):
    create_block(api, helper, label="notes", value="v0")
    for i in range(1, 5):
        api.call("PUT", f"{BLOCKS}/notes", as_=helper, body={"value": f"v{i}"})
    first = api.get(f"{BLOCKS}/notes/revisions", as_=helper, limit=2).json()
    assert [r["value"] for r in first["data"]] == ["v4", "v3"]
    second = api.get(
        f"{BLOCKS}/notes/revisions", as_=helper, limit=2, after=first["nextCursor"]
    ).json()
    assert [r["value"] for r in second["data"]] == ["v2", "v1"]
    last = api.get(
        f"{BLOCKS}/notes/revisions", as_=helper, limit=2, after=second["nextCursor"]
    ).json()
    assert last == {"data": [{**last["data"][0], "value": "v0"}], "nextCursor": None}
    # The default page, not every revision.
    default = api.get(f"{BLOCKS}/notes/revisions", as_=helper).json()
    assert len(default["data"]) == 5 and default["nextCursor"] is None
    assert api.get(f"{BLOCKS}/notes/revisions", as_=helper, limit=201).status_code == 400


def test_a_revisions_cursor_of_another_block_is_400_not_its_page(api, helper):
    """The cursor held only a revision's place: another block's list read it as a place of
    its own, and answered a wrong page or a wrong end (review)."""
    create_block(api, helper, label="older", value="w0")
    api.call("PUT", f"{BLOCKS}/older", as_=helper, body={"value": "w1"})
    create_block(api, helper, label="notes", value="v0")
    api.call("PUT", f"{BLOCKS}/notes", as_=helper, body={"value": "v1"})
    cursor = api.get(f"{BLOCKS}/notes/revisions", as_=helper, limit=1).json()["nextCursor"]
    rest = api.get(f"{BLOCKS}/notes/revisions", as_=helper, after=cursor).json()["data"]
    assert [r["value"] for r in rest] == ["v0"]
    refused = api.get(f"{BLOCKS}/older/revisions", as_=helper, after=cursor)
    assert another_list(refused), refused.content


def test_only_the_newest_revisions_are_kept(api, helper, settings):
    settings.MEMSVC_BLOCK_REVISIONS_KEPT = 3
    create_block(api, helper, label="notes", value="v0")
    create_block(api, helper, label="other", value="w0")
    for i in range(1, 6):
        api.call("PUT", f"{BLOCKS}/notes", as_=helper, body={"value": f"v{i}"})
    kept = MemoryBlockRevision.objects.filter(block__label="notes").order_by("created_at", "id")
    assert [r.value for r in kept] == ["v3", "v4", "v5"]
    # Another block's revisions are its own to keep.
    assert MemoryBlockRevision.objects.filter(block__label="other").count() == 1

    settings.MEMSVC_BLOCK_REVISIONS_KEPT = 0  # keep every one
    for i in range(6, 9):
        api.call("PUT", f"{BLOCKS}/notes", as_=helper, body={"value": f"v{i}"})
    assert MemoryBlockRevision.objects.filter(block__label="notes").count() == 6


def test_the_local_api_and_the_agent_api_share_one_block(api, client, helper):
    """One table, one service: a block written through the local API (with the agent's key,
    from another machine) is the block the agent API reads and changes, revisions included."""
    remote = {"REMOTE_ADDR": "192.0.2.10", "HTTP_X_API_KEY": helper.key}
    created = client.post(
        "/memory-blocks",
        {"agent_name": "helper", "label": "human", "value": "Name: Alice"},
        content_type="application/json",
        **remote,
    )
    assert created.status_code == 200, created.content
    assert api.get(f"{BLOCKS}/human", as_=helper).json()["value"] == "Name: Alice"

    api.patch(f"{BLOCKS}/human", {"append": "Likes: tea"}, as_=helper)
    local = client.get("/memory-blocks/helper/human", **remote).json()
    assert local["value"] == "Name: Alice\nLikes: tea"
    revisions = api.get(f"{BLOCKS}/human/revisions", as_=helper).json()["data"]
    assert [r["value"] for r in revisions] == ["Name: Alice\nLikes: tea", "Name: Alice"]


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_lose_no_text(live_server):
    with transaction.atomic():
        helper = make_agent("busy")
    url = f"{live_server.url}{BLOCKS}"
    headers = {"Authorization": f"Bearer {helper.key}"}
    httpx.post(url, json={"label": "log", "limit": 10_000}, headers=headers).raise_for_status()
    failures = []

    def append_lines(thread_name):
        with httpx.Client(headers=headers, timeout=30) as client:
            for i in range(50):
                response = client.patch(f"{url}/log", json={"append": f"{thread_name}-{i}"})
                if response.status_code != 200:
                    failures.append(response.text)

    threads = [threading.Thread(target=append_lines, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    lines = MemoryBlock.objects.get(agent=helper.agent, label="log").value.split("\n")
    assert len(lines) == 100
    assert sorted(lines) == sorted([f"a-{i}" for i in range(50)] + [f"b-{i}" for i in range(50)])
    assert [line for line in lines if line.startswith("a-")] == [f"a-{i}" for i in range(50)]


@pytest.mark.django_db(transaction=True)
def test_a_block_deleted_while_it_changes_is_deleted_with_every_revision():
    """The delete waits for the change in progress; before, it collected the revisions
    without the change's new one, and the block's row then failed on it (a 500)."""
    helper = make_agent("busy")
    principal = helper.agent.as_principal()
    block = memory_block_create(principal, agent=helper.agent, label="log", value="first")
    outcome = {}

    def delete():
        try:
            memory_block_delete(principal, block=block)
            outcome["deleted"] = True
        except Exception as exc:  # the test's point: it must not fail
            outcome["deleted"] = exc
        finally:
            connection.close()

    with transaction.atomic():
        memory_block_update(principal, block=block, append="second")
        deleting = threading.Thread(target=delete)
        deleting.start()
        deleting.join(timeout=1.0)
        assert deleting.is_alive()  # waiting for the change to end
    deleting.join(timeout=10)
    assert outcome["deleted"] is True
    assert not MemoryBlock.objects.filter(pk=block.pk).exists()
    assert not MemoryBlockRevision.objects.filter(block_id=block.pk).exists()
    # And a change that comes after the delete finds no block (404, not a failed save).
    with pytest.raises(NotFound):
        memory_block_update(principal, block=block, append="third")


def test_a_label_written_decomposed_finds_the_block_it_looks_like(api, helper):
    """ "zoe" and a combining diaeresis was a 404 naming a block that looks exactly like the
    one there is (review): every label given is composed, so a lookup is too. A label kept
    decomposed from before that rule is still found as it is written."""
    decomposed = quote("zoe\u0308")
    create_block(api, helper, label="zo\u00eb", value="composed")
    found = api.get(f"{BLOCKS}/{decomposed}", as_=helper)
    assert found.status_code == 200 and found.json()["value"] == "composed"
    MemoryBlock.objects.create(agent=helper.agent, label="zoe\u0308", value="decomposed")
    again = api.get(f"{BLOCKS}/{decomposed}", as_=helper)
    assert again.json()["value"] == "decomposed"
