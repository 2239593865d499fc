"""A reader's place in a conversation's turns: how far an LLM reader (the memory extraction,
``extraction.py``; Letta's sleeptime observer, ``sleeptime.py``) has read, what it gave back
to read again, and what a worker is reading now.

A worker claims turns before it asks the LLM (two workers never read the same turns), and
the claim is committed before the LLM answers. A worker that fails gives its turns back; one
that is killed (``kill -9``, the machine lost, the task's hard time limit) cannot, so a
claim is a lease (``taken``): past ``lease_seconds()`` its turns are given back by the next
claim, and the minute's sweep (``tasks.sweep_lapsed_reads_task``) hands them to a worker.
(The turns a killed worker had claimed were never read: review.)
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings

# The lease outlives the task that holds it: a task asking the LLM is killed 30 s after its
# soft limit (``tasks.LLM_TASK_OPTIONS``), so past this its worker is gone.
LEASE_MARGIN_SECONDS = 60


def lease_seconds() -> int:
    return settings.MEMSVC_LLM_TASK_SECONDS + LEASE_MARGIN_SECONDS


def _spans(value) -> list:
    """The well-formed spans of ``value`` (a JSON list of ``[after, through, ...]`` lists of
    whole numbers): a place edited by hand or left by an older release reads as what it
    holds, not as an error."""
    return [
        list(span)
        for span in (value if isinstance(value, list) else [])
        if isinstance(span, list) and len(span) in (2, 3) and all(type(n) is int for n in span)
    ]


@dataclass
class Place:
    """``through``: the ``seq`` of the last turn read (the next claim starts after it);
    ``unread``: spans given back after a later claim had read past them, ``[after, through]``,
    oldest first, read first; ``taken``: the spans workers are reading,
    ``[after, through, until]`` (``until``: when the lease lapses, in seconds since the epoch).
    """

    through: int = 0
    unread: list = field(default_factory=list)
    taken: list = field(default_factory=list)

    @classmethod
    def of(cls, through, unread, taken) -> "Place":
        """A place as stored (JSON), whatever shape its lists are in."""
        spans = [span[:2] for span in _spans(unread)]
        leases = [span for span in _spans(taken) if len(span) == 3]
        return cls(through if type(through) is int else 0, spans, leases)

    def lapsed(self, now: float | None = None) -> bool:
        """Whether a worker's lease has lapsed (its worker is gone, its turns are unread)."""
        now = time.time() if now is None else now
        return any(until <= now for _, _, until in self.taken)

    def recover(self, now: float | None = None) -> None:
        """Give back the turns of every lapsed lease, the newest first (so the place moves
        back over each in turn where nothing was read past them)."""
        now = time.time() if now is None else now
        for after, through, until in sorted(self.taken, key=lambda span: -span[1]):
            if until <= now:
                self.give_back(after, through)

    def take(self, after: int, through: int, *, moves: bool) -> None:
        """Lease the turns after ``after`` through ``through`` to this worker; ``moves``: they
        are the next turns, read past from now on (else a span given back)."""
        if moves:
            self.through = through
        self.taken.append([after, through, int(time.time()) + lease_seconds()])

    def end(self, after: int, through: int) -> None:
        """The worker is done with the turns it took (read, or given back)."""
        self.taken = [span for span in self.taken if span[:2] != [after, through]]

    def give_back(self, previous: int, claimed: int) -> None:
        """Give back the turns taken after ``previous`` through ``claimed``: the place moves
        back when nothing was read past them since, else they are a span to read first (a
        give-back that found the place moved on did nothing, and those turns were never
        read; review)."""
        self.end(previous, claimed)
        if self.through == claimed:
            self.through = previous
        else:
            self.unread = sorted([*self.unread, [previous, claimed]])

    def next_unread(self, window: Callable[[int, int], list]) -> tuple[int, list]:
        """The first span given back whose ``window(after, through)`` (the turns a reader
        takes at once, oldest first) holds turns, taken off ``unread``: (after, the turns);
        what of the span the window did not hold stays first. A span whose turns are all
        deleted since is dropped. (0, []) when none holds any."""
        while self.unread:
            (after, through), *self.unread = self.unread
            turns = window(after, through)
            if turns:
                if turns[-1].seq < through:  # (the rest of the span: the next one's)
                    self.unread = [[turns[-1].seq, through], *self.unread]
                return after, turns
        return 0, []
