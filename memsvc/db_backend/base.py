"""memsvc's PostgreSQL backend, for both modes: Django's, with timestamps read faster, and in
local mode the embedded server started by the first connection that needs it.

Settings name the embedded server (a socket under ``MEMSVC_DATA_DIR``) without starting it,
so that ``manage.py check``, an IDE or ``celery beat`` boot no database. A process that
connects (a gunicorn worker, a Celery worker process, ``manage.py migrate``, the test
session, whose first connection is to the ``postgres`` database) starts it here, or finds
it running. ``embedded_db.stop_server`` stops it again in the process that asks (``memsvc
serve``). With ``DATABASE_URL`` nothing is started.
"""

import functools
import select
from datetime import datetime

from django.conf import settings
from django.db.backends.postgresql import base, client
from psycopg.pq import Format

from memsvc import embedded_db


class DatabaseClient(client.DatabaseClient):
    """``manage.py dbshell`` runs ``psql``, which does not connect through the wrapper."""

    def runshell(self, parameters):
        if settings.DATABASE_URL is None:
            embedded_db.ensure_server(settings.MEMSVC_DATA_DIR)
        super().runshell(parameters)


@functools.cache
def _iso_loader(django_loader: type) -> type:
    """Django's loader of ``timestamptz`` (an aware datetime in the connection's time zone),
    reading the value as ISO 8601 in C (``datetime.fromisoformat``): Django's loader
    derives from psycopg's loader in Python (psycopg's C loaders serve only its own
    classes), 2.8 us a value against 0.1; a search reads a hundred of them. PostgreSQL
    writes a timestamp in UTC (Django sets the session's time zone) as ``2026-11-24
    22:50:51.123456+00``; anything else (another offset, a date BC, a year past 9999) is
    left to Django's loader, which answers as it always did."""

    class IsoTimestamptzLoader(django_loader):
        def load(self, data):
            text = bytes(data).decode()
            if text.endswith("+00"):
                try:
                    value = datetime.fromisoformat(text)
                except ValueError:
                    return super().load(data)
                # The instant, in the connection's zone (``DATABASES`` ``TIME_ZONE``): a
                # zone of offset 0 with summer time (Europe/London) holds an hour twice in
                # autumn, told apart by ``fold``, which ``replace`` would leave at the
                # first. None (``USE_TZ = False``): the wall time, the session's offset
                # being 0.
                if self.timezone is None:
                    return value.replace(tzinfo=None)
                return value.astimezone(self.timezone)
            return super().load(data)

    return IsoTimestamptzLoader


class DatabaseWrapper(base.DatabaseWrapper):
    client_class = DatabaseClient

    def get_new_connection(self, conn_params):
        if settings.DATABASE_URL is None:
            # Once per process: later calls return at once (see ensure_server). The
            # package's own checks of a server it cannot start (one still running on a data
            # directory deleted under it) are assertions: an outage, as any database not
            # answering (a 503), not a bug's HTML page (review).
            try:
                embedded_db.ensure_server(settings.MEMSVC_DATA_DIR)
            except AssertionError as exc:
                raise base.Database.OperationalError(
                    f"the embedded PostgreSQL could not be started here ({exc!r})"
                ) from exc
        connection = super().get_new_connection(conn_params)
        django_loader = connection.adapters.get_loader(base.TIMESTAMPTZ_OID, Format.TEXT)
        connection.adapters.register_loader("timestamptz", _iso_loader(django_loader))
        return connection

    def is_usable(self):
        """Whether the connection still reaches its server (``CONN_HEALTH_CHECKS``: asked at
        the first statement of each request), without Django's ``SELECT 1`` while the socket
        is quiet: that was a round trip more for every request, which after a pause also
        woke the server's process. An idle connection has nothing to read; a server that
        ended it (stopped, restarted by ``memsvc serve``, the backend terminated, a proxy's
        idle timeout) left its last message or the end of the stream on the socket. When
        something is there, Django's own check decides (it reads what is waiting)."""
        raw = self.connection
        if raw is None or raw.closed:
            return False
        poller = select.poll()  # (not select(): a process may hold over 1024 files)
        try:
            poller.register(raw.fileno(), select.POLLIN)
        except base.Database.Error:
            return False  # no socket left to read
        return not poller.poll(0) or super().is_usable()
