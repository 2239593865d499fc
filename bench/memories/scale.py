"""Saving memories through the API at scale, and timing searches of them.

``save_users`` posts every user's memories to ``POST /v1/agent/memories/batch`` (at most 100
a call, one user a call, from several client threads) and counts what the service merged:
a saved memory comes back with the id of the memory it was merged into, so the inputs
minus the distinct ids returned are the merged ones. ``measure_searches`` times sequential
``POST /v1/agent/memories/search`` requests over HTTP (query embedding included).
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from bench.common import api_call, log, make_client, percentile
from bench.memories.texts import UserTexts

MAX_BATCH = 100  # the API's limit
WARM_UP_SEARCHES = 10
REQUEST_RETRIES = 2


@dataclass
class SaveResult:
    seconds: float
    sent: int
    ids: set = field(default_factory=set)
    call_ms: list = field(default_factory=list)
    merges: list = field(default_factory=list)  # (text sent, text of the memory kept)

    @property
    def merged(self) -> int:
        return self.sent - len(self.ids)


def _batches(users: list[UserTexts], rng) -> list[tuple[str, list[dict]]]:
    """(user id, memories) per call: a user's memories, at most ``MAX_BATCH`` a call, with
    an importance of their own (the service ranks by it)."""
    batches = []
    for user in users:
        for start in range(0, len(user.memories), MAX_BATCH):
            memories = [
                {"content": text, "importance": round(rng.uniform(0.1, 0.9), 2)}
                for text in user.memories[start : start + MAX_BATCH]
            ]
            batches.append((user.user_id, memories))
    return batches


def save_users(url: str, key: str, users: list[UserTexts], *, clients: int, rng) -> SaveResult:
    """Every user's memories through the batch API, from ``clients`` threads."""
    batches = _batches(users, rng)
    result = SaveResult(seconds=0.0, sent=sum(len(memories) for _, memories in batches))
    local = threading.local()
    lock = threading.Lock()
    done = [0]

    def send(batch):
        if not hasattr(local, "client"):
            local.client = make_client(key)
        user_id, memories = batch
        started = time.perf_counter()
        # Not retried: a repeated batch would be merged into itself and counted as merges.
        response = api_call(
            local.client,
            "POST",
            f"{url}/v1/agent/memories/batch",
            json_body={"userId": user_id, "memories": memories},
            expect=201,
        )
        elapsed = (time.perf_counter() - started) * 1000
        saved = response.json()["data"]
        with lock:
            for memory, sent in zip(saved, memories, strict=True):
                if memory["id"] in result.ids:
                    result.merges.append((sent["content"], memory["content"]))
                result.ids.add(memory["id"])
            result.call_ms.append(elapsed)
            done[0] += len(memories)
            if len(result.call_ms) % 100 == 0:
                rate = done[0] / (time.monotonic() - started_all)
                log(f"  saved {done[0]}/{result.sent} ({rate:.0f}/s)")

    started_all = time.monotonic()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(send, batches))
    result.seconds = time.monotonic() - started_all
    return result


def latency_summary(latencies: list[float]) -> dict:
    return {
        "requests": len(latencies),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p95_ms": round(percentile(latencies, 95), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
    }


def measure_searches(url: str, key: str, requests: list[dict]) -> dict:
    """Send ``requests`` (search bodies) one after another; the first ``WARM_UP_SEARCHES``
    are not timed. Latency percentiles in ms and the mean number of results."""
    latencies, results = [], []
    with make_client(key) as client:
        for index, body in enumerate(requests):
            started = time.perf_counter()
            response = api_call(
                client,
                "POST",
                f"{url}/v1/agent/memories/search",
                json_body=body,
                retries=REQUEST_RETRIES,
            )
            elapsed = (time.perf_counter() - started) * 1000
            if index >= WARM_UP_SEARCHES:
                latencies.append(elapsed)
                results.append(len(response.json()["data"]))
    return latency_summary(latencies) | {"mean_results": round(sum(results) / len(results), 2)}
