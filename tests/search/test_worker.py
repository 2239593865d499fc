"""A real Celery worker, fed through Redis, embeds a message end to end."""

import base64
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from conversations.models import Message
from tests.db import database_url
from tests.search.conftest import sent_to_broker

REDIS_URL = "redis://127.0.0.1:6379/14"
DEADLINE_SECONDS = 120  # a ceiling for a slow machine (the model loads in ~6 s here)


@pytest.fixture
def redis_broker():
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"this test needs Redis on {REDIS_URL}: {exc}")
    queue = f"memsvc-test-{uuid.uuid4().hex[:8]}"
    with sent_to_broker(broker_url=REDIS_URL, task_default_queue=queue):
        yield queue
    redis.Redis.from_url(REDIS_URL).delete(queue)


@pytest.fixture
def worker(redis_broker, tmp_path):
    env = {
        **os.environ,
        "CELERY_BROKER_URL": REDIS_URL,
        "DATABASE_URL": database_url(),
        "MEMSVC_LOCAL_MODE": "1",  # the test data dir's secrets, as the tests use
    }
    log = (tmp_path / "worker.log").open("w")
    # `memsvc worker` as an operator starts it (its supervisor and a Celery worker under
    # it), with Celery's own options after "--": one process, on this test's queue.
    process = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("memsvc")),
            "worker",
            "--",
            "--pool",
            "solo",
            "--queues",
            redis_broker,
            "--loglevel",
            "INFO",
            "--without-mingle",
            "--without-gossip",
            "--hostname",
            f"{redis_broker}@%h",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    yield process, tmp_path / "worker.log"
    process.terminate()
    process.wait(timeout=30)
    log.close()


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_embeds_a_message_through_redis(api, alice, worker):
    process, log = worker
    conversation = api.post("/v1/user/conversations", {}, as_=alice).json()
    response = api.post(
        f"/v1/user/conversations/{conversation['id']}/messages",
        {"content": "Caroline went to the support group"},
        as_=alice,
    )
    assert response.status_code == 201
    message = Message.objects.get(id=response.json()["id"])

    deadline = time.monotonic() + DEADLINE_SECONDS
    while message.embedded_at is None and time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        time.sleep(0.5)
        message.refresh_from_db()

    assert message.embedded_at is not None, log.read_text()
    assert message.embedding_model == "all-MiniLM-L6-v2@int8"
    assert "search.embed_messages" in log.read_text()
    found = api.post(
        "/v1/user/search/messages", {"query": "support group", "mode": "semantic"}, as_=alice
    ).json()["data"]
    assert found[0]["message"]["id"] == str(message.id)


def malformed_task(queue: str) -> str:
    """A message as kombu's Redis transport writes one, named as an embedding task, whose
    body (``[]``) is not a task's ``[args, kwargs, embed]``."""
    return json.dumps(
        {
            "body": base64.b64encode(b"[]").decode(),
            "headers": {"task": "search.embed_messages", "id": str(uuid.uuid4()), "lang": "py"},
            "content-type": "application/json",
            "content-encoding": "utf-8",
            "properties": {
                "delivery_tag": str(uuid.uuid4()),
                "delivery_info": {"exchange": "", "routing_key": queue},
                "body_encoding": "base64",
                "priority": 0,
            },
        }
    )


@pytest.mark.django_db(transaction=True)
def test_a_message_that_is_no_task_is_rejected_and_the_worker_goes_on(api, alice, worker):
    """Its unpacking ended the worker; Redis gave it back to the next worker, which ended
    too, and nothing was embedded again (review). Rejected, logged, and the next message
    embedded by the same worker."""
    process, log = worker
    queue = process.args[process.args.index("--queues") + 1]
    redis.Redis.from_url(REDIS_URL).lpush(queue, malformed_task(queue))
    conversation = api.post("/v1/user/conversations", {}, as_=alice).json()
    response = api.post(
        f"/v1/user/conversations/{conversation['id']}/messages",
        {"content": "Caroline went to the support group"},
        as_=alice,
    )
    message = Message.objects.get(id=response.json()["id"])
    deadline = time.monotonic() + DEADLINE_SECONDS
    while message.embedded_at is None and time.monotonic() < deadline:
        time.sleep(0.5)
        message.refresh_from_db()
    said = log.read_text()
    assert message.embedded_at is not None, said
    assert "the message's body is not a task's" in said
    assert "Unrecoverable error" not in said
