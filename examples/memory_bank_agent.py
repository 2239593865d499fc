"""The memory bank: a long tool-using agent task kept inside the context window.

An agent loop (a trip planner calling five tools, ``bench/tool_task.py``) runs against the
test suite's stand-in LLM twice: sending the whole history at every step, then inside
``learning(agent=..., strategy="memory_bank")``, which stores each tool result in memsvc as a
tool record and sends the model the task, the three most relevant records and the last tool
interaction instead. It prints how much the model received at each step, both ways (tokens
estimated as characters / 4).

With memsvc running (``./scripts/serve``):

    .venv/bin/python examples/memory_bank_agent.py --steps 30
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.tool_task import context_tokens
from memsvc.client import server_url_from_env
from tests.fake_openai import FakeOpenAI, ToolCall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="tool-calling steps of the task")
    parser.add_argument("--agent", default="memory_bank_example")
    args = parser.parse_args()
    server_url = server_url_from_env()  # MEMORY_SERVER_URL, or _HOST and _PORT, as learning()

    with FakeOpenAI() as llm:
        rows = context_tokens(
            llm, ToolCall, steps=args.steps, server_url=server_url, agent=args.agent
        )
    print(f"{'step':>4}  {'whole history':>13}  {'memory bank':>11}   (tokens, chars/4)")
    for row in rows:
        print(f"{row['step']:>4}  {row['whole_history']:>13}  {row['memory_bank']:>11}")
    whole = sum(row["whole_history"] for row in rows)
    bank = sum(row["memory_bank"] for row in rows)
    print(f"total {whole:>12}  {bank:>11}   ({bank / whole:.0%} of the whole history)")


if __name__ == "__main__":
    main()
