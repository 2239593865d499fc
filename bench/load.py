"""Mixed load: ``python -m bench.load [--clients 16 --clients 64] [--seconds 60]``.

It starts a private memsvc (see ``bench.common``; or ``--url`` with ``--api-key``), gives each
client a conversation of its own, and for ``--seconds`` per level keeps ``--clients``
clients busy, each sending its next request as soon as the last one is answered: 70% appends
of one message (``POST /v1/agent/conversations/{id}/messages``, with an ``Idempotency-Key``)
and 30% searches (``POST /v1/agent/search/messages``, hybrid: the query is embedded by the
web process). It reports requests/s, p50/p95/p99 per kind, errors (any other status, any
transport error), the embedding backlog when the load stops and how long the worker takes to
drain it, and the CPU time the service spent per request: memsvc's processes (web server,
worker) and PostgreSQL's, read from the kernel (user + system, reaped children included)
before and after.

The clients are asyncio tasks in this one process, which runs on the same machine: its own
CPU time is reported beside the service's. Each keeps one connection of ``bench.lean_http``
alive, which spends a quarter of httpx's CPU on a request: on two cores, what the clients
spend is taken from the service they measure.
"""

import argparse
import asyncio
import contextlib
import json
import random
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench.common import (
    BenchError,
    api_call,
    benchmark_server,
    get_health,
    log,
    make_client,
    percentile,
    write_json,
)
from bench.lean_http import Connection, ConnectionLost

APPEND_SHARE = 0.7
REQUEST_TIMEOUT_SECONDS = 60.0
WORDS = [
    "memory",
    "agent",
    "user",
    "search",
    "summary",
    "fork",
    "message",
    "conversation",
    "remember",
    "yesterday",
    "garden",
    "coffee",
    "meeting",
    "project",
    "deadline",
    "travel",
    "Paris",
    "Berlin",
    "piano",
    "lesson",
    "doctor",
    "birthday",
    "gift",
    "budget",
    "report",
    "weekend",
    "hiking",
    "dinner",
    "recipe",
    "book",
    "movie",
    "music",
    "concert",
    "train",
    "ticket",
    "hotel",
    "friend",
    "sister",
    "brother",
    "mother",
    "father",
    "colleague",
    "manager",
    "team",
    "plan",
    "idea",
    "question",
    "answer",
]


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


# --- CPU time of process trees ----------------------------------------------------------------


class CpuMeter:
    """CPU seconds (user + system) of named groups of process trees, e.g. {"web": [...],
    "postgres": [...]}. ``roots`` is called at every sample, so restarted processes are
    found; each process is counted with the last time read from it, so one that ends (a
    killed worker) keeps what it spent. Sampled every second while a level runs: a process
    that lives less than that between samples is missed (with a pool, PostgreSQL's backends
    live as long as the web processes)."""

    def __init__(self, roots):
        self.roots = roots
        self.seen: dict[int, tuple[str, float]] = {}
        self.lock = threading.Lock()

    def sample(self) -> None:
        for name, processes in self.roots().items():
            for root in processes:
                try:
                    members = [root, *root.children(recursive=True)]
                except psutil.NoSuchProcess:
                    continue
                for process in members:
                    try:
                        times = process.cpu_times()
                    except psutil.NoSuchProcess:
                        continue
                    with self.lock:
                        self.seen[process.pid] = (name, times.user + times.system)

    def read(self) -> dict[str, float]:
        self.sample()
        totals: dict[str, float] = {}
        with self.lock:
            for name, seconds in self.seen.values():
                totals[name] = totals.get(name, 0.0) + seconds
        return totals

    @contextlib.contextmanager
    def sampling(self, every: float = 1.0):
        stop = threading.Event()

        def loop():
            while not stop.wait(every):
                self.sample()

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def private_server_roots(server) -> dict[str, list[psutil.Process]]:
    """The trees of a ``memsvc serve``: its web server, its worker and beat, its PostgreSQL."""
    serve = psutil.Process(server.process.pid)
    groups: dict[str, list[psutil.Process]] = {"web": [], "worker": [], "postgres": []}
    for child in serve.children():
        command = child.cmdline()
        groups["web" if "gunicorn" in command else "worker"].append(child)
    pid = int((server.data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
    groups["postgres"].append(psutil.Process(pid))
    return groups


# --- the load ---------------------------------------------------------------------------------


@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"append": [], "search": []})
    errors: dict[str, int] = field(default_factory=dict)
    acknowledged: list[str] = field(default_factory=list)  # message ids answered with 201

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


async def _client(
    http: Connection, conversation_id: str, rng, deadline: float, tally: Tally
) -> None:
    append_path = f"/v1/agent/conversations/{conversation_id}/messages"
    while time.monotonic() < deadline:
        append = rng.random() < APPEND_SHARE
        kind = "append" if append else "search"
        if append:
            body = {"messages": [{"role": "user", "content": sentence(rng, 12)}]}
            path, headers, expected = append_path, {"Idempotency-Key": str(uuid.uuid4())}, 201
        else:
            body = {"query": sentence(rng, 4)}
            path, headers, expected = "/v1/agent/search/messages", None, 200
        started = time.perf_counter()
        try:
            status, answer = await http.post(path, json.dumps(body).encode(), headers)
        except ConnectionLost as exc:
            tally.error(f"{kind}: {exc}")
            continue
        elapsed_ms = (time.perf_counter() - started) * 1000
        if status != expected:
            tally.error(f"{kind}: HTTP {status}")
            continue
        tally.latencies[kind].append(elapsed_ms)
        if append:
            tally.acknowledged.extend(message["id"] for message in json.loads(answer)["data"])


async def _run(urls, api_key, conversations, seconds: float, seed: int) -> Tally:
    tally = Tally()
    headers = {"Authorization": f"Bearer {api_key}"}
    connections = [
        Connection(urls[i % len(urls)], headers, REQUEST_TIMEOUT_SECONDS)
        for i in range(len(conversations))
    ]
    deadline = time.monotonic() + seconds
    try:
        await asyncio.gather(
            *(
                _client(connection, cid, random.Random(seed + i), deadline, tally)
                for i, (connection, cid) in enumerate(zip(connections, conversations, strict=True))
            )
        )
    finally:
        for connection in connections:
            connection.close()
    return tally


def create_conversations(
    client: httpx.Client, url: str, count: int, title: str = "load"
) -> list[str]:
    return [
        api_call(
            client,
            "POST",
            f"{url}/v1/agent/conversations",
            json_body={"title": f"{title} {index}"},
            expect=201,
        ).json()["id"]
        for index in range(count)
    ]


def summarize(tally: Tally, seconds: float) -> dict:
    every = tally.latencies["append"] + tally.latencies["search"]
    requests = len(every) + sum(tally.errors.values())

    def stats(values):
        return {
            "count": len(values),
            "p50_ms": round(percentile(values, 50) or 0, 1),
            "p95_ms": round(percentile(values, 95) or 0, 1),
            "p99_ms": round(percentile(values, 99) or 0, 1),
        }

    return {
        "requests": requests,
        "requests_per_second": round(requests / seconds, 1),
        "all": stats(every),
        "append": stats(tally.latencies["append"]),
        "search": stats(tally.latencies["search"]),
        "errors": sum(tally.errors.values()),
        "error_kinds": tally.errors,
        "messages_acknowledged": len(tally.acknowledged),
    }


def wait_for_drain(client: httpx.Client, urls: list[str], timeout: float) -> tuple[int, float]:
    """(backlog when called, seconds until ``pendingEmbeddings`` was 0)."""
    started = time.monotonic()
    first = None
    while time.monotonic() - started < timeout:
        status, body = get_health(client, urls[0])
        pending = body.get("pendingEmbeddings") if status == 200 else None
        if first is None and pending is not None:
            first = pending
        if pending == 0:
            return first or 0, time.monotonic() - started
        time.sleep(0.5)
    raise BenchError(f"the embedding backlog did not drain within {timeout:.0f} s")


def warm_up(client: httpx.Client, urls: list[str], rounds: int = 20) -> None:
    """Searches until every web process has its model loaded (the first ones wait for it),
    and an empty backlog: the levels measure a warm service."""
    conversation = create_conversations(client, urls[0], 1, title="warm-up")[0]
    for index in range(rounds):
        url = urls[index % len(urls)]
        api_call(
            client,
            "POST",
            f"{url}/v1/agent/conversations/{conversation}/messages",
            json_body={"messages": [{"role": "user", "content": f"warm up {index}"}]},
            expect=201,
        )
        api_call(client, "POST", f"{url}/v1/agent/search/messages", json_body={"query": "warm"})
    wait_for_drain(client, urls, timeout=600)


def run_level(
    client: httpx.Client,
    urls: list[str],
    api_key: str,
    *,
    clients: int,
    seconds: float,
    seed: int,
    meter: CpuMeter | None,
    drain_timeout: float = 600.0,
) -> tuple[dict, Tally]:
    """One load level: the summary, and the tally (with every acknowledged message id)."""
    conversations = create_conversations(client, urls[0], clients)
    cpu_before = meter.read() if meter else {}
    own_before = time.process_time()
    load_before = psutil.getloadavg()[0]
    log(f"{clients} clients for {seconds:.0f} s against {', '.join(urls)}")
    started = time.monotonic()
    with meter.sampling() if meter else contextlib.nullcontext():
        tally = asyncio.run(_run(urls, api_key, conversations, seconds, seed))
        elapsed = time.monotonic() - started
        cpu_load = meter.read() if meter else {}
        own = time.process_time() - own_before
        load_after = psutil.getloadavg()[0]
        backlog, drain = wait_for_drain(client, urls, drain_timeout)
        cpu_drained = meter.read() if meter else {}
    summary = summarize(tally, elapsed)
    requests = max(1, summary["requests"])
    summary.update(
        clients=clients,
        seconds=round(elapsed, 1),
        backlog_at_end=backlog,
        drain_seconds=round(drain, 1),
        load_average_1m={"before": round(load_before, 2), "after": round(load_after, 2)},
        client_cpu_ms_per_request=round(own * 1000 / requests, 2),
    )
    if meter:
        summary["cpu_ms_per_request_during_load"] = {
            name: round((cpu_load[name] - cpu_before.get(name, 0)) * 1000 / requests, 2)
            for name in cpu_load
        }
        summary["cpu_ms_per_request_load_and_drain"] = {
            name: round((cpu_drained[name] - cpu_before.get(name, 0)) * 1000 / requests, 2)
            for name in cpu_drained
        }
    log(f"  {summary}")
    return summary, tally


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.load", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--clients", type=int, action="append", help="repeat: 16 and 64")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--url", help="an existing server (default: a private one)")
    parser.add_argument("--api-key", help="with --url: a key with the read and write scopes")
    parser.add_argument("--keep", action="store_true", help="leave the private server running")
    parser.add_argument("--out", type=Path, default=Path("bench-results/load.json"))
    args = parser.parse_args(argv)
    levels = args.clients or [16, 64]
    client = make_client()
    results = []
    try:
        with benchmark_server(
            client, url=args.url, api_key=args.api_key, keep=args.keep, agent_name="load-bench"
        ) as (url, server):
            meter = CpuMeter(lambda: private_server_roots(server)) if server else None
            warm_up(client, [url])
            for clients in levels:
                summary, _ = run_level(
                    client,
                    [url],
                    client.headers["Authorization"].removeprefix("Bearer "),
                    clients=clients,
                    seconds=args.seconds,
                    seed=args.seed,
                    meter=meter,
                )
                results.append(summary)
    except BenchError as exc:
        log(f"error: {exc}")
        return 1
    write_json(args.out, {"levels": results, "cpu_count": psutil.cpu_count()})
    print(f"results in {args.out}")
    for summary in results:
        print(
            f"{summary['clients']:3} clients: {summary['requests_per_second']} req/s, "
            f"p50/p95/p99 {summary['all']['p50_ms']}/{summary['all']['p95_ms']}/"
            f"{summary['all']['p99_ms']} ms, errors {summary['errors']}, backlog "
            f"{summary['backlog_at_end']} drained in {summary['drain_seconds']} s, "
            f"CPU ms/request {summary.get('cpu_ms_per_request_load_and_drain')}, "
            f"load {summary['load_average_1m']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
