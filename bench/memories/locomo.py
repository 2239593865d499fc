"""Retrieval through memories on LoCoMo: are the turns that answer a question reached by
the memories a search returns?

Each sample's observations (facts about one of the two speakers, drawn from a session, each
citing the turns it rests on) are saved as memories of one user, the sample's id, of one
agent, through ``POST /v1/agent/memories/batch``. A memory counts for the turns it cites;
one the service merged another into (the same fact again, cosine >= 0.95) counts for the
turns of both. Then each question of categories 1-4 is searched among its sample's memories
(``limit`` 10, ``minScore`` 0 so nothing is cut) and scored with ``bench.locomo.metrics``,
the records shaped like ``bench.locomo.evaluate``'s so that its summaries serve both.

The question set is ``bench.locomo``'s (``plan_questions`` with every turn findable), so
message search over the same server answers the same questions; a question whose evidence
no observation cites cannot be answered through memories at all (the "ceiling").
"""

import time

import httpx

from bench.common import api_call, log, mean
from bench.locomo.evaluate import Plan
from bench.locomo.load import LoadedMemories
from bench.locomo.metrics import by_category, ranking_metrics

LIMIT = 10
REQUEST_RETRIES = 2
WARM_UP_SEARCHES_PER_MODE = 4


def search_memories(
    client: httpx.Client, url: str, user_id: str, query: str, mode: str
) -> tuple[list[dict], float]:
    """The top ``LIMIT`` memories of ``user_id`` for ``query``, and the request's ms."""
    started = time.perf_counter()
    response = api_call(
        client,
        "POST",
        f"{url}/v1/agent/memories/search",
        json_body={"query": query, "userId": user_id, "limit": LIMIT, "minScore": 0, "mode": mode},
        retries=REQUEST_RETRIES,
    )
    return response.json()["data"], (time.perf_counter() - started) * 1000


def warm_up(client: httpx.Client, url: str, user_id: str, modes: list[str]) -> None:
    for mode in modes:
        for _ in range(WARM_UP_SEARCHES_PER_MODE):
            search_memories(client, url, user_id, "warm up: what do they like?", mode)


def score(ranked_ids: list, loaded: LoadedMemories, evidence: tuple[str, ...]) -> dict:
    """``bench.locomo.metrics`` of one ranking of memory ids (a memory reaches its turns)."""
    reached = [loaded.evidence.get(str(memory_id), set()) for memory_id in ranked_ids]
    return ranking_metrics(reached, set(evidence))


def evaluate(
    client: httpx.Client,
    url: str,
    plan: Plan,
    loaded: dict[str, LoadedMemories],
    modes: list[str],
) -> list[dict]:
    """Search every planned question in every mode; one record per question, in
    ``bench.locomo.evaluate``'s shape (``ranked`` holds memory ids)."""
    records = []
    total = len(plan.questions)
    for number, question in enumerate(plan.questions, start=1):
        memories = loaded[question.sample_id]
        evidence = plan.evidence[(question.sample_id, question.index)]
        record = {
            "sampleId": question.sample_id,
            "index": question.index,
            "category": question.category,
            "question": question.text,
            "evidence": list(evidence),
            # some memory of the sample cites an evidence turn: memories can answer it
            "reachable": any(
                not cited.isdisjoint(evidence) for cited in memories.evidence.values()
            ),
            "modes": {},
        }
        for mode in modes:
            results, elapsed_ms = search_memories(
                client, url, memories.user_id, question.text, mode
            )
            ranked = [result["id"] for result in results]
            record["modes"][mode] = {
                "ranked": ranked,
                "scores": [result["score"] for result in results],
                "latencyMs": round(elapsed_ms, 2),
                # another user's memory in the results would be a leak
                "foreignResults": sum(1 for r in results if r["userId"] != memories.user_id),
                **score(ranked, memories, evidence),
            }
        records.append(record)
        if number % 50 == 0 or number == total:
            log(f"  searched {number}/{total} questions")
    return records


def ceiling(plan: Plan, loaded: dict[str, LoadedMemories]) -> dict:
    """The best any ranking of a sample's memories could do, overall and per category:
    ``hit``, the share of questions with an evidence turn some memory cites; ``recall``,
    the mean share of a question's evidence turns some memory cites."""
    rows = []
    for question in plan.questions:
        evidence = set(plan.evidence[(question.sample_id, question.index)])
        cited = set().union(*loaded[question.sample_id].evidence.values()) & evidence
        rows.append((question.category, float(bool(cited)), len(cited) / len(evidence)))

    def means(subset):
        return {
            "questions": len(subset),
            "hit": mean(r[1] for r in subset),
            "recall": mean(r[2] for r in subset),
        }

    return {
        **means(rows),
        "byCategory": {
            str(category): means(subset)
            for category, subset in by_category(rows, lambda row: row[0]).items()
        },
    }


def paired(memory_records: list[dict], message_records: list[dict], mode: str) -> dict:
    """hit@5 of the two searches question by question (the same questions in the same
    order): how many both find, only one finds, neither; and on the questions memories can
    answer (``reachable``), each search's mean hit@5."""
    pairs = [
        (memory["modes"][mode]["hit@5"], message["modes"][mode]["hit@5"], memory["reachable"])
        for memory, message in zip(memory_records, message_records, strict=True)
    ]
    reachable = [pair for pair in pairs if pair[2]]
    return {
        "both": sum(1 for m, g, _ in pairs if m and g),
        "memoriesOnly": sum(1 for m, g, _ in pairs if m and not g),
        "messagesOnly": sum(1 for m, g, _ in pairs if g and not m),
        "neither": sum(1 for m, g, _ in pairs if not m and not g),
        "reachable": len(reachable),
        "reachableMemoriesHit@5": mean(m for m, _, _ in reachable),
        "reachableMessagesHit@5": mean(g for _, g, _ in reachable),
    }
