"""PostgreSQL on local mode's embedded server, started by the first connection that needs it.

Settings name the server (a socket under ``MEMSVC_DATA_DIR``) without starting it, so that
``manage.py check``, an IDE or ``celery beat`` boot no database. A process that connects
(a gunicorn worker, a Celery worker process, ``manage.py migrate``, the test session, whose
first connection is to the ``postgres`` database) starts it here, or finds it running.
``embedded_db.stop_server`` stops it again in the process that asks (``memsvc serve``).
"""

from django.conf import settings
from django.db.backends.postgresql import base, client

from memsvc import embedded_db


class DatabaseClient(client.DatabaseClient):
    """``manage.py dbshell`` runs ``psql``, which does not connect through the wrapper."""

    def runshell(self, parameters):
        embedded_db.ensure_server(settings.MEMSVC_DATA_DIR)
        super().runshell(parameters)


class DatabaseWrapper(base.DatabaseWrapper):
    client_class = DatabaseClient

    def get_new_connection(self, conn_params):
        # Once per process: later calls return at once (see ensure_server).
        embedded_db.ensure_server(settings.MEMSVC_DATA_DIR)
        return super().get_new_connection(conn_params)
