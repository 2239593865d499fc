"""The seed's example: two sessions, and the second remembers the first.

With memsvc running (``./scripts/serve``), against any OpenAI-compatible endpoint:

    OPENAI_BASE_URL=... OPENAI_API_KEY=... OPENAI_MODEL=... .venv/bin/python examples/two_sessions.py

or against the stand-in LLM of the test suite, which prints what the model receives:

    .venv/bin/python examples/two_sessions.py --test-llm

The second request carries what the user said in the first, injected by ``learning()`` as a
system message.
"""

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import httpx
from openai import OpenAI

from memsvc.client import learning, server_url_from_env


def wait_until_embedded(timeout: float = 60.0) -> None:
    """memsvc embeds in the background; a real second session comes later than this one."""
    url = server_url_from_env()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(f"{url}/v1/health", timeout=5).json().get("pendingEmbeddings") == 0:
            return
        time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", default="example_agent")
    parser.add_argument(
        "--test-llm", action="store_true", help="use the test suite's local stand-in LLM"
    )
    args = parser.parse_args()
    model = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")

    with contextlib.ExitStack() as stack:
        if args.test_llm:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from tests.fake_openai import FakeOpenAI

            llm = stack.enter_context(FakeOpenAI(reply="(a canned reply from the test LLM)"))
            client = OpenAI(base_url=llm.base_url, api_key="test")
        else:
            client = OpenAI()  # reads OPENAI_BASE_URL and OPENAI_API_KEY

        # Session 1: the user says who they are; learning() stores both turns.
        with learning(agent=args.agent):
            reply = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "My name is Alice and I prefer Python."}],
            )
            print("session 1:", reply.choices[0].message.content)

        if args.test_llm:
            wait_until_embedded()

        # Session 2, later: a fresh request, and the model is reminded.
        with learning(agent=args.agent):
            messages = [{"role": "user", "content": "What programming language should I use?"}]
            reply = client.chat.completions.create(model=model, messages=messages)
            print("session 2:", reply.choices[0].message.content)

        if args.test_llm:
            print("\nwhat the model received in session 2:")
            for message in llm.requests[-1].body["messages"]:
                print(f"--- {message['role']}\n{message['content']}")


if __name__ == "__main__":
    main()
