"""A service found down, not asked again for a while (the broker, Redis): each call to one that
does not answer waits for its timeout, and every request of an outage paid it again (an append
with Redis stopped: 4 s, its broker's 3 and the rate limit's 1; review)."""

import time


class Outage:
    """Whether a service failed less than ``seconds`` ago (``ongoing``): a caller that does
    without it meanwhile does so at once. Per process; a thread may ask while another
    records a failure (one float read or written)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._began = float("-inf")  # (time.monotonic)

    @property
    def ongoing(self) -> bool:
        return time.monotonic() - self._began < self.seconds

    def began(self) -> None:
        self._began = time.monotonic()

    def end(self) -> None:
        self._began = float("-inf")


class Reminder:
    """A line logged at most once every ``seconds`` (per process): what every request meets
    while it lasts (the database down) said once a while, not by every request (some 115
    lines a refused request with its traceback, 11,400 in an outage of 7 s: review)."""

    def __init__(self, seconds: float = 60.0):
        self._said = Outage(seconds)

    def say(self, log, *args, **kwargs) -> bool:
        """``log(*args, **kwargs)`` unless it was said less than ``seconds`` ago; whether it
        was said."""
        if self._said.ongoing:
            return False
        self._said.began()
        log(*args, **kwargs)
        return True
