"""Cursors name their list (``memsvc.api.pagination``): one of another list, filter or
caller is refused, not read as a place in this one (it held only a sort key, and another
list read it as its own place, often its end: review)."""

import base64
import json
import uuid

import pytest

from memsvc.api.errors import InvalidInput
from memsvc.api.pagination import ANOTHER_LIST, decode_cursor, encode_cursor, list_digest
from memsvc.api.principals import Principal

KEY = ["2026-01-01T00:00:00+00:00", "5d0b0dcb-77f4-4b7d-9f3e-2a4f5b1d6c7e"]
TYPES = (str, str)
ALICE = Principal.user("alice")
AGENT = uuid.UUID("9f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f")
ALICES_SEA = list_digest("memories", ALICE, agent=AGENT, tag="sea")


def refusal(cursor: str, of_list: str, field: str = "after") -> dict:
    with pytest.raises(InvalidInput) as refused:
        decode_cursor(cursor, types=TYPES, of_list=of_list, field=field)
    return refused.value.details


def test_a_cursor_is_read_by_its_own_list():
    cursor = encode_cursor(*KEY, of_list=ALICES_SEA)
    assert decode_cursor(cursor, types=TYPES, of_list=ALICES_SEA) == KEY
    # The same list named again: its filters in any order, an id as a UUID or its text.
    assert list_digest("memories", ALICE, tag="sea", agent=str(AGENT)) == ALICES_SEA
    assert len(ALICES_SEA) == 12  # (a cursor grows by 17 characters)


@pytest.mark.parametrize(
    "other",
    [
        list_digest("user memories", ALICE, agent=AGENT, tag="sea"),  # another listing
        list_digest("memories", Principal.user("bob"), agent=AGENT, tag="sea"),
        list_digest("memories", ALICE, agent=AGENT, tag="sky"),
        list_digest("memories", ALICE, agent=None, tag="sea"),
        list_digest("memories", ALICE, agent=AGENT),  # a filter left out
        list_digest("memories", ALICE, agent=AGENT, tag="sea", order="popular"),
    ],
    ids=["listing", "caller", "tag", "no agent", "no tag", "order"],
)
def test_a_cursor_of_another_list_filter_or_caller_is_refused(other):
    cursor = encode_cursor(*KEY, of_list=ALICES_SEA)
    assert refusal(cursor, other) == {"after": [ANOTHER_LIST]}


def test_an_agent_and_the_user_it_acts_for_are_the_caller():
    """Acting for a user narrows what an agent reaches: another list. Its key's scopes do
    not: a walk goes on with a new key."""
    agent = Principal.for_agent(AGENT, scopes=frozenset({"read"}))
    digests = {
        list_digest("tool records", who)
        for who in (agent, Principal.for_agent(AGENT, on_behalf_of="alice"), ALICE)
    }
    assert len(digests) == 3
    assert list_digest("tool records", agent) == list_digest(
        "tool records", Principal.for_agent(AGENT, scopes=frozenset({"read", "write"}))
    )
    # None (no such filter) is not "" (the agent's own memories).
    assert list_digest("memories", agent, user_id=None) != list_digest(
        "memories", agent, user_id=""
    )


def test_a_cursor_of_another_list_with_a_key_of_another_shape_is_refused_as_such():
    """A list of messages' cursor (one number) on a list of memories was "malformed", not
    another list's (review)."""
    messages = encode_cursor(42, of_list=list_digest("messages", ALICE))
    assert refusal(messages, ALICES_SEA) == {"after": [ANOTHER_LIST]}


def test_a_cursor_issued_before_cursors_named_their_list_is_refused_to_list_again():
    before = base64.urlsafe_b64encode(json.dumps(KEY).encode()).decode().rstrip("=")
    assert refusal(before, ALICES_SEA, field="before") == {"before": [ANOTHER_LIST]}


@pytest.mark.parametrize(
    "content",
    [
        b"nope",
        b'{"after": 1}',
        b"[]",
        json.dumps([ALICES_SEA, 1, 2]).encode(),  # its list's, but not its key's types
        json.dumps([ALICES_SEA, KEY[0]]).encode(),  # its list's, a value short (code review)
        json.dumps([ALICES_SEA, *KEY, "more"]).encode(),
        json.dumps([7, *KEY]).encode(),
    ],
)
def test_a_malformed_cursor_is_still_malformed(content):
    cursor = base64.urlsafe_b64encode(content).decode().rstrip("=")
    assert refusal(cursor, ALICES_SEA) == {"after": ["malformed cursor"]}
    assert refusal("not base64!", ALICES_SEA) == {"after": ["malformed cursor"]}
