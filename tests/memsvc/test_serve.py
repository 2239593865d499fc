"""``memsvc serve`` as a user runs it: a real process tree on a free port, stopped by SIGTERM."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

MEMSVC = Path(sys.executable).parent / "memsvc"
START_DEADLINE_SECONDS = 60  # a generous ceiling for slow CI machines, not a speed target


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Served:
    def __init__(self, tmp_path: Path):
        self.data_dir = tmp_path / "data"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / "serve.log"
        env = {
            **os.environ,
            "MEMSVC_DATA_DIR": str(self.data_dir),
            "MEMORY_SERVER_PORT": str(self.port),
            "MEMSVC_WEB_WORKERS": "1",
        }
        env.pop("DATABASE_URL", None)
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [str(MEMSVC), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def wait_until_healthy(self) -> httpx.Response:
        deadline = time.monotonic() + START_DEADLINE_SECONDS
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            try:
                return httpx.get(f"{self.url}/v1/health", timeout=2)
            except httpx.TransportError:
                time.sleep(0.2)
        pytest.fail(f"memsvc serve did not answer in time:\n{self.log.read_text()}")

    def postmaster(self) -> psutil.Process:
        pid = int((self.data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
        return psutil.Process(pid)

    def process_tree(self) -> list[psutil.Process]:
        return [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(True)]

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)

    def kill(self) -> None:
        if self.process.poll() is None:
            for proc in reversed(self.process_tree()):
                proc.kill()


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def served(tmp_path):
    served = Served(tmp_path)
    yield served
    served.kill()


def test_serve_answers_health_and_stops_everything_on_sigterm(served):
    response = served.wait_until_healthy()
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    assert response.json()["database"] == "embedded"
    # Made by `serve` itself, so a client can read the JWT secret of the running server.
    assert (served.data_dir / "secrets.json").exists()

    # The admin's static files are served by the same process (WhiteNoise).
    css = httpx.get(f"{served.url}/static/admin/css/base.css", timeout=5)
    assert css.status_code == 200
    assert httpx.get(f"{served.url}/admin/login/", timeout=5).status_code == 200

    tree = served.process_tree()
    commands = " ".join(" ".join(p.cmdline()) for p in tree)
    assert "gunicorn" in commands
    assert "celery" in commands
    postmaster = served.postmaster()
    assert alive(postmaster)

    assert served.terminate() == 0
    left = [p for p in [*tree, postmaster] if alive(p)]
    assert left == [], served.log.read_text()


def test_health_is_503_with_a_reason_while_the_database_is_down(served):
    assert served.wait_until_healthy().status_code == 200

    postmaster = served.postmaster()
    postmaster.send_signal(signal.SIGINT)  # PostgreSQL's "fast shutdown"
    postmaster.wait(timeout=30)

    response = httpx.get(f"{served.url}/v1/health", timeout=10)
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert "database unreachable" in body["reason"]
    assert served.terminate() == 0
