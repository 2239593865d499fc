"""Loading LoCoMo into memsvc through the agent API (one conversation per sample, one
message per turn), or finding what a previous run loaded (``--skip-load``)."""

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx

from bench.common import BenchError, api_call, log
from bench.locomo.dataset import Observation, Sample, Turn

MAX_MESSAGES_PER_APPEND = 100
MAX_BATCH = 100  # memories per save: the API's limit
PAGE_LIMIT = 200
REQUEST_RETRIES = 2


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


# --- observations as memories -----------------------------------------------------------


@dataclass
class LoadedMemories:
    """What the agent keeps about one sample's user: memory id -> the turns it cites."""

    user_id: str
    evidence: dict[str, set[str]] = field(default_factory=dict)
    saved: int = 0
    merged: list[dict] = field(default_factory=list)  # an observation merged into another


def memory_payload(observation: Observation, message_ids: Mapping[str, str] | None) -> dict:
    """An observation as a memory; with ``message_ids`` (dia_id -> message id), citing the
    loaded turns it rests on."""
    payload = {
        "content": observation.text,
        "metadata": {
            "session": observation.session,
            "speaker": observation.speaker,
            "evidence": list(observation.evidence),
        },
    }
    if message_ids is not None:
        payload["messageIds"] = [message_ids[e] for e in observation.evidence if e in message_ids]
    return payload


def load_observations(
    client: httpx.Client,
    url: str,
    samples: list[Sample],
    conversations: Mapping[str, LoadedConversation] | None = None,
) -> dict[str, LoadedMemories]:
    """Every sample's observations as memories of user ``sample_id``; sample_id -> loaded.
    With the samples' ``conversations`` (loaded first), each memory cites its turns.

    Not retried: a batch sent twice would be merged into itself. A merge is seen by id: the
    saved memory comes back as the one it was merged into."""
    loaded = {}
    for sample in samples:
        memories = LoadedMemories(user_id=sample.sample_id)
        cited = conversations[sample.sample_id].message_ids if conversations else None
        texts: dict[str, str] = {}
        started = time.monotonic()
        for start in range(0, len(sample.observations), MAX_BATCH):
            batch = sample.observations[start : start + MAX_BATCH]
            response = api_call(
                client,
                "POST",
                f"{url}/v1/agent/memories/batch",
                expect=201,
                json_body={
                    "userId": memories.user_id,
                    "memories": [memory_payload(o, cited) for o in batch],
                },
            )
            saved = response.json()["data"]
            if len(saved) != len(batch):
                raise BenchError(f"saving {len(batch)} memories returned {len(saved)}")
            for observation, memory in zip(batch, saved, strict=True):
                if memory["userId"] != memories.user_id:
                    raise BenchError(f"memory {memory['id']} saved for {memory['userId']!r}")
                if memory["id"] in memories.evidence:
                    memories.merged.append({"text": observation.text, "into": texts[memory["id"]]})
                else:
                    texts[memory["id"]] = memory["content"]
                memories.evidence.setdefault(memory["id"], set()).update(observation.evidence)
            memories.saved += len(batch)
        loaded[sample.sample_id] = memories
        log(
            f"  {sample.sample_id}: {memories.saved} observations -> {len(memories.evidence)} "
            f"memories ({len(memories.merged)} merged) in {time.monotonic() - started:.1f} s"
        )
    return loaded
