"""Where a request spends its time in the server: ``python -m bench.timeline``.

It serves a data directory (``--data-dir``: a benchmark's kept server, stopped, or any memsvc
data directory) with one web process of this checkout, as ``memsvc serve`` runs one (one
model thread, the rate limit off as in every benchmark), its application wrapped so that
each request records, from its arrival: when its request thread starts and ends, each
statement (Django's execute wrapper, named by its first words, numbered when a request runs
it again), the query's embedding (``search.engine.query_vector``, on whichever thread) and
when the response is sent. It sends ``--requests`` requests one at a time, ``--gap-ms``
apart (a pause as between an agent's calls: this kind of VM is slower after one), each body
with ``{n}`` replaced by the request's number (a new text each time: no query vector kept),
and prints each event's median time from arrival, in order, with how many requests had it::

    python -m bench.timeline --data-dir DIR --path /context/AGENT \\
        --body '{"query": "What did I tell you about the cat {n}?"}' [--api-key KEY]

The numbers are the process's own view: the client's round trip (printed too) adds the
network and the client.
"""

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from bench.common import (
    CHECKOUT,
    BenchError,
    api_call,
    exit_with,
    free_port,
    log,
    make_client,
    percentile,
    private_env,
    wait_for_health,
    write_json,
)

TIMELINE_PATH = "/__timeline__"  # answered by the wrapper: the records so far, then cleared
WARM_UP_REQUESTS = 5


# --- in the server: the wrapped application (``uvicorn bench.timeline:application``) -----------


def __getattr__(name: str):
    """``application``, made on first use: only the server's process loads Django."""
    if name == "application":
        return _instrumented()
    raise AttributeError(name)


def _instrumented():
    from django.db.backends.signals import connection_created

    from memsvc import asgi  # it sets Django up: only then can search's models load

    engine = importlib.import_module("search.engine")

    records: list[list] = []
    current: list = [None]  # the events of the request being served (one at a time)

    def mark(event: str) -> None:
        if current[0] is not None:
            current[0].append((event, time.perf_counter()))

    def timed_statement(execute, sql, params, many, context):
        first_words = " ".join(sql.split()[:4])[:40]
        mark(f"statement {first_words}")
        try:
            return execute(sql, params, many, context)
        finally:
            mark("  done")

    def on_connection(sender, connection, **kwargs):
        connection.execute_wrappers.append(timed_statement)

    connection_created.connect(on_connection, weak=False)

    def timed(name: str, function):
        def wrapper(*args, **kwargs):
            mark(f"{name} starts")
            try:
                return function(*args, **kwargs)
            finally:
                mark(f"{name} ends")

        return wrapper

    engine.query_vector = timed("embedding", engine.query_vector)
    handler = asgi.application
    handler.respond = timed("request thread", handler.respond)

    async def application(scope, receive, send):
        if scope["type"] != "http":
            return await handler(scope, receive, send)
        if scope["path"] == TIMELINE_PATH:
            body = json.dumps(records).encode()
            records.clear()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": body})
            return
        events = current[0] = [("arrives", time.perf_counter())]

        async def timed_send(message):
            if message["type"] == "http.response.body" and not message.get("more_body"):
                mark("response sent")
            await send(message)

        try:
            await handler(scope, receive, timed_send)
        finally:
            current[0] = None
            start = events[0][1]
            records.append([(event, (at - start) * 1000) for event, at in events])

    return application


# --- the driver ----------------------------------------------------------------------------


def medians(records: list[list]) -> list[tuple[float, int, str]]:
    """Each event (numbered by its repeats within a request) with its median time from
    arrival and the number of requests that had it, in the order of the medians."""
    times = defaultdict(list)
    for events in records:
        seen = Counter()
        for event, at in events:
            seen[event] += 1
            times[f"{event} #{seen[event]}" if seen[event] > 1 else event].append(at)
    return sorted(
        (statistics.median(values), len(values), event) for event, values in times.items()
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.timeline", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--data-dir", type=Path, required=True, help="a memsvc data directory")
    parser.add_argument("--path", required=True, help="the request's path, e.g. /context/AGENT")
    parser.add_argument("--body", help="a JSON body ({n}: the request's number); else a GET")
    parser.add_argument("--api-key", help="sent as X-API-Key")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--gap-ms", type=float, default=50.0)
    parser.add_argument("--out", type=Path, default=Path("bench-results/timeline.json"))
    args = parser.parse_args(argv)
    if not (args.data_dir / "pgdata").is_dir():
        raise BenchError(f"{args.data_dir} holds no memsvc database (no pgdata)")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**private_env(args.data_dir), "MEMSVC_EMBEDDING_THREADS": "1"}
    command = [sys.executable, "-m", "uvicorn", "bench.timeline:application", "--port", str(port)]
    log(f"serving {args.data_dir} at {url} with the wrapped application")
    server = subprocess.Popen(  # noqa: S603 (our own module)
        [*command, "--log-level", "warning"], env=env, cwd=CHECKOUT
    )
    try:
        http = make_client()
        wait_for_health(http, url)
        headers = {"X-API-Key": args.api_key} if args.api_key else {}
        round_trips = []
        for n in range(WARM_UP_REQUESTS + args.requests):
            body = json.loads(args.body.replace("{n}", str(n))) if args.body else None
            time.sleep(args.gap_ms / 1000)
            started = time.perf_counter()
            api_call(
                http,
                "POST" if body is not None else "GET",
                f"{url}{args.path}",
                json_body=body,
                headers=headers,
            )
            round_trips.append((time.perf_counter() - started) * 1000)
        records = http.get(f"{url}{TIMELINE_PATH}").json()[WARM_UP_REQUESTS:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    rows = medians(records)
    timed = round_trips[WARM_UP_REQUESTS:]
    print(f"{len(records)} requests of {args.path}, {args.gap_ms:g} ms apart")
    print(f"{'ms':>8}  {'requests':>8}  event (median time from arrival)")
    for at, count, event in rows:
        print(f"{at:8.2f}  {count:8d}  {event}")
    print(
        f"client round trip p50 / p90: {percentile(timed, 50):.2f} / {percentile(timed, 90):.2f} ms"
    )
    out = write_json(
        args.out,
        {
            "path": args.path,
            "requests": len(records),
            "gap_ms": args.gap_ms,
            "events": [{"median_ms": at, "requests": count, "event": e} for at, count, e in rows],
            "round_trip_p50_ms": percentile(timed, 50),
            "round_trip_p90_ms": percentile(timed, 90),
        },
    )
    log(f"written to {out}")
    return 0


if __name__ == "__main__":
    exit_with(main)
