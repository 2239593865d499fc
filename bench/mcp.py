"""``python -m bench.mcp``: the MCP server's ``memory_search`` round trip, over streamable
HTTP (``/mcp`` of ``memsvc serve``) and over stdio (``memsvc mcp`` as a client starts it),
with the SDK's own client, on an agent's store of ``--memories`` memories.

Every call is timed on the client from sending the request to having the parsed result,
one call at a time (an assistant asks, then waits). The REST search of the same queries
(``POST /v1/agent/memories/search``) is timed beside them: the difference is what MCP adds.

    .venv/bin/python -m bench.mcp --memories 10000 --calls 1000
"""

import argparse
import os
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from bench.common import (
    BenchError,
    api_call,
    benchmark_server,
    log,
    make_client,
    mean,
    memsvc_executable,
    percentile,
    private_env,
    write_json,
)
from bench.memories.texts import load_texts, users_texts
from bench.search import database

AGENT = "mcp-bench"
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared/bench/locomo/locomo-dev.json"
BATCH = 100
WARM_UP_CALLS = 20


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.mcp", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--memories", type=int, default=10_000, help="the agent's store")
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per transport")
    parser.add_argument("--rest-calls", type=int, default=300, help="timed REST searches")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo texts, if there")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--clients", type=int, default=4, help="threads saving the store")
    parser.add_argument("--out", type=Path, default=Path("bench-results/mcp.json"))
    parser.add_argument(
        "--keep-server", action="store_true", help="leave the private server running after"
    )
    return parser


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def summary(latencies_ms: list[float], load_before: float) -> dict:
    return {
        "calls": len(latencies_ms),
        "p50_ms": round(percentile(latencies_ms, 50), 2),
        "p95_ms": round(percentile(latencies_ms, 95), 2),
        "mean_ms": round(mean(latencies_ms), 2),
        "load_1min_before": load_before,
        "load_1min_after": load_average(),
    }


def fill_store(key: str, url: str, texts: list[str], rng: random.Random, clients: int) -> int:
    """The texts as the agent's own memories, through the batch API from ``clients``
    threads; how many are stored (a near-duplicate is merged into the memory it repeats)."""
    batches = [
        [
            {"content": text, "importance": round(rng.uniform(0.1, 0.9), 2)}
            for text in texts[start : start + BATCH]
        ]
        for start in range(0, len(texts), BATCH)
    ]
    local = threading.local()

    def send(memories: list[dict]) -> list[str]:
        if not hasattr(local, "client"):
            local.client = make_client(key)
        response = api_call(
            local.client,
            "POST",
            f"{url}/v1/agent/memories/batch",
            json_body={"memories": memories},
            expect=201,
        )
        return [memory["id"] for memory in response.json()["data"]]

    ids = set()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        for done, saved in enumerate(pool.map(send, batches), start=1):
            ids.update(saved)
            if done % 10 == 0:
                log(f"  saved {done * BATCH}/{len(texts)} (load {load_average()})")
    return len(ids)


def queries_from(texts: list[str], count: int, rng: random.Random) -> list[str]:
    """Questions as an assistant would ask them: the first words of stored facts (a partial
    match, as a model paraphrases)."""
    return [" ".join(rng.choice(texts).split()[:6]) for _ in range(count)]


async def time_mcp_calls(server, queries: list[str], **client_options) -> list[float]:
    latencies = []
    async with Client(server, **client_options) as client:
        for index, query in enumerate([*queries[:WARM_UP_CALLS], *queries]):
            started = time.perf_counter()
            result = await client.call_tool("memory_search", {"query": query})
            elapsed = (time.perf_counter() - started) * 1000
            if result.is_error:
                raise BenchError(f"memory_search failed: {result.content[0].text}")
            if index >= WARM_UP_CALLS:
                latencies.append(elapsed)
    return latencies


def time_rest_calls(client, url: str, queries: list[str]) -> list[float]:
    latencies = []
    for index, query in enumerate([*queries[:WARM_UP_CALLS], *queries]):
        started = time.perf_counter()
        api_call(client, "POST", f"{url}/v1/agent/memories/search", json_body={"query": query})
        if index >= WARM_UP_CALLS:
            latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def run(args) -> dict:
    rng = random.Random(args.seed)
    source = load_texts(args.data)
    per_user = 100
    users = users_texts(source, -(-args.memories // per_user), per_user, args.seed)
    texts = [text for user in users for text in user.memories][: args.memories]
    client = make_client()
    with benchmark_server(
        client,
        url=None,
        api_key=None,
        keep=args.keep_server,
        agent_name=AGENT,
        # No Celery worker: kombu's filesystem transport can crash it under a stream of
        # use counts (docs/benchmarks.md), and `memsvc serve` then stops the web server too.
        # A search still queues its use count (a file), as with a worker.
        serve_args=("--no-worker",),
    ) as (
        url,
        server,
    ):
        log(f"saving {len(texts)} memories as {AGENT}'s own (load {load_average()})")
        started = time.monotonic()
        stored = fill_store(server.api_key, url, texts, rng, args.clients)
        log(f"  {stored} stored in {time.monotonic() - started:.0f} s")
        # The new store vacuumed and analysed, as after any bulk load (``bench.search``):
        # autovacuum comes within a minute of the writes, and a store filled faster than that
        # was searched without statistics (the keyword side then counts every word: 30 ms a
        # search instead of 13, a bench that measured how fast the store was filled).
        if server is not None:
            with database(server.data_dir) as conn:
                conn.autocommit = True
                conn.execute("VACUUM ANALYZE memory")
        queries = queries_from(texts, args.calls, rng)
        results = {"memories_stored": stored, "queries": len(queries)}

        log(f"REST: {args.rest_calls} searches (load {load_average()})")
        load = load_average()
        results["rest"] = summary(time_rest_calls(client, url, queries[: args.rest_calls]), load)
        log(f"  {results['rest']}")

        log(f"MCP over streamable HTTP: {args.calls} calls (load {load_average()})")
        load = load_average()
        transport = streamable_http_client(
            f"{url}/mcp",
            http_client=httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {server.api_key}"}, timeout=60
            ),
        )
        results["http"] = summary(anyio.run(lambda: time_mcp_calls(transport, queries)), load)
        log(f"  {results['http']}")

        log(f"MCP over stdio: {args.calls} calls (load {load_average()})")
        load = load_average()
        stdio = StdioServerParameters(
            command=memsvc_executable(),
            args=["mcp"],
            env={**private_env(server.data_dir), "MEMSVC_API_KEY": server.api_key},
        )
        results["stdio"] = summary(anyio.run(lambda: time_mcp_calls(stdio, queries)), load)
        log(f"  {results['stdio']}")
    return results


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        results = run(args)
    except BenchError as exc:
        log(f"bench.mcp: {exc}")
        return 1
    path = write_json(args.out, results)
    print(f"{'transport':<10} {'calls':>6} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8}  load 1-min")
    for name in ("rest", "http", "stdio"):
        row = results[name]
        print(
            f"{name:<10} {row['calls']:>6} {row['p50_ms']:>8} {row['p95_ms']:>8} "
            f"{row['mean_ms']:>8}  {row['load_1min_before']} -> {row['load_1min_after']}"
        )
    print(f"({results['memories_stored']} memories; results in {path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
