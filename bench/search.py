"""Search speed at scale: ``python -m bench.search --messages 100000 [--users 1000]``.

It starts a private memsvc (see ``bench.common``) and builds a corpus in three steps:

1. Conversations (100 messages each) owned by ``--users`` users, created through the agent
   API on their behalf; an "auditor" user is made a reader of every conversation and a
   "visitor" of 1% of them, through the user API.
2. ``--http-messages`` real messages appended through the API in bulk (100 per call, from
   ``--clients`` threads): this measures ingest (messages/s accepted); the worker embeds
   them with the local model: this measures embedding (messages/s embedded).
3. The rest of the corpus is copied straight into PostgreSQL: each row repeats the text of
   one of the embedded messages, with that message's real vector plus a small random
   perturbation (then normalised), so the vector index holds distinct vectors of a
   realistic distribution without embedding 100,000 texts. The vector and full-text
   indexes are dropped for the copy and built again after it (the same definitions): one
   build is far faster than a million inserts into the graph.

Then it measures ``POST /v1/user/search/messages`` over HTTP, query embedding included,
for the auditor (sees everything) and the visitor (sees 1%): p50/p95/p99 of sequential
requests, per mode. Texts and questions come from the LoCoMo file when it is there (read
in place), otherwise from a small generator.
"""

import argparse
import json
import random
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import jwt
import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg.types.json import Jsonb

from bench.common import (
    BenchError,
    api_call,
    create_api_key,
    exit_with,
    log,
    make_client,
    percentile,
    private_env,
    start_private_server,
    wait_for_embeddings,
    write_json,
)
from bench.message_copy import MessageCopy, setup_django

MESSAGES_PER_CONVERSATION = 100
BULK = 100
PERTURBATION = 0.02
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared/bench/locomo/locomo-dev.json"


# --- texts ------------------------------------------------------------------------------------


def corpus_texts(data: Path, seed: int) -> tuple[list[tuple[str, str]], list[str]]:
    """(speaker, text) turns and questions: LoCoMo's when the file is there, else generated."""
    if data.exists():
        samples = json.loads(data.read_text())
        turns, questions = [], []
        for sample in samples:
            conversation = sample["conversation"]
            for key, value in conversation.items():
                if key.startswith("session_") and isinstance(value, list):
                    turns += [(turn["speaker"], turn["text"]) for turn in value]
            questions += [qa["question"] for qa in sample["qa"] if qa.get("category") != 5]
        log(f"texts: {len(turns)} LoCoMo turns and {len(questions)} questions from {data}")
        return turns, questions
    rng = random.Random(seed)
    subjects = ["I", "We", "My sister", "The team", "Our neighbour", "Grandma"]
    verbs = ["adopted", "painted", "visited", "cooked", "read about", "wrote to", "planned"]
    things = ["a puppy", "the beach", "a novel", "Tokyo", "a cake", "the museum", "a garden"]
    turns = [
        (
            rng.choice(["Ann", "Ben"]),
            f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(things)}",
        )
        for _ in range(3000)
    ]
    questions = [f"Who {rng.choice(verbs)} {rng.choice(things)}?" for _ in range(500)]
    log(f"texts: LoCoMo data not found at {data}; using {len(turns)} generated sentences")
    return turns, questions


# --- building the corpus ----------------------------------------------------------------------


def user_token(secret: str, user_id: str) -> str:
    now = int(time.time())
    return jwt.encode({"sub": user_id, "iat": now, "exp": now + 86_400}, secret, algorithm="HS256")


def create_conversations(client, url, count: int, users: int) -> list[tuple[str, str]]:
    """(conversation id, owner) for ``count`` conversations owned round-robin by the users."""
    made = []
    for index in range(count):
        owner = f"user-{index % users}"
        response = api_call(
            client,
            "POST",
            f"{url}/v1/agent/conversations",
            json_body={"title": f"bench {index}"},
            headers={"X-On-Behalf-Of": owner},
            expect=201,
        )
        made.append((response.json()["id"], owner))
    return made


def share(url, secret, conversations, reader: str) -> None:
    with httpx.Client(timeout=60) as client:
        for conversation_id, owner in conversations:
            api_call(
                client,
                "POST",
                f"{url}/v1/user/conversations/{conversation_id}/memberships",
                json_body={"userId": reader, "accessLevel": "reader"},
                headers={"Authorization": f"Bearer {user_token(secret, owner)}"},
                expect=201,
            )


def ingest(url, key, conversations, turns, total: int, clients: int, rng) -> float:
    """Append ``total`` messages through the API, ``BULK`` per call; the seconds it took."""
    batches = []
    for index in range(0, total, BULK):
        conversation_id = conversations[index // MESSAGES_PER_CONVERSATION][0]
        batch = []
        for _ in range(min(BULK, total - index)):
            speaker, text = rng.choice(turns)
            batch.append({"role": "user", "authorName": speaker, "content": text})
        batches.append((conversation_id, batch))
    local = threading.local()

    def send(item):
        if not hasattr(local, "client"):
            local.client = make_client(key)
        conversation_id, batch = item
        api_call(
            local.client,
            "POST",
            f"{url}/v1/agent/conversations/{conversation_id}/messages",
            json_body={"messages": batch},
            expect=201,
        )

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(send, batches))
    return time.monotonic() - started


def database(data_dir: Path) -> psycopg.Connection:
    """A connection to the private server's embedded PostgreSQL (from its postmaster.pid)."""
    lines = (data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()
    conn = psycopg.connect(host=lines[4], port=int(lines[3]), user="postgres", dbname="memsvc")
    register_vector(conn)
    return conn


# Rebuilt after a bulk copy rather than updated row by row: building the HNSW graph once is
# many times faster than inserting a million vectors into it one at a time.
BULK_BUILT_INDEXES = ("message_embedding_hnsw", "message_search_vector")
COPY_CHUNK = 10_000


def perturbed_messages(
    base, conversations, first_conversation: int, count: int, rng
) -> Iterator[dict]:
    """``count`` messages, each repeating the text of one of ``base`` (author, content,
    vector, model) with its vector perturbed and normalised again; by column name."""
    vectors = np.stack([row[2].to_numpy() for row in base]).astype(np.float32)
    noise = np.random.default_rng(rng.randrange(2**32))
    now = datetime.now(UTC)
    for chunk_start in range(0, count, COPY_CHUNK):
        size = min(COPY_CHUNK, count - chunk_start)
        picks = [rng.randrange(len(base)) for _ in range(size)]
        chunk = vectors[picks] + noise.normal(0, PERTURBATION, (size, vectors.shape[1]))
        chunk /= np.linalg.norm(chunk, axis=1, keepdims=True)
        for offset, (pick, vector) in enumerate(zip(picks, chunk.astype(np.float32), strict=True)):
            index = chunk_start + offset
            conversation_id, owner = conversations[
                first_conversation + index // MESSAGES_PER_CONVERSATION
            ]
            author, content, _, model = base[pick]
            yield {
                "id": uuid.uuid4(),
                "conversation_id": uuid.UUID(conversation_id),
                "channel": "history",
                "role": "user",
                "visibility": "user",
                "author_principal": owner,
                "author_name": author,
                "content": content,
                "metadata": Jsonb({}),
                "created_at": now,
                "embedding": vector,
                "embedding_model": model,
                "embedded_at": now,
            }


def copy_perturbed(
    conn, conversations, first_conversation: int, count: int, rng, *, build_memory: str
) -> dict:
    """Copy ``count`` rows repeating embedded messages with perturbed vectors
    (``perturbed_messages``), in the columns of the Message model (``MessageCopy``).

    The vector and full-text indexes are dropped for the copy and built again afterwards
    (same definitions), in ``build_memory`` of maintenance memory. Returns the seconds each
    step took."""
    base = conn.execute(
        "SELECT author_name, content, embedding, embedding_model FROM message "
        "WHERE embedding IS NOT NULL"
    ).fetchall()
    if not base:
        raise BenchError("no embedded message to copy vectors from")
    layout = MessageCopy(conn)
    definitions = dict(
        conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(%s)",
            [list(BULK_BUILT_INDEXES)],
        ).fetchall()
    )
    timings = {}
    started = time.monotonic()
    for name in definitions:
        conn.execute(f'DROP INDEX "{name}"')
    with conn.cursor() as cursor, cursor.copy(layout.statement) as copy:
        copy.set_types(layout.types)
        messages = perturbed_messages(base, conversations, first_conversation, count, rng)
        for row in layout.rows(messages):
            copy.write_row(row)
    conn.commit()
    timings["copy_seconds"] = round(time.monotonic() - started, 1)
    conn.autocommit = True
    conn.execute(f"SET maintenance_work_mem = '{build_memory}'")
    for name, definition in definitions.items():
        started = time.monotonic()
        conn.execute(definition)
        timings[f"build_{name}_seconds"] = round(time.monotonic() - started, 1)
    conn.autocommit = False
    return timings


# --- measuring --------------------------------------------------------------------------------


def measure(url, token, questions, *, mode: str, count: int, rng) -> dict:
    """Sequential searches: latency percentiles in ms and the mean number of results."""
    picked = [rng.choice(questions) for _ in range(count + 10)]
    latencies, results = [], []
    with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {token}"}) as client:
        for index, question in enumerate(picked):
            started = time.perf_counter()
            response = api_call(
                client,
                "POST",
                f"{url}/v1/user/search/messages",
                json_body={"query": question, "topK": 5, "mode": mode},
                expect=200,
            )
            elapsed = (time.perf_counter() - started) * 1000
            if index >= 10:  # the first ten warm caches up
                latencies.append(elapsed)
                results.append(len(response.json()["data"]))
    return {
        "requests": len(latencies),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p95_ms": round(percentile(latencies, 95), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "mean_results": round(sum(results) / len(results), 2),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.search", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument(
        "--http-messages", type=int, default=10_000, help="appended through the API"
    )
    parser.add_argument("--clients", type=int, default=4, help="threads appending in parallel")
    parser.add_argument("--queries", type=int, default=200, help="timed searches per user and mode")
    parser.add_argument("--mode", action="append", choices=["hybrid", "semantic", "keyword"])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--build-memory",
        default="2GB",
        help="PostgreSQL maintenance_work_mem for building the indexes after the copy "
        "(the default builds the HNSW graph of a million messages in memory: see "
        "docs/benchmarks.md)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results/search.json"))
    parser.add_argument(
        "--keep-server", action="store_true", help="leave the server running (prints its URL)"
    )
    args = parser.parse_args(argv)
    modes = args.mode or ["hybrid", "semantic", "keyword"]
    if args.http_messages > args.messages:
        parser.error("--http-messages cannot exceed --messages")
    rng = random.Random(args.seed)
    turns, questions = corpus_texts(args.data, args.seed)
    conversations_needed = -(-args.messages // MESSAGES_PER_CONVERSATION)

    client = make_client()
    server = start_private_server(client, agent_name="search-bench")
    try:
        env = private_env(server.data_dir)
        key = create_api_key(
            env, agent_name="search-bench", scopes=("read", "write", "impersonate")
        )
        client.headers["Authorization"] = f"Bearer {key}"
        secret = json.loads((server.data_dir / "secrets.json").read_text())["MEMSVC_JWT_SECRET"]

        started = time.monotonic()
        conversations = create_conversations(client, server.url, conversations_needed, args.users)
        share(server.url, secret, conversations, "auditor")
        share(server.url, secret, conversations[::100], "visitor")  # 1% of them
        setup_seconds = time.monotonic() - started
        log(f"{len(conversations)} conversations and memberships in {setup_seconds:.1f} s")

        log(f"appending {args.http_messages} messages through the API ({args.clients} clients)")
        ingest_seconds = ingest(
            server.url, key, conversations, turns, args.http_messages, args.clients, rng
        )
        ingest_rate = args.http_messages / ingest_seconds
        log(f"  accepted {ingest_rate:.0f} messages/s")
        pending_at_end = client.get(f"{server.url}/v1/health").json()["pendingEmbeddings"]
        drain_seconds = wait_for_embeddings(client, server.url)
        embed_rate_drain = pending_at_end / drain_seconds if drain_seconds else None
        embed_rate_total = args.http_messages / (ingest_seconds + drain_seconds)
        log(
            f"  embedded {embed_rate_total:.0f} messages/s overall, {embed_rate_drain or 0:.0f}/s once ingest ended"
        )

        rest = args.messages - args.http_messages
        first = -(-args.http_messages // MESSAGES_PER_CONVERSATION)
        with database(server.data_dir) as conn:
            setup_django(conn, server.data_dir)
            build = (
                copy_perturbed(
                    conn, conversations, first, rest, rng, build_memory=args.build_memory
                )
                if rest
                else {}
            )
            log(f"copied {rest} perturbed rows and rebuilt the indexes: {build}")
            conn.autocommit = True
            # Statistics for every table, as after any bulk load: the conversations and
            # memberships made through the API a minute ago may not be analysed yet, and
            # the benchmark measures the steady state, not autovacuum's next round.
            conn.execute("VACUUM ANALYZE")
            total = conn.execute("SELECT count(*) FROM message").fetchone()[0]

        results = {}
        for user in ("auditor", "visitor"):
            token = user_token(secret, user)
            for mode in modes:
                results[f"{user}/{mode}"] = measure(
                    server.url, token, questions, mode=mode, count=args.queries, rng=rng
                )
                log(f"  {user:8} {mode:8} {results[f'{user}/{mode}']}")
    finally:
        if args.keep_server:
            log(
                f"the server keeps running at {server.url} (pid {server.process.pid}, data {server.data_dir})"
            )
        else:
            server.stop()

    # (Said with the figures: an old checkout has no ../shared beside it, and its runs
    # searched generated texts, not comparable: docs/benchmarks.md.)
    locomo = args.data.exists()
    texts = f"LoCoMo texts from {args.data}" if locomo else "GENERATED texts"
    print(
        f"\nsearch benchmark: {total} messages, {len(conversations)} conversations, "
        f"{args.users} users, {texts}"
    )
    print(
        f"ingest: {ingest_rate:.0f} messages/s accepted ({args.http_messages} through the API, {args.clients} clients)"
    )
    print(
        f"embedding: {embed_rate_total:.0f} messages/s overall, {embed_rate_drain or 0:.0f}/s after ingest"
    )
    print(f"\n{'user':10}{'mode':10}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'results':>9}")
    for name, row in results.items():
        user, mode = name.split("/")
        print(
            f"{user:10}{mode:10}{row['p50_ms']:9.1f}{row['p95_ms']:9.1f}{row['p99_ms']:9.1f}{row['mean_results']:9.1f}"
        )
    path = write_json(
        args.out,
        {
            "config": vars(args) | {"modes": modes, "data": str(args.data), "out": str(args.out)},
            "messages": total,
            "conversations": len(conversations),
            "visitor_conversations": len(conversations[::100]),
            "setup_seconds": round(setup_seconds, 1),
            "ingest_messages_per_second": round(ingest_rate, 1),
            "embedding_messages_per_second": round(embed_rate_total, 1),
            "embedding_messages_per_second_after_ingest": round(embed_rate_drain or 0, 1),
            "corpus_build": build,
            "texts": "locomo" if locomo else "generated",
            "latency": results,
        },
    )
    print(f"\nresults written to {path}")
    return 0


if __name__ == "__main__":
    exit_with(main)
