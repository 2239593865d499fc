"""What ``learning()`` adds to a model call: ``python -m bench.learning``.

It starts a private memsvc (see ``bench.common``; or ``--url`` for a running one on this
machine, reached without a key from loopback in local mode) and the test suite's stand-in
LLM (``tests/fake_openai.py``, which answers at once), gives an agent a history
(``--history`` calls made inside ``learning()``, embedded before timing starts), then times
the same chat completion (each question a new text, whose embedding a call pays for as a
user's next message does) plain and inside ``learning()``, in alternating rounds (so a
change of machine load hits both), with ``--gap-ms`` between calls (0: back to back; a real
model's answer takes longer than the stores, which then finish in the gap). The added
latency is the difference of the medians (and of the 90th percentiles).

``--stand-in`` puts the test suite's stand-in memsvc (``tests/fake_memsvc.py``, answering
at once) in its place: what is left is the client's own cost.

``--memories N`` gives the agent ``N`` long-term memories of its own first (facts about the
same topics, through ``POST /v1/agent/memories/batch``, with the private server's key or
``MEMSVC_API_KEY``): each context request then searches them beside the messages, as it
does for an agent that keeps memories.

``--compare PATH`` times another ``learning`` the same way: a client module that needs
nothing but ``openai`` and ``httpx`` (for instance the single-file client of an earlier
commit: ``git show <commit>:memsvc/client.py > /tmp/old_client.py``).
"""

import argparse
import asyncio
import contextlib
import importlib.util
import itertools
import os
import random
import sys
import time
from pathlib import Path

import openai

from bench.common import (
    BenchError,
    api_call,
    exit_with,
    log,
    make_client,
    percentile,
    start_private_server,
    wait_for_embeddings,
    wait_for_health,
    write_json,
)
from bench.common import (
    mean as average,
)
from memsvc.client import MemoryServerUnavailable, learning

ROUND = 20
AGENT = "learning-bench"
TOPICS = [
    "my sister's wedding in Porto",
    "the tomato plants on the balcony",
    "learning Rust in the evenings",
    "the marathon training plan",
    "my cat Tom who hates the vet",
    "the new job at the bakery",
    "a trip to Kyoto next spring",
    "the broken bicycle chain",
    "my grandmother's soup recipe",
    "the chess club on Thursdays",
]
SAYINGS = [
    "I keep thinking about {t}.",
    "Yesterday I talked to a friend about {t}.",
    "Remind me later about {t}, it matters to me.",
    "I am worried about {t}.",
]
QUESTIONS = [
    "What did I tell you about {t}?",
    "Any advice on {t}?",
    "Do you remember {t}?",
]


def load_learning(path: Path):
    """The ``learning`` of a client module given as a file."""
    spec = importlib.util.spec_from_file_location("compared_client", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.learning


FACTS = [
    "The user cares a lot about {t}.",
    "The user mentioned {t} last week.",
    "The user wants to be reminded about {t}.",
    "The user's friend knows about {t}.",
    "The user is worried about {t}.",
]


def give_memories(http, url: str, count: int, rng: random.Random) -> None:
    """``count`` memories of the agent's own (no user), in batches of 100; near-duplicates
    merge, so the texts are numbered."""
    key = os.environ.get("MEMSVC_API_KEY")
    if not key:
        raise BenchError("--memories needs the agent's key: a private server, or MEMSVC_API_KEY")
    facts = [
        {
            "content": f"{rng.choice(FACTS).format(t=rng.choice(TOPICS))[:-1]} (note {n}).",
            "importance": round(rng.random(), 2),
        }
        for n in range(count)
    ]
    for start in range(0, count, 100):
        api_call(
            http,
            "POST",
            f"{url}/v1/agent/memories/batch",
            expect=201,
            json_body={"memories": facts[start : start + 100]},
            headers={"X-API-Key": key},
        )


def one_call(client, text: str) -> float:
    started = time.perf_counter()
    client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": text}])
    return (time.perf_counter() - started) * 1000


async def one_acall(client, text: str) -> float:
    started = time.perf_counter()
    await client.chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": text}]
    )
    return (time.perf_counter() - started) * 1000


def one_context(http, url: str, text: str) -> float:
    """The context request alone, as the client sends it (what memsvc takes to answer)."""
    started = time.perf_counter()
    key = os.environ.get("MEMSVC_API_KEY")
    headers = {"X-API-Key": key} if key else {}
    http.post(f"{url}/context/{AGENT}", json={"agent_name": AGENT, "query": text}, headers=headers)
    return (time.perf_counter() - started) * 1000


def timed_rounds(
    client, block_of, texts, gap: float, rounds: int, context=None
) -> dict[str, list[float]]:
    """``rounds`` x (``ROUND`` plain calls, ``ROUND`` calls in one block of each client, and
    ``ROUND`` context requests alone when ``context`` times one)."""
    times: dict[str, list[float]] = {name: [] for name in ["plain", *block_of]}
    if context is not None:
        times["context request alone"] = []
    for _ in range(rounds):
        for name in times:
            if name == "context request alone":
                for _ in range(ROUND):
                    times[name].append(context(next(texts)))
                    time.sleep(gap)
                continue
            block = block_of[name]() if name != "plain" else contextlib.nullcontext()
            with block:
                for _ in range(ROUND):
                    times[name].append(one_call(client, next(texts)))
                    time.sleep(gap)
    return times


async def atimed_rounds(client, url, texts, gap: float, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"plain": [], "learning": []}
    for _ in range(rounds):
        for name in times:
            block = learning(agent=AGENT, server_url=url) if name != "plain" else None
            async with block or contextlib.AsyncExitStack():
                for _ in range(ROUND):
                    times[name].append(await one_acall(client, next(texts)))
                    await asyncio.sleep(gap)
    return times


def summary(times: dict[str, list[float]]) -> dict[str, dict]:
    plain50, plain90 = percentile(times["plain"], 50), percentile(times["plain"], 90)
    rows = {}
    for name, values in times.items():
        p50, p90 = percentile(values, 50), percentile(values, 90)
        plain = name != "context request alone"  # not a model call: nothing is added
        rows[name] = {
            "calls": len(values),
            "p50_ms": round(p50, 2),
            "p90_ms": round(p90, 2),
            "mean_ms": round(average(values), 2),
            "added_p50_ms": round(p50 - plain50, 2) if plain else None,
            "added_p90_ms": round(p90 - plain90, 2) if plain else None,
        }
    return rows


def wait_until_enterable(url: str, timeout: float = 120.0) -> None:
    """A server that has just become healthy may still be loading its model in the
    background: too slow for a block's entry check on a loaded machine. Wait."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with learning(agent=AGENT, server_url=url):
                return
        except MemoryServerUnavailable:
            if time.monotonic() > deadline:
                raise
            log("  memsvc not answering a block's entry yet: waiting")
            time.sleep(2)


def load_average() -> float:
    return os.getloadavg()[0]


def texts_forever(rng: random.Random, templates, *, new: bool = False):
    """Texts from ``templates``; with ``new`` each one said once (a user's next message is
    new text: memsvc keeps the vectors of the last queries, and a question asked again
    would measure that cache instead of the embedding a real call pays for), still one
    sentence (a text of two is searched as a whole and as each of its parts)."""
    for n in itertools.count(1):
        text = rng.choice(templates).format(t=rng.choice(TOPICS))
        yield f"{text[:-1]}, question {n} of today{text[-1]}" if new else text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.learning", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--calls", type=int, default=200, help="timed calls per client and gap")
    parser.add_argument("--history", type=int, default=200, help="calls made before timing")
    parser.add_argument("--gap-ms", type=float, action="append", help="pause between calls")
    parser.add_argument("--memories", type=int, default=0, help="the agent's own memories")
    parser.add_argument("--compare", type=Path, help="another client module's learning()")
    parser.add_argument("--no-async", action="store_true", help="skip the async client")
    parser.add_argument("--url", help="a running memsvc on this machine (else a private one)")
    parser.add_argument(
        "--stand-in",
        action="store_true",
        help="the test suite's stand-in memsvc, which answers at once: the client's own cost",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("bench-results/learning.json"))
    args = parser.parse_args(argv)
    gaps = args.gap_ms or [0.0, 100.0]
    rounds = max(1, args.calls // ROUND)
    rng = random.Random(args.seed)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.fake_memsvc import StandInMemsvc
    from tests.fake_openai import FakeOpenAI

    http = make_client()
    server = stand_in = None
    if args.stand_in:
        stand_in = StandInMemsvc().__enter__()
        url = stand_in.url
    elif args.url:
        url = args.url.rstrip("/")
        wait_for_health(http, url, timeout=15)
    else:
        server = start_private_server(http, agent_name=AGENT)
        url = server.url
        # The server's agent has a key, so loopback trust does not reach it: every block
        # (ours and --compare's) presents the key, as a user of such an agent does.
        os.environ["MEMSVC_API_KEY"] = server.api_key
    results = {
        "load_average_start": load_average(),
        "server": url,
        "memories": args.memories,
        "gaps": {},
    }
    try:
        with FakeOpenAI() as llm:
            client = openai.OpenAI(base_url=llm.base_url, api_key="bench")
            log(f"history: {args.history} calls inside learning()")
            sayings = texts_forever(rng, SAYINGS)
            wait_until_enterable(url)
            with learning(agent=AGENT, server_url=url):
                for _ in range(args.history):
                    one_call(client, next(sayings))
            if args.memories:
                log(f"memories: {args.memories} of the agent's own")
                give_memories(http, url, args.memories, rng)
            if stand_in is None:
                wait_for_embeddings(http, url)
            block_of = {"learning": lambda: learning(agent=AGENT, server_url=url)}
            if args.compare:
                compared = load_learning(args.compare)
                block_of[f"compare:{args.compare.name}"] = lambda: compared(
                    agent=AGENT, server_url=url
                )
            questions = texts_forever(rng, QUESTIONS, new=True)
            timed_rounds(client, block_of, questions, 0, 1)  # warm up every path
            for gap in gaps:
                log(f"timing {rounds * ROUND} calls per client, {gap:g} ms apart")
                load = load_average()
                times = timed_rounds(
                    client,
                    block_of,
                    questions,
                    gap / 1000,
                    rounds,
                    context=lambda text: one_context(http, url, text),
                )
                entry = {"load_average": load, "sync": summary(times)}
                if not args.no_async:
                    aclient = openai.AsyncOpenAI(base_url=llm.base_url, api_key="bench")
                    atimes = asyncio.run(atimed_rounds(aclient, url, questions, gap / 1000, rounds))
                    entry["async"] = summary(atimes)
                results["gaps"][f"{gap:g}"] = entry
    finally:
        if server is not None:
            server.stop()
        if stand_in is not None:
            stand_in.__exit__(None, None, None)
    results["load_average_end"] = load_average()
    print_table(results)
    log(f"written to {write_json(args.out, results)}")
    return 0


def print_table(results: dict) -> None:
    print(
        f"load average (1 min): {results['load_average_start']:.2f} at start, "
        f"{results['load_average_end']:.2f} at end"
    )
    print(f"{'gap ms':>6}  {'client':<34} {'p50':>7} {'p90':>7} {'+p50':>7} {'+p90':>7}  load")
    for gap, entry in results["gaps"].items():
        for kind in ("sync", "async"):
            for name, row in (entry.get(kind) or {}).items():
                label = f"{kind} {name}"
                added = [
                    "-" if row[key] is None else f"{row[key]:.2f}"
                    for key in ("added_p50_ms", "added_p90_ms")
                ]
                print(
                    f"{gap:>6}  {label:<34} {row['p50_ms']:>7.2f} {row['p90_ms']:>7.2f} "
                    f"{added[0]:>7} {added[1]:>7}  {entry['load_average']:.2f}"
                )


if __name__ == "__main__":
    exit_with(main)
