import contextlib
import json
import os
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import jwt
import pytest

from memsvc import cli


def test_token_prints_a_local_jwt_for_the_user(capsys, settings):
    assert cli.main(["token", "alice", "--ttl", "120"]) == 0
    token = capsys.readouterr().out.strip()
    claims = jwt.decode(token, settings.MEMSVC_JWT_SECRET, algorithms=["HS256"])
    assert claims["sub"] == "alice"
    assert 110 <= claims["exp"] - time.time() <= 121


def test_token_without_a_secret_says_so_in_one_line(capsys, settings):
    """Outside local mode without MEMSVC_JWT_SECRET (review: a traceback, exit 1)."""
    settings.MEMSVC_JWT_SECRET = ""
    assert cli.main(["token", "alice"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "memsvc: MEMSVC_JWT_SECRET is not set: local tokens cannot be signed\n"


@pytest.mark.django_db
def test_apikey_create_list_and_revoke(capsys, api):
    assert cli.main(["apikey", "create", "scribe", "--scope", "read", "--scope", "write"]) == 0
    out, err = capsys.readouterr()
    key = out.strip()
    assert key.startswith("msk_")
    assert "shown only now" in err
    me = api.get("/v1/agent/me", as_={"HTTP_X_API_KEY": key})
    assert me.status_code == 200
    assert me.json()["name"] == "scribe"

    # A second key for the same agent: the agent is reused.
    assert cli.main(["apikey", "create", "scribe", "--name", "the laptop"]) == 0
    second = capsys.readouterr().out.strip()
    assert api.get("/v1/agent/me", as_={"HTTP_X_API_KEY": second}).json()["id"] == me.json()["id"]

    assert cli.main(["apikey", "list", "--agent", "scribe"]) == 0
    listing = capsys.readouterr().out
    public_id = key.removeprefix("msk_").split("_")[0]
    assert public_id in listing
    assert key not in listing and second not in listing
    assert [line.split("\t")[-1] for line in listing.splitlines()] == ["", "the laptop"]
    # By the agent's id too, as an export takes it; an agent there is not is said (an id
    # listed nothing, and so did "nosuch", exit 0: review).
    assert cli.main(["apikey", "list", "--agent", me.json()["id"]]) == 0
    assert capsys.readouterr().out == listing
    assert cli.main(["apikey", "list", "--agent", "nosuch"]) == 1
    assert capsys.readouterr().err.strip() == "no agent 'nosuch'"

    capsys.readouterr()
    assert cli.main(["apikey", "revoke", public_id]) == 0
    assert capsys.readouterr().err.strip() == f"revoked {public_id}"
    assert cli.main(["apikey", "revoke", public_id]) == 0  # the same key again: said so
    assert "was revoked already" in capsys.readouterr().err
    assert api.get("/v1/agent/me", as_={"HTTP_X_API_KEY": key}).status_code == 401
    assert api.get("/v1/agent/me", as_={"HTTP_X_API_KEY": second}).status_code == 200
    assert cli.main(["apikey", "revoke", "nope"]) == 1
    # The whole key names it too; a key of no one is refused without its secret written
    # back (review).
    capsys.readouterr()
    assert cli.main(["apikey", "revoke", second]) == 0
    assert capsys.readouterr().err.strip() == f"revoked {second.removeprefix('msk_').split('_')[0]}"
    assert api.get("/v1/agent/me", as_={"HTTP_X_API_KEY": second}).status_code == 401
    assert cli.main(["apikey", "revoke", "msk_nobody_s3cr3t"]) == 1
    assert "s3cr3t" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["token", ""], "user id must"),
        (["token", "alice", "--ttl", "-5"], "--ttl must"),
        (["token", "alice", "--ttl", "31536001"], "--ttl must be between 1 and 31536000"),
        (["apikey", "create", ""], "agent name"),
        (["apikey", "create", "a" * 201], "agent name"),
        (["apikey", "create", "a/b"], "agent name"),
        (["apikey", "create", "scribe", "--owner", ""], "--owner must"),
    ],
)
@pytest.mark.django_db
def test_what_names_no_one_is_refused_with_a_reason(capsys, command, said):
    """(A traceback from the database, or a token the server refuses, before.)"""
    assert cli.main(command) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(said), err
    assert "Traceback" not in err


@pytest.mark.django_db
def test_user_create_makes_a_login_for_the_pages(capsys, monkeypatch, client):
    from django.contrib.auth import get_user_model

    assert cli.main(["user", "create", "alice", "--password", "correct horse battery"]) == 0
    assert client.login(username="alice", password="correct horse battery")
    # Asked for when omitted, twice; a mismatch, a weak password or a taken name is refused.
    answers = iter(["another long secret", "another long secret"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    assert cli.main(["user", "create", "bob"]) == 0
    answers = iter(["one long secret", "two long secret"])
    assert cli.main(["user", "create", "carol"]) == 1
    assert cli.main(["user", "create", "dave", "--password", "123"]) == 1
    assert cli.main(["user", "create", "alice", "--password", "correct horse battery"]) == 1
    assert cli.main(["user", "create", "agent:x", "--password", "correct horse battery"]) == 1
    assert sorted(get_user_model().objects.values_list("username", flat=True)) == ["alice", "bob"]
    assert "exists already" in capsys.readouterr().err

    def no_terminal(prompt=""):
        raise EOFError  # `echo pw | memsvc user create erin`: one line, then nothing

    monkeypatch.setattr("getpass.getpass", no_terminal)
    assert cli.main(["user", "create", "erin"]) == 1
    assert "no password given" in capsys.readouterr().err


@pytest.mark.django_db
def test_user_create_refuses_a_name_the_login_form_reads_as_another(capsys, client):
    """The login form reads a name in NFKC ("ﬁsh" as "fish"): the login made for "ﬁsh"
    never logged in, by either name (review)."""
    from django.contrib.auth import get_user_model

    password = "correct horse battery"
    assert cli.main(["user", "create", "\ufb01sh", "--password", password]) == 1
    said = capsys.readouterr().err
    assert said == "user name must be written as it reads in Unicode's NFKC form: 'fish'\n"
    assert not get_user_model().objects.exists()
    assert cli.main(["user", "create", "fish", "--password", password]) == 0
    page = client.post("/app/login/", {"username": "\ufb01sh", "password": password})
    assert page.status_code == 302


def test_python_dash_m_memsvc_is_the_memsvc_command():
    """(`python -m memsvc serve` said "No module named memsvc.__main__": review.)"""
    from tests.agents_api.test_mcp import REPO, server_env

    result = subprocess.run(
        [sys.executable, "-m", "memsvc", "token", "--help"],
        env=server_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: memsvc token")


@pytest.mark.django_db(transaction=True)
def test_an_export_into_a_pipe_its_reader_closed_ends_quietly():
    """(`memsvc export user alice | head -c 200` ended in a BrokenPipeError traceback.)"""
    import subprocess
    import sys

    from conversations.services import conversation_create
    from memsvc.api.principals import Principal
    from tests.agents_api.test_mcp import REPO, server_env
    from tests.factories import messages_inserted

    conversation = conversation_create(Principal.user("alice"), title="Long")
    messages_inserted(conversation, 1_000, "x" * 500, author_principal="alice")
    export = subprocess.Popen(
        [sys.executable, "-m", "memsvc.cli", "export", "user", "alice"],
        env=server_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert export.stdout.read(200).startswith(b"{")
    export.stdout.close()  # as head does, long before the 500 KB are written
    _, errors = export.communicate(timeout=60)
    assert export.returncode == 1
    assert b"Traceback" not in errors, errors.decode()[-2000:]


def memsvc_on(data_dir, *args: str, prefix=()) -> subprocess.CompletedProcess:
    """``memsvc ARGS`` in a process of its own on ``data_dir``, the embedded database (run
    by the command ``prefix`` when given)."""
    from tests.agents_api.test_mcp import REPO

    env = {**os.environ, "MEMSVC_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO)}
    env.pop("DATABASE_URL", None)
    return subprocess.run(
        [*prefix, sys.executable, "-m", "memsvc.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.parametrize(
    "command", [["token", "alice"], ["apikey", "list"], ["export", "user", "alice"]]
)
def test_a_result_for_a_closed_standard_output_is_refused_in_words(command, monkeypatch, capsys):
    """``memsvc token alice >&-`` lost the token without a word (exit 0), and an export
    ended in a traceback (review)."""
    monkeypatch.setattr(sys, "stdout", None)  # (Python's, for a closed descriptor 1)
    assert cli.main(command) == 2
    assert capsys.readouterr().err == (
        "memsvc: standard output is closed: nowhere to write the result\n"
    )


@pytest.mark.django_db
def test_a_command_whose_result_is_no_output_runs_with_standard_output_closed(monkeypatch):
    """``memsvc prune >&-`` in a cron job: its summary goes nowhere, its work is done
    (code review: it was refused with the commands whose output is their result)."""
    monkeypatch.setattr(sys, "stdout", None)
    assert cli.main(["prune"]) == 0


@pytest.mark.django_db
def test_an_export_to_a_file_without_a_name_is_refused_and_writes_nothing(
    tmp_path, monkeypatch, capsys
):
    """``-o ""`` is the working directory: a ".partial" was written beside it (review)."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["export", "user", "alice", "-o", ""]) == 1
    assert "the export failed: [Errno 2] no file name given" in capsys.readouterr().err
    assert list(tmp_path.parent.glob("*.partial")) == []


def test_the_commands_work_on_a_data_directory_serve_never_ran_on(tmp_path):
    """The README's MCP setup makes a key (`memsvc apikey create claude-code`) before anything
    else may have run: the embedded database was created empty, and the command ended in a
    traceback (relation "agent" does not exist)."""
    created = memsvc_on(tmp_path / "data", "apikey", "create", "claude-code")
    assert created.returncode == 0, created.stderr[-2000:]
    assert created.stdout.strip().startswith("msk_")
    exported = memsvc_on(tmp_path / "data", "export", "agent", "claude-code")
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert exported.stdout.startswith('{"format":"memsvc-export"')


def test_commands_run_at_once_on_a_new_data_directory_each_find_its_database(tmp_path):
    """Each saw no database, and all but the first to create it ended in a traceback
    (duplicate key in pg_database; review)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda _: memsvc_on(tmp_path / "data", "apikey", "list"), range(3)))
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]


def test_a_data_directory_made_then_mounted_read_only_is_refused_in_words(tmp_path):
    """The package's change of the directory's modes ended in a traceback (``OSError:
    Read-only file system``; review). (The mount is a private one: ``unshare -m``.)"""
    import shutil

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"]).returncode:
        pytest.skip("no private mounts here (unshare -m needs root)")
    data_dir = tmp_path / "data"
    assert memsvc_on(data_dir, "apikey", "create", "kept").returncode == 0
    listed = memsvc_on(
        data_dir,
        "apikey",
        "list",
        prefix=[
            "unshare",
            "-m",
            "sh",
            "-c",
            f'mount --bind -o ro "{data_dir}" "{data_dir}" && exec "$@"',
            "sh",
        ],
    )
    assert listed.returncode == 2, listed.stderr[-2000:]
    assert "is no directory memsvc can use: Read-only file system" in listed.stderr
    assert "Traceback" not in listed.stderr


def test_a_data_directory_whose_first_start_was_killed_in_initdb_starts(tmp_path):
    """initdb writes PG_VERSION first, and the package takes that for a whole cluster: a
    first start killed during initdb left a data directory no command could start again
    ('database "postgres" does not exist'; review). What initdb left is moved aside."""
    data_dir = tmp_path / "data"
    pgdata = data_dir / "pgdata"
    (pgdata / "base" / "1").mkdir(parents=True)
    (pgdata / "PG_VERSION").write_text("18\n")  # (what initdb writes first)
    listed = memsvc_on(data_dir, "apikey", "list")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "was left half-made by a first start that was stopped" in listed.stderr
    [aside] = data_dir.glob("pgdata.cut-*")
    assert (aside / "PG_VERSION").exists() and (pgdata / "memsvc.conf").exists()
    # A whole cluster without memsvc's settings file (deleted; a data directory older
    # than it) is kept where it is, its keys with it.
    created = memsvc_on(data_dir, "apikey", "create", "kept")
    assert created.returncode == 0, created.stderr[-2000:]
    (pgdata / "memsvc.conf").unlink()
    again = memsvc_on(data_dir, "apikey", "list")
    assert again.returncode == 0 and "\tkept\t" in again.stdout, again.stderr[-2000:]
    assert len(list(data_dir.glob("pgdata.cut-*"))) == 1


def test_a_worker_starts_on_a_data_directory_serve_never_ran_on(tmp_path):
    """(It ended in a traceback: relation "message" does not exist.)"""
    import os
    import queue
    import signal
    import subprocess
    import sys
    import threading

    from tests.agents_api.test_mcp import REPO

    env = {**os.environ, "MEMSVC_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(REPO)}
    env.pop("DATABASE_URL", None)
    worker = subprocess.Popen(
        [sys.executable, "-m", "memsvc.cli", "worker"],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = time.monotonic()
    said, deadline = [], started + 180
    # Its lines read on a thread: waiting on the pipe for each line missed those that came
    # in one read with the one before ("ready." with "Connected to ..."): they waited in
    # the reader's buffer, and the test for 180 s (once in some suites' runs).
    lines = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in worker.stderr])
    reader.start()
    try:
        while time.monotonic() < deadline and worker.poll() is None:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            said.append(line)
            if line.rstrip().endswith("ready."):
                break
        ended = worker.poll()  # (not None: the worker exited before it was ready)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        reader.join(timeout=10)
    ready = bool(said) and said[-1].rstrip().endswith("ready.")
    if not ready:  # what it said after, how it ended and when: a hang or a crash
        said += list(lines.queue)
    assert ready, (
        f"exit {ended} after {time.monotonic() - started:.0f} s:\n" + "".join(said)[-4000:]
    )


def test_a_database_that_stops_answering_mid_command_is_said_in_a_line(monkeypatch, capsys):
    """(``memsvc reindex`` printed Django's traceback when PostgreSQL died under it; review.)"""
    from django.db import OperationalError

    def stopped(args):
        raise OperationalError("connection failed: the server closed the connection\nmore")

    monkeypatch.setattr(cli, "cmd_reindex", stopped)
    assert cli.main(["reindex"]) == 1
    said = capsys.readouterr().err
    assert said == (
        "memsvc: the database did not answer: connection failed: the server closed the connection\n"
    )


def test_the_llms_worker_takes_the_options_given_to_both_with_a_name_of_its_own():
    """``memsvc worker -- ...`` starts two workers when an LLM is configured: the LLM's gets
    a name of its own and keeps its queue and processes; a file the two would share (a
    pid file: the second worker found it and ended everything, review) is refused."""
    assert cli._llm_worker_extra(["--loglevel", "DEBUG"]) == [
        "--hostname",
        "llm@%h",
        "--loglevel",
        "DEBUG",
    ]
    assert cli._llm_worker_extra(["--loglevel", "DEBUG", "-n", "w1@%h", "-c", "8"]) == [
        "--loglevel",
        "DEBUG",
        "-n",
        "llm-w1@%h",
    ]
    assert cli._llm_worker_extra(["--hostname=w1@%h", "--queues=x", "--pidfile=/run/%n.pid"]) == [
        "--hostname",
        "llm-w1@%h",
        "--pidfile",
        "/run/%n.pid",
    ]
    for shared in (["--pidfile", "/run/w.pid"], ["--logfile=/var/log/w.log"], ["-S", "state"]):
        with pytest.raises(ValueError, match="put %n"):
            cli._llm_worker_extra(shared)


def test_the_llms_tasks_go_to_its_queue_and_the_others_to_the_default(settings):
    from agents_api import tasks
    from memsvc.celery import app
    from search.tasks import embed_messages_task

    def queue(task) -> str:
        return app.amqp.router.route({}, task.name, task_type=task)["queue"].name

    llm = [tasks.extract_memories_task, tasks.observe_tool_record_task]
    llm.append(tasks.observe_letta_turns_task)
    assert {queue(task) for task in llm} == {settings.MEMSVC_LLM_QUEUE}
    others = [embed_messages_task, tasks.touch_memories_task, tasks.prune_memories_task]
    assert {queue(task) for task in others} == {settings.CELERY_TASK_DEFAULT_QUEUE}


@pytest.mark.django_db
def test_an_export_stopped_midway_leaves_the_file_it_would_replace(tmp_path, monkeypatch, capsys):
    """Ctrl-C (or the database gone) during ``memsvc export -o FILE``: the file was cut
    short, the backup it held lost (review). Now it is replaced only once written whole."""
    from agents_api.portability import export

    backup = tmp_path / "alice.json"
    backup.write_text('{"the": "backup"}')

    def interrupted(*args):
        yield '{"format": '
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "document_chunks", interrupted)
    assert cli.main(["export", "user", "alice", "-o", str(backup)]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert backup.read_text() == '{"the": "backup"}'
    assert [path.name for path in tmp_path.iterdir()] == ["alice.json"]


@pytest.mark.django_db
def test_an_export_writes_a_links_target_keeps_a_files_mode_and_makes_a_new_one_private(
    tmp_path, capsys
):
    """It replaced whatever was at the path with a new file: a link (its target left as it
    was), a device (``/dev/stdout`` as root), a file made private, now world-readable; a
    full disk on stdout was a traceback (review)."""
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("old")
    target.chmod(0o640)
    link.symlink_to(target)
    assert cli.main(["export", "user", "alice", "-o", str(link)]) == 0
    assert link.is_symlink() and json.loads(target.read_text())["userId"] == "alice"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    new = tmp_path / "new.json"
    assert cli.main(["export", "user", "alice", "-o", str(new)]) == 0
    assert stat.S_IMODE(new.stat().st_mode) == 0o600
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with ThreadPoolExecutor(1) as reader:
        read = reader.submit(pipe.read_text)
        assert cli.main(["export", "user", "alice", "-o", str(pipe)]) == 0
        assert json.loads(read.result(timeout=30))["userId"] == "alice"
    assert pipe.is_fifo()
    # An anonymous pipe, named as a descriptor (`-o /dev/stdout | gzip`): its name resolves
    # to no path a file could be made beside.
    read_end, write_end = os.pipe()
    with ThreadPoolExecutor(1) as reader, os.fdopen(read_end, "rb") as source:
        read = reader.submit(source.read)
        try:
            assert cli.main(["export", "user", "alice", "-o", f"/dev/fd/{write_end}"]) == 0
        finally:
            os.close(write_end)
        assert json.loads(read.result(timeout=30))["userId"] == "alice"
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "link.json",
        "new.json",
        "pipe",
        "target.json",
    ]
    if os.path.exists("/dev/full"):
        full = open("/dev/full", "w")  # noqa: SIM115 (its close is this test's to make)
        with contextlib.redirect_stdout(full):
            assert cli.main(["export", "user", "alice"]) == 1
        assert "the export failed: [Errno 28]" in capsys.readouterr().err
        with contextlib.suppress(OSError):
            full.close()


@pytest.mark.parametrize("port", ["0", "-1", "99999", "http"])
def test_serve_refuses_a_port_out_of_range_before_anything_starts(port, capsys):
    """0 was read as none given (the server took MEMORY_SERVER_PORT's); -1 and 99999 ran
    the migrations, then the web server failed to bind (review)."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--port", port])
    assert exited.value.code == 2
    assert "--port" in capsys.readouterr().err


@pytest.mark.django_db
def test_names_longer_than_their_columns_are_refused_in_words(capsys):
    """A login of 200 characters (a user id may have 255) and a key's name of 500 ended in
    a DataError traceback (review)."""
    assert cli.main(["user", "create", "u" * 200, "--password", "Xy7!kkkkkkkkk"]) == 1
    assert "at most 150 characters for a login" in capsys.readouterr().err
    assert cli.main(["apikey", "create", "bot", "--name", "x" * 500]) == 1
    assert "--name at most 200 characters" in capsys.readouterr().err
    # A note shown as it is, on one line (a bidi control showed another; review).
    for note, said in (
        ("\u202epotpal", "bidirectional control"),
        ("the\tlaptop", "control characters"),
        ("a\u2028b", "one line"),
        ("laptop\u200b", "must not begin or end with a space"),
        ("\udcff", "lone surrogate"),  # (a command line's byte that is no UTF-8)
    ):
        assert cli.main(["apikey", "create", "bot", "--name", note]) == 1
        assert said in capsys.readouterr().err
    from agents_api.models import ApiKey

    assert not ApiKey.objects.exists()


def test_a_data_directory_that_is_a_file_is_refused_in_words(tmp_path):
    """Every database command ended in a FileExistsError traceback (review); ``serve`` and
    ``token`` said what was wrong."""
    import os
    import subprocess
    import sys

    from tests.agents_api.test_mcp import REPO

    not_a_directory = tmp_path / "afile"
    not_a_directory.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "memsvc.cli", "apikey", "list"],
        env={**os.environ, "MEMSVC_DATA_DIR": str(not_a_directory)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "MEMSVC_DATA_DIR" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("host", "bound"),
    [("127.0.0.1", "127.0.0.1:8283"), ("::", "[::]:8283"), ("[::1]", "[::1]:8283")],
)
def test_the_web_server_binds_an_ipv6_host_in_brackets(host, bound):
    """``memsvc serve --host ::`` failed at once: "'' is not a valid port number" (review)."""
    command = cli._web_command(host, 8283)
    assert command[command.index("--bind") + 1] == bound


@pytest.mark.django_db(transaction=True)
def test_a_migrate_waits_for_another_on_the_same_database():
    """Two `memsvc serve` started at once on one database both migrated: one failed
    half-way, and a migration was applied twice (review). One migrates at a time."""
    import threading

    from django.db import connection, connections

    other = connections.create_connection("default")  # (another process's session)
    with other.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [cli.MIGRATION_LOCK])
    done = threading.Event()

    def migrating():
        try:
            cli.migrate()
            done.set()
        finally:
            connection.close()

    thread = threading.Thread(target=migrating)
    thread.start()
    try:
        assert not done.wait(1.0)  # (waiting for the other)
    finally:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [cli.MIGRATION_LOCK])
        other.close()
    thread.join(60)
    assert done.is_set()


@pytest.mark.django_db
def test_apikey_create_gives_a_key_to_an_agent_named_by_the_rules_of_its_time(capsys):
    """An imported agent whose owner or name the given rules refuse now got no key, and a
    new agent of its name was made for another owner (review)."""
    from agents_api.models import Agent
    from agents_api.services import agent_get_or_create

    kept, _ = agent_get_or_create(owner_principal="zoe\u0308", name="bot3")
    assert cli.main(["apikey", "create", "bot3", "--owner", "zoe\u0308"]) == 0
    assert capsys.readouterr().out.startswith("msk_")
    assert list(Agent.objects.filter(name="bot3")) == [kept]
    # A new agent's owner is held to them.
    assert cli.main(["apikey", "create", "bot4", "--owner", "zoe\u0308"]) == 1
    assert "--owner must be written as it reads" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "read"),
    [
        ("MEMSVC_WEB_WORKERS", lambda: cli._web_command("127.0.0.1", 8283)),
        ("MEMSVC_WORKER_CONCURRENCY", lambda: cli._worker_processes()),
    ],
)
def test_a_count_of_processes_past_any_machine_is_refused(monkeypatch, name, read):
    """(A typo of 99999 web workers was taken, and booted them until the load was 129.)"""
    from django.core.exceptions import ImproperlyConfigured

    monkeypatch.setenv(name, str(cli.MAX_PROCESSES + 1))
    with pytest.raises(ImproperlyConfigured, match=f"{name} must be <= {cli.MAX_PROCESSES}"):
        read()
    monkeypatch.setenv(name, "3")
    read()  # (a count a machine has: taken)


@pytest.mark.django_db
def test_a_key_for_a_new_agent_of_a_name_others_have_says_whose_they_are(capsys):
    """A Letta client's agent is owned by its key's: ``apikey create travel`` without
    ``--owner`` made a second "travel", owned by local, whose searches found nothing of the
    first's, and said nothing (review)."""
    from agents_api.services import agent_get_or_create

    letta, _ = agent_get_or_create(
        owner_principal="agent:1f0c5c56-0000-0000-0000-000000000001", name="travel"
    )
    assert cli.main(["apikey", "create", "travel"]) == 0
    said = capsys.readouterr().err
    assert "created agent 'travel'" in said
    assert f"note: other agents named 'travel' exist, owned by {letta.owner_principal}" in said
    assert cli.main(["apikey", "create", "travel"]) == 0  # (its own again: no note)
    assert "note:" not in capsys.readouterr().err
