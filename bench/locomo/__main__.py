"""The command: ``python -m bench.locomo`` (see the package docstring)."""

import argparse
import os
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from bench.common import (
    BenchError,
    benchmark_server,
    get_health,
    log,
    make_client,
    stopped_on_sigterm,
    wait_for_embeddings,
)
from bench.locomo.dataset import CATEGORIES, read_dataset
from bench.locomo.evaluate import (
    TOP_K,
    WARM_UP_SEARCHES_PER_MODE,
    evaluate,
    plan_questions,
    summarise,
    summarise_by_category,
    warm_up,
)
from bench.locomo.load import find_loaded, load_observations, load_samples
from bench.locomo.report import report

DEFAULT_DATA = Path("../shared/bench/locomo/locomo-dev.json")
DEFAULT_OUT = Path("bench-results/locomo.json")
MODES = ("hybrid", "semantic", "keyword")
AGENT_NAME = "locomo-bench"
EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.locomo",
        description="LoCoMo retrieval benchmark of /v1/agent/search/messages.",
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"default: {DEFAULT_DATA}")
    parser.add_argument(
        "--mode",
        action="append",
        choices=MODES,
        dest="modes",
        help="search mode; repeat for several (default: hybrid)",
    )
    parser.add_argument("--url", help="a running memsvc (default: start a private one)")
    parser.add_argument("--api-key", help="an agent key (read, write) for --url")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default: {DEFAULT_OUT}")
    parser.add_argument(
        "--limit-questions",
        type=int,
        metavar="N",
        help="search only the first N eligible questions (file order), for quick runs",
    )
    parser.add_argument(
        "--keep-server",
        action="store_true",
        help="leave the private server running and print its URL and key",
    )
    parser.add_argument(
        "--skip-load",
        action="store_true",
        help="with --url: reuse the conversations a previous run loaded (found by title)",
    )
    parser.add_argument(
        "--observations",
        action="store_true",
        help="also save each sample's observations as memories of user <sample id> citing "
        "the turns they rest on: message search then ranks those turns by the memories",
    )
    parser.add_argument(
        "--loo",
        action="store_true",
        help="also compare the search settings of bench/locomo/loo.py in-process and choose "
        "one leaving one conversation out (needs the private server, or --data-dir)",
    )
    parser.add_argument(
        "--setting",
        action="append",
        dest="settings",
        metavar="LABEL",
        help="with --loo: compare only these settings (repeat; default: all)",
    )
    parser.add_argument(
        "--loo-only",
        action="store_true",
        help="with --loo: skip the searches over HTTP (only the in-process comparison)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="with --url and --loo: the data directory of that (kept private) server",
    )
    return parser


def run(args: argparse.Namespace) -> dict:
    """The whole benchmark; the results (also written to ``args.out``)."""
    modes = list(dict.fromkeys(args.modes or ["hybrid"]))
    dataset = read_dataset(args.data)
    samples, evidence_stats = dataset.samples, dataset.question_evidence
    turns = sum(len(sample.turns) for sample in samples)
    photos = sum(turn.has_photo for sample in samples for turn in sample.turns)
    log(f"{args.data}: {len(samples)} conversations, {turns} turns ({photos} with a photo caption)")
    started_at = datetime.now(UTC)
    timings: dict[str, float | None] = {}
    with (
        make_client() as client,
        benchmark_server(
            client,
            url=args.url,
            api_key=args.api_key,
            keep=args.keep_server,
            agent_name=AGENT_NAME,
        ) as (url, private),
    ):
        started = time.monotonic()
        if args.skip_load:
            log("finding the conversations of a previous run")
            loaded = find_loaded(client, url, samples)
            timings["loadSeconds"] = None
        else:
            log(f"loading {len(samples)} conversations into {url}")
            loaded = load_samples(client, url, samples)
            if args.observations:
                log("saving the observations as memories citing their turns")
                load_observations(client, url, samples, loaded)
            timings["loadSeconds"] = time.monotonic() - started
            log(f"  loaded in {timings['loadSeconds']:.1f} s")
        log("waiting for the embedding backlog")
        timings["embeddingWaitSeconds"] = wait_for_embeddings(client, url)
        _, health = get_health(client, url)

        findable = {sample_id: conv.message_ids for sample_id, conv in loaded.items()}
        plan = plan_questions(samples, findable, args.limit_questions)
        log(f"searching {len(plan.questions)} questions in {', '.join(modes)}")
        if args.loo_only:
            modes = []
        if plan.questions and modes:
            warm_up(client, url, loaded[plan.questions[0].sample_id].conversation_id, modes)
        started = time.monotonic()
        records = evaluate(client, url, plan, loaded, modes)
        timings["evaluationSeconds"] = time.monotonic() - started
        compared = None
        if args.loo:
            started = time.monotonic()
            compared = compare_settings(
                args, private.data_dir if private else args.data_dir, plan, loaded
            )
            timings["looSeconds"] = time.monotonic() - started

    per_mode = {mode: summarise(records, mode) for mode in modes}
    for mode in modes:
        per_mode[mode]["byCategory"] = summarise_by_category(records, mode)
    return {
        "benchmark": "locomo",
        "startedAt": started_at.isoformat(),
        "finishedAt": datetime.now(UTC).isoformat(),
        "config": {
            "data": str(args.data),
            "modes": modes,
            "topK": TOP_K,
            "limitQuestions": args.limit_questions,
            "url": url,
            "privateServer": private is not None,
            "skipLoad": args.skip_load,
            # With --skip-load, the memories of the run that loaded (if it saved them).
            "observations": args.observations and not args.skip_load,
            "categories": {str(k): v for k, v in CATEGORIES.items()},
            "messageText": "turn text, plus ' [shares a photo: <caption>]' for photo turns",
            "createdAt": "session date (UTC) + 1 s per turn within the session",
            "warmUpSearchesPerMode": WARM_UP_SEARCHES_PER_MODE,
            "server": {k: health.get(k) for k in ("embeddingBackend", "embeddingModel")},
        },
        "counts": {
            "conversations": len(samples),
            "turns": turns,
            "turnsWithPhotoCaption": photos,
            "turnsLoaded": sum(len(c.message_ids) for c in loaded.values()),
            "questions": sum(len(sample.questions) for sample in samples),
            "questionsByCategory": dict(
                sorted(Counter(str(q.category) for s in samples for q in s.questions).items())
            ),
            "evaluated": len(plan.questions),
            "skippedCategory5": plan.category_5,
            "skippedNoEvidence": len(plan.no_evidence),
            "skippedOverLimit": plan.over_limit,
            "evidenceIds": evidence_stats.ids,
            "evidenceIdsNormalised": len(evidence_stats.fixed),
            "evidencePiecesUnparseable": len(evidence_stats.unparseable),
            "evidenceIdsNotLoaded": sum(len(u["ids"]) for u in plan.unknown_evidence),
        },
        "timings": timings,
        "modes": per_mode,
        "evidenceFixes": [{"raw": raw, "ids": ids} for raw, ids in evidence_stats.fixed],
        "evidenceNotLoaded": plan.unknown_evidence,
        "skippedQuestions": plan.no_evidence,
        "loo": compared,
        "loadAverage": [round(x, 2) for x in os.getloadavg()],
        "questions": records,
    }


def compare_settings(args: argparse.Namespace, data_dir: Path, plan, loaded) -> dict:
    """``bench.locomo.loo.compare`` in this process, on the server's database."""
    from bench.locomo.loo import compare
    from bench.message_copy import setup_django
    from bench.search import database

    log("comparing search settings in-process (--loo)")
    # One model thread, as the server's web processes have: the query's vector then comes
    # out as over HTTP.
    os.environ["MEMSVC_EMBEDDING_THREADS"] = "1"
    with database(data_dir) as conn:
        setup_django(conn, data_dir)
    return compare(AGENT_NAME, plan, loaded, args.settings)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.limit_questions is not None and args.limit_questions < 1:
        print("--limit-questions must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    if args.skip_load and not args.url:
        print(
            "--skip-load needs --url and --api-key (a private server starts empty)", file=sys.stderr
        )
        return EXIT_USAGE
    if args.loo and args.url and not args.data_dir:
        print("--loo with --url needs that server's --data-dir", file=sys.stderr)
        return EXIT_USAGE
    if not args.data.is_file():
        print(
            f"no LoCoMo data at {args.data}: it is kept outside the repository "
            f"(../shared/bench/locomo/locomo-dev.json); give its path with --data",
            file=sys.stderr,
        )
        return EXIT_USAGE
    stopped_on_sigterm()
    try:
        results = run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BenchError as exc:
        print(f"bench.locomo failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    report(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
