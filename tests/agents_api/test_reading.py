"""A reader's place in a conversation's turns (``agents_api.reading``), its clock stood still
(the database's, ``reading.database_now``)."""

import copy
from types import SimpleNamespace

import pytest

from agents_api import reading
from agents_api.reading import GiveBack, Place

NOW = 1_000_000.0


@pytest.fixture(autouse=True)
def clock(monkeypatch, settings):
    settings.MEMSVC_LLM_TASK_SECONDS = 600
    monkeypatch.setattr(reading, "database_now", lambda: NOW)


def window_of(*seqs):
    """A reader's window over turns numbered ``seqs``: at most three at once."""

    def window(after, through):
        found = [s for s in seqs if s > after and (through is None or s <= through)]
        return [SimpleNamespace(seq=s) for s in found[:3]]

    return window


def enough(after) -> bool:
    return True


def test_a_claim_moves_the_place_and_leases_the_turns():
    place = Place(through=4)
    claim = place.claim(window_of(5, 6, 7, 8), enough)
    assert (claim.after, [t.seq for t in claim.turns]) == (4, [5, 6, 7])
    [[after, through, until, token]] = place.taken
    assert (place.through, after, through, token) == (7, 4, 7, claim.token)
    assert until == NOW + reading.lease_seconds()
    assert not place.lapsed(until - 1) and place.lapsed(until)
    assert place.end(claim.token)
    assert place == Place(through=7)
    assert Place(through=4).claim(window_of(5), lambda after: False) is None


def test_a_lease_outlives_the_task_that_holds_it(settings):
    """A task asking the LLM is killed at its hard limit: past the lease, it is gone."""
    from agents_api.tasks import LLM_TASK_OPTIONS

    killed_after = LLM_TASK_OPTIONS["time_limit"] - LLM_TASK_OPTIONS["soft_time_limit"]
    assert reading.lease_seconds() - settings.MEMSVC_LLM_TASK_SECONDS > killed_after


def test_turns_given_back_move_the_place_back_unless_read_past():
    place = Place(through=4)
    first = place.claim(window_of(5, 6, 7, 8, 9, 10), enough)
    assert place.end(first.token, again=True)
    assert place == Place(through=4)
    first = place.claim(window_of(5, 6, 7, 8, 9, 10), enough)
    place.claim(window_of(5, 6, 7, 8, 9, 10), enough)  # (8..10 read meanwhile)
    place.end(first.token, again=True)
    assert (place.through, place.unread, len(place.taken)) == (10, [[4, 7]], 1)
    # Read first, by the next claim.
    assert [t.seq for t in place.claim(window_of(5, 6, 7, 8, 9, 10), enough).turns] == [5, 6, 7]


def test_lapsed_leases_are_given_back_the_newest_first():
    """Two workers killed one after the other: the place moves back over both (the oldest
    first left the newest's turns a span to read again, and the place where it was)."""
    place = Place(through=4)
    window = window_of(5, 6, 7, 8, 9, 10)
    place.claim(window, enough)
    place.claim(window, enough)
    place.taken[0][2] = place.taken[1][2] = NOW - 1
    assert place.recover()
    assert place == Place(through=4)
    assert not place.recover()


def test_a_worker_that_finishes_after_its_lease_was_given_back_changes_nothing():
    """Alive after all (a pool without time limits, a machine suspended): its give-back or
    its end took the next worker's lease of the same turns, whose turns were then read by
    a third while it read them, or lost with it (code review)."""
    place = Place(through=4)
    window = window_of(5, 6, 7)
    late = place.claim(window, enough)
    place.taken[0][2] = NOW - 1
    place.recover()
    next_one = place.claim(window, enough)
    assert [t.seq for t in next_one.turns] == [5, 6, 7]
    held = copy.deepcopy(place)
    assert not place.end(late.token, again=True) and place == held
    assert not place.end(late.token) and place == held
    assert place.end(next_one.token) and place == Place(through=7)


def test_spans_given_back_are_read_first_as_far_as_a_window_holds():
    place = Place(through=30, unread=[[4, 9], [12, 14]])
    claim = place.claim(window_of(5, 6, 7, 8, 13), enough)
    assert (claim.after, [t.seq for t in claim.turns]) == (4, [5, 6, 7])
    assert place.unread == [[7, 9], [12, 14]] and place.through == 30
    # A span whose turns are deleted since is dropped.
    place = Place(through=30, unread=[[4, 9]])
    assert place.claim(window_of(31), lambda after: False) is None
    assert place == Place(through=30)


def test_a_reader_ends_its_lease_once_whatever_its_work_does():
    """Given back by its work (``GiveBack``) the lease was ended twice: given back, then
    read (code review)."""
    place = Place(through=4)
    claim = place.claim(window_of(5, 6), enough)
    ended = []

    def give_back():
        raise GiveBack(["human"])

    assert claim.settle(give_back, ended.append) == ["human"]
    assert claim.settle(lambda: "saved", ended.append) == "saved"
    with pytest.raises(ZeroDivisionError):
        claim.settle(lambda: 1 / 0, ended.append)
    assert ended == [True, False, True]


def test_a_place_stored_in_another_shape_reads_as_what_it_holds():
    """Edited by hand (the admin's metadata), or left by a release before leases."""
    place = Place.of("9", [[1, 2], [3], "x", [True, 4], ["5", 6]], None)
    assert place == Place(through=9, unread=[[1, 2], [5, 6]], taken=[])
    stored = Place.of(
        7, [[1, 2, 3]], [[1, 2], [3, 4, 5.5, "t"], [3, 4, "5", "t"], [3, 4, True, "t"]]
    )
    assert stored == Place(7, [], [[3, 4, 5.5, "t"]])


def test_the_sweep_looks_again_at_lapsed_and_unreadable_leases_only():
    leases = [
        ("live", [[1, 2, NOW + 1, "a"]]),
        ("lapsed", [[1, 2, NOW + 1, "a"], [2, 3, NOW, "b"]]),
        ("of an older release", [[1, 2, NOW + 1]]),
    ]
    assert reading.to_recover(leases, NOW) == ["lapsed", "of an older release"]
