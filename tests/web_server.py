"""The web app as ``memsvc serve`` runs it (gunicorn, the same options), on this checkout's
code, in a process of its own: for what only a real server shows (keep-alive connections,
several processes sharing state, a database that is down)."""

import os
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
START_DEADLINE_SECONDS = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class WebServer:
    def __init__(self, tmp_path: Path, env: dict[str, str], *, workers: int = 1):
        from memsvc.cli import _web_command

        tmp_path.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"gunicorn-{self.port}.log"
        command = _web_command("127.0.0.1", self.port)
        command[command.index("--workers") + 1] = str(workers)
        # Without the embedding model's warm-up (memsvc.gunicorn_conf): these tests search
        # nothing, and loading it would slow their start on a busy machine.
        config = command.index("--config")
        del command[config : config + 2]
        full_env = {
            **os.environ,
            "MEMSVC_DATA_DIR": str(tmp_path / "data"),
            "PYTHONPATH": str(ROOT),
            **env,
        }
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            self._wait_until_listening()
        except BaseException:
            # (A server that did not answer was left running by the failed test: a gunicorn
            # whose parent was gone still ran an hour later.)
            self.stop()
            raise

    def _wait_until_listening(self) -> None:
        deadline = time.monotonic() + START_DEADLINE_SECONDS
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            try:
                httpx.get(f"{self.url}/v1/health", timeout=5)
                return
            except httpx.TransportError:
                time.sleep(0.2)
        pytest.fail(f"gunicorn did not answer in time:\n{self.log.read_text()}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def shared_database_env() -> dict[str, str]:
    """The environment that points a server at the database the tests use, in local mode
    (keyless loopback trust, rate limits counted in the database)."""
    from django.db import connection

    db = connection.settings_dict
    return {
        "DATABASE_URL": f"postgres://{db['USER']}@{quote(db['HOST'], safe='')}:{db['PORT']}/{db['NAME']}",
        "MEMSVC_LOCAL_MODE": "1",
        "DJANGO_SECRET_KEY": "test-secret-key-" + "x" * 40,
    }


def raw_exchange(sock: socket.socket, request: bytes) -> bytes:
    """Send one HTTP/1.1 request on ``sock`` and read its whole response (by Content-Length)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return head + b"\r\n\r\n" + body
