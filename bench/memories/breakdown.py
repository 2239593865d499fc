"""Where a memory search's time goes, statement by statement, in-process:
``python -m bench.memories.breakdown --data-dir DIR`` against a server that
``python -m bench.memories --keep-server`` left running (its data directory).

Django is set up on that server's database (``bench.message_copy.setup_django``) with one
model thread, as the web processes have. For ``--queries`` questions per case (one user's
memories, the second agent's whole store), it times each step of a hybrid search the way
``search.engine.find_candidates`` runs them (query embedding, query terms, keyword
candidates, the exact/graph choice, nearest vectors with fills), then the whole
``agents_api.selectors.memory_search`` per mode. Nothing is written: the selector does not
count accesses (the view does), so the store is left as it was.
"""

import argparse
import os
import random
import statistics
import time
from pathlib import Path

from bench.memories.__main__ import AGENT, DEFAULT_DATA, MODES, STORE_AGENT
from bench.memories.texts import load_texts, users_texts


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[int(len(ordered) * 0.9)]
    return f"p50 {statistics.median(ordered) * 1000:6.1f} ms   p90 {p90 * 1000:6.1f} ms"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memories.breakdown")
    parser.add_argument("--data-dir", type=Path, required=True, help="the kept server's")
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args(argv)

    from bench.message_copy import setup_django
    from bench.search import database

    os.environ["MEMSVC_EMBEDDING_THREADS"] = "1"
    with database(args.data_dir) as conn:
        setup_django(conn, args.data_dir)
    from django.db import connection, transaction

    from agents_api.models import Agent
    from agents_api.selectors import MEMORIES, memory_scope, memory_search
    from search import statements
    from search.embeddings import configured_backend, vector_literal
    from search.tuning import configured_tuning

    source = load_texts(args.data)
    users = users_texts(source, args.users, args.memories // args.users, args.seed)
    rng = random.Random(args.seed + 2)
    tuning = configured_tuning()
    backend = configured_backend()
    backend.embed(["warm up"])
    limit = tuning.candidates_for(5)
    for case, agent_name, with_user in (("user", AGENT, True), ("store", STORE_AGENT, False)):
        agent = Agent.objects.get(name=agent_name)
        steps = {name: [] for name in ("embedding", "terms", "keyword", "choice", "nearest")}
        totals = {mode: [] for mode in MODES}
        orders = []
        for _ in range(args.queries):
            user = rng.choice(users)
            query = source.question(user.name, user.friend, rng)
            user_id = user.user_id if with_user else ""
            scope = memory_scope(agent.id, user_id)
            started = time.perf_counter()
            vector = vector_literal(backend.embed([query])[0])
            steps["embedding"].append(time.perf_counter() - started)
            with transaction.atomic(), connection.cursor() as cursor:
                started = time.perf_counter()
                terms = statements.query_terms(cursor, MEMORIES, scope, query, tuning)
                steps["terms"].append(time.perf_counter() - started)
                started = time.perf_counter()
                keyword = statements.keyword_candidates(
                    cursor, MEMORIES, scope, terms, limit, tuning
                )
                steps["keyword"].append(time.perf_counter() - started)
                started = time.perf_counter()
                order = statements.nearest_order(cursor, MEMORIES, scope, limit, tuning)
                steps["choice"].append(time.perf_counter() - started)
                orders.append("graph" if order == statements.INDEX_ORDER else "exact")
                started = time.perf_counter()
                statements.nearest_with_fills(
                    cursor,
                    MEMORIES,
                    scope,
                    vector,
                    backend.model,
                    limit,
                    terms,
                    list(keyword),
                    order,
                    tuning,
                )
                steps["nearest"].append(time.perf_counter() - started)
            for mode in MODES:
                started = time.perf_counter()
                memory_search(
                    agent, user_id=user_id, query=query, limit=5, min_score=0.3, mode=mode
                )
                totals[mode].append(time.perf_counter() - started)
        counts = {order: orders.count(order) for order in sorted(set(orders))}
        print(f"{case} ({agent_name}, {args.queries} questions; nearest vectors: {counts})")
        for name, values in steps.items():
            print(f"  {name:24}{_ms(values)}")
        for mode, values in totals.items():
            print(f"  {'memory_search ' + mode:24}{_ms(values)}")
    print(f"load average (1, 5, 15 min) at the end: {[round(x, 2) for x in os.getloadavg()]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
