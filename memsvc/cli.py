"""The ``memsvc`` command line.

``memsvc serve`` is the whole service on one machine: it migrates, then runs the web server,
a Celery worker and the beat scheduler (periodic sweeps) as child processes, restarts any of
them that dies and the embedded database if it stops (memsvc.supervisor), and stops them
all, and the embedded database if it started it, on Ctrl-C or SIGTERM.
"""

import argparse
import contextlib
import errno
import os
import signal
import stat
import sys
import threading
import time

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import SystemCheckError
from django.db import IntegrityError, OperationalError, ProgrammingError

from memsvc.env import data_directory, lock_alone, unusable_directory, usable_directory
from memsvc.supervisor import Supervisor, log

KEEP_ALIVE_SECONDS = 75


def _setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memsvc.settings")
    import django

    django.setup()
    from django.conf import settings

    if settings.LOCAL_MODE:
        # Its user's alone, whichever command makes it, before anything is made in it: the
        # model's cache or the queue's folders made it 0755 as their parent (code review).
        data_directory(settings.MEMSVC_DATA_DIR)


def _setup_database() -> None:
    """Django, with the embedded database migrated (``_migrate_embedded``)."""
    _setup_django()
    _migrate_embedded()


def _migrate_embedded() -> None:
    """Migrate the embedded database: a command may be the first to run on a data directory
    (a key made for an MCP client before any `memsvc serve`). A database of
    ``DATABASE_URL`` is migrated by its operator, once per release."""
    from django.conf import settings

    if not settings.DATABASE_URL:
        migrate()


# Taken by ``migrate``: the key of one session-level advisory lock ("memsvc" in ASCII).
MIGRATION_LOCK = 0x6D656D737663
MIGRATION_LOCK_POLL_SECONDS = 0.2


def migrate(**options) -> None:
    """Django's ``migrate``, one process at a time on a database: two `memsvc serve` started
    at once on one database both migrated, one failed half-way, and a migration was applied
    twice (review). The second waits, then finds nothing to do."""
    from django.core.management import call_command
    from django.db import DatabaseError, connection

    with connection.cursor() as cursor:
        # Asked again until it is free, not waited for in one statement: a waiting statement
        # is a transaction, which a migration's CREATE INDEX CONCURRENTLY waits to see end,
        # and it waited for the migration's lock (commands run at once on a new data
        # directory: "deadlock detected"; review).
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [MIGRATION_LOCK])
        while not cursor.fetchone()[0]:
            time.sleep(MIGRATION_LOCK_POLL_SECONDS)
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [MIGRATION_LOCK])
    try:
        call_command("migrate", interactive=False, verbosity=0, **options)
    finally:
        with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [MIGRATION_LOCK])


# The most processes of one kind ``serve`` and ``worker`` start (each loads the model): a
# typo of 99999 booted workers until the machine's load was 129 (review).
MAX_PROCESSES = 64


def _web_command(host: str, port: int) -> list[str]:
    """gunicorn managing uvicorn workers, serving the ASGI application: a request reaches a
    thread only once its headers and body are in, so slow clients cost a socket each, never a
    request thread (docs/benchmarks.md, "Slow clients")."""
    from memsvc.env import env_int

    workers = env_int("MEMSVC_WEB_WORKERS", 2, minimum=1, maximum=MAX_PROCESSES)
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "memsvc.asgi:application",
        "--bind",
        _address(host, port),
        "--workers",
        str(workers),
        "--worker-class",
        "memsvc.web_worker.OneConnectionAtATimeWorker",
        "--timeout",
        "60",
        "--graceful-timeout",
        "10",
        # Longer than any client keeps an idle connection (httpx: 5 s), so the server never
        # closes one just as a client sends on it (a "connection reset" for that request).
        "--keep-alive",
        str(KEEP_ALIVE_SECONDS),
        # The client's address is the peer's: uvicorn would otherwise take a loopback peer's
        # X-Forwarded-For as it (any program on the machine could name itself anyone).
        # memsvc reads that header itself, from the proxies of MEMSVC_TRUSTED_PROXIES only.
        "--forwarded-allow-ips",
        "",
        "--access-logfile",
        "-",
        "--config",
        "python:memsvc.gunicorn_conf",
        # gunicorn's control socket is one path per user: two servers would share it.
        "--no-control-socket",
    ]


# The longest statement of a web request (``MEMSVC_STATEMENT_TIMEOUT_SECONDS``), unless set.
WEB_STATEMENT_TIMEOUT_SECONDS = "30"


def _web_env() -> dict[str, str]:
    """One embedding thread per web process: a search embeds one short query while the same
    process talks to PostgreSQL, and the other core serves the next request. A statement of
    a request runs at most ``WEB_STATEMENT_TIMEOUT_SECONDS``."""
    return {
        "MEMSVC_EMBEDDING_THREADS": os.environ.get("MEMSVC_EMBEDDING_THREADS", "1"),
        "MEMSVC_STATEMENT_TIMEOUT_SECONDS": os.environ.get(
            "MEMSVC_STATEMENT_TIMEOUT_SECONDS", WEB_STATEMENT_TIMEOUT_SECONDS
        ),
    }


def _worker_processes() -> int:
    """Worker processes: one per core (at most 4). The model computes fastest with one thread
    per process, and one process embeds while another waits for PostgreSQL."""
    from memsvc.env import env_int

    return env_int(
        "MEMSVC_WORKER_CONCURRENCY", min(4, os.cpu_count() or 1), minimum=1, maximum=MAX_PROCESSES
    )


def _worker_env(processes: int) -> dict[str, str]:
    """The worker's share of the cores for each process's model (unless set by hand)."""
    threads = os.environ.get("MEMSVC_EMBEDDING_THREADS") or str(
        max(1, (os.cpu_count() or 1) // processes)
    )
    return {"MEMSVC_EMBEDDING_THREADS": threads}


def _celery(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "memsvc.celery", *arguments]


def _memsvc_command(*arguments: str) -> list[str]:
    """A command of this program, run as a child with this interpreter."""
    return [sys.executable, "-m", "memsvc.cli", *arguments]


# Celery's options that name one worker, and its files: the LLM's worker takes a name of its
# own, and a file only a name in it (``%n``) tells apart from the other worker's.
_NAME_OPTIONS = {"-n", "--hostname"}
_FILE_OPTIONS = {"-f", "--logfile", "--pidfile", "-S", "--statedb"}
# What the LLM's worker sets for itself.
_OWN_OPTIONS = {"-Q", "--queues", "-c", "--concurrency"}


def _llm_worker_extra(extra: list[str]) -> list[str]:
    """Celery's options of ``memsvc worker -- ...`` as the LLM's worker takes them: a name
    given (``-n w1@%h``) as ``llm-w1@%h``, else ``llm@%h``; its queue and processes its own;
    ``ValueError`` for a file both workers would share (a pid file: the second worker to
    start found it and ended, and the whole ``memsvc worker`` with it: review)."""
    taken, named, options = [], False, iter(extra)
    for option in options:
        name, given, value = option.partition("=")
        if name in _NAME_OPTIONS | _FILE_OPTIONS | _OWN_OPTIONS and not given:
            value = next(options, "")
        if name in _OWN_OPTIONS:
            continue
        if name in _NAME_OPTIONS:
            taken += [name, f"llm-{value}"]
            named = True
        elif name in _FILE_OPTIONS:
            if "%n" not in value:
                raise ValueError(
                    f"{name} {value}: both workers (the LLM's too) would write that file; "
                    "put %n (each worker's name) in it"
                )
            taken += [name, value]
        else:
            taken.append(option)
    return taken if named else ["--hostname", "llm@%h", *taken]


def _worker_command(
    *, processes: int, extra: list[str] | None = None, llm: bool = False
) -> list[str]:
    """The Celery worker of the default queue (Celery's options in ``extra`` may change
    it), or with ``llm`` the one of the LLM's queue (``_llm_worker_extra``)."""
    from django.conf import settings

    command = _celery("worker", "--loglevel", "INFO", "--concurrency", str(processes))
    if settings.CELERY_BROKER_URL.startswith("filesystem://"):
        # The filesystem transport has no broadcast: no worker-to-worker chatter.
        command += ["--without-mingle", "--without-gossip", "--without-heartbeat"]
    if llm:
        return [*command, "--queues", settings.MEMSVC_LLM_QUEUE, *_llm_worker_extra(extra or [])]
    return command + ["--queues", settings.CELERY_TASK_DEFAULT_QUEUE] + (extra or [])


def _beat_command() -> list[str]:
    """The periodic scheduler, a process of its own (not inside a worker, where the worker's
    death would orphan it); its schedule file remembers the last runs across restarts."""
    from django.conf import settings

    schedule = settings.MEMSVC_DATA_DIR / "celerybeat-schedule"
    # No pid file: the supervisor is what keeps a single beat.
    return _celery("beat", "--loglevel", "INFO", "--schedule", str(schedule), "--pidfile=")


def _hold_the_scheduler() -> int | None:
    """A descriptor holding the lock of this data directory's scheduler until it is closed,
    or None (said) when another process (a ``memsvc serve`` with its worker, a ``memsvc
    worker --beat``) holds it. (A second ``serve`` on one data directory ran a second beat
    on the same schedule file: every periodic sweep twice; review.)"""
    from django.conf import settings

    data_dir = data_directory(settings.MEMSVC_DATA_DIR)
    try:
        held = lock_alone(data_dir / "scheduler.lock")
    except OSError as exc:
        raise unusable_directory(data_dir, "MEMSVC_DATA_DIR", exc) from None
    if held is None:
        print(
            f"memsvc: another memsvc process runs the scheduler of {data_dir} (a `memsvc "
            "serve`, or a `memsvc worker --beat`): stop it first, or serve with --no-worker",
            file=sys.stderr,
        )
        return None
    return held


def _worker_niceness() -> int:
    """How much lower the worker's scheduling priority is than the web server's. Embedding
    appended messages can wait; a request waiting behind it is a user waiting. Under a full
    load the worker still gets a share of the cores (nice 10 weighs about a tenth of nice 0),
    and all of what the requests leave."""
    from memsvc.env import env_int

    return env_int("MEMSVC_WORKER_NICE", 10, minimum=0, maximum=19)


def _start_workers(supervisor: Supervisor, *, beat: bool, extra: list[str] | None = None) -> None:
    """The embedding worker; with an LLM configured, the LLM's worker beside it (its tasks
    wait on the model, for minutes at times: on the embedding worker they held its processes
    while messages waited to be embedded); with ``beat``, the scheduler."""
    from memsvc.env import env_int
    from memsvc.llm import llm_configured

    processes = _worker_processes()
    supervisor.start(
        "worker",
        _worker_command(processes=processes, extra=extra),
        env=_worker_env(processes),
        niceness=_worker_niceness(),
    )
    if llm_configured():
        processes = env_int("MEMSVC_LLM_WORKER_CONCURRENCY", 2, minimum=1, maximum=MAX_PROCESSES)
        supervisor.start(
            "LLM worker",
            _worker_command(processes=processes, extra=extra, llm=True),
            env=_worker_env(processes),
            niceness=_worker_niceness(),
        )
    if beat:
        supervisor.start("beat", _beat_command())


def cmd_serve(args: argparse.Namespace) -> int:
    supervisor = Supervisor()
    _setup_django()
    from django.conf import settings

    from memsvc import embedded_db
    from search.checks import check_embedding_dimension, warn_about_other_vector_models
    from search.embeddings import configured_model_prepared

    host = args.host or settings.MEMORY_SERVER_HOST
    port = settings.MEMORY_SERVER_PORT if args.port is None else args.port
    scheduler = None if args.no_worker else _hold_the_scheduler()
    if scheduler is None and not args.no_worker:
        return 1
    try:
        if settings.LOCAL_MODE:
            # Local mode's secrets exist from now on, for the children and for whoever wants
            # the JWT secret of a running server; the web processes' WhiteNoise scans
            # STATIC_ROOT.
            embedded_db.local_secrets(settings.MEMSVC_DATA_DIR)
            usable_directory(settings.STATIC_ROOT, "DJANGO_STATIC_ROOT")
        # The first connection starts the embedded database (memsvc.db_backend): this
        # process holds it until the `finally` below, and starts it again if it stops.
        # (With the system checks, which call_command skips: a setting Django refuses, such
        # as a CSRF origin without its scheme, stops the start, as in `manage.py check`.)
        migrate(skip_checks=False)
        check_embedding_dimension()
        warn_about_other_vector_models()
        # Before the first request can come: the first start on a data directory makes the
        # model's graph (seconds), and each search, or learning()'s context request, would
        # wait for it (the one that waited past the client's 10 s went without memory). In a
        # child: an export loads torch and the model, which this long-lived process would
        # hold for good (780 MB), and a stop asked meanwhile ends it at once.
        if not configured_model_prepared():
            log("making the local model's graph (once for its cache: seconds)")
            code = supervisor.run_to_end("model's graph", _memsvc_command("prepare-model"))
            if code:
                return code
        if supervisor.stopping:
            return 0
        if settings.DATABASE_URL is None:
            supervisor.watched += _embedded_database_watched()
        supervisor.start("web server", _web_command(host, port), env=_web_env())
        if not args.no_worker:
            _start_workers(supervisor, beat=True)
        return supervisor.run()
    finally:
        supervisor.stop_all()
        embedded_db.stop_server()
        if scheduler is not None:
            os.close(scheduler)  # (and with it the lock)


def cmd_prepare_model(args: argparse.Namespace) -> int:
    """The local model's files made ahead (``memsvc serve`` runs it on a first start; an
    image build can, so that no container makes them at start)."""
    _setup_django()
    from search.embeddings import prepare_configured_model

    prepare_configured_model()
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    supervisor = Supervisor()
    _setup_django()
    scheduler = _hold_the_scheduler() if args.beat else None
    if scheduler is None and args.beat:
        return 1
    from memsvc import embedded_db
    from memsvc.llm import llm_configured
    from search.checks import check_embedding_dimension, warn_about_other_vector_models

    try:
        _migrate_embedded()
        check_embedding_dimension()
        warn_about_other_vector_models()
        # `memsvc worker -- --hostname w1@%h`: what follows "--" is Celery's.
        extra = args.celery_args[1:] if args.celery_args[:1] == ["--"] else args.celery_args
        if llm_configured():
            try:
                _llm_worker_extra(extra)
            except ValueError as exc:
                print(f"memsvc worker: {exc}", file=sys.stderr)
                return 2
        _start_workers(supervisor, beat=args.beat, extra=extra)
        return supervisor.run()
    finally:
        embedded_db.stop_server()
        if scheduler is not None:
            os.close(scheduler)  # (and with it the lock)


def cmd_reindex(args: argparse.Namespace) -> int:
    _setup_database()
    from django.conf import settings
    from django.utils import timezone

    from agents_api.services import (
        memories_embed_pending,
        memories_reembed_all,
        still_waiting,
        tool_records_embed_pending,
        tool_records_reembed_all,
    )
    from memsvc import embedded_db
    from search.checks import check_embedding_dimension, check_model_width
    from search.embeddings import EmbeddingError
    from search.services import PATIENCE_SECONDS, embed_pending, reembed_all, vector_columns_resized

    if args.resize:
        width = settings.MEMORY_EMBEDDING_DIMENSION
        check_model_width(must_answer=True)  # (before a vector is dropped)
        # A service running on the embedded database: its processes would go on with the
        # old width, each write of a vector refused (review). (A database of DATABASE_URL:
        # the tables held are refused, below; README says to stop the service.)
        others = embedded_db.other_holders()
        if others:
            print(
                f"other memsvc processes use this database ({', '.join(map(str, others))}): "
                "stop the service, then run this again; nothing was changed",
                file=sys.stderr,
            )
            return 1
        try:
            resized = vector_columns_resized(width)
        except OperationalError as exc:
            print(
                f"the tables are in use ({str(exc).strip()}): stop the service, then run this "
                "again; nothing was changed",
                file=sys.stderr,
            )
            return 1
        for table in resized:
            print(
                f"{table}.embedding is now vector({width}): its rows wait for the new model",
                file=sys.stderr,
            )
    # (A model of another width than the columns: said in one line, as `serve` says it; a
    # traceback of the database's refusal of the first batch: review.)
    check_embedding_dimension()
    started, began = time.monotonic(), timezone.now()
    try:
        # (``patient``: what another reindex or a worker is embedding meanwhile is waited
        # for, so that nothing waits once this says it is done.)
        count = reembed_all() if args.all else embed_pending(patient=True)
        memories = memories_reembed_all() if args.all else memories_embed_pending(patient=True)
        records = (
            tool_records_reembed_all() if args.all else tool_records_embed_pending(patient=True)
        )
    except EmbeddingError as exc:
        print(
            f"the embedding backend failed ({exc}): what was embedded before it stays; "
            "run this again once it answers",
            file=sys.stderr,
        )
        return 1
    except OperationalError as exc:  # (a row another transaction held past the lock timeout)
        print(
            f"the database refused a write ({exc}): what was embedded before it stays; "
            "run this again",
            file=sys.stderr,
        )
        return 1
    elapsed = time.monotonic() - started
    print(
        f"embedded {count} messages, {memories} memories and {records} tool records "
        f"in {elapsed:.1f} s",
        file=sys.stderr,
    )
    if args.all:
        return 0
    # What another process held past the patience (a worker hung on a remote model): said,
    # and a failure (it said it was done, those still waiting: review).
    waiting = still_waiting(began)
    left = ", ".join(f"{name}: {n}" for name, n in waiting.items() if n)
    if left:
        print(
            f"still waiting ({left}): held by another process past {PATIENCE_SECONDS:.0f} s "
            "(the sweep embeds them once it lets go), or refused by the model (the log says "
            "which)",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    _setup_database()
    from agents_api.services import memories_prune, unattached_blocks_prune
    from memsvc.api.idempotency import idempotency_keys_prune

    result = memories_prune()
    print(f"memories: {result.deleted} deleted, {result.extended} extended")
    print(f"idempotency keys: {idempotency_keys_prune()} forgotten")
    print(f"unattached blocks: {unattached_blocks_prune()} deleted")
    return 0


def _embedded_database_watched() -> list:
    """What a process that holds the embedded database keeps running: the server, and its
    watcher (which stops it once no process holds it)."""
    from memsvc import embedded_db
    from memsvc.supervisor import Watched

    return [
        Watched("embedded PostgreSQL", embedded_db.server_running, embedded_db.restart_server),
        Watched(
            "embedded PostgreSQL's watcher",
            embedded_db.watcher_running,
            embedded_db.restart_watcher,
        ),
    ]


def cmd_mcp(args: argparse.Namespace) -> int:
    # stdin and stdout are the protocol's alone: from here on whatever else writes to file
    # descriptor 1 (this process, a library, a child such as the embedded PostgreSQL) writes
    # to stderr, and whatever reads file descriptor 0 reads nothing.
    wire_in, wire = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.close(nothing)
    os.dup2(2, 1)
    _setup_django()
    from django.conf import settings

    from agents_api.mcp_server.stdio import CallerError, serve, stdio_caller
    from agents_api.tasks import flush_memory_touches
    from memsvc import embedded_db
    from memsvc.supervisor import keep_running
    from search.embeddings import warm_up_in_background

    stopped = threading.Event()

    try:
        # The name of an agent made here follows the rule of every API that makes one;
        # refused before anything is written (a fresh data directory's migration).
        if args.agent and _refused("memsvc mcp: agent name", _agent_name_problem(args.agent)):
            return 2
        _migrate_embedded()
        try:
            caller = stdio_caller(
                agent_name=args.agent,
                api_key=os.environ.get("MEMSVC_API_KEY"),
                local_mode=settings.LOCAL_MODE,
            )
        except CallerError as exc:
            print(f"memsvc mcp: {exc}", file=sys.stderr)
            return 2
        warm_up_in_background()
        if settings.DATABASE_URL is None:
            threading.Thread(
                target=keep_running,
                args=(_embedded_database_watched(), stopped),
                name="embedded-database",
                daemon=True,
            ).start()
        print(
            f"memsvc mcp: serving agent {caller.agent.name!r} over stdio",
            file=sys.stderr,
            flush=True,
        )
        # An MCP client that ends its server with SIGTERM (rather than closing stdin) ends
        # it as Ctrl-C does: the use counts below are sent first (the default action ended
        # the process where it was: they were lost; review). While it serves, the session's
        # event loop takes the signal (``serve``).
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            serve(caller, wire_in, wire)
        finally:
            # The session's use counts, however it ended, while the database is up for the
            # broker-down fallback (the exit's own flush would come after it stopped).
            flush_memory_touches()
        return 0
    finally:
        stopped.set()
        embedded_db.stop_server()


def _address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets (``--host ::`` failed: "'' is not a valid
    port number"; review)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _port(text: str) -> int:
    """``--port``: 1..65535 (0 was read as no port given, and the server took another;
    -1 or 99999 started everything, then the web server failed to bind: review)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1..65535, not {port}")
    return port


def _refused(what: str, problem: str | None) -> bool:
    """Say why ``what`` is refused (``problem``, a ``*_problem`` function's answer), if it is."""
    if problem:
        print(f"{what} {problem}", file=sys.stderr)
    return bool(problem)


def _agent_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an agent (the rule of every API that makes one), or None."""
    from rest_framework.exceptions import ValidationError

    from agents_api.local_api.serializers import AgentNameField

    try:
        AgentNameField().run_validation(name)
    except ValidationError as exc:
        return " ".join(str(detail) for detail in exc.detail)
    return None


# A user token is a bearer credential nothing can revoke: it lives a year at most.
MAX_TOKEN_TTL_SECONDS = 365 * 24 * 3600


def cmd_token(args: argparse.Namespace) -> int:
    _setup_django()
    from memsvc.api.principals import user_id_problem
    from memsvc.tokens import mint_user_token

    # (A token the server would refuse is no token.)
    if _refused("user id", user_id_problem(args.user_id)) or _refused(
        "--ttl",
        None
        if 0 < args.ttl <= MAX_TOKEN_TTL_SECONDS
        else f"must be between 1 and {MAX_TOKEN_TTL_SECONDS} seconds (a year)",
    ):
        return 1
    print(mint_user_token(args.user_id, ttl_seconds=args.ttl))
    return 0


def cmd_apikey_create(args: argparse.Namespace) -> int:
    _setup_database()
    from agents_api.models import Agent, api_key_name_problem
    from agents_api.services import agent_get_or_create, api_key_create
    from memsvc.api.errors import NotFound
    from memsvc.api.principals import agent_owner_problem

    # The rules of a new agent's name and owner, not of one that exists (an import's, named
    # by rules of its time, got no key here, and a new agent of the name was made: review).
    new = not Agent.objects.filter(owner_principal=args.owner, name=args.agent).exists()
    if (
        (new and _refused("agent name", _agent_name_problem(args.agent)))
        or (new and _refused("--owner", agent_owner_problem(args.owner)))
        or _refused("--name", api_key_name_problem(args.name or ""))
    ):
        return 1
    agent, created = agent_get_or_create(owner_principal=args.owner, name=args.agent)
    try:
        api_key, full_key = api_key_create(agent=agent, scopes=args.scope, name=args.name or "")
    except NotFound:
        print(f"agent {agent.name!r} was deleted meanwhile: no key made", file=sys.stderr)
        return 1
    print(
        f"{'created' if created else 'existing'} agent {agent.name!r} (id {agent.id}); "
        f"key {api_key.public_id} with scopes {', '.join(api_key.scopes)}. "
        "The key is shown only now:",
        file=sys.stderr,
    )
    others = Agent.objects.filter(name=args.agent).exclude(pk=agent.pk)
    if created and others.exists():
        # (A Letta client's agent is owned by its key's: a key made without --owner made a
        # second agent of the name, whose searches found nothing of the first's; review.)
        owners = ", ".join(sorted(set(others.values_list("owner_principal", flat=True)))[:5])
        print(
            f"note: other agents named {args.agent!r} exist, owned by {owners}: for a key "
            "of one of those, give its owner (--owner)",
            file=sys.stderr,
        )
    print(full_key)
    return 0


def cmd_apikey_list(args: argparse.Namespace) -> int:
    _setup_database()
    from agents_api.models import ApiKey

    keys = ApiKey.objects.select_related("agent").order_by("created_at")
    if args.agent:
        # By id or by name, as ``export agent`` takes one (an id listed nothing, and so did
        # an agent there is not, exit 0: review); every agent of that name.
        agents = _agents_of(args.agent)
        if not agents.exists():
            print(f"no agent {args.agent!r}", file=sys.stderr)
            return 1
        keys = keys.filter(agent__in=agents)
    for key in keys:
        state = f"revoked {key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "active"
        used = f"{key.last_used_at:%Y-%m-%d %H:%M}" if key.last_used_at else "never"
        # Its note last (README: "NOTE tells keys apart"; it was not shown: review), as
        # Python writes it when it holds what would break the line.
        note = key.name if key.name.isprintable() else repr(key.name)
        print(
            f"{key.public_id}\t{key.agent.name}\t{key.agent_id}\t{','.join(key.scopes)}"
            f"\t{state}\tlast used {used}\t{note}"
        )
    return 0


def cmd_apikey_revoke(args: argparse.Namespace) -> int:
    _setup_database()
    from agents_api.keys import split_key
    from agents_api.models import ApiKey
    from agents_api.services import api_key_revoke

    # The whole key names its id too; its secret is never written back (it was, on stderr,
    # in "no API key 'msk_...'": review).
    whole = split_key(args.key_id)
    key_id = whole[0] if whole else args.key_id
    api_key = ApiKey.objects.filter(public_id=key_id).first()
    if api_key is None:
        print(f"no API key {key_id!r}", file=sys.stderr)
        return 1
    if api_key.revoked_at is not None:
        print(
            f"{api_key.public_id} was revoked already, at {api_key.revoked_at:%Y-%m-%d %H:%M:%S %Z}",
            file=sys.stderr,
        )
        return 0
    api_key_revoke(api_key=api_key)
    print(f"revoked {api_key.public_id}", file=sys.stderr)
    return 0


def _agents_of(name_or_id: str):
    """The agent with this id, or the agents with this name (a queryset)."""
    import uuid

    from agents_api.models import Agent

    try:
        return Agent.objects.filter(id=uuid.UUID(name_or_id))
    except ValueError:
        return Agent.objects.filter(name=name_or_id).order_by("created_at")


def _agent_named(name_or_id: str):
    """The agent with this id, or the one agent with this name; None (said why) otherwise."""
    agents = list(_agents_of(name_or_id))
    if len(agents) == 1:
        return agents[0]
    if agents:
        ids = ", ".join(f"{agent.id} (owner {agent.owner_principal})" for agent in agents)
        print(
            f"several agents are called {name_or_id!r}: give the id of one of {ids}",
            file=sys.stderr,
        )
    else:
        print(f"no agent {name_or_id!r}", file=sys.stderr)
    return None


def cmd_export(args: argparse.Namespace) -> int:
    _setup_database()
    from agents_api.portability.export import agent_header, document_chunks, user_header
    from agents_api.portability.sections import AGENT_SECTIONS, USER_SECTIONS
    from memsvc.api.principals import user_id_problem

    if args.kind == "user":
        # No user is "" (an unset shell variable): its "memories" would be every agent's own.
        if _refused("user id", user_id_problem(args.subject)):
            return 1
        chunks = document_chunks(user_header(args.subject), USER_SECTIONS, args.subject)
    else:
        agent = _agent_named(args.subject)
        if agent is None:
            return 1
        chunks = document_chunks(agent_header(agent), AGENT_SECTIONS, agent)
    try:
        if args.output in (None, "-"):
            sys.stdout.writelines(chunks)
            sys.stdout.flush()
        else:
            _write_whole(args.output, chunks)
    except OSError as exc:
        if args.output in (None, "-"):
            # What is left unwritten goes nowhere at exit (its flush fails again).
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        # The reader stopped (`| head`): end quietly, as cat does; else say why (a full
        # disk was a traceback; review).
        if not isinstance(exc, BrokenPipeError):
            print(f"the export failed: {exc}", file=sys.stderr)
        return 1
    return 0


def _write_whole(path: str, chunks) -> None:
    """Write ``chunks`` to the file at ``path``, beside it first, then put in its place
    whole: an export stopped midway (Ctrl-C, the database gone) left the file half-written,
    the backup it held lost (review). A link's target is written (the link stays), keeping
    an existing file's mode (a new one's is 0600: it holds a person's data). A device, a
    descriptor's name (``/dev/stdout``, ``/dev/fd/3``) or a pipe is written to as it is,
    after what it holds (``-o /dev/stdout >> log`` appends): it was replaced by a file
    (review)."""
    if not path:
        # ("" is the working directory: a ".partial" was written beside it first; review)
        raise OSError(errno.ENOENT, "no file name given")
    if path.startswith(("/dev/", "/proc/")) or (os.path.exists(path) and not os.path.isfile(path)):
        with open(path, "a", encoding="utf-8") as output:
            output.writelines(chunks)
        return
    target = os.path.realpath(path)
    mode = stat.S_IMODE(os.stat(target).st_mode) if os.path.exists(target) else 0o600
    partial = f"{target}.partial"
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        with os.fdopen(os.open(partial, flags, 0o600), "w", encoding="utf-8") as output:
            os.fchmod(output.fileno(), mode)
            output.writelines(chunks)
        os.replace(partial, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)


def cmd_import(args: argparse.Namespace) -> int:
    import json

    _setup_database()
    from agents_api.portability.importing import document_import
    from agents_api.portability.restore import ImportRefused
    from memsvc.api.parsers import too_many_digits

    try:
        if args.file == "-":
            document = json.load(sys.stdin)
        else:
            with open(args.file, encoding="utf-8") as source:
                document = json.load(source)
        result = document_import(document)
    except ValueError as exc:
        print(f"nothing imported: {too_many_digits(exc) or exc}", file=sys.stderr)
        return 1
    except (OSError, ImportRefused) as exc:
        print(f"nothing imported: {exc}", file=sys.stderr)
        return 1
    except RecursionError:  # (the decoder's: ``document_import`` refuses far less deep)
        print("nothing imported: it is nested too deeply", file=sys.stderr)
        return 1
    print(f"imported the {result.kind} {result.subject}:", file=sys.stderr)
    for name, stored in result.stored.items():
        skipped = result.skipped[name]
        note = (
            f" ({skipped} skipped: their conversation or agent is gone, the user is not "
            "a member there, turned memory off, or was erased since)"
            if skipped
            else ""
        )
        print(f"  {name}: {stored}{note}", file=sys.stderr)
    return 0


def cmd_user_create(args: argparse.Namespace) -> int:
    """A login for the web pages: a Django user whose username is the principal id (the
    same id a JWT's ``sub`` gives, so the pages and the user API show the same things)."""
    _setup_database()
    import getpass

    from django.contrib.auth import get_user_model
    from django.contrib.auth.password_validation import validate_password
    from django.core.exceptions import ValidationError

    from memsvc.api.principals import user_id_problem

    users = get_user_model()
    longest = users._meta.get_field("username").max_length  # (a user id may be longer)
    too_long = f"at most {longest} characters for a login" if len(args.name) > longest else None
    # (A name the login form reads as another, NFKC's: ``user_id_problem``'s given rule.)
    if _refused("user name", user_id_problem(args.name, given=True) or too_long):
        return 1
    if users.objects.filter(username=args.name).exists():
        print(f"user {args.name!r} exists already", file=sys.stderr)
        return 1
    password = args.password
    if password is None:
        try:
            password = getpass.getpass("Password: ")
            again = getpass.getpass("Password (again): ")
        except EOFError:  # no terminal, and no second line on stdin
            print("no password given: type it twice, or pass --password", file=sys.stderr)
            return 1
        if again != password:
            print("the passwords differ", file=sys.stderr)
            return 1
    user = users(username=args.name)
    try:
        validate_password(password, user)
    except ValidationError as exc:
        print("\n".join(exc.messages), file=sys.stderr)
        return 1
    user.set_password(password)
    try:
        user.save()
    except IntegrityError:  # (made meanwhile, by another `memsvc user create`)
        print(f"user {args.name!r} exists already", file=sys.stderr)
        return 1
    print(f"created user {args.name!r}: log in at /app/login/", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memsvc", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="migrate, then run the web server and a worker")
    serve.add_argument("--host", help="default: MEMORY_SERVER_HOST (127.0.0.1)")
    serve.add_argument("--port", type=_port, help="default: MEMORY_SERVER_PORT (8283)")
    serve.add_argument("--no-worker", action="store_true", help="run the web server only")
    serve.set_defaults(func=cmd_serve)

    prepare = commands.add_parser(
        "prepare-model", help="make the local model's ONNX graph now (serve does it once)"
    )
    prepare.set_defaults(func=cmd_prepare_model)

    worker = commands.add_parser("worker", help="run a Celery worker")
    worker.add_argument("--beat", action="store_true", help="also run the periodic scheduler")
    worker.add_argument(
        "celery_args", nargs=argparse.REMAINDER, help="passed to celery worker (after --)"
    )
    worker.set_defaults(func=cmd_worker)

    reindex = commands.add_parser("reindex", help="embed what is waiting (--all: everything)")
    reindex.add_argument(
        "--all",
        action="store_true",
        help="re-embed every message, memory and tool record (a new model)",
    )
    reindex.add_argument(
        "--resize",
        action="store_true",
        help="first make the vector columns MEMORY_EMBEDDING_DIMENSION wide, every row then "
        "waiting (a model of another width; the service stopped)",
    )
    reindex.set_defaults(func=cmd_reindex)

    prune = commands.add_parser(
        "prune",
        help="the memory lifecycle now: delete expired memories, extend popular ones; "
        "forget Idempotency-Keys older than 7 days, Letta blocks left unattached for a day",
    )
    prune.set_defaults(func=cmd_prune)

    mcp = commands.add_parser(
        "mcp",
        help="serve MCP over stdio as an agent (Claude Code, Claude Desktop, IDEs)",
        epilog="MEMSVC_API_KEY=msk_... acts as that key's agent, with its scopes (any mode).",
    )
    mcp.add_argument(
        "--agent", help="the local agent to act as (made if missing; local mode), if no key"
    )
    mcp.set_defaults(func=cmd_mcp)

    token = commands.add_parser("token", help="print a local HS256 JWT for a user id")
    token.add_argument("user_id")
    token.add_argument(
        "--ttl", type=int, default=3600, help="lifetime in seconds (3600; a year at most)"
    )
    token.set_defaults(func=cmd_token)

    apikey = commands.add_parser("apikey", help="create, list and revoke agents' API keys")
    apikey_commands = apikey.add_subparsers(dest="apikey_command", required=True)
    create = apikey_commands.add_parser("create", help="a new key for an agent (made if missing)")
    create.add_argument("agent", help="the agent's name")
    create.add_argument(
        "--scope",
        action="append",
        choices=["read", "write", "impersonate"],
        help="repeat for several (default: read and write)",
    )
    create.add_argument("--owner", default="local", help="who owns the agent (default: local)")
    create.add_argument("--name", help="a note to tell keys apart")
    create.set_defaults(func=cmd_apikey_create)
    listing = apikey_commands.add_parser("list", help="every key (never the secrets)")
    listing.add_argument("--agent", help="only this agent's keys (its name or id)")
    listing.set_defaults(func=cmd_apikey_list)
    revoke = apikey_commands.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id", help="its id (as `apikey list` shows it), or the key itself")
    revoke.set_defaults(func=cmd_apikey_revoke)

    export = commands.add_parser(
        "export", help="write a user's data or an agent's memory as one JSON document"
    )
    export.add_argument("kind", choices=["user", "agent"])
    export.add_argument("subject", help="the user id, or the agent's id or name")
    export.add_argument("-o", "--output", help="a file (default: standard output)")
    export.set_defaults(func=cmd_export)
    importing = commands.add_parser(
        "import", help="put back what `memsvc export` wrote (all of it or nothing)"
    )
    importing.add_argument("file", help="the document (- for standard input)")
    importing.set_defaults(func=cmd_import)
    user = commands.add_parser("user", help="logins for the web pages (/app/)")
    user_commands = user.add_subparsers(dest="user_command", required=True)
    user_create = user_commands.add_parser("create", help="a new login (its name is the user id)")
    user_create.add_argument("name", help="the user id (a JWT's sub for the same person)")
    user_create.add_argument("--password", help="asked for when omitted")
    user_create.set_defaults(func=cmd_user_create)
    return parser


# Commands whose result is what they write on standard output (not a summary of what they
# did: ``prune >&-`` in a cron job still prunes).
WRITING_THEIR_RESULT = frozenset({"token", "apikey", "export", "mcp"})


def _writes_nowhere(args: argparse.Namespace) -> bool:
    """Whether the command's result would go to a standard output that is closed (``>&-``):
    a token made was lost without a word, exit 0, and an export ended in a traceback
    (review)."""
    to_a_file = getattr(args, "output", None) not in (None, "-")
    return sys.stdout is None and args.command in WRITING_THEIR_RESULT and not to_a_file


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if _writes_nowhere(args):
        print("memsvc: standard output is closed: nowhere to write the result", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except ImproperlyConfigured as exc:  # a setting missing or malformed: its message says which
        print(f"memsvc: {exc}", file=sys.stderr)
        return 2
    except SystemCheckError as exc:  # (``serve``: a setting only Django's checks refuse)
        print(f"memsvc: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # (Ctrl-C: what the command did so far is committed or not)
        print("memsvc: interrupted", file=sys.stderr)
        return 130
    except OperationalError as exc:  # the database stopped answering (a restart, a crash)
        # What the command did so far is committed or rolled back whole; the driver's
        # message names the socket's path or host: the first line, not a traceback.
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"memsvc: the database did not answer: {first_line}", file=sys.stderr)
        return 1
    except ProgrammingError as exc:
        from memsvc.db import not_migrated

        if not not_migrated(exc):
            raise
        # A DATABASE_URL before its migrate (or one without pgvector, which migrate
        # refuses): a 47-line traceback ended in 'relation "message" does not exist'.
        print(
            "memsvc: the database is not (fully) migrated: a table of memsvc's is missing; "
            "run `python manage.py migrate` on it first (it says what else is missing, "
            "pgvector among it)",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
