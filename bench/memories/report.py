"""The tables of ``bench.memories`` on stdout, and its JSON."""

from pathlib import Path

from bench.common import write_json
from bench.locomo.dataset import CATEGORIES
from bench.locomo.metrics import METRICS


def _n(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def scale_report(results: dict, out: Path) -> None:
    saves, config = results["saves"], results["config"]
    print(
        f"\nmemories at scale: {saves['sent']} saved through the batch API for "
        f"{config['users']} users ({config['perUser']} each, {config['clients']} clients), "
        f"texts from {results['texts']}"
    )
    print(
        f"saves: {saves['perSecond']:.0f}/s ({saves['seconds']} s); merged as duplicates: "
        f"{saves['merged']}; saved without a vector: {saves['savedWithoutVector']}; a call of "
        f"100: p50 {saves['callMs']['p50_ms']:.0f} ms, p95 {saves['callMs']['p95_ms']:.0f} ms"
    )
    for merge in saves["merges"][:5]:
        print(f"  merged: {merge['sent']!r}\n    into: {merge['keptAs']!r}")
    print(f"rows per agent: {results['rows']}; store copy: {results['storeBuild']}")
    print_latency(results["latency"])
    print(f"\nsaves afterwards (ms): {results['probeSaves']}")
    print(f"load average (1, 5, 15 min): {results['loadAverage']}")
    print(f"results written to {write_json(out, results)}")


def print_latency(latency: dict) -> None:
    print(f"\n{'case':8}{'mode':10}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'results':>9}")
    for name, row in latency.items():
        case, mode = name.split("/")
        print(
            f"{case:8}{mode:10}{row['p50_ms']:9.1f}{row['p95_ms']:9.1f}{row['p99_ms']:9.1f}"
            f"{row['mean_results']:9.1f}"
        )


def latency_report(results: dict, out: Path) -> None:
    """``--url``: the searches only."""
    print_latency(results["latency"])
    print(f"load average (1, 5, 15 min): {results['loadAverage']}")
    print(f"results written to {write_json(out, results)}")


def _metric_table(rows: dict[str, dict]) -> str:
    header = f"{'':28}{'hit@5':>7}{'rec@5':>7}{'rec@10':>8}{'MRR':>7}{'p50 ms':>8}{'p95 ms':>8}"
    lines = [header, "-" * len(header)]
    for label, summary in rows.items():
        latency = summary.get("latencyMs") or {}
        lines.append(
            f"{label:28}{_n(summary['hit@5']):>7}{_n(summary['recall@5']):>7}"
            f"{_n(summary['recall@10']):>8}{_n(summary['mrr']):>7}"
            f"{_n(latency.get('p50'), 1):>8}{_n(latency.get('p95'), 1):>8}"
        )
    return "\n".join(lines)


def _category_table(rows: dict[str, dict], metric: str) -> str:
    names = [f"{key} {name}" for key, name in CATEGORIES.items()]
    header = f"{metric:28}" + "".join(f"{name:>15}" for name in names)
    lines = [header, "-" * len(header)]
    for label, by_category in rows.items():
        cells = [_n((by_category.get(str(key)) or {}).get(metric)) for key in CATEGORIES]
        lines.append(f"{label:28}" + "".join(f"{cell:>15}" for cell in cells))
    return "\n".join(lines)


def locomo_report(results: dict, out: Path) -> None:
    counts = results["counts"]
    print(
        f"\nLoCoMo through memories: {counts['samples']} samples, {counts['observations']} "
        f"observations saved -> {counts['memories']} memories ({counts['merged']} merged); "
        f"{counts['questions']} questions of categories 1-4, limit 10, minScore 0"
    )
    rows = {f"memories {mode}": s for mode, s in results["memories"].items()}
    if results["messages"]:
        rows |= {f"messages {mode}": s for mode, s in results["messages"].items()}
    print(_metric_table(rows))
    ceiling = results["ceiling"]
    print(
        f"ceiling through memories (an evidence turn cited by some memory): hit "
        f"{_n(ceiling['hit'])}, recall {_n(ceiling['recall'])}"
    )
    for mode, pair in (results["paired"] or {}).items():
        print(
            f"{mode} hit@5 question by question: both {pair['both']}, only memories "
            f"{pair['memoriesOnly']}, only messages {pair['messagesOnly']}, neither "
            f"{pair['neither']}; on the {pair['reachable']} questions memories can answer: "
            f"memories {_n(pair['reachableMemoriesHit@5'])}, messages "
            f"{_n(pair['reachableMessagesHit@5'])}"
        )
    by_category = {label: s["byCategory"] for label, s in rows.items()}
    for metric in ("hit@5", "recall@10"):
        print()
        print(_category_table(by_category, metric))
    print()
    print(_category_table({"ceiling": ceiling["byCategory"]}, "hit"))
    print(_category_table({"ceiling": ceiling["byCategory"]}, "recall"))
    sweep = results["sweep"]
    if sweep:
        print(
            f"\nhybrid weights for memories, in-process ({sweep['questions']} questions; the "
            f"default's rankings equal the HTTP run's for {sweep['defaultSameAsHttp']})"
        )
        samples = list(next(iter(sweep["settings"].values()))["bySample"])
        header = (
            f"{'setting':52}"
            + "".join(f"{m:>8}" for m in METRICS)
            + "".join(f"{s:>9}" for s in samples)
        )
        print(header + "\n" + "-" * len(header))
        for label, summary in sweep["settings"].items():
            print(
                f"{label:52}"
                + "".join(f"{_n(summary[m]):>8}" for m in METRICS)
                + "".join(f"{_n(summary['bySample'][s]['hit@5']):>9}" for s in samples)
            )
        loo = sweep["leaveOneOut"]
        if not loo:
            print("leave one conversation out: needs questions of two samples at least")
        else:
            print(
                "leave one conversation out (best hit@5 on the others): "
                + ", ".join(f"{sample}: {label}" for sample, label in loo["chosen"].items())
            )
            print("  held-out " + ", ".join(f"{m} {_n(loo[m])}" for m in METRICS))
    print(f"load average (1, 5, 15 min) at the end: {results['loadAverage']}")
    print(f"results written to {write_json(out, results)}")
