"""The memory bank's measures (issue 17), against a private ``memsvc serve`` (or ``--url``):

- tokens: a 30-step synthetic tool task (``bench.tool_task``) run against the test suite's
  stand-in LLM, sending the whole history and inside ``learning(strategy="memory_bank")``;
  the tokens the model received at each step, estimated as characters / 4 of the messages'
  JSON (model-agnostic; tool schemas, the same both ways, left out);
- search: ``POST /v1/agent/tool-records/search`` latency with 10,000 records stored (100
  tasks of 100 steps), within one task and over the agent's whole store, for the
  strategy's fixed query and for an identifier only a raw output holds.

    .venv/bin/python -m bench.tool_records --steps 30 --records 10000 --queries 100
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

from bench.common import (
    BenchError,
    api_call,
    benchmark_server,
    log,
    make_client,
    percentile,
    write_json,
)
from bench.tool_task import context_tokens, script, tool_output
from memsvc.memory_bank import RETRIEVAL_QUERY

AGENT = "tool-records-bench"
STEPS_PER_TASK = 100
LOAD_BATCH = 100


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tool_records", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--steps", type=int, default=30, help="steps of the synthetic task")
    parser.add_argument("--records", type=int, default=10_000, help="stored before searching")
    parser.add_argument("--queries", type=int, default=100, help="timed searches per case")
    parser.add_argument("--url", help="a running memsvc (default: a private one)")
    parser.add_argument("--api-key", help="an agent key of --url (read and write)")
    parser.add_argument("--keep-server", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench-results/tool_records.json"))
    return parser


def warm_up(client, url: str) -> None:
    """Load the embedding model in the server's processes before anything is timed (the
    client's 10 s timeout is shorter than a cold model load on a busy machine)."""
    records = [{"tool_name": "warm_up", "output": {"ok": True}}]
    for _ in range(4):
        api_call(
            client,
            "POST",
            f"{url}/tool-records",
            json_body={"agent_name": AGENT, "task_id": "warm-up", "records": records},
        )
        api_call(client, "POST", f"{url}/v1/agent/tool-records/search", json_body={"query": "warm"})
    api_call(client, "DELETE", f"{url}/v1/agent/tool-records", params={"taskId": "warm-up"})


def measure_tokens(url: str, steps: int, *, api_key: str) -> list[dict]:
    """(The agent has a key, so loopback trust does not reach it: learning() presents it.)"""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.fake_openai import FakeOpenAI, ToolCall

    with FakeOpenAI() as llm:
        return context_tokens(
            llm, ToolCall, steps=steps, server_url=url, agent=AGENT, api_key=api_key
        )


def load_records(client, url: str, count: int) -> None:
    """``count`` records in tasks of ``STEPS_PER_TASK``, through the local batch route."""
    started = time.monotonic()
    plan = script(STEPS_PER_TASK)
    for first in range(0, count, LOAD_BATCH):
        records = []
        for index in range(first, min(first + LOAD_BATCH, count)):
            task, step = divmod(index, STEPS_PER_TASK)
            name, arguments = plan[step][0]
            # Each task plans another trip: its own cities, so its own ids.
            arguments = {
                k: f"{v} {task}" if k in ("city", "origin", "destination") else v
                for k, v in arguments.items()
            }
            if "hotel_id" in arguments:
                arguments["hotel_id"] = f"{arguments['hotel_id']}-t{task}"
            records.append(
                {
                    "step": step + 1,
                    "tool_name": name,
                    "input": arguments,
                    "output": tool_output(name, arguments),
                    "task": f"task-{task}",
                }
            )
        for task_id in sorted({r["task"] for r in records}):
            batch = [
                {k: v for k, v in r.items() if k != "task"} for r in records if r["task"] == task_id
            ]
            api_call(
                client,
                "POST",
                f"{url}/tool-records",
                json_body={"agent_name": AGENT, "task_id": task_id, "records": batch},
            )
        done = min(first + LOAD_BATCH, count)
        if done % 1000 == 0 or done == count:
            rate = done / (time.monotonic() - started)
            log(f"  {done} records stored ({rate:.0f}/s, load {os.getloadavg()[0]:.1f})")


def time_searches(client, url: str, queries: int, tasks: int) -> dict:
    cases = {
        "one task, fixed query": lambda i: {
            "query": RETRIEVAL_QUERY,
            "taskId": f"task-{i % tasks}",
        },
        "whole store, fixed query": lambda i: {"query": RETRIEVAL_QUERY},
        # Step 2 of every task looks up this hotel (``bench.tool_task.script``).
        "whole store, an output's id": lambda i: {"query": f"htl-lis-002-t{i % tasks}"},
    }
    results = {}
    for name, body in cases.items():
        api_call(client, "POST", f"{url}/v1/agent/tool-records/search", json_body=body(0))
        times, first_right = [], 0
        for i in range(queries):
            query = body(i)
            started = time.perf_counter()
            response = api_call(
                client, "POST", f"{url}/v1/agent/tool-records/search", json_body=query
            )
            times.append((time.perf_counter() - started) * 1000)
            hits = response.json()["data"]
            # For an id: is the best record one whose raw output holds it?
            first_right += bool(hits) and query["query"] in json.dumps(hits[0]["output"])
        results[name] = {
            "p50_ms": round(percentile(times, 50), 1),
            "p95_ms": round(percentile(times, 95), 1),
            "top_holds_query": first_right / queries,
            "load_1min": round(os.getloadavg()[0], 2),
        }
        log(f"  {name}: {results[name]}")
    return results


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    client = make_client()
    try:
        with benchmark_server(
            client, url=args.url, api_key=args.api_key, keep=args.keep_server, agent_name=AGENT
        ) as (url, server):
            warm_up(client, url)
            log(f"tokens per step, {args.steps} steps (load {os.getloadavg()[0]:.1f})")
            tokens = measure_tokens(url, args.steps, api_key=args.api_key or server.api_key)
            for row in tokens:
                print(f"step {row['step']:>3}: {row['whole_history']:>7} {row['memory_bank']:>7}")
            log(f"storing {args.records} records")
            load_records(client, url, args.records)
            searches = time_searches(
                client, url, args.queries, max(1, args.records // STEPS_PER_TASK)
            )
    except BenchError as exc:
        log(f"error: {exc}")
        return 1
    path = write_json(args.out, {"tokens": tokens, "searches": searches, "records": args.records})
    log(f"results in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
