"""A reader's place in a conversation's turns (``agents_api.reading``), without a database."""

from types import SimpleNamespace

from agents_api import reading
from agents_api.reading import Place


def turns(*seqs) -> list:
    return [SimpleNamespace(seq=seq) for seq in seqs]


def test_a_claim_moves_the_place_and_leases_the_turns(settings):
    settings.MEMSVC_LLM_TASK_SECONDS = 600
    place = Place(through=4)
    place.take(4, 9, moves=True)
    [[after, through, until]] = place.taken
    assert (place.through, after, through) == (9, 4, 9)
    assert not place.lapsed(until - 1) and place.lapsed(until)
    place.end(4, 9)
    assert place == Place(through=9)


def test_a_lease_outlives_the_task_that_holds_it(settings):
    """A task asking the LLM is killed 30 s after its soft limit: past the lease, its worker
    is gone (a shorter lease gave a live worker's turns to a second one)."""
    from agents_api.tasks import LLM_TASK_OPTIONS

    settings.MEMSVC_LLM_TASK_SECONDS = 5
    assert reading.lease_seconds() > 5 + 30
    assert LLM_TASK_OPTIONS["time_limit"] - LLM_TASK_OPTIONS["soft_time_limit"] == 30


def test_turns_given_back_move_the_place_back_unless_read_past():
    place = Place(through=9, taken=[[4, 9, 100]])
    place.give_back(4, 9)
    assert place == Place(through=4)
    place = Place(through=15, taken=[[4, 9, 100], [9, 15, 100]])
    place.give_back(4, 9)  # (9..15 were read meanwhile)
    assert place == Place(through=15, unread=[[4, 9]], taken=[[9, 15, 100]])


def test_lapsed_leases_are_given_back_the_newest_first():
    """Two workers killed one after the other: the place moves back over both (the oldest
    first left the newest's turns a span to read again, and the place where it was)."""
    place = Place(through=15, taken=[[4, 9, 100], [9, 15, 100], [1, 2, 500]])
    place.recover(now=200)
    assert place == Place(through=4, taken=[[1, 2, 500]])


def test_spans_given_back_are_read_first_as_far_as_a_window_holds():
    place = Place(through=30, unread=[[4, 9], [12, 14]])
    after, read = place.next_unread(lambda after, through: turns(5, 6)[: through - after])
    assert (after, [t.seq for t in read]) == (4, [5, 6])
    assert place.unread == [[6, 9], [12, 14]]
    # A span whose turns are deleted since is dropped.
    assert place.next_unread(lambda after, through: []) == (0, [])
    assert place.unread == []


def test_a_place_stored_in_another_shape_reads_as_what_it_holds():
    """Edited by hand (the admin's metadata), or left by a release before leases."""
    place = Place.of("9", [[1, 2], [3], "x", [True, 4], [5, 6]], None)
    assert place == Place(through=0, unread=[[1, 2], [5, 6]], taken=[])
    assert Place.of(7, [[1, 2, 3]], [[1, 2], [3, 4, 5]]) == Place(7, [[1, 2]], [[3, 4, 5]])
