"""memsvc.supervisor with small stand-in children (a real ``memsvc serve`` is in test_serve.py)."""

import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from memsvc import supervisor as supervision
from tests.waiting import wait_until

DEADLINE_SECONDS = 30


@pytest.fixture
def supervisor(monkeypatch):
    """A Supervisor, with this process's signal handlers put back afterwards."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setattr(supervision, "FIRST_BACKOFF_SECONDS", 0.1)
    made = supervision.Supervisor()
    yield made
    made.stopping = True
    made.stop_all()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def running(supervisor) -> threading.Thread:
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    return thread


def test_a_child_that_fails_on_its_first_start_ends_the_service(supervisor, capsys):
    supervisor.start("web server", [sys.executable, "-c", "raise SystemExit(3)"])
    assert supervisor.run() == 3
    assert "the web server exited with 3" in capsys.readouterr().err


def test_a_killed_child_is_restarted_and_what_it_started_is_ended(supervisor, tmp_path, capsys):
    pids = tmp_path / "grandchild"
    child_code = (
        "import subprocess, sys, time;"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        f"open({str(pids)!r}, 'a').write(f'{{p.pid}}\\n'); time.sleep(60)"
    )
    supervisor.start("worker", [sys.executable, "-c", child_code])
    thread = running(supervisor)
    wait_until(lambda: pids.exists() and pids.read_text().count("\n") == 1, "first start")
    [child] = supervisor.children
    first = child.process.pid
    grandchild = psutil.Process(int(pids.read_text().split()[0]))

    psutil.Process(first).kill()

    wait_until(lambda: pids.read_text().count("\n") == 2, "a second start")
    assert child.process.pid != first and child.starts == 2
    wait_until(lambda: not grandchild.is_running(), "the orphan ended")
    supervisor.stopping = True
    thread.join(timeout=DEADLINE_SECONDS)
    err = capsys.readouterr().err
    assert f"the worker (pid {first}) was killed by signal 9; restarting" in err
    assert "starting the worker again" in err


def test_backoff_doubles_to_a_ceiling():
    delays = [supervision._backoff(failures) for failures in range(1, 10)]
    assert delays[:3] == [1.0, 2.0, 4.0]
    assert delays[-1] == supervision.MAX_BACKOFF_SECONDS


def test_a_watched_service_that_stops_is_started_again_and_retried(supervisor, capsys):
    state = {"up": True, "attempts": 0}

    def restart():
        state["attempts"] += 1
        if state["attempts"] == 1:
            raise RuntimeError("still shutting down")
        state["up"] = True

    supervisor.watched.append(
        supervision.Watched("embedded PostgreSQL", lambda: state["up"], restart)
    )
    thread = running(supervisor)
    state["up"] = False
    wait_until(lambda: state["up"], "restarted")
    supervisor.stopping = True
    thread.join(timeout=DEADLINE_SECONDS)
    err = capsys.readouterr().err
    assert state["attempts"] == 2
    assert "the embedded PostgreSQL did not start (RuntimeError('still shutting down'))" in err
    assert "the embedded PostgreSQL is running again" in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG)")
def test_children_end_when_the_supervisor_is_killed(tmp_path):
    """A ``kill -9`` of the supervising process (``memsvc serve``) leaves no child behind
    (a web server holding the port for the next start)."""
    supervising = (
        "import sys, time; from memsvc.supervisor import Supervisor;"
        "s = Supervisor(); s.start('web server', [sys.executable, '-c',"
        " 'import time; time.sleep(60)']);"
        "print(s.children[0].process.pid, flush=True); time.sleep(60)"
    )
    parent = psutil.Popen([sys.executable, "-c", supervising], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    assert child.is_running()

    parent.kill()
    parent.wait()

    wait_until(
        lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE,
        "the child outlived its supervisor",
    )


def test_a_child_run_to_its_end_gives_its_exit_code_and_is_not_kept(supervisor):
    assert supervisor.run_to_end("task", [sys.executable, "-c", "raise SystemExit(4)"]) == 4
    assert supervisor.run_to_end("task", [sys.executable, "-c", "pass"]) == 0
    assert supervisor.children == []  # (never restarted as a child that died)


def test_a_stop_asked_while_a_child_runs_to_its_end_ends_it(supervisor):
    threading.Timer(0.5, supervisor.request_stop, args=(signal.SIGTERM, None)).start()
    started = time.monotonic()
    code = supervisor.run_to_end("task", [sys.executable, "-c", "import time; time.sleep(60)"])
    assert code is None
    assert time.monotonic() - started < 10
    assert supervisor.children == []


def test_a_log_no_one_reads_any_more_stops_nothing(monkeypatch):
    """``memsvc serve > pipe``, its reader gone (or its file's disk full): the supervisor
    died of a ``BrokenPipeError`` at the next line it said (a child restarted), and the
    service with it (review). The line is lost; the supervisor goes on."""

    class Closed:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stderr", Closed())
    supervision.log("the beat (pid 1) was killed; restarting in 1 s")  # (no exception)
