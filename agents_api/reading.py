"""A reader's place in a conversation's turns: how far an LLM reader (the memory extraction,
``extraction.py``; Letta's sleeptime observer, ``sleeptime.py``) has read, what it gave back
to read again, and what workers are reading now.

A worker claims turns before it asks the LLM (two workers never read the same turns), and
the claim is committed before the LLM answers. A worker that fails gives its turns back; one
that is killed (``kill -9``, the machine lost, the task's hard time limit) cannot, so a
claim is a lease (``taken``): past ``lease_seconds()`` its turns are given back by the next
claim or by the minute's sweep (``tasks.sweep_lapsed_reads_task``), which hands them on.
(The turns a killed worker had claimed were never read: review.) Each lease has a token of
its own: a worker that was alive after all (a pool without time limits, a machine that was
suspended) and finishes once its lease was given back changes nothing (it had taken back
or ended the next worker's lease of the same turns: code review); at worst its turns are
read twice, and the readers' saves merge what repeats.
"""

import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from django.conf import settings
from django.db import connection, transaction

from memsvc.llm import LLMError

T = TypeVar("T")
K = TypeVar("K")

# The lease outlives the task that holds it: a task asking the LLM is killed 30 s after its
# soft limit (``tasks.LLM_TASK_OPTIONS``), and the lease lasts 60 s past that limit (30 s
# past the kill).
LEASE_MARGIN_SECONDS = 60


def lease_seconds() -> int:
    return settings.MEMSVC_LLM_TASK_SECONDS + LEASE_MARGIN_SECONDS


def database_now() -> float:
    """The database's clock, in seconds since the epoch: every worker's lease is measured by
    the one clock, whichever machine it runs on."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        return cursor.fetchone()[0]


def _seq(value) -> int | None:
    """A stored ``seq``: a whole number (or its digits, as an operator may type it)."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return value if type(value) is int else None


@dataclass
class Claim:
    """The turns a worker took: those after ``after``, its lease's ``token``."""

    after: int
    turns: list
    token: str

    def settle(self, work: Callable[[], T], end: Callable[[bool], None]) -> T:
        """What ``work`` (the reader's, on these turns) answers, the lease ended after it by
        ``end(again)``: the turns read, or given back to be read again when it raised
        ``GiveBack`` (then its ``result`` is answered; ``TryAgain`` is raised on, for the
        reader's task to be tried again) or failed (then the error is raised on: the
        database, the embedding backend, a bug; nothing of the turns was saved)."""
        try:
            result = work()
        except TryAgain:
            end(True)
            raise
        except GiveBack as back:
            end(True)
            return back.result
        except Exception:
            end(True)
            raise
        # (Killed before this, the lease lapses and the turns are read again: the readers'
        # saves merge what repeats.)
        end(False)
        return result


@dataclass
class Place:
    """``through``: the ``seq`` of the last turn read (the next claim starts after it);
    ``unread``: spans given back after a later claim had read past them, ``[after, through]``,
    oldest first, read first; ``taken``: the spans workers are reading,
    ``[after, through, until, token]`` (``until``: when the lease lapses, in seconds since
    the epoch by the database's clock).
    """

    through: int = 0
    unread: list = field(default_factory=list)
    taken: list = field(default_factory=list)

    @classmethod
    def of(cls, through, unread, taken) -> "Place":
        """A place as stored (JSON), whatever shape it is in: a place edited by hand or
        left by an older release reads as what it holds, not as an error."""

        def spans(value, size: int) -> list:
            return [
                list(span)
                for span in (value if isinstance(value, list) else [])
                if isinstance(span, list)
                and len(span) == size
                and all(_seq(n) is not None for n in span[:2])
            ]

        unread = [[_seq(a), _seq(b)] for a, b in spans(unread, 2)]
        taken = [
            [_seq(a), _seq(b), until, token]
            for a, b, until, token in spans(taken, 4)
            if isinstance(until, int | float)
            and not isinstance(until, bool)
            and isinstance(token, str)
        ]
        return cls(_seq(through) or 0, unread, taken)

    def lapsed(self, now: float | None = None) -> bool:
        """Whether a worker's lease has lapsed (its worker is gone, its turns unread)."""
        if not self.taken:
            return False
        now = database_now() if now is None else now
        return any(until <= now for _, _, until, _ in self.taken)

    def recover(self, now: float | None = None) -> bool:
        """Give back the turns of every lapsed lease, the newest first (so the place moves
        back over each in turn where nothing was read past them); whether any had lapsed."""
        if not self.taken:
            return False
        now = database_now() if now is None else now
        lapsed = [lease for lease in self.taken if lease[2] <= now]
        for _, _, _, token in sorted(lapsed, key=lambda lease: -lease[1]):
            self.end(token, again=True)
        return bool(lapsed)

    def claim(
        self, window: Callable[[int, int | None], list], enough: Callable[[int], bool]
    ) -> Claim | None:
        """Lease the next turns to read to a worker: first those of a lapsed lease or given
        back (``unread``), else, when there are ``enough(after)``, those after the place,
        read past from now on. ``window(after, through)``: the turns a reader takes at once
        after ``after`` (through ``through``, or as far as it goes), oldest first. None when
        there is nothing to read."""
        now = database_now()
        self.recover(now)
        after, turns = self._next_unread(window)
        moves = not turns
        if moves and enough(self.through):
            after, turns = self.through, window(self.through, None)
        if not turns:
            return None
        token = secrets.token_hex(8)
        if moves:
            self.through = turns[-1].seq
        self.taken.append([after, turns[-1].seq, now + lease_seconds(), token])
        return Claim(after, turns, token)

    def end(self, token: str, *, again: bool = False) -> bool:
        """The worker holding the lease ``token`` is done with its turns: read (or not to be
        read, an answer that could not be), or ``again``: given back, to be read again. The
        place moves back when nothing was read past them since, else they are a span to read
        first (a give-back that found the place moved on did nothing, and those turns were
        never read; review). False, and nothing changes, when the lease is not there (it
        lapsed and was given back)."""
        lease = next((lease for lease in self.taken if lease[3] == token), None)
        if lease is None:
            return False
        self.taken.remove(lease)
        previous, claimed = lease[:2]
        if not again:
            return True
        if self.through == claimed:
            self.through = previous
        else:
            self.unread = sorted([*self.unread, [previous, claimed]])
        return True

    def _next_unread(self, window: Callable[[int, int | None], list]) -> tuple[int, list]:
        """The first span given back whose window holds turns, taken off ``unread``: (after,
        the turns); what of the span the window did not hold stays first. A span whose turns
        are all deleted since is dropped. (0, []) when none holds any."""
        while self.unread:
            (after, through), *self.unread = self.unread
            turns = window(after, through)
            if turns:
                if turns[-1].seq < through:  # (the rest of the span: the next one's)
                    self.unread = [[turns[-1].seq, through], *self.unread]
                return after, turns
        return 0, []


def to_recover(leases: Iterable[tuple[K, object]], now: float | None = None) -> list[K]:
    """The keys of ``leases`` (key, ``taken`` as stored) whose leases hold a lapsed one, or
    one that cannot be read (left by an older release, edited by hand: dropped, or the row
    was looked at every minute for good)."""
    now = database_now() if now is None else now
    found = []
    for key, taken in leases:
        place = Place.of(0, [], taken)
        if place.taken != taken or place.lapsed(now):
            found.append(key)
    return found


def recovered(leased: Iterable[tuple[K, object]], *, lock, stored, save) -> list:
    """A sweep's part of a reader (``tasks.sweep_lapsed_reads_task``): the rows of
    ``leased`` ((key, ``taken`` as stored)) whose lapsed leases it gave back, each locked by
    ``lock(key)`` (None: gone, or held by a claim, left for the next sweep), its place as
    stored ``stored(row)``, saved by ``save(row, place)`` once recovered."""
    rows = []
    for key in to_recover(leased):
        with transaction.atomic():
            row = lock(key)
            if row is None:
                continue
            as_stored = stored(row)
            place = Place.of(as_stored.through, as_stored.unread, as_stored.taken)
            place.recover()
            if place == as_stored:
                continue
            save(row, place)
        rows.append(row)
    return rows


class GiveBack(Exception):
    """Raised by a reader's work on the turns it claimed, once it has said why (logged): the
    turns are given back to be read again (``Place.end(..., again=True)``). ``result``: what
    the work did before."""

    later = "read again after the next write"  # (what a reader's log says)

    def __init__(self, result=None):
        super().__init__()
        self.result = result


class TryAgain(GiveBack):
    """The turns given back, and the reader's task to be sent again for later: its LLM could
    not answer now (unreachable, overloaded, its answer not in time) and may soon.
    ``Claim.settle`` raises it on once the turns are given back (``tasks``). Else a
    conversation whose last turns came while the LLM was down was never read past them
    (they waited for its next write)."""

    later = "given back: the model may answer later"


def given_back(exc: LLMError) -> GiveBack | None:
    """What becomes of the turns a reader's LLM did not answer for: read again in a while
    (``TryAgain``: it may answer then), after the conversation's next write (``GiveBack``:
    it refused memsvc's setup, which the operator fixes), or None: read for nothing (an
    answer that could not be used)."""
    if exc.transient:
        return TryAgain([])
    return GiveBack([]) if exc.misconfigured else None
