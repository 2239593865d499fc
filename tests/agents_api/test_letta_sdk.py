"""Letta's own ``agentic-learning`` SDK, unmodified, against memsvc: its ``learning()`` stores
each turn in memsvc, memsvc's sleeptime observer (the stand-in LLM, tests/fake_openai.py)
updates the ``human`` block, and the next session's model call receives it.

The SDK runs in a child process: it patches the ``openai`` package for good, which must
not leak into the other tests (tests/memsvc/test_client.py checks memsvc's own patching).
"""

import json
import os
import subprocess
import sys

import pytest

from agents_api.models import Agent, MemoryBlock
from conversations.models import Message
from tests.agents_api.conftest import make_agent
from tests.fake_openai import FakeOpenAI

pytestmark = pytest.mark.django_db(transaction=True)

# One session of a program using the SDK as its README shows: the OpenAI client inside
# ``learning(agent=...)``, the memory client pointed at memsvc.
SESSION = """
import sys
import openai
from agentic_learning import AgenticLearning, learning

memsvc_url, llm_url, *questions = sys.argv[1:]
model = openai.OpenAI(base_url=llm_url, api_key="test")
memory = AgenticLearning(base_url=memsvc_url)
with learning(agent="travel", client=memory):
    for question in questions:
        answer = model.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": question}]
        )
        print(answer.choices[0].message.content)
"""

HUMAN = "The user is Ada, lives in Lisbon and prefers window seats."


def run_session(memsvc_url: str, llm: FakeOpenAI, key: str, *questions: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", SESSION, memsvc_url, llm.base_url, *questions],
        env={**os.environ, "LETTA_API_KEY": key},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    # The SDK reports every failed memory call as a warning and carries on: none here.
    assert "[Warning]" not in result.stderr, result.stderr
    return result.stdout


def test_the_second_session_receives_what_the_observer_learned_in_the_first(live_server, settings):
    key = make_agent("sdk-user").key
    with FakeOpenAI(reply="Happy to help.") as llm:
        settings.MEMSVC_LLM_BASE_URL = llm.base_url
        settings.MEMSVC_LLM_MODEL = "gpt-test"
        llm.answer(
            "maintain the memory blocks",
            json.dumps({"blocks": [{"label": "human", "value": HUMAN}]}),
        )

        run_session(
            live_server.url,
            llm,
            key,
            "My name is Ada and I live in Lisbon.",
            "I like window seats.",
        )

        agent = Agent.objects.get(name="travel")
        assert agent.owner_principal.startswith("agent:")
        assert list(
            Message.objects.filter(conversation__local_agent=agent)
            .order_by("seq")
            .values_list("role", "content")
        ) == [
            ("user", "My name is Ada and I live in Lisbon."),
            ("assistant", "Happy to help."),
            ("user", "I like window seats."),
            ("assistant", "Happy to help."),
        ]
        # The SDK asks for a sleeptime group with frequency 2: two turns, one observation.
        assert len(llm.requests_containing("maintain the memory blocks")) == 1
        assert MemoryBlock.objects.get(agent=agent, label="human").value == HUMAN

        run_session(live_server.url, llm, key, "Book me a flight home.")

    [call] = llm.requests_containing("Book me a flight home.")
    system = [m["content"] for m in call["messages"] if m["role"] == "system"]
    assert any(HUMAN in content for content in system), call["messages"]
