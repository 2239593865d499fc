"""LoCoMo retrieval benchmark: does ``/v1/agent/search/messages`` find the turns that answer
a question?

Each LoCoMo sample (one long two-person conversation) becomes one agent conversation titled
with its ``sample_id``; each turn becomes one ``user`` message whose ``authorName`` is the
speaker and whose metadata keeps ``dia_id`` and the session number. Then every question of
categories 1-4 (5, adversarial, has no answer in the conversation) is searched in its own
conversation in each ``--mode``, and the top 10 messages are compared with the question's
evidence turns: hit@5, recall@5, recall@10 and MRR, overall and per category, plus the
search latency. See ``../shared/bench/locomo/README.md`` for the data and the baselines.

Choices:

- A turn that shares a photo has its BLIP caption appended: ``"<text> [shares a photo:
  <caption>]"`` (the caption is often what a question asks about).
- ``createdAt`` is the session's date (``"1:56 pm on 8 May, 2023"``, read as UTC) plus one
  second per turn, so turns keep distinct, ordered times (sessions are hours apart at least).
- Evidence ids are normalised (``"D:11:26"`` -> ``"D11:26"``, ``"D30:05"`` -> ``"D30:5"``,
  ``"D8:6; D9:17"`` -> both); pieces that are no turn id (``"D"``) or name no loaded turn are
  dropped and counted; a question left with no evidence is skipped and counted.
- Before the timed searches a few warm-up searches per mode (not counted) load the embedding
  model in the web workers, so the latencies are of a warm server.
- Appends carry an ``Idempotency-Key`` so a dropped connection can be retried safely.

Exit status: 0 done; 1 the benchmark failed (server, API); 2 bad arguments or no data file
(the data is not in the repository: absent data is a usage problem, not a pass); 130 Ctrl-C.

Run from the checkout: ``.venv/bin/python -m bench.locomo --help``.
"""

import argparse
import json
import re
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from bench.common import (
    BenchError,
    api_call,
    benchmark_server,
    get_health,
    log,
    make_client,
    mean,
    percentile,
    wait_for_embeddings,
    write_json,
)

DEFAULT_DATA = Path("../shared/bench/locomo/locomo-dev.json")
DEFAULT_OUT = Path("bench-results/locomo.json")
MODES = ("hybrid", "semantic", "keyword")
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
TOP_K = 10
MAX_MESSAGES_PER_APPEND = 100
PAGE_LIMIT = 200
AGENT_NAME = "locomo-bench"
WARM_UP_SEARCHES_PER_MODE = 4
REQUEST_RETRIES = 2
EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130

SESSION_KEY = re.compile(r"session_(\d+)")
EVIDENCE_ID = re.compile(r"D:?(\d+):(\d+)")
EVIDENCE_SEPARATORS = re.compile(r"[;,\s]+")
SESSION_DATE_FORMAT = "%I:%M %p on %d %B, %Y"


# --- the data ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    dia_id: str
    session: int
    speaker: str
    text: str
    created_at: datetime
    has_photo: bool


@dataclass(frozen=True)
class Question:
    sample_id: str
    index: int  # position in the sample's ``qa`` list
    text: str
    category: int
    evidence: tuple[str, ...]  # normalised turn ids, in the data's order, without duplicates
    raw_evidence: tuple[str, ...]


@dataclass
class Sample:
    sample_id: str
    turns: list[Turn]
    questions: list[Question]


@dataclass
class EvidenceStats:
    """What normalising the evidence ids did, for the report."""

    ids: int = 0
    fixed: list[tuple[str, list[str]]] = field(default_factory=list)
    unparseable: list[str] = field(default_factory=list)


def parse_session_date(text: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` as an aware UTC datetime."""
    cleaned = " ".join(text.split())
    return datetime.strptime(cleaned, SESSION_DATE_FORMAT).replace(tzinfo=UTC)


def turn_text(turn: dict) -> str:
    """The words of a turn, with the caption of the photo it shares, if any."""
    text = turn.get("text", "")
    caption = (turn.get("blip_caption") or "").strip()
    return f"{text} [shares a photo: {caption}]" if caption else text


def normalise_evidence(raw: str) -> tuple[list[str], list[str]]:
    """Turn ids in one evidence string, and the pieces that are no turn id.

    ``"D:11:26"`` -> ``["D11:26"]``; ``"D30:05"`` -> ``["D30:5"]``; ``"D8:6; D9:17"`` ->
    ``["D8:6", "D9:17"]``; ``"D"`` -> ``[]`` with ``"D"`` rejected.
    """
    ids, rejected = [], []
    for piece in EVIDENCE_SEPARATORS.split(raw.strip()):
        if not piece:
            continue
        match = EVIDENCE_ID.fullmatch(piece)
        if match:
            ids.append(f"D{int(match[1])}:{int(match[2])}")
        else:
            rejected.append(piece)
    return ids, rejected


def read_turns(conversation: dict) -> list[Turn]:
    """Every turn of every session, sessions in number order, turns in file order."""
    sessions = sorted(
        (int(match[1]), key)
        for key in conversation
        if (match := SESSION_KEY.fullmatch(key)) and conversation[key]
    )
    turns = []
    for number, key in sessions:
        started = parse_session_date(conversation[f"{key}_date_time"])
        for position, turn in enumerate(conversation[key]):
            turns.append(
                Turn(
                    dia_id=turn["dia_id"],
                    session=number,
                    speaker=turn["speaker"],
                    text=turn_text(turn),
                    created_at=started + timedelta(seconds=position),
                    has_photo=bool((turn.get("blip_caption") or "").strip()),
                )
            )
    return turns


def read_questions(sample_id: str, qa: list[dict], stats: EvidenceStats) -> list[Question]:
    """The sample's questions (all categories) with normalised evidence."""
    questions = []
    for index, item in enumerate(qa):
        raw = tuple(str(e) for e in item.get("evidence") or [])
        evidence: list[str] = []
        for piece in raw:
            ids, rejected = normalise_evidence(piece)
            stats.ids += 1
            if rejected:
                stats.unparseable.extend(rejected)
            if ids and ids != [piece]:
                stats.fixed.append((piece, ids))
            evidence += [i for i in ids if i not in evidence]
        questions.append(
            Question(
                sample_id=sample_id,
                index=index,
                text=item["question"],
                category=int(item["category"]),
                evidence=tuple(evidence),
                raw_evidence=raw,
            )
        )
    return questions


def read_samples(path: Path) -> tuple[list[Sample], EvidenceStats]:
    """The LoCoMo file at ``path``: its samples, and what evidence normalisation did."""
    stats = EvidenceStats()
    samples = []
    for item in json.loads(path.read_text()):
        sample_id = item["sample_id"]
        samples.append(
            Sample(
                sample_id=sample_id,
                turns=read_turns(item["conversation"]),
                questions=read_questions(sample_id, item["qa"], stats),
            )
        )
    return samples, stats


# --- loading ----------------------------------------------------------------------------------


@dataclass
class LoadedConversation:
    conversation_id: str
    message_ids: dict[str, str]  # dia_id -> message id


def iso_utc(moment: datetime) -> str:
    """``2023-05-08T13:56:00Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def message_payload(turn: Turn) -> dict:
    """The agent API's message for one turn."""
    return {
        "role": "user",
        "authorName": turn.speaker,
        "content": turn.text,
        "metadata": {"dia_id": turn.dia_id, "session": turn.session},
        "createdAt": iso_utc(turn.created_at),
    }


def create_conversation(client: httpx.Client, url: str, sample_id: str) -> str:
    """A new agent conversation titled ``sample_id``; its id."""
    response = api_call(
        client,
        "POST",
        f"{url}/v1/agent/conversations",
        expect=201,
        json_body={"title": sample_id, "metadata": {"sample_id": sample_id}},
    )
    return response.json()["id"]


def append_turns(
    client: httpx.Client, url: str, conversation_id: str, turns: list[Turn]
) -> dict[str, str]:
    """Append ``turns`` in order, at most 100 per call; dia_id -> message id."""
    message_ids: dict[str, str] = {}
    for start in range(0, len(turns), MAX_MESSAGES_PER_APPEND):
        batch = turns[start : start + MAX_MESSAGES_PER_APPEND]
        response = api_call(
            client,
            "POST",
            f"{url}/v1/agent/conversations/{conversation_id}/messages",
            expect=201,
            json_body={"messages": [message_payload(turn) for turn in batch]},
            headers={"Idempotency-Key": f"bench.locomo:{conversation_id}:{start}"},
            retries=REQUEST_RETRIES,
        )
        created = response.json()["data"]
        if len(created) != len(batch):
            raise BenchError(
                f"appending {len(batch)} messages to {conversation_id} returned {len(created)}"
            )
        for turn, message in zip(batch, created, strict=True):
            if (message.get("metadata") or {}).get("dia_id") != turn.dia_id:
                raise BenchError(
                    f"message {message.get('id')} came back with metadata "
                    f"{message.get('metadata')}, expected dia_id {turn.dia_id}"
                )
            message_ids[turn.dia_id] = message["id"]
    return message_ids


def load_samples(
    client: httpx.Client, url: str, samples: list[Sample]
) -> dict[str, LoadedConversation]:
    """One conversation per sample, every turn appended; sample_id -> what was loaded."""
    existing = find_conversations(client, url)
    loaded = {}
    for sample in samples:
        if existing.get(sample.sample_id):
            log(
                f"  note: {len(existing[sample.sample_id])} conversation(s) titled "
                f"{sample.sample_id} already on the server; loading another (--skip-load reuses)"
            )
        started = time.monotonic()
        conversation_id = create_conversation(client, url, sample.sample_id)
        message_ids = append_turns(client, url, conversation_id, sample.turns)
        loaded[sample.sample_id] = LoadedConversation(conversation_id, message_ids)
        log(
            f"  {sample.sample_id}: {len(message_ids)} turns -> conversation {conversation_id} "
            f"({time.monotonic() - started:.1f} s)"
        )
    return loaded


def find_conversations(client: httpx.Client, url: str) -> dict[str, list[dict]]:
    """Every conversation the key can see, by title (most recently updated first)."""
    by_title: dict[str, list[dict]] = {}
    cursor = None
    while True:
        params = {"limit": PAGE_LIMIT, **({"after": cursor} if cursor else {})}
        page = api_call(
            client, "GET", f"{url}/v1/agent/conversations", params=params, retries=REQUEST_RETRIES
        ).json()
        for conversation in page["data"]:
            by_title.setdefault(conversation["title"], []).append(conversation)
        cursor = page.get("nextCursor")
        if not cursor:
            return by_title


def read_message_ids(client: httpx.Client, url: str, conversation_id: str) -> dict[str, str]:
    """dia_id -> message id of a conversation already on the server (its context, paged)."""
    message_ids: dict[str, str] = {}
    after = None
    while True:
        params = {"limit": PAGE_LIMIT, **({"afterMessageId": after} if after else {})}
        page = api_call(
            client,
            "GET",
            f"{url}/v1/agent/conversations/{conversation_id}/context",
            params=params,
            retries=REQUEST_RETRIES,
        ).json()
        for message in page["messages"]:
            dia_id = (message.get("metadata") or {}).get("dia_id")
            if dia_id:
                message_ids[dia_id] = message["id"]
        after = page.get("nextAfterMessageId")
        if not after:
            return message_ids


def find_loaded(
    client: httpx.Client, url: str, samples: list[Sample]
) -> dict[str, LoadedConversation]:
    """``--skip-load``: the conversations a previous run loaded, found by title."""
    existing = find_conversations(client, url)
    loaded = {}
    for sample in samples:
        matches = existing.get(sample.sample_id)
        if not matches:
            raise BenchError(
                f"--skip-load: no conversation titled {sample.sample_id!r} visible to this key "
                "(run once without --skip-load)"
            )
        if len(matches) > 1:
            log(f"  note: {len(matches)} conversations titled {sample.sample_id}: using the newest")
        conversation_id = matches[0]["id"]
        message_ids = read_message_ids(client, url, conversation_id)
        missing = len({t.dia_id for t in sample.turns} - set(message_ids))
        log(
            f"  {sample.sample_id}: conversation {conversation_id}, {len(message_ids)} turns"
            + (f" ({missing} turns of the data missing)" if missing else "")
        )
        loaded[sample.sample_id] = LoadedConversation(conversation_id, message_ids)
    return loaded


# --- evaluation -------------------------------------------------------------------------------


@dataclass
class Plan:
    """The questions to search, and those left out (with why)."""

    questions: list[Question]
    evidence: dict[tuple[str, int], tuple[str, ...]]  # question key -> evidence turns loaded
    category_5: int = 0
    no_evidence: list[dict] = field(default_factory=list)
    unknown_evidence: list[dict] = field(default_factory=list)
    over_limit: int = 0


def plan_questions(
    samples: list[Sample], loaded: dict[str, LoadedConversation], limit: int | None
) -> Plan:
    """Questions of categories 1-4 whose evidence names loaded turns (the first ``limit``)."""
    plan = Plan(questions=[], evidence={})
    for sample in samples:
        turns = loaded[sample.sample_id].message_ids
        for question in sample.questions:
            if question.category not in CATEGORIES:
                plan.category_5 += 1
                continue
            evidence = tuple(e for e in question.evidence if e in turns)
            unknown = [e for e in question.evidence if e not in turns]
            if unknown:
                plan.unknown_evidence.append(
                    {"sampleId": sample.sample_id, "index": question.index, "ids": unknown}
                )
            if not evidence:
                plan.no_evidence.append(
                    {
                        "sampleId": sample.sample_id,
                        "index": question.index,
                        "question": question.text,
                        "evidence": list(question.raw_evidence),
                    }
                )
                continue
            if limit is not None and len(plan.questions) >= limit:
                plan.over_limit += 1
                continue
            plan.questions.append(question)
            plan.evidence[(sample.sample_id, question.index)] = evidence
    return plan


def search(
    client: httpx.Client, url: str, conversation_id: str, query: str, mode: str
) -> tuple[list[dict], float]:
    """The top 10 results of ``query`` in one conversation, and the request's milliseconds."""
    started = time.perf_counter()
    response = api_call(
        client,
        "POST",
        f"{url}/v1/agent/search/messages",
        json_body={
            "query": query,
            "topK": TOP_K,
            "conversationIds": [conversation_id],
            "mode": mode,
        },
        retries=REQUEST_RETRIES,
    )
    elapsed_ms = (time.perf_counter() - started) * 1000
    return response.json()["data"], elapsed_ms


def ranking_metrics(ranked: list[str | None], evidence: set[str]) -> dict:
    """hit@5, recall@5, recall@10 and reciprocal rank of one ranking (dia_ids, best first)."""
    found_at = [rank for rank, dia_id in enumerate(ranked[:TOP_K], start=1) if dia_id in evidence]
    in_top = {k: len(set(ranked[:k]) & evidence) for k in (5, 10)}
    return {
        "hit@5": 1.0 if found_at and found_at[0] <= 5 else 0.0,
        "recall@5": in_top[5] / len(evidence),
        "recall@10": in_top[10] / len(evidence),
        "mrr": 1.0 / found_at[0] if found_at else 0.0,
    }


def warm_up(client: httpx.Client, url: str, conversation_id: str, modes: list[str]) -> None:
    """A few untimed searches per mode, so every web worker has its model loaded."""
    for mode in modes:
        for _ in range(WARM_UP_SEARCHES_PER_MODE):
            search(client, url, conversation_id, "warm up: what did they talk about?", mode)


def evaluate(
    client: httpx.Client,
    url: str,
    plan: Plan,
    loaded: dict[str, LoadedConversation],
    modes: list[str],
) -> list[dict]:
    """Search every planned question in every mode; one record per question."""
    records = []
    total = len(plan.questions)
    for number, question in enumerate(plan.questions, start=1):
        conversation_id = loaded[question.sample_id].conversation_id
        evidence = plan.evidence[(question.sample_id, question.index)]
        record = {
            "sampleId": question.sample_id,
            "index": question.index,
            "category": question.category,
            "question": question.text,
            "evidence": list(evidence),
            "modes": {},
        }
        for mode in modes:
            results, elapsed_ms = search(client, url, conversation_id, question.text, mode)
            ranked = [(r["message"].get("metadata") or {}).get("dia_id") for r in results]
            foreign = sum(1 for r in results if r.get("conversationId") != conversation_id)
            record["modes"][mode] = {
                "ranked": ranked,
                "scores": [r.get("score") for r in results],
                "latencyMs": round(elapsed_ms, 2),
                "foreignResults": foreign,
                **ranking_metrics(ranked, set(evidence)),
            }
        records.append(record)
        if number % 50 == 0 or number == total:
            log(f"  searched {number}/{total} questions")
    return records


METRICS = ("hit@5", "recall@5", "recall@10", "mrr")


def summarise(records: list[dict], mode: str) -> dict:
    """The metrics of ``mode`` over ``records``: means of the per-question metrics, latency."""
    runs = [record["modes"][mode] for record in records]
    latencies = [run["latencyMs"] for run in runs]
    summary = {"questions": len(runs)}
    summary.update({name: mean(run[name] for run in runs) for name in METRICS})
    summary["latencyMs"] = {
        "p50": percentile(latencies, 50),
        "p95": percentile(latencies, 95),
        "mean": mean(latencies),
        "max": max(latencies, default=None),
    }
    summary["meanResults"] = mean(len(run["ranked"]) for run in runs)
    summary["foreignResults"] = sum(run["foreignResults"] for run in runs)
    return summary


def summarise_by_category(records: list[dict], mode: str) -> dict:
    """``summarise`` per category (keys are the category numbers as strings)."""
    by_category = {}
    for category, name in CATEGORIES.items():
        subset = [record for record in records if record["category"] == category]
        if subset:
            summary = summarise(subset, mode)
            by_category[str(category)] = {"name": name, **summary}
    return by_category


# --- output -----------------------------------------------------------------------------------


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


# --- the command ------------------------------------------------------------------------------


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
    return parser


def run(args: argparse.Namespace) -> dict:
    """The whole benchmark; the results (also written to ``args.out``)."""
    modes = list(dict.fromkeys(args.modes or ["hybrid"]))
    samples, evidence_stats = read_samples(args.data)
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
            timings["loadSeconds"] = time.monotonic() - started
            log(f"  loaded in {timings['loadSeconds']:.1f} s")
        log("waiting for the embedding backlog")
        timings["embeddingWaitSeconds"] = wait_for_embeddings(client, url)
        _, health = get_health(client, url)

        plan = plan_questions(samples, loaded, args.limit_questions)
        log(f"searching {len(plan.questions)} questions in {', '.join(modes)}")
        if plan.questions:
            warm_up(client, url, loaded[plan.questions[0].sample_id].conversation_id, modes)
        started = time.monotonic()
        records = evaluate(client, url, plan, loaded, modes)
        timings["evaluationSeconds"] = time.monotonic() - started

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
        "questions": records,
    }


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
    foreign = {m: s["foreignResults"] for m, s in results["modes"].items() if s["foreignResults"]}
    if foreign:
        print(f"WARNING: results from other conversations than the one searched: {foreign}")
    path = write_json(out, results)
    print(f"results written to {path}")


def _stop_on_sigterm(signum, frame) -> None:
    # SystemExit unwinds through the ``finally`` blocks, so a private server is stopped.
    log("terminated (SIGTERM)")
    raise SystemExit(128 + signum)


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
    if not args.data.is_file():
        print(
            f"no LoCoMo data at {args.data}: it is kept outside the repository "
            f"(../shared/bench/locomo/locomo-dev.json); give its path with --data",
            file=sys.stderr,
        )
        return EXIT_USAGE
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
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
