"""The benchmark's output: tables on stdout, the results as JSON."""

from pathlib import Path

from bench.common import write_json
from bench.locomo.dataset import CATEGORIES
from bench.locomo.metrics import METRICS


def _number(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(per_mode: dict) -> str:
    """Modes as rows: questions, hit@5, recall@5, recall@10, MRR, p50 and p95 ms."""
    header = (
        f"{'mode':<9} {'questions':>9} {'hit@5':>7} {'recall@5':>9} {'recall@10':>10} "
        f"{'MRR':>7} {'p50 ms':>8} {'p95 ms':>8}"
    )
    lines = [header, "-" * len(header)]
    for mode, summary in per_mode.items():
        latency = summary["latencyMs"]
        lines.append(
            f"{mode:<9} {summary['questions']:>9} {_number(summary['hit@5']):>7} "
            f"{_number(summary['recall@5']):>9} {_number(summary['recall@10']):>10} "
            f"{_number(summary['mrr']):>7} {_number(latency['p50'], 1):>8} "
            f"{_number(latency['p95'], 1):>8}"
        )
    return "\n".join(lines)


def format_category_table(per_mode: dict, metric: str = "hit@5") -> str:
    """Modes as rows, categories as columns (with their question counts), one metric."""
    categories = list(next(iter(per_mode.values()))["byCategory"].items())
    columns = [f"{key} {info['name']} ({info['questions']})" for key, info in categories]
    header = f"{metric:<9} " + " ".join(f"{column:>18}" for column in columns)
    lines = [header, "-" * len(header)]
    for mode, summary in per_mode.items():
        cells = [_number(summary["byCategory"][key][metric]) for key, _ in categories]
        lines.append(f"{mode:<9} " + " ".join(f"{cell:>18}" for cell in cells))
    return "\n".join(lines)


def format_loo(compared: dict) -> str:
    """Settings as rows (then the leave-one-out choice): hit@5 / recall@10 overall and per
    category."""
    rows = dict(compared["settings"])
    for name, chosen in compared.get("byDirection", {}).items():
        if chosen:
            rows[f"leave-one-out: {name}"] = chosen
    if compared["leaveOneOut"]:
        rows["leave-one-out: all"] = compared["leaveOneOut"]
    categories = list(next(iter(rows.values()))["byCategory"])
    names = {str(k): v for k, v in CATEGORIES.items()}
    width = max(len(label) for label in rows)
    header = f"{'setting':<{width}} {'hit@5/rec@10':>13} {'MRR':>6} {'p50 ms':>6} " + " ".join(
        f"{names.get(c, c):>13}" for c in categories
    )
    lines = [header, "-" * len(header)]
    for label, row in rows.items():
        cells = [
            f"{_number(row['byCategory'][c]['hit@5'])}/{_number(row['byCategory'][c]['recall@10'])}"
            for c in categories
        ]
        lines.append(
            f"{label:<{width}} {_number(row['hit@5']):>6}/{_number(row['recall@10'])} "
            f"{_number(row['mrr']):>6} {_number(row.get('p50Ms'), 1):>6} "
            + " ".join(f"{cell:>13}" for cell in cells)
        )
    for label, row in rows.items():
        if "chosen" in row:
            picks = ", ".join(f"{s}: {choice}" for s, choice in row["chosen"].items())
            lines.append(f"{label} chose {picks}")
    return "\n".join(lines)


def report(results: dict, out: Path) -> None:
    """Print the tables and the counts; write the JSON."""
    counts, timings = results["counts"], results["timings"]
    load = timings["loadSeconds"]
    print()
    print(
        f"LoCoMo ({counts['conversations']} conversations, {counts['turnsLoaded']} turns "
        f"loaded, {counts['turnsWithPhotoCaption']} with ' [shares a photo: <caption>]' "
        "appended), categories 1-4, top 10, turn level"
    )
    print(
        f"questions: {counts['evaluated']} searched; skipped {counts['skippedCategory5']} of "
        f"category 5, {counts['skippedNoEvidence']} with no loaded evidence turn, "
        f"{counts['skippedOverLimit']} over --limit-questions; evidence ids: "
        f"{counts['evidenceIdsNormalised']} normalised, {counts['evidencePiecesUnparseable']} "
        f"unparseable, {counts['evidenceIdsNotLoaded']} naming no loaded turn"
    )
    print(
        f"load {'(skipped)' if load is None else f'{load:.1f} s'}, embedding wait after load "
        f"{timings['embeddingWaitSeconds']:.1f} s, searches {timings['evaluationSeconds']:.1f} s"
    )
    print()
    print(format_table(results["modes"]))
    if results["modes"] and counts["evaluated"]:
        print()
        print("per category:")
        for metric in METRICS:
            print(format_category_table(results["modes"], metric))
            print()
    if results.get("loo"):
        print("settings compared in-process (hybrid), and chosen leaving one conversation out:")
        print(format_loo(results["loo"]))
        print()
    foreign = {m: s["foreignResults"] for m, s in results["modes"].items() if s["foreignResults"]}
    if foreign:
        print(f"WARNING: results from other conversations than the one searched: {foreign}")
    path = write_json(out, results)
    print(f"results written to {path}")
