"""Waiting in tests for something another thread or process brings about, never for good.

A poll without a deadline holds the whole suite when what it waits for came and went
between two looks (CI hung once in such a loop); a fixed sleep is slow or flaky. These wait
as long as needed, at most ``seconds``, and fail naming what never came.
"""

import asyncio
import time

import pytest

DEADLINE_SECONDS = 30
EVERY_SECONDS = 0.01


def wait_until(condition, what: str, *, seconds: float = DEADLINE_SECONDS, every=EVERY_SECONDS):
    """``condition()``'s first truthy value, asked every ``every`` seconds."""
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        if time.monotonic() >= deadline:
            pytest.fail(f"not within {seconds} s: {what}")
        time.sleep(every)
    return found


async def until(condition, what: str, *, seconds: float = DEADLINE_SECONDS, every=EVERY_SECONDS):
    """``wait_until`` for a coroutine: the event loop runs other tasks meanwhile."""
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        if time.monotonic() >= deadline:
            pytest.fail(f"not within {seconds} s: {what}")
        await asyncio.sleep(every)
    return found
