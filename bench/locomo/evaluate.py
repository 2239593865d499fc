"""Searching LoCoMo's questions through ``/v1/agent/search/messages`` and scoring the
results against the evidence turns."""

import time
from collections.abc import Container, Mapping
from dataclasses import dataclass, field

import httpx

from bench.common import api_call, log, mean, percentile
from bench.locomo.dataset import CATEGORIES, Question, Sample
from bench.locomo.load import REQUEST_RETRIES, LoadedConversation
from bench.locomo.metrics import DEPTH, by_category, mean_metrics, ranking_metrics

TOP_K = DEPTH  # as many results as a question is scored on
WARM_UP_SEARCHES_PER_MODE = 4


@dataclass
class Plan:
    """The questions to search, and those left out (with why)."""

    questions: list[Question]
    evidence: dict[tuple[str, int], tuple[str, ...]]  # question key -> evidence turns findable
    category_5: int = 0
    no_evidence: list[dict] = field(default_factory=list)
    unknown_evidence: list[dict] = field(default_factory=list)
    over_limit: int = 0


def plan_questions(
    samples: list[Sample], findable: Mapping[str, Container[str]], limit: int | None
) -> Plan:
    """Questions of categories 1-4 whose evidence names turns that can be found (the first
    ``limit``). ``findable``: sample_id -> the dia_ids a search can reach (the loaded turns)."""
    plan = Plan(questions=[], evidence={})
    for sample in samples:
        turns = findable[sample.sample_id]
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
            reached = [{dia_id} if dia_id else set() for dia_id in ranked]
            foreign = sum(1 for r in results if r.get("conversationId") != conversation_id)
            record["modes"][mode] = {
                "ranked": ranked,
                "scores": [r.get("score") for r in results],
                "latencyMs": round(elapsed_ms, 2),
                "foreignResults": foreign,
                **ranking_metrics(reached, set(evidence)),
            }
        records.append(record)
        if number % 50 == 0 or number == total:
            log(f"  searched {number}/{total} questions")
    return records


def summarise(records: list[dict], mode: str) -> dict:
    """The metrics of ``mode`` over ``records``: means of the per-question metrics, latency."""
    runs = [record["modes"][mode] for record in records]
    latencies = [run["latencyMs"] for run in runs]
    summary = {"questions": len(runs)}
    summary.update(mean_metrics(runs))
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
    return {
        str(category): {"name": CATEGORIES[category], **summarise(subset, mode)}
        for category, subset in by_category(records, lambda record: record["category"]).items()
    }
