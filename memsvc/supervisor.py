"""What keeps ``memsvc serve`` (and ``memsvc worker``) up: child processes restarted when they
die, and local mode's embedded PostgreSQL restarted when it stops.

Each child runs in a process group of its own, so that when its main process dies (even by
``kill -9``) whatever it left behind (a Celery worker's pool processes, gunicorn's workers)
is ended with it before the child is started again: nothing is orphaned, and a restarted
web server finds its port free. On Linux each child is also ended (SIGTERM) when the
supervisor itself dies, ``kill -9`` or the kernel's out-of-memory killer included: no web
server is left holding the port for the next ``memsvc serve``. Restarts back off (1 s, doubling up to 30 s, back to 1 s
after a minute of good health) and every one is logged on stderr. A child that fails on its
very first start (a port in use, a bad setting) ends the service instead: that is a
mistake to report, not a crash to heal.
"""

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SHUTDOWN_GRACE_SECONDS = 20
POLL_SECONDS = 0.2
FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
HEALTHY_AFTER_SECONDS = 60.0
# A child exiting with an error this soon after its first start failed to start.
START_FAILURE_SECONDS = 10.0


def log(text: str) -> None:
    """A line on standard error; none when it cannot be written (its reader gone, a pipe
    closed, a full disk): the supervisor died of the ``BrokenPipeError`` at the next thing
    it had to say, and took the service down with it (review)."""
    with contextlib.suppress(OSError):
        print(f"memsvc: {text}", file=sys.stderr, flush=True)


def _backoff(failures: int) -> float:
    return min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2 ** max(0, failures - 1))


# prctl(2)'s request: "send me this signal when the thread that started me ends".
PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _before_exec(niceness: int) -> Callable[[], None]:
    """For a child about to start (run between its fork and its exec): SIGTERM to it when
    the process starting it dies, and its scheduling priority lowered by ``niceness``. The
    request names the starting thread, so children are started by the supervisor's loop,
    which lives as long as the process."""
    parent = os.getpid()

    def prepare() -> None:
        if niceness:
            os.nice(niceness)
            # The child leads a session of its own, and where the kernel groups sessions
            # (sched_autogroup_enabled), the cores are shared between groups first: its
            # group's niceness is what weighs against the web server's group.
            with contextlib.suppress(OSError):
                Path("/proc/self/autogroup").write_text(str(niceness))
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # it died before the request was made
                os.kill(os.getpid(), signal.SIGTERM)

    return prepare


@dataclass
class Child:
    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    niceness: int = 0  # added to the supervisor's (nice(2)): background work yields the cores
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    starts: int = 0
    failures: int = 0  # deaths since it last ran HEALTHY_AFTER_SECONDS
    restart_at: float | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(  # noqa: S603 (our own interpreter and arguments)
            self.command,
            env={**os.environ, **self.env},
            start_new_session=True,
            preexec_fn=_before_exec(self.niceness),
        )
        self.started_at = time.monotonic()
        self.starts += 1
        self.restart_at = None

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """Signal every process left in the child's group (its own, made at start)."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)


@dataclass
class Watched:
    """Something that is not our child but must keep running (the embedded database):
    ``running()`` says whether it does, ``restart()`` starts it again (raising if it cannot)."""

    name: str
    running: Callable[[], bool]
    restart: Callable[[], None]
    failures: int = 0
    retry_at: float = 0.0


def check_watched(watched: Watched) -> None:
    """Start ``watched`` again if it stopped and its time to try has come (with backoff)."""
    now = time.monotonic()
    if now < watched.retry_at:
        return
    try:
        if watched.running():
            return
    except Exception as exc:  # (unknown for now: asked again at the next look)
        log(f"whether the {watched.name} runs is unknown ({exc!r})")
        return
    log(f"the {watched.name} is not running: starting it again")
    try:
        watched.restart()
    except Exception as exc:
        watched.failures += 1
        delay = _backoff(watched.failures)
        log(f"the {watched.name} did not start ({exc!r}); trying again in {delay:.0f} s")
        watched.retry_at = now + delay
    else:
        log(f"the {watched.name} is running again")
        watched.failures = 0


# How often a process that supervises nothing else looks (``keep_running``): an idle
# ``memsvc mcp`` read the server's pid file and took a lock five times a second for hours.
KEEP_RUNNING_SECONDS = 2.0


def keep_running(watched: list[Watched], stop: threading.Event) -> None:
    """``check_watched`` of each, every ``KEEP_RUNNING_SECONDS`` until ``stop`` is set: for a
    process that supervises nothing else (``memsvc mcp`` over stdio, which an AI tool keeps
    for hours: the embedded database it started, killed, was never started again; review)."""
    while not stop.wait(KEEP_RUNNING_SECONDS):
        for one in watched:
            check_watched(one)


class Supervisor:
    """Runs children until told to stop (SIGTERM, SIGINT), restarting those that die."""

    def __init__(self) -> None:
        self.children: list[Child] = []
        self.watched: list[Watched] = []
        self.stopping = False
        # Installed before anything slow (start-up, migrations) so that a SIGTERM at any
        # moment still ends in an orderly stop.
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def start(
        self, name: str, command: list[str], env: dict[str, str] | None = None, niceness: int = 0
    ) -> None:
        child = Child(name=name, command=command, env=env or {}, niceness=niceness)
        child.start()
        self.children.append(child)

    def run_to_end(self, name: str, command: list[str]) -> int | None:
        """Run ``command`` as a child until it exits: its exit code; None when a stop is
        asked meanwhile (the child is then stopped as every child is, ``stop_all``)."""
        child = Child(name=name, command=command)
        child.start()
        self.children.append(child)
        try:
            while child.process.poll() is None:
                if self.stopping:
                    self.stop_all()
                    return None
                time.sleep(POLL_SECONDS)
            return child.process.returncode
        finally:
            self.children.remove(child)

    def request_stop(self, signum, frame) -> None:
        self.stopping = True

    def run(self) -> int:
        """Until told to stop; the exit code is 0, or that of a child that failed to start."""
        exit_code = 0
        while not self.stopping:
            for watched in self.watched:
                check_watched(watched)
            for child in self.children:
                code = self._check_child(child)
                if code is not None:
                    exit_code, self.stopping = code, True
            time.sleep(POLL_SECONDS)
        self.stop_all()
        return exit_code

    def _check_child(self, child: Child) -> int | None:
        """Restart a dead child when its time comes; an exit code if it failed to start."""
        now = time.monotonic()
        if child.restart_at is not None:
            if now >= child.restart_at:
                log(f"starting the {child.name} again")
                child.start()
            return None
        code = child.process.poll()
        if code is None:
            if child.failures and now - child.started_at > HEALTHY_AFTER_SECONDS:
                child.failures = 0
            return None
        ran = now - child.started_at
        how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
        child.kill_group()  # what it leaves behind (pool processes, an embedded beat) goes too
        if child.starts == 1 and code > 0 and ran < START_FAILURE_SECONDS:
            log(f"the {child.name} {how} {ran:.1f} s after it started: stopping")
            return code
        child.failures += 1
        delay = _backoff(child.failures)
        log(f"the {child.name} (pid {child.process.pid}) {how}; restarting in {delay:.0f} s")
        child.restart_at = now + delay
        return None

    def stop_all(self) -> None:
        """SIGTERM to every child's main process, then SIGKILL to whatever is left of its group
        after the grace period."""
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                child.process.terminate()
        deadline = time.monotonic() + SHUTDOWN_GRACE_SECONDS
        for child in self.children:
            if child.process is None:
                continue
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
            child.kill_group()
