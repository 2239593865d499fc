"""The README's examples run as a user runs them: a separate process, told where memsvc is
by ``MEMORY_SERVER_HOST`` / ``MEMORY_SERVER_PORT`` (as ``memsvc serve`` is), against the test
suite's stand-in LLM."""

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]


def run_example(live_server, *args) -> subprocess.CompletedProcess:
    address = urlsplit(live_server.url)
    env = {
        **os.environ,
        "MEMORY_SERVER_HOST": address.hostname,
        "MEMORY_SERVER_PORT": str(address.port),
    }
    env.pop("MEMORY_SERVER_URL", None)
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=CHECKOUT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.django_db(transaction=True)
def test_the_memory_bank_example_finds_the_server_by_its_port(live_server):
    """(It read MEMORY_SERVER_URL only, so it went to 8283 whatever the port was.)"""
    result = run_example(live_server, "examples/memory_bank_agent.py", "--steps", "6")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "of the whole history" in result.stdout


@pytest.mark.django_db(transaction=True)
def test_the_two_sessions_example_remembers_the_first_session(live_server):
    result = run_example(live_server, "examples/two_sessions.py", "--test-llm")
    assert result.returncode == 0, result.stderr[-2000:]
    received = result.stdout.split("what the model received in session 2:")[1]
    assert "My name is Alice and I prefer Python." in received
