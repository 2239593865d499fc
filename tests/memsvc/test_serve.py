"""``memsvc serve`` as a user runs it: a real process tree on a free port, stopped by SIGTERM."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.local_http import LocalHttpServer, Reply

# This checkout's code (a worktree shares the environment, whose console script may import
# another checkout's).
CHECKOUT = Path(__file__).resolve().parents[2]
MEMSVC = [sys.executable, "-m", "memsvc.cli"]
START_DEADLINE_SECONDS = 60  # a generous ceiling for slow CI machines, not a speed target
RECOVERY_DEADLINE_SECONDS = 90  # the same for a restart (a worker loads its model again)
SLOW_CLIENTS = 16  # more than the 8 request threads the review starved with 12
PROBE_TIMEOUT_SECONDS = 5


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Served:
    def __init__(self, tmp_path: Path, **env: str):
        self.data_dir = tmp_path / "data"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / "serve.log"
        env = {
            **os.environ,
            "MEMSVC_DATA_DIR": str(self.data_dir),
            "MEMORY_SERVER_PORT": str(self.port),
            "MEMSVC_WEB_WORKERS": "1",
            "MEMSVC_WORKER_CONCURRENCY": "1",
            "PYTHONPATH": str(CHECKOUT),
            **env,
        }
        env.pop("DATABASE_URL", None)
        env.pop("CELERY_BROKER_URL", None)
        env.pop("MEMSVC_WORKER_NICE", None)  # (the default's, tested)
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [*MEMSVC, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=CHECKOUT
            )

    def wait_until_healthy(self) -> httpx.Response:
        """Its health's first answer, once it says it listens: a server of another test that
        had taken the port meanwhile (``free_port`` frees it before this binds it) answered
        first, and the test went on talking to it (a 404 in CI)."""
        deadline = time.monotonic() + START_DEADLINE_SECONDS
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            if "serving on" not in self.log.read_text():
                time.sleep(0.2)
                continue
            try:
                return httpx.get(f"{self.url}/v1/health", timeout=2)
            except httpx.TransportError:
                time.sleep(0.2)
        pytest.fail(f"memsvc serve did not answer in time:\n{self.log.read_text()}")

    def postmaster(self) -> psutil.Process:
        pid = int((self.data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
        return psutil.Process(pid)

    def child(self, role: str) -> psutil.Process | None:
        """The living child of ``memsvc serve`` running ``role`` ("gunicorn", "worker",
        "beat"); None while there is not exactly one (one just killed and not yet reaped)."""
        found = []
        for child in psutil.Process(self.process.pid).children():
            try:
                if child.status() != psutil.STATUS_ZOMBIE and role in child.cmdline():
                    found.append(child)
            except psutil.Error:
                continue
        return found[0] if len(found) == 1 else None

    def wait_for(self, condition, what: str, deadline: float = RECOVERY_DEADLINE_SECONDS):
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            assert self.process.poll() is None, self.log.read_text()
            found = condition()
            if found:
                return found
            time.sleep(0.2)
        pytest.fail(f"{what}: not within {deadline} s\n{self.log.read_text()}")

    def process_tree(self) -> list[psutil.Process]:
        return [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(True)]

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)

    def kill(self) -> None:
        if self.process.poll() is None:
            for proc in reversed(self.process_tree()):
                proc.kill()
        # An embedded PostgreSQL started again after a test killed it is not always a child
        # of `serve` (it was left running after every run of the suite).
        with contextlib.suppress(OSError, ValueError, psutil.Error):
            postmaster = self.postmaster()
            if postmaster.name() == "postgres":
                postmaster.kill()


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One ``memsvc serve`` for the tests that break a part of it and watch it mended: each
    leaves it running and healthy for the next (starting one costs ~15 s: initdb, migrations,
    the worker's model; 25 s on a slow host). Its start is a first one (the model's int8
    graph still to make: ``test_the_first_start_makes_...``), and its stop is the module's
    last test (``test_sigterm_stops_everything``)."""
    directory = tmp_path_factory.mktemp("shared")
    cache = directory / "models"
    cache.mkdir()
    # The float32 graph from the suite's cache, if made (else `serve` exports it too: ~10 s
    # more); the int8 graph, made from it, is left to make.
    for graph in Path(os.environ["MEMSVC_MODEL_CACHE_DIR"]).glob("*.onnx"):
        if not graph.name.endswith("-int8.onnx"):
            shutil.copy(graph, cache)
    served = Served(directory, MEMSVC_MODEL_CACHE_DIR=str(cache))
    served.cache = cache
    yield served
    served.kill()


def test_the_first_start_makes_the_models_graph_before_it_answers(shared):
    """A search of a new data directory waited for the model's graph (an export and a
    quantisation: seconds), and a context request of ``learning()`` that waited past the
    client's 10 s went on without memory (``bench.learning``'s first minute). ``serve``
    makes the graph before it answers. And it answers health, the admin and its static
    files, with every part of the service running."""
    served = shared
    # "serving on" is said once the web server listens: a client that read it and called
    # was refused (it was said as the web server was started; review).
    deadline = time.monotonic() + START_DEADLINE_SECONDS
    while "serving on" not in served.log.read_text():  # (read closely: the race is short)
        assert time.monotonic() < deadline and served.process.poll() is None
        time.sleep(0.002)
    socket.create_connection(("127.0.0.1", served.port), timeout=5).close()
    assert f"memsvc: serving on {served.url}\n" in served.log.read_text()
    response = served.wait_until_healthy()
    assert list(served.cache.glob("*-int8.onnx")) != [], served.log.read_text()
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    assert response.json()["database"] == "embedded"
    # Made by `serve` itself, so a client can read the JWT secret of the running server.
    assert (served.data_dir / "secrets.json").exists()

    # The admin's static files are served by the same process (WhiteNoise).
    css = httpx.get(f"{served.url}/static/admin/css/base.css", timeout=5)
    assert css.status_code == 200
    assert httpx.get(f"{served.url}/admin/login/", timeout=5).status_code == 200

    commands = " ".join(" ".join(p.cmdline()) for p in served.process_tree())
    assert "gunicorn" in commands
    assert "memsvc.asgi:application" in commands
    assert "celery -A memsvc.celery worker" in commands
    assert "celery -A memsvc.celery beat" in commands
    assert alive(served.postmaster())


def test_the_graph_is_made_by_a_child_that_a_stop_ends_at_once(tmp_path):
    """The export loads torch and the model: made by a child of its own, so that the
    supervisor, which lives as long as the service, does not hold them for good (780 MB).
    It takes seconds (more on a slow host): a SIGTERM meanwhile ends it and ``serve`` at
    once, not once the export is done."""
    served = Served(tmp_path, MEMSVC_MODEL_CACHE_DIR=str(tmp_path / "models"))
    try:
        making = served.wait_for(lambda: served.child("prepare-model"), "a child makes the graph")
        time.sleep(1)  # (under way: loading torch, exporting)
        stopped = time.monotonic()
        assert served.terminate() == 0
        assert time.monotonic() - stopped < 5, served.log.read_text()
        assert not alive(making)
        assert list((tmp_path / "models").glob("*-int8.onnx")) == []
    finally:
        served.kill()


def replaced(served, role: str, old: psutil.Process) -> bool:
    new = served.child(role)
    return new is not None and new.pid != old.pid and alive(new)


def healthy(served) -> bool:
    try:
        return httpx.get(f"{served.url}/v1/health", timeout=10).status_code == 200
    except httpx.TransportError:
        return False


def test_the_access_log_shows_no_querys_values(shared):
    """A key, a token or a password a client put in the address, and what a person
    searched for, were kept in clear in the access log (review)."""
    shared.wait_until_healthy()
    secret = "msk_0123456789ab_NotARealSecretButKeptOutAnyway"
    answer = httpx.get(f"{shared.url}/v1/agent/me?api_key={secret}&q=my+diagnosis", timeout=10)
    assert answer.status_code == 401
    line = shared.wait_for(
        lambda: next(
            (x for x in shared.log.read_text().splitlines() if "/v1/agent/me?" in x), None
        ),
        "the request's access log line",
    )
    assert "/v1/agent/me?api_key=…&q=…" in line and secret not in shared.log.read_text()
    assert "diagnosis" not in shared.log.read_text()


def test_health_is_503_with_a_reason_while_the_database_is_down(shared):
    served = shared
    assert served.wait_until_healthy().status_code == 200
    supervisor = psutil.Process(served.process.pid)
    supervisor.suspend()  # or it starts the database again before we look
    try:
        postmaster = served.postmaster()
        postmaster.send_signal(signal.SIGINT)  # PostgreSQL's "fast shutdown"
        postmaster.wait(timeout=30)

        response = httpx.get(f"{served.url}/v1/health", timeout=20)
        assert response.status_code == 503
        body = response.json()
        assert body["status"] == "unavailable"
        assert "database unreachable" in body["reason"]
    finally:
        supervisor.resume()
    served.wait_for(lambda: healthy(served), "health 200 again")  # for the next test


def test_a_stopped_database_is_started_again(shared):
    served = shared
    served.wait_until_healthy()
    postmaster = served.postmaster()
    postmaster.send_signal(signal.SIGINT)
    postmaster.wait(timeout=30)

    served.wait_for(lambda: healthy(served), "health 200 again")
    assert served.postmaster().pid != postmaster.pid
    assert "the embedded PostgreSQL is running again" in served.log.read_text()


def watchers(served) -> list[psutil.Process]:
    """The embedded PostgreSQL's watchers (``python -m memsvc.embedded_db <pgdata>``)."""
    pgdata = str((served.data_dir / "pgdata").resolve())
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if "memsvc.embedded_db" in (cmdline := process.info["cmdline"] or []) and pgdata in cmdline:
            found.append(process)
    return [process for process in found if alive(process)]


def test_a_killed_watcher_of_the_database_is_started_again(shared):
    """The watcher killed, `serve` started none: killed next, `serve` left the database
    running for good, with a quarter of the machine's memory (review)."""
    served = shared
    served.wait_until_healthy()
    [watcher] = watchers(served)
    watcher.kill()
    watcher.wait(timeout=10)
    again = "the embedded PostgreSQL's watcher is running again"
    served.wait_for(lambda: again in served.log.read_text(), "a new watcher")
    assert len(watchers(served)) == 1 and watchers(served)[0].pid != watcher.pid


def worker_said(served) -> str | None:
    """What health says of the embedding queue's worker: active, silent."""
    return httpx.get(f"{served.url}/v1/health", timeout=10).json()["worker"]


def test_a_worker_killed_with_sigkill_is_restarted_and_leaves_nothing_behind(shared):
    served = shared
    served.wait_until_healthy()
    served.wait_for(lambda: "ready." in served.log.read_text(), "the worker ready")
    # (As it is ready a worker sends itself a task: health sees it before the first sweep.)
    served.wait_for(lambda: worker_said(served) == "active", "health seeing the worker")
    worker, beat, web = served.child("worker"), served.child("beat"), served.child("gunicorn")
    pool = worker.children()
    assert pool, "the worker's pool processes"
    ready = served.log.read_text().count("ready.")

    worker.kill()  # kill -9 of Celery's main process

    served.wait_for(lambda: served.log.read_text().count("ready.") > ready, "a new worker ready")
    served.wait_for(lambda: replaced(served, "worker", worker), "the new worker")
    assert "the worker (pid" in served.log.read_text()
    assert "was killed by signal 9; restarting" in served.log.read_text()
    assert served.child("worker").pid != worker.pid
    assert not any(alive(p) for p in pool)  # its pool went with it
    # The scheduler and the web server never noticed: same processes, still serving.
    assert served.child("beat").pid == beat.pid and alive(beat)
    assert served.child("gunicorn").pid == web.pid
    assert healthy(served)


def test_the_worker_yields_the_cores_to_the_web_server(shared):
    """Embedding appended messages can wait, a request cannot: the worker and its pool run
    at a lower priority (MEMSVC_WORKER_NICE, 10), in a scheduling group of their own where
    the kernel groups sessions, and the web server at the supervisor's own."""
    served = shared
    served.wait_until_healthy()
    served.wait_for(lambda: "ready." in served.log.read_text(), "the worker ready")
    worker, web = served.child("worker"), served.child("gunicorn")
    base = psutil.Process(served.process.pid).nice()
    assert web.nice() == base
    pool = worker.children()
    assert pool, "the worker's pool processes"
    assert {p.nice() for p in [worker, *pool]} == {min(19, base + 10)}
    autogroups = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if autogroups.exists() and autogroups.read_text().strip() == "1":
        assert Path(f"/proc/{worker.pid}/autogroup").read_text().rstrip().endswith("nice 10")
        assert Path(f"/proc/{web.pid}/autogroup").read_text().rstrip().endswith("nice 0")


def test_beat_and_the_web_server_are_restarted_too(shared):
    served = shared
    served.wait_until_healthy()
    beat, web = served.child("beat"), served.child("gunicorn")
    web_workers = web.children()
    beat.kill()
    web.kill()  # gunicorn's arbiter: its workers must go too, or the port stays taken

    served.wait_for(lambda: replaced(served, "gunicorn", web) and healthy(served), "web")
    served.wait_for(lambda: replaced(served, "beat", beat), "beat")
    assert not any(alive(p) for p in web_workers)


def test_a_second_scheduler_on_the_data_directory_is_refused(shared):
    """A second `serve` on the data directory started a second beat on the same schedule
    file: every periodic sweep ran twice (review). It, and a `worker --beat`, are refused
    before they start anything; the first runs on."""
    served = shared
    served.wait_until_healthy()
    env = {
        **os.environ,
        "MEMSVC_DATA_DIR": str(served.data_dir),
        "MEMORY_SERVER_PORT": str(free_port()),
        "PYTHONPATH": str(CHECKOUT),
    }
    env.pop("DATABASE_URL", None)
    for command in (["serve"], ["worker", "--beat"]):
        second = subprocess.run(
            [*MEMSVC, *command], env=env, cwd=CHECKOUT, capture_output=True, text=True, timeout=60
        )
        assert second.returncode == 1, second.stderr
        assert f"another memsvc process runs the scheduler of {served.data_dir}" in second.stderr
    assert served.child("beat") is not None and healthy(served)


def test_a_file_in_the_local_queue_that_holds_no_message_does_not_stop_the_worker(shared):
    """kombu #1551: a reader that met an empty message file ended the worker, and the service."""
    served = shared
    served.wait_until_healthy()
    served.wait_for(lambda: "ready." in served.log.read_text(), "the worker ready")
    worker = served.child("worker")
    queue = served.data_dir / "broker" / "queue"
    (queue / "1_00000000-0000-0000-0000-000000000000.celery.msg").write_bytes(b"")

    rejected = served.data_dir / "broker" / "rejected"
    served.wait_for(lambda: rejected.exists() and any(rejected.iterdir()), "the file set aside")
    time.sleep(1)
    assert served.child("worker").pid == worker.pid and alive(worker)
    assert "holds no message" in served.log.read_text()


def test_slow_clients_do_not_starve_the_web_server(shared):
    """Connections that trickle their headers hold no request thread: probes still answer."""
    served = shared
    served.wait_until_healthy()
    served.wait_for(lambda: healthy(served), "health 200")
    slow = []
    for _ in range(SLOW_CLIENTS):
        sock = socket.create_connection(("127.0.0.1", served.port))
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        slow.append(sock)
    try:
        for _ in range(5):
            for sock in slow:
                sock.sendall(b"X-Slow: 1\r\n")  # never the blank line that ends the headers
            response = httpx.get(f"{served.url}/v1/health", timeout=PROBE_TIMEOUT_SECONDS)
            assert response.status_code == 200
            time.sleep(0.5)
    finally:
        for sock in slow:
            sock.close()


def test_a_model_that_does_not_answer_holds_back_no_embedding(tmp_path):
    """The LLM's tasks have a worker of their own, and a time limit: while the model keeps
    a tool record's observation waiting, a message appended is embedded; once the limit has
    passed, the LLM's worker takes the next observation."""
    release = threading.Event()

    def respond(method, path, body):
        release.wait(120)  # (the client's timeout is 120 s: longer than the task's limit)
        return Reply(503, {"error": {"message": "gone"}})

    record = {"agent_name": "scout", "records": [{"tool_name": "search_hotels", "output": {}}]}
    with LocalHttpServer(respond) as llm:
        served = Served(
            tmp_path,
            MEMSVC_LLM_BASE_URL=f"{llm.url}/v1",
            MEMSVC_LLM_MODEL="stand-in",
            MEMSVC_LLM_TASK_SECONDS="8",
            MEMSVC_LLM_WORKER_CONCURRENCY="1",
        )
        try:
            served.wait_until_healthy()
            assert httpx.post(f"{served.url}/agents", json={"name": "scout"}).is_success
            assert httpx.post(f"{served.url}/tool-records", json=record).is_success
            served.wait_for(lambda: llm.requests, "the observer asking the model")
            message = {"agent_name": "scout", "role": "user", "content": "Book the harbour inn"}
            assert httpx.post(f"{served.url}/messages", json=message).is_success
            served.wait_for(
                lambda: httpx.get(f"{served.url}/v1/health").json()["pendingEmbeddings"] == 0,
                "the message embedded while the model is silent",
                deadline=60,
            )
            assert len(llm.requests) == 1  # (still that one)
            served.wait_for(
                lambda: "the model took longer than 8 s" in served.log.read_text(),
                "the observation ended by its time limit",
            )
            assert httpx.post(f"{served.url}/tool-records", json=record).is_success
            served.wait_for(lambda: len(llm.requests) == 2, "the next observation asking")
        finally:
            release.set()
            served.kill()


def test_sigterm_stops_everything(shared):
    """(The last test of the module that uses ``shared``: it stops it.)"""
    served = shared
    served.wait_until_healthy()
    tree = served.process_tree()
    postmaster = served.postmaster()
    assert served.terminate() == 0
    # (The server's watcher, started with it by `serve`, ends a moment after it.)
    _, left = psutil.wait_procs([p for p in [*tree, postmaster] if alive(p)], timeout=5)
    assert left == [], served.log.read_text()


def test_memsvc_mcp_over_stdio_starts_its_database_again(tmp_path):
    """An AI tool keeps `memsvc mcp` for hours: the embedded PostgreSQL it started, killed,
    was never started again, and every call said "try again shortly" for good (review)."""
    import json

    from tests.agents_api.test_mcp import RAW_INITIALIZE

    env = {**os.environ, "MEMSVC_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(CHECKOUT)}
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "MEMSVC_API_KEY"):
        env.pop(name, None)
    log = tmp_path / "mcp.log"
    with log.open("w") as errors:
        process = subprocess.Popen(
            [*MEMSVC, "mcp", "--agent", "survivor"],
            env=env,
            cwd=CHECKOUT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    ids = iter(range(2, 1000))

    def ask(message: dict) -> dict | None:
        process.stdin.write(json.dumps(message) + "\n")
        process.stdin.flush()
        return json.loads(process.stdout.readline()) if "id" in message else None

    def listed() -> bool:
        call = {"name": "memory_list", "arguments": {}}
        answer = ask({"jsonrpc": "2.0", "id": next(ids), "method": "tools/call", "params": call})
        return not answer["result"].get("isError")

    try:
        assert "result" in ask(RAW_INITIALIZE), log.read_text()
        ask({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert listed(), log.read_text()
        pid = int((tmp_path / "data" / "pgdata" / "postmaster.pid").read_text().split()[0])
        psutil.Process(pid).kill()
        # (The killed server's backends may answer a moment longer: the restart is awaited.)
        deadline = time.monotonic() + RECOVERY_DEADLINE_SECONDS
        while "the embedded PostgreSQL is running again" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        while not listed():  # (a connection to the killed server is dropped at its first use)
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
    finally:
        process.stdin.close()
        process.wait(timeout=60)
