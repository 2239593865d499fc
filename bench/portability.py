"""``python -m bench.portability``: an agent's memory moved through its own API, export then
import into another agent, on a store of ``--memories`` memories.

A private ``memsvc serve`` (no worker: nothing here needs one); the first agent's memories
are saved through the batch API (``bench.mcp.fill_store``), then timed on the client:
``GET /v1/agent/export`` read to the end, and ``POST /v1/agent/import`` of that document
with a second agent's key, answered. The import's counts are checked against the export's,
and the second agent's keyword search is asked for one of the moved memories.

    .venv/bin/python -m bench.portability --memories 10000
"""

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from bench.common import (
    BenchError,
    api_call,
    benchmark_server,
    create_api_key,
    log,
    make_client,
    private_env,
    write_json,
)
from bench.mcp import DEFAULT_DATA, fill_store
from bench.memories.texts import load_texts, users_texts

AGENT = "portability-bench"
RECEIVER = "portability-bench-receiver"
TIMEOUT_SECONDS = 600.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.portability", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--memories", type=int, default=10_000, help="the agent's store")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo texts, if there")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--clients", type=int, default=4, help="threads saving the store")
    parser.add_argument("--out", type=Path, default=Path("bench-results/portability.json"))
    return parser


def run(args) -> dict:
    rng = random.Random(args.seed)
    users = users_texts(load_texts(args.data), -(-args.memories // 100), 100, args.seed)
    texts = [text for user in users for text in user.memories][: args.memories]
    client = make_client()
    client.timeout = TIMEOUT_SECONDS
    with benchmark_server(
        client, url=None, api_key=None, keep=False, agent_name=AGENT, serve_args=("--no-worker",)
    ) as (url, server):
        log(f"saving {len(texts)} memories as {AGENT}'s own")
        stored = fill_store(server.api_key, url, texts, rng, args.clients)

        started = time.perf_counter()
        exported = api_call(client, "GET", f"{url}/v1/agent/export").content
        export_s = time.perf_counter() - started
        document = json.loads(exported)
        log(f"  export: {len(exported) / 1e6:.1f} MB in {export_s:.2f} s")

        receiver = make_client(create_api_key(private_env(server.data_dir), agent_name=RECEIVER))
        receiver.timeout = TIMEOUT_SECONDS
        started = time.perf_counter()
        response = receiver.post(
            f"{url}/v1/agent/import",
            content=exported,  # the document as it came: no encoding timed on this side
            headers={"Content-Type": "application/json"},
        )
        import_s = time.perf_counter() - started
        if response.status_code != 200:
            raise BenchError(f"import: {response.status_code} {response.text[:500]}")
        answer = response.json()
        log(f"  import: {answer} in {import_s:.2f} s")
        if answer["stored"]["memories"] != len(document["memories"]):
            raise BenchError(f"exported {len(document['memories'])} memories, stored {answer}")

        probe = rng.choice(document["memories"])["content"]
        found = api_call(
            receiver,
            "POST",
            f"{url}/v1/agent/memories/search",
            json_body={"query": probe, "mode": "keyword", "minScore": 0},
        ).json()["data"]
        if probe not in [hit["content"] for hit in found]:
            raise BenchError(f"the receiver's keyword search does not find {probe!r}")
    return {
        "memories": stored,
        "export_bytes": len(exported),
        "export_seconds": round(export_s, 2),
        "import_seconds": round(import_s, 2),
        "imported": answer,
        "load_1min_after": round(os.getloadavg()[0], 2),
    }


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        results = run(args)
    except BenchError as exc:
        log(f"bench.portability: {exc}")
        return 1
    path = write_json(args.out, results)
    print(json.dumps(results, indent=2))
    print(f"(results in {path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
