"""The Celery application. Configuration comes from Django settings (``CELERY_*``)."""

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from celery import Celery, states
from celery import Task as CeleryTask
from celery.beat import PersistentScheduler
from celery.exceptions import InvalidTaskError
from celery.signals import before_task_publish, worker_init, worker_ready
from kombu.exceptions import OperationalError
from kombu.transport import TRANSPORT_ALIASES

from memsvc.broker import task_shaped
from memsvc.outage import Outage, Reminder

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memsvc.settings")

# ``filesystem://`` (local mode's broker) is kombu's transport with whole-message writes and a
# reader that survives a bad file (memsvc.broker). Named here, before any connection resolves
# the alias, in every process that sends or receives tasks.
TRANSPORT_ALIASES["filesystem"] = "memsvc.broker:Transport"


def route(name, args, kwargs, options, task=None, **kw) -> dict | None:
    """The queue of a task: the LLM's own (``MEMSVC_LLM_QUEUE``) for a task that asks it
    (``uses_llm``), else the default (``CELERY_TASK_ROUTES``)."""
    if getattr(task, "uses_llm", False):
        from django.conf import settings

        return {"queue": settings.MEMSVC_LLM_QUEUE}
    return None


logger = logging.getLogger(__name__)
beat_logger = logging.getLogger("celery.beat")  # (Celery's own line of each task sent)


def shape_checked_strategy(task, app, consumer, **kwargs):
    """Celery's strategy (how a worker takes a task's message), refusing a message whose
    body is not a task's (``task_shaped``) as an invalid task: rejected, not requeued, and
    logged. Its unpacking raised out of the worker's loop and ended the worker; Redis gave
    the message back to the next one, which ended too, and nothing was embedded again
    until it was removed by hand (review). (Local mode's reader sets such a file aside
    before: ``memsvc.broker``.)"""
    from celery.worker.strategy import default  # (a worker's: not every process's import)

    handle = default(task, app, consumer, **kwargs)

    def checked(message, body, ack, reject, callbacks, **more):
        try:
            shaped = task_shaped(message)
        except (ValueError, TypeError, RecursionError):  # (no JSON, or nested past reading)
            shaped = False
        if not shaped:
            raise InvalidTaskError("the message's body is not a task's [args, kwargs, embed]")
        return handle(message, body, ack, reject, callbacks, **more)

    return checked


class Task(CeleryTask):
    Strategy = "memsvc.celery:shape_checked_strategy"

    def after_return(self, status, *args, **kwargs) -> None:
        """A worker's process, after each task that succeeded, says a worker of the task's
        queue does its tasks (``worker_seen``): one whose every task fails (its database
        refusing) is not seen (code review). (Not a retry's: Celery calls none then.)"""
        queue = (self.request.delivery_info or {}).get("routing_key")
        if status == states.SUCCESS and not self.request.is_eager and queue:
            worker_seen(queue)


app = Celery("memsvc", task_cls=Task)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["search", "agents_api"])


@worker_init.connect
@before_task_publish.connect
def make_local_queue_folders(**kwargs) -> None:
    """Local mode's queue folders, made when first needed rather than when settings are read.

    kombu's filesystem transport lists and writes them but never makes them: a worker lists
    the queue folder as soon as it starts, and a publisher (a web process, beat) writes into
    it, whichever comes first. Both are here: a worker starting, a task about to be sent.
    """
    if not app.conf.broker_url.startswith("filesystem://"):
        return
    options = app.conf.broker_transport_options
    names = ("data_folder_in", "data_folder_out", "processed_folder", "control_folder")
    folders = [Path(options[name]) for name in names]
    # Each once, the folder holding them first; their user's alone, as the data directory
    # (the tasks' files were anyone's to read where that lets others pass through: review).
    for folder in dict.fromkeys([*(folder.parent for folder in folders), *folders]):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)


def consumes(worker, queue: str) -> bool:
    """Whether a starting worker (a signal's sender: its controller, or its consumer) takes
    the tasks of ``queue`` (its ``--queues``, selected before ``worker_init``)."""
    return queue in worker.app.amqp.queues.consume_from


@worker_init.connect
def import_the_llm_client(sender, **kwargs) -> None:
    """A worker of the LLM's queue imports the model's client before it forks its processes.
    Imported by each process's first task, it took that task 0.6 s of CPU here, out of the
    task's time limit (``MEMSVC_LLM_TASK_SECONDS``) and at the worker's lower priority: on a
    busy CI host a first tool-record observation reached its 8 s limit before it asked the
    model."""
    from django.conf import settings

    from memsvc.llm import llm_configured, openai_package

    if llm_configured() and consumes(sender, settings.MEMSVC_LLM_QUEUE):
        openai_package()


# A queue's worker noted as working (``worker_seen``) by a process less than this long ago
# is not noted again by it: one statement every 10 s at most, not one a task.
WORKER_SEEN_EVERY_SECONDS = 10.0
_WORKER_NOTED: dict[str, Outage] = {}  # (this process's, by queue)


def worker_seen(queue: str) -> None:
    """Note that a worker of ``queue`` finished a task now, unless this process noted it
    less than ``WORKER_SEEN_EVERY_SECONDS`` ago: health says whether one of the default
    queue's (the embeddings') did lately (``worker_seen_at``). Written by the task's own
    process, on the task's connection, after the task: a thread beside the pool, the
    worker's heartbeat tried before, hung the tasks of the processes it forked
    (docs/benchmarks.md). A database that refuses costs the note, never the task."""
    from django.db import DatabaseError, connection

    noted = _WORKER_NOTED.setdefault(queue, Outage(WORKER_SEEN_EVERY_SECONDS))
    if noted.ongoing:
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO worker_seen (queue, seen_at) VALUES (%s, statement_timestamp())"
                " ON CONFLICT (queue) DO UPDATE"
                " SET seen_at = greatest(worker_seen.seen_at, excluded.seen_at)",
                [queue],
            )
    except DatabaseError:
        logger.debug("could not note that a worker works", exc_info=True)
        return
    noted.began()


def worker_seen_at() -> tuple | None:
    """When a worker of the default queue was last noted working (``worker_seen``: up to
    10 s after its last task), and how long ago by the database's clock, which wrote it (a
    web host's clock may differ from an external database's: code review); (None, None) if
    none ever was; None when the database has no such table yet (a ``DATABASE_URL`` not
    migrated to this release: health is not refused for it; code review)."""
    from django.conf import settings
    from django.db import ProgrammingError, connection

    from memsvc.db import not_migrated

    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT seen_at, statement_timestamp() - seen_at FROM worker_seen WHERE queue = %s",
                [settings.CELERY_TASK_DEFAULT_QUEUE],
            )
            return cursor.fetchone() or (None, None)
    except ProgrammingError as exc:
        if not_migrated(exc):
            return None
        raise


@app.task(name="memsvc.worker_started")
def worker_started_task() -> None:
    """Nothing but the note its end makes (``Task.after_return``): sent to the default
    queue by a worker of it as it is ready (``say_a_worker_started``; any worker of the
    queue may take it), so that health sees one before the first real task (the sweeps
    come each minute)."""


@worker_ready.connect
def say_a_worker_started(sender, **kwargs) -> None:
    from django.conf import settings

    if consumes(sender, settings.CELERY_TASK_DEFAULT_QUEUE):
        sent(worker_started_task, instead="health sees the worker at its first task")


def broker_reachable(timeout: float = 1.0) -> bool:
    """Whether a connection to the broker opens within ``timeout`` seconds (for the health
    probe: with the broker down the service still answers, and the sweep embeds later); not
    asked again while it failed a moment ago (``BROKER_OUTAGE``: one that does not answer
    cost each probe some 3 s, Redis's own connection timeout; code review)."""
    if BROKER_OUTAGE.ongoing:
        return False
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=0, timeout=timeout)
    except Exception:  # kombu raises the transport's own errors, whatever they are
        BROKER_OUTAGE.began()
        return False
    return True


# A broker that failed a send is not asked again for this long (``sent``): every append of
# an outage waited for its connection timeout (3 s).
BROKER_OUTAGE = Outage(seconds=5.0)
# By task and what happens instead: the tasks not sent while it lasts.
NOT_SENT_SAID: dict[tuple[str, str], Reminder] = {}


def sent(task, args=(), *, instead: str, **options) -> bool:
    """Whether ``task`` (with ``args``, and ``apply_async``'s ``options``) was handed to a
    worker. When the broker fails, or failed a moment ago (``BROKER_OUTAGE``), False, and
    a warning says what happens ``instead`` ("the sweep will embed them"): a request never fails for
    its background work, nor waits for a broker that is down."""
    if BROKER_OUTAGE.ongoing:
        # Once a minute a task, not at every request (941 lines in 40 s of appends: review).
        NOT_SENT_SAID.setdefault((task.name, instead), Reminder()).say(
            logger.info,
            "the broker is down: %s not sent meanwhile (said once a minute); %s",
            task.name,
            instead,
        )
        return False
    try:
        task.apply_async(args=list(args), retry=False, **options)
        return True
    except Exception as exc:  # any broker failure: kombu, redis, amqp, OS errors
        if isinstance(exc, OperationalError | OSError):  # (it could not be reached)
            BROKER_OUTAGE.began()
        logger.warning("could not send %s (%s); %s", task.name, exc, instead)
        return False


class Gathered:
    """Ids a process's requests hand over for a task, sent together by a thread of the
    process's own: ``send(ids)`` once ``seconds`` after the first of them. A request adds
    its ids without waiting for the broker, and the worker takes one task for many (a
    message a request cost it about 0.5-1 ms of the web process's CPU; docs/benchmarks.md).

    The thread is started by the first ids (in the process that adds them: a thread does
    not outlive a fork; a forked child starts afresh, what the parent held is the parent's
    to send). A process that exits sends what it holds (``flush``, at exit, waiting for a
    send the thread has begun: the interpreter stops a daemon thread where it is once the
    exit's handlers are done); one killed outright loses what it held: at most ``seconds``
    of them, or what came while a send waited for a broker that did not answer (the sweeps
    embed what the queue lost). With tasks run inline (the tests'), each ``add`` sends at
    once."""

    def __init__(self, send: Callable[[list[str]], object], *, seconds: float, name: str):
        self.send = send
        self.seconds = seconds
        self.name = name
        self._at_exit = False
        self._start_afresh()
        os.register_at_fork(after_in_child=self._start_afresh)

    def _start_afresh(self) -> None:
        # (In a forked child too: a lock the parent's thread held at the fork would never
        # be released there.)
        self._lock = threading.Lock()
        self._sending = threading.Lock()  # (one send at a time: ``flush``)
        self._pending: list[str] = []
        self._due = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, ids: list[str]) -> None:
        if app.conf.task_always_eager:
            self.send(ids)
            return
        with self._lock:
            self._pending += ids
            if self._thread is None or not self._thread.is_alive():
                if not self._at_exit:
                    atexit.register(self.flush)
                    self._at_exit = True
                self._thread = threading.Thread(
                    target=self._send_forever, name=self.name, daemon=True
                )
                try:
                    self._thread.start()
                except RuntimeError as exc:  # (no thread to be had: never the request's error)
                    logger.warning("%s: sent with the next ids or at exit (%s)", self.name, exc)
        self._due.set()

    def flush(self) -> None:
        """Send what the process holds now (at exit, and for tests)."""
        with self._sending:
            with self._lock:
                ids, self._pending = self._pending, []
            if ids:
                self.send(ids)

    def _send_forever(self) -> None:
        from django.db import connections

        while True:
            self._due.wait()
            time.sleep(self.seconds)
            self._due.clear()  # (ids added from here on set it again)
            try:
                self.flush()
            except Exception:  # a thread that ends would send nothing more
                logger.exception("%s: not sent", self.name)
            finally:
                connections.close_all()  # (this thread's own, if a fallback opened one)


class Scheduler(PersistentScheduler):
    """Celery's beat scheduler (``--schedule`` file), saying a task it could not send in a
    line, once a minute while it lasts: with the broker down, or its queue folder not
    writable, Celery logged a traceback and the stack above it for every sweep every minute
    (reviews). The next run sends it as before."""

    def apply_entry(self, entry, producer=None):
        beat_logger.info("Scheduler: Sending due task %s (%s)", entry.name, entry.task)
        try:
            self.apply_async(entry, producer=producer, advance=False)
        except Exception as exc:  # any broker failure, as Celery's own catches
            instead = "it is sent at its next run"
            NOT_SENT_SAID.setdefault((entry.task, instead), Reminder()).say(
                logger.warning,
                "beat could not send %s (%s); %s (said once a minute)",
                entry.task,
                exc,
                instead,
            )
