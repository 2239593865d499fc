"""What the benchmarks share: a private memsvc server, waiting for it, API calls, statistics,
and writing results.

A private server is ``memsvc serve --port <free port>`` run with ``MEMSVC_DATA_DIR`` set to a
fresh temporary directory (so it brings up its own embedded PostgreSQL and local queue) and
without ``DATABASE_URL`` or ``CELERY_BROKER_URL`` (either would point it at shared
infrastructure: another database, or a broker whose workers cannot see its database). Its
output goes to ``server.log`` in that directory, whose tail is printed when it fails.
"""

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

HEALTH_TIMEOUT_SECONDS = 120.0
EXTERNAL_HEALTH_TIMEOUT_SECONDS = 15.0
EMBEDDING_TIMEOUT_SECONDS = 15 * 60.0
STOP_TIMEOUT_SECONDS = 60.0
APIKEY_TIMEOUT_SECONDS = 120.0
POLL_SECONDS = 0.5
PROGRESS_SECONDS = 5.0
REQUEST_TIMEOUT_SECONDS = 120.0
# Environment variables a private server must not inherit (see the module docstring).
SHARED_INFRASTRUCTURE_VARIABLES = ("DATABASE_URL", "CELERY_BROKER_URL")


class BenchError(Exception):
    """A benchmark cannot go on; the message says why (printed without a traceback)."""


class ApiError(BenchError):
    """An API call answered with an unexpected status."""

    def __init__(self, method: str, url: str, status: int, body: str, expected: int):
        self.status = status
        self.body = body
        super().__init__(f"{method} {url} -> HTTP {status} (expected {expected}): {body[:2000]}")


def log(message: str) -> None:
    """Progress for the person watching, on stderr (stdout is kept for results)."""
    print(message, file=sys.stderr, flush=True)


# --- HTTP -------------------------------------------------------------------------------------


def exit_with(main) -> None:
    """Run a benchmark's ``main()`` as the process: its status the exit status, a
    ``BenchError`` one line on stderr and status 1 (for the modules whose ``main`` lets it
    out)."""
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


def make_client(api_key: str | None = None) -> httpx.Client:
    """One keep-alive client for the whole run; ``authorize`` adds the key later if needed."""
    client = httpx.Client(timeout=REQUEST_TIMEOUT_SECONDS)
    if api_key:
        authorize(client, api_key)
    return client


def authorize(client: httpx.Client, api_key: str) -> None:
    """Send ``api_key`` as a bearer token on every later request of ``client``."""
    client.headers["Authorization"] = f"Bearer {api_key}"


def api_call(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    expect: int = 200,
    json_body=None,
    params: dict | None = None,
    headers: dict | None = None,
    retries: int = 0,
) -> httpx.Response:
    """``method url``; raises ``ApiError`` unless the status is ``expect``.

    Only transport errors (a dropped connection) are retried, ``retries`` times: callers
    pass retries only for requests that are safe to repeat (reads, searches, appends with an
    ``Idempotency-Key``).
    """
    for attempt in range(retries + 1):
        try:
            response = client.request(method, url, json=json_body, params=params, headers=headers)
            break
        except httpx.TransportError as exc:
            if attempt == retries:
                raise BenchError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
            time.sleep(0.5 * 2**attempt)
    if response.status_code != expect:
        raise ApiError(method, url, response.status_code, response.text, expect)
    return response


def get_health(client: httpx.Client, url: str) -> tuple[int, dict]:
    """``GET /v1/health``: (status, body); (0, {}) when nothing answers."""
    try:
        response = client.get(f"{url}/v1/health", timeout=10)
    except httpx.TransportError:
        return 0, {}
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, {}


def wait_for_health(
    client: httpx.Client,
    url: str,
    *,
    timeout: float = HEALTH_TIMEOUT_SECONDS,
    server: "PrivateServer | None" = None,
) -> dict:
    """Poll ``/v1/health`` until it answers 200; its body. Fails early if ``server`` dies."""
    deadline = time.monotonic() + timeout
    status, body = 0, {}
    while time.monotonic() < deadline:
        status, body = get_health(client, url)
        if status == 200:
            return body
        if server is not None and server.process.poll() is not None:
            raise BenchError(
                f"memsvc serve exited with {server.process.returncode} before it was healthy\n"
                f"{server.log_tail()}"
            )
        time.sleep(POLL_SECONDS)
    tail = f"\n{server.log_tail()}" if server else ""
    raise BenchError(
        f"{url}/v1/health did not answer 200 within {timeout:.0f} s "
        f"(last: HTTP {status} {body}){tail}"
    )


def wait_for_embeddings(
    client: httpx.Client, url: str, *, timeout: float = EMBEDDING_TIMEOUT_SECONDS
) -> float:
    """Poll ``/v1/health`` until ``pendingEmbeddings`` is 0, printing progress; the seconds
    waited. The backlog counts every message of the server, not only ours."""
    started = time.monotonic()
    last_report = 0.0
    last_pending = None
    while True:
        status, body = get_health(client, url)
        pending = body.get("pendingEmbeddings") if status == 200 else None
        elapsed = time.monotonic() - started
        if pending == 0:
            log(f"  embeddings: backlog empty after {elapsed:.1f} s")
            return elapsed
        if elapsed > timeout:
            raise BenchError(
                f"embedding backlog not empty after {timeout:.0f} s "
                f"(pendingEmbeddings={pending}, health HTTP {status} {body})"
            )
        if elapsed - last_report >= PROGRESS_SECONDS or last_pending is None:
            rate = ""
            if last_pending is not None and pending is not None and elapsed > last_report:
                rate = f", {(last_pending - pending) / (elapsed - last_report):.0f}/s"
            shown = pending if pending is not None else f"unknown (HTTP {status})"
            log(f"  embeddings: {shown} pending after {elapsed:.0f} s{rate}")
            last_report, last_pending = elapsed, pending
        time.sleep(POLL_SECONDS)


# --- a private server -------------------------------------------------------------------------


def memsvc_executable() -> str:
    """The ``memsvc`` console script of this interpreter's environment, else the one on PATH."""
    beside = Path(sys.executable).with_name("memsvc")
    if beside.exists():
        return str(beside)
    found = shutil.which("memsvc")
    if found is None:
        raise BenchError("no memsvc command: run with the project's .venv/bin/python")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (another process could take it before us: unlikely)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# The checkout these benchmarks belong to. Its code is what a private server runs: the
# environment's editable install may point at another checkout (a git worktree shares the
# main checkout's .venv), and ``memsvc serve`` would then migrate with that one's code.
CHECKOUT = Path(__file__).resolve().parents[1]


def private_env(data_dir: Path) -> dict[str, str]:
    """This process's environment for a server of its own in ``data_dir``, running the code
    of this checkout (first on ``PYTHONPATH``)."""
    env = dict(os.environ)
    for name in SHARED_INFRASTRUCTURE_VARIABLES:
        env.pop(name, None)
    env["MEMSVC_DATA_DIR"] = str(data_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHECKOUT), env.get("PYTHONPATH")]))
    # A benchmark's clients share one key and one address: they measure the service, not
    # the per-principal rate limit (1,200 a minute by default), unless asked to.
    env.setdefault("MEMSVC_RATE_LIMIT", "0")
    return env


@dataclass
class PrivateServer:
    """A ``memsvc serve`` this benchmark started, with an agent API key of its own."""

    url: str
    data_dir: Path
    process: subprocess.Popen
    log_path: Path
    api_key: str = ""

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's output, to explain a failure."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"(no server log at {self.log_path})"
        return f"--- last lines of {self.log_path} ---\n" + "\n".join(text)

    def stop(self, *, remove_data: bool = True) -> None:
        """SIGTERM, wait (memsvc stops gunicorn, the worker and PostgreSQL), then clean up."""
        if self.process.poll() is None:
            log(f"stopping the private server (pid {self.process.pid})")
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                log(f"  no exit after {STOP_TIMEOUT_SECONDS:.0f} s: killing its process group")
                # The server runs in a session of its own: its group is only its children.
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if remove_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def _stop_on_sigterm(signum, frame) -> None:
    log("terminated (SIGTERM)")
    raise SystemExit(128 + signum)


def stopped_on_sigterm() -> None:
    """A SIGTERM (``kill``, a timeout) raises SystemExit in the main thread, which unwinds
    through the ``finally`` blocks that stop a private server: it ended the benchmark and
    left its server running (a whole ``memsvc serve`` with 100,000 messages, for hours)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop_on_sigterm)


def start_private_server(
    client: httpx.Client, *, agent_name: str, serve_args: tuple[str, ...] = ()
) -> PrivateServer:
    """Start ``memsvc serve`` on a free port in a fresh data directory, wait until it is
    healthy, and create an agent key with the read and write scopes. From now on a SIGTERM
    stops it too (``stopped_on_sigterm``)."""
    stopped_on_sigterm()
    data_dir = Path(tempfile.mkdtemp(prefix="memsvc-bench-"))
    env = private_env(data_dir)
    port = free_port()
    log_path = data_dir / "server.log"
    command = [memsvc_executable(), "serve", "--port", str(port), *serve_args]
    log(f"starting a private server: {' '.join(command)} (MEMSVC_DATA_DIR={data_dir})")
    with log_path.open("wb") as log_file:
        # A session of its own: a Ctrl-C in the terminal reaches only us, and we stop it.
        process = subprocess.Popen(  # noqa: S603 (our own console script)
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = PrivateServer(
        url=f"http://127.0.0.1:{port}", data_dir=data_dir, process=process, log_path=log_path
    )
    try:
        started = time.monotonic()
        wait_for_health(client, server.url, server=server)
        log(f"  healthy after {time.monotonic() - started:.1f} s at {server.url}")
        server.api_key = create_api_key(env, agent_name=agent_name)
    except BaseException:
        server.stop(remove_data=False)
        log(f"  (its data directory is kept for inspection: {data_dir})")
        raise
    return server


def create_api_key(
    env: dict[str, str], *, agent_name: str, scopes: tuple[str, ...] = ("read", "write")
) -> str:
    """``memsvc apikey create <agent_name> --scope ...`` with ``env``; the key it prints last."""
    command = [memsvc_executable(), "apikey", "create", agent_name]
    for scope in scopes:
        command += ["--scope", scope]
    result = subprocess.run(  # noqa: S603 (our own console script)
        command, env=env, capture_output=True, text=True, timeout=APIKEY_TIMEOUT_SECONDS
    )
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not lines:
        raise BenchError(
            f"{' '.join(command)} failed (exit {result.returncode}):\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return lines[-1]


@contextlib.contextmanager
def benchmark_server(
    client: httpx.Client,
    *,
    url: str | None,
    api_key: str | None,
    keep: bool,
    agent_name: str,
    serve_args: tuple[str, ...] = (),
) -> Iterator[tuple[str, PrivateServer | None]]:
    """The server to benchmark: ``url`` (with ``api_key``) or a private one, stopped on the
    way out (also on errors, Ctrl-C and SIGTERM-as-SystemExit). With ``keep`` it stays up
    after a finished run or an error (to rerun against it), but not after an interruption
    or when it died. Yields (url, private server or None); ``client`` is authorized with the
    key either way."""
    if url:
        if not api_key:
            raise BenchError("--url needs --api-key")
        authorize(client, api_key)
        # A server that is already running answers at once: fail fast on a wrong URL.
        wait_for_health(client, url.rstrip("/"), timeout=EXTERNAL_HEALTH_TIMEOUT_SECONDS)
        yield url.rstrip("/"), None
        return
    server = start_private_server(client, agent_name=agent_name, serve_args=serve_args)
    authorize(client, server.api_key)
    keep_it = keep
    try:
        yield server.url, server
    except (KeyboardInterrupt, SystemExit):
        keep_it = False  # an interrupted run may have loaded half of its data: not worth keeping
        raise
    except BaseException:
        if server.process.poll() is not None:
            log(f"the private server exited with {server.process.returncode}\n{server.log_tail()}")
            keep_it = False
        raise
    finally:
        if keep_it:
            log(
                "the private server keeps running:\n"
                f"  url      {server.url}\n"
                f"  api key  {server.api_key}\n"
                f"  pid      {server.process.pid} (stop it with: kill -TERM {server.process.pid})\n"
                f"  data dir {server.data_dir} (remove it once stopped)\n"
                f"  log      {server.log_path}"
            )
        else:
            server.stop()


# --- statistics and results -------------------------------------------------------------------


def percentile(values, p: float) -> float | None:
    """The ``p``-th percentile (0..100) by linear interpolation (numpy's default); None when
    there are no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * p / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def mean(values) -> float | None:
    """The arithmetic mean; None when there are no values."""
    values = list(values)
    return sum(values) / len(values) if values else None


def write_json(path: Path, data) -> Path:
    """Write ``data`` as indented JSON to ``path``, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    return path
