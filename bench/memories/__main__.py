"""The command: ``python -m bench.memories`` (see the package docstring)."""

import argparse
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
    start_private_server,
    stopped_on_sigterm,
    wait_for_embeddings,
)
from bench.locomo import evaluate as message_evaluate
from bench.locomo.dataset import read_dataset
from bench.locomo.evaluate import plan_questions, summarise, summarise_by_category
from bench.locomo.load import load_observations, load_samples
from bench.memories import locomo, report, scale, store
from bench.memories.texts import load_texts, probe_texts, users_texts

DEFAULT_DATA = Path(__file__).resolve().parents[2].parent / "shared/bench/locomo/locomo-dev.json"
MODES = ("hybrid", "semantic", "keyword")
AGENT = "memories-bench"
STORE_AGENT = "memories-bench-store"
LOCOMO_AGENT = "memories-locomo-bench"
# Kept small: into a store of 100,000 each memory costs a scan of the store (and gunicorn
# stops a request after 60 s).
PROBE_BATCH = 10


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.memories", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--memories", type=int, default=100_000, help="saved through the API")
    parser.add_argument("--users", type=int, default=1000, help="the memories spread over them")
    parser.add_argument(
        "--store-memories",
        type=int,
        help="the second agent's own store, copied (default: --memories; 0: none)",
    )
    parser.add_argument("--clients", type=int, default=4, help="threads saving in parallel")
    parser.add_argument("--queries", type=int, default=200, help="timed searches per case and mode")
    parser.add_argument("--mode", action="append", choices=MODES, dest="modes")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo texts, if there")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--build-memory", default="1GB", help="maintenance_work_mem for indexes")
    parser.add_argument(
        "--locomo",
        type=Path,
        metavar="PATH",
        help="instead: retrieval through memories on this LoCoMo file",
    )
    parser.add_argument("--no-messages", action="store_true", help="--locomo: no message search")
    parser.add_argument("--no-sweep", action="store_true", help="--locomo: no weight sweep")
    parser.add_argument("--limit-questions", type=int, metavar="N", help="--locomo: quick runs")
    parser.add_argument("--out", type=Path, help="default: bench-results/memories[-locomo].json")
    parser.add_argument("--keep-server", action="store_true", help="leave the server running")
    parser.add_argument("--url", help="measure searches again on a kept server (no saves)")
    parser.add_argument("--api-key", help="with --url: the first agent's key")
    parser.add_argument("--store-api-key", help="with --url: the store agent's key")
    parser.add_argument(
        "--question-seed",
        type=int,
        help="with --url: the questions' seed (default: new questions every run; the web "
        "processes keep the vectors of their last 256 queries, so questions asked before "
        "measure no embedding)",
    )
    return parser


# --- at scale ---------------------------------------------------------------------------------


def run_scale(args: argparse.Namespace) -> dict:
    modes = list(dict.fromkeys(args.modes or MODES))
    per_user = args.memories // args.users
    store_count = args.memories if args.store_memories is None else args.store_memories
    rng = random.Random(args.seed)
    source = load_texts(args.data)
    taken: set[str] = set()
    users = users_texts(source, args.users, per_user, args.seed, taken)
    # New facts for the saves into one user's memories and the whole store at the end.
    probe = probe_texts(source, 2 * (PROBE_BATCH + 1), args.seed, taken)
    loads = {"start": os.getloadavg()}

    client = make_client()
    server = start_private_server(client, agent_name=AGENT)
    try:
        env = private_env(server.data_dir)
        store_key = create_api_key(env, agent_name=STORE_AGENT)
        log(f"saving {args.memories} memories of {args.users} users ({args.clients} clients)")
        saved = scale.save_users(server.url, server.api_key, users, clients=args.clients, rng=rng)
        loads["after_saves"] = os.getloadavg()
        log(f"  {saved.sent / saved.seconds:.0f} saves/s, {saved.merged} merged")

        from bench.search import database

        with database(server.data_dir) as conn:
            conn.autocommit = True
            unembedded = conn.execute(
                "SELECT count(*) FROM memory WHERE embedding IS NULL"
            ).fetchone()[0]
            build = {}
            if store_count:
                log(f"copying {store_count} memories into {STORE_AGENT}'s own store")
                build = store.copy_store(
                    conn,
                    source_agent=store.agent_id(conn, AGENT),
                    target_agent=store.agent_id(conn, STORE_AGENT),
                    count=store_count,
                    build_memory=args.build_memory,
                )
                log(f"  {build}")
            rows = dict(
                conn.execute(
                    "SELECT a.name, count(*) FROM memory m JOIN agent a ON a.id = m.agent_id "
                    "GROUP BY a.name"
                ).fetchall()
            )

        latency = measure_latency(
            server.url, server.api_key, store_key if store_count else None, users, source, args, rng
        )
        loads["after_searches"] = os.getloadavg()
        probes = probe_saves(
            server.url,
            server.api_key,
            store_key,
            probe,
            user_id=users[0].user_id,
            with_store=bool(store_count),
        )
    finally:
        if args.keep_server:
            log(
                f"the server keeps running at {server.url} (pid {server.process.pid}, data "
                f"{server.data_dir}); measure again with: --memories {args.memories} --users "
                f"{args.users} --seed {args.seed} --url {server.url} --api-key {server.api_key} "
                f"--store-api-key {store_key}"
            )
        else:
            server.stop()
    return {
        "benchmark": "memories",
        "config": vars(args) | {"modes": modes, "perUser": per_user, "storeMemories": store_count},
        "texts": type(source).__name__,
        "saves": {
            "sent": saved.sent,
            "seconds": round(saved.seconds, 1),
            "perSecond": round(saved.sent / saved.seconds, 1),
            "merged": saved.merged,
            "merges": [{"sent": sent, "keptAs": kept} for sent, kept in saved.merges],
            "callMs": scale.latency_summary(saved.call_ms),
            "savedWithoutVector": unembedded,
        },
        "rows": rows,
        "storeBuild": build,
        "latency": latency,
        "probeSaves": probes,
        "loadAverage": {k: [round(x, 2) for x in v] for k, v in loads.items()},
    }


def measure_latency(url, key, store_key, users, source, args, rng) -> dict:
    """Sequential searches per case and mode: one user's memories (``key``, a random user
    and a question renamed for them each time), and the whole store (``store_key``, no
    user, a question renamed for a random user). The service's defaults otherwise (limit
    5, minScore 0.3)."""
    cases = {"user": (key, True)}
    if store_key:
        cases["store"] = (store_key, False)
    latency = {}
    for case, (case_key, with_user) in cases.items():
        for mode in list(dict.fromkeys(args.modes or MODES)):
            bodies = []
            for _ in range(args.queries + scale.WARM_UP_SEARCHES):
                user = rng.choice(users)
                body = {"query": source.question(user.name, user.friend, rng), "mode": mode}
                if with_user:
                    body["userId"] = user.user_id
                bodies.append(body)
            latency[f"{case}/{mode}"] = scale.measure_searches(url, case_key, bodies)
            log(f"  {case:6} {mode:8} {latency[f'{case}/{mode}']}")
    return latency


def remeasure(args: argparse.Namespace) -> dict:
    """``--url``: the searches again, against a server a previous run kept (the same
    ``--memories``, ``--users`` and ``--seed`` give the same users and texts), with new
    questions unless ``--question-seed`` names them (the seed is in the results)."""
    source = load_texts(args.data)
    users = users_texts(source, args.users, args.memories // args.users, args.seed)
    if args.question_seed is None:
        args.question_seed = random.SystemRandom().randrange(2**32)
    log(f"questions of seed {args.question_seed}")
    before = os.getloadavg()
    latency = measure_latency(
        args.url.rstrip("/"),
        args.api_key,
        args.store_api_key,
        users,
        source,
        args,
        random.Random(args.question_seed),
    )
    return {
        "benchmark": "memories",
        "config": vars(args) | {"modes": list(dict.fromkeys(args.modes or MODES))},
        "latency": latency,
        "loadAverage": {"start": before, "after_searches": os.getloadavg()},
    }


def probe_saves(url, user_key, store_key, probe, *, user_id: str, with_store: bool) -> dict:
    """What one save and one batch of ``PROBE_BATCH`` new memories cost, into the memories
    of one user (``user_id``) and into the whole store (the near-duplicate check computes
    the distance to every memory of the scope): ms."""
    timings = {}
    targets = {"user": (user_key, {"userId": user_id})}
    if with_store:
        targets["store"] = (store_key, {})
    texts = iter(probe)
    with make_client() as client:
        for target, (key, extra) in targets.items():
            client.headers["Authorization"] = f"Bearer {key}"
            started = time.perf_counter()
            api_call(
                client,
                "POST",
                f"{url}/v1/agent/memories",
                expect=201,
                json_body={"content": next(texts), **extra},
            )
            timings[f"{target}/one"] = round((time.perf_counter() - started) * 1000, 1)
            batch = [{"content": next(texts)} for _ in range(PROBE_BATCH)]
            started = time.perf_counter()
            api_call(
                client,
                "POST",
                f"{url}/v1/agent/memories/batch",
                expect=201,
                json_body={"memories": batch, **extra},
            )
            timings[f"{target}/batch of {len(batch)}"] = round(
                (time.perf_counter() - started) * 1000, 1
            )
    log(f"  probe saves (ms): {timings}")
    return timings


# --- on LoCoMo --------------------------------------------------------------------------------


def run_locomo(args: argparse.Namespace) -> dict:
    modes = list(dict.fromkeys(args.modes or MODES))
    dataset = read_dataset(args.locomo)
    samples = dataset.samples
    log(
        f"{args.locomo}: {len(samples)} samples, "
        f"{sum(len(s.observations) for s in samples)} observations"
    )
    timings = {}
    with (
        make_client() as client,
        benchmark_server(
            client, url=None, api_key=None, keep=args.keep_server, agent_name=LOCOMO_AGENT
        ) as (url, private),
    ):
        started = time.monotonic()
        loaded = load_observations(client, url, samples)
        timings["memoriesLoadSeconds"] = round(time.monotonic() - started, 1)
        plan = plan_questions(
            samples,
            {s.sample_id: {t.dia_id for t in s.turns} for s in samples},
            args.limit_questions,
        )
        log(f"searching {len(plan.questions)} questions among memories in {', '.join(modes)}")
        locomo.warm_up(client, url, samples[0].sample_id, modes)
        started = time.monotonic()
        memory_records = locomo.evaluate(client, url, plan, loaded, modes)
        timings["memorySearchSeconds"] = round(time.monotonic() - started, 1)

        message_records = []
        if not args.no_messages:
            log("loading the same samples as conversations (bench.locomo) for message search")
            conversations = load_samples(client, url, samples)
            wait_for_embeddings(client, url)
            first = conversations[plan.questions[0].sample_id].conversation_id
            message_evaluate.warm_up(client, url, first, modes)
            message_records = message_evaluate.evaluate(client, url, plan, conversations, modes)

        swept = None
        if not args.no_sweep:
            from bench.memories.sweep import sweep
            from bench.message_copy import setup_django
            from bench.search import database

            log("sweeping the hybrid weights in-process (agents_api.selectors.memory_search)")
            # One model thread, as the server's web processes have (``memsvc serve``): the
            # query's vector then comes out as over HTTP (the order of float sums differs
            # with the thread count, and near ties with it).
            os.environ["MEMSVC_EMBEDDING_THREADS"] = "1"
            with database(private.data_dir) as conn:
                setup_django(conn, private.data_dir)
            hybrid = {
                (r["sampleId"], r["index"]): r["modes"]["hybrid"]["ranked"]
                for r in memory_records
                if "hybrid" in r["modes"]
            }
            started = time.monotonic()
            swept = sweep(LOCOMO_AGENT, plan, loaded, hybrid)
            timings["sweepSeconds"] = round(time.monotonic() - started, 1)

    def summaries(records):
        per_mode = {mode: summarise(records, mode) for mode in modes}
        for mode in modes:
            per_mode[mode]["byCategory"] = summarise_by_category(records, mode)
        return per_mode

    return {
        "benchmark": "memories-locomo",
        "config": vars(args) | {"modes": modes, "limit": locomo.LIMIT},
        "counts": {
            "samples": len(samples),
            "observations": sum(m.saved for m in loaded.values()),
            "memories": sum(len(m.evidence) for m in loaded.values()),
            "merged": sum(len(m.merged) for m in loaded.values()),
            "questions": len(plan.questions),
            "skippedNoEvidence": len(plan.no_evidence),
        },
        "merged": {sample: m.merged for sample, m in loaded.items()},
        "ceiling": locomo.ceiling(plan, loaded),
        "timings": timings,
        "memories": summaries(memory_records),
        "messages": summaries(message_records) if message_records else None,
        "paired": {mode: locomo.paired(memory_records, message_records, mode) for mode in modes}
        if message_records
        else None,
        "sweep": swept,
        "questions": memory_records,
        "messageQuestions": message_records,
        "loadAverage": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.locomo is None and (args.users < 1 or args.memories % args.users):
        parser.error("--memories must be a multiple of --users")
    if args.url and not args.api_key:
        parser.error("--url needs --api-key (and --store-api-key for the store)")
    if args.locomo is not None and not args.locomo.is_file():
        parser.error(f"no LoCoMo data at {args.locomo} (it is kept outside the repository)")
    stopped_on_sigterm()
    try:
        if args.locomo is not None:
            results = run_locomo(args)
            report.locomo_report(results, args.out or Path("bench-results/memories-locomo.json"))
        elif args.url:
            results = remeasure(args)
            report.latency_report(results, args.out or Path("bench-results/memories.json"))
        else:
            results = run_scale(args)
            report.scale_report(results, args.out or Path("bench-results/memories.json"))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"bench.memories failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
