"""The web server's workers share the connections clients make together
(``memsvc.web_worker``): gunicorn with the worker class ``memsvc serve`` runs, serving an
application that answers with its process id."""

import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from memsvc.cli import _web_command
from tests.web_server import free_port

ROOT = Path(__file__).resolve().parents[2]
CONNECTIONS = 16  # bench.load's clients
START_DEADLINE_SECONDS = 60


async def app(scope, receive, send):
    """An ASGI application whose answer is the id of the process that serves it."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = str(os.getpid()).encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def worker_class() -> str:
    command = _web_command("127.0.0.1", 0)
    return command[command.index("--worker-class") + 1]


@pytest.fixture
def two_workers(tmp_path):
    port = free_port()
    log = tmp_path / "gunicorn.log"
    command = [
        *(sys.executable, "-m", "gunicorn", f"{__name__}:app"),
        *("--bind", f"127.0.0.1:{port}", "--workers", "2", "--worker-class", worker_class()),
        *("--no-control-socket", "--log-level", "info"),
    ]
    with log.open("w") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_DEADLINE_SECONDS
        while len(re.findall("Application startup complete", log.read_text())) < 2:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield port, psutil.Process(process.pid).children()
    finally:
        process.terminate()
        process.wait(timeout=20)


def served_by(port: int, workers: list[psutil.Process]) -> Counter:
    """How many of ``CONNECTIONS`` connections each worker took (by its process id), all
    made while the workers were stopped: waiting together when they wake, as a pool's
    connections made at once are."""
    for worker in workers:
        worker.suspend()
    try:
        connections = [socket.create_connection(("127.0.0.1", port)) for _ in range(CONNECTIONS)]
    finally:
        for worker in workers:
            worker.resume()
    pids = Counter()
    try:
        for connection in connections:
            connection.sendall(b"GET / HTTP/1.1\r\nHost: memsvc\r\n\r\n")
        for connection in connections:
            pids[int(body_of(connection))] += 1
    finally:
        for connection in connections:
            connection.close()
    return pids


def body_of(connection: socket.socket) -> bytes:
    """The body of the answer ``connection`` receives."""
    received = b""
    while True:
        chunk = connection.recv(4096)
        assert chunk, "the connection was closed"
        received += chunk
        head, blank, body = received.partition(b"\r\n\r\n")
        if blank:
            length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
            if len(body) >= length:
                return body[:length]


def test_connections_made_together_are_shared_by_the_workers(two_workers):
    """uvicorn's own worker took every connection waiting at its wake-up: a client's 16
    kept-alive connections all went to one web process, which served every request while
    the other idled (``bench.load``: 38 s of CPU against 3). Taking one a wake-up was not
    enough on a busy machine: the worker that ran first came back for the next before the
    other ran (review), so each gives the others the processor after a connection."""
    port, workers = two_workers
    pids = served_by(port, workers)
    # Both take some: how many each is up to the scheduler (7 / 9 to 8 / 8 on a quiet
    # machine, 15 / 1 once in a CI run of three test processes; uvicorn's own worker gave
    # one all 16 in 4 of 4 runs here, 11 of 12 in a review's).
    assert len(pids) == 2, pids
