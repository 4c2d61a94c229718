"""Deadlines on every connection to Redis and Postgres (read by ``config.settings``).

A dependency that hangs (SIGSTOP, a full network buffer, a server that accepts connections
and never answers) must fail a call in seconds, so that each request gets its documented
JSON error within its deadline and recovers by itself once the dependency answers again
(docs/OPERATIONS.md, "Faults"). Every value is overridable by the environment.
"""

from __future__ import annotations

import os


def _env(name: str, default: float) -> float:
    return float(os.environ.get(name) or default)


# Redis (broker, results; injection.kvcache.redis_client has its own per-client values)
REDIS_SOCKET_TIMEOUT = _env("REDIS_SOCKET_TIMEOUT", 3.0)
REDIS_CONNECT_TIMEOUT = _env("REDIS_CONNECT_TIMEOUT", 3.0)
REDIS_HEALTH_CHECK_INTERVAL = int(_env("REDIS_HEALTH_CHECK_INTERVAL", 15))
REDIS_SOCKETS = {"socket_timeout": REDIS_SOCKET_TIMEOUT,
                 "socket_connect_timeout": REDIS_CONNECT_TIMEOUT,
                 "health_check_interval": REDIS_HEALTH_CHECK_INTERVAL,
                 "socket_keepalive": True}
# a publish, and the result backend's reconnect (its default: 20 tries, where the web's
# result wait used to sit while Redis hung), are retried once
RETRY_ONCE = {"max_retries": 1, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5}

# Postgres: a new connection fails within DB_CONNECT_TIMEOUT s; the server cancels a
# statement running longer than DB_STATEMENT_TIMEOUT_MS (0: no limit, e.g. a long migration)
DB_CONNECT_TIMEOUT = int(_env("DB_CONNECT_TIMEOUT", 5))
DB_STATEMENT_TIMEOUT_MS = int(_env("DB_STATEMENT_TIMEOUT_MS", 30000))


def postgres_options() -> dict:
    return {"connect_timeout": DB_CONNECT_TIMEOUT,
            "options": f"-c statement_timeout={DB_STATEMENT_TIMEOUT_MS}"}


def settings(visibility_timeout: int) -> dict:
    """The Django/Celery settings these make (``config.settings`` adds them to its names)."""
    return {
        "CELERY_BROKER_TRANSPORT_OPTIONS": {"visibility_timeout": visibility_timeout,
                                            **REDIS_SOCKETS},
        "CELERY_BROKER_CONNECTION_TIMEOUT": REDIS_CONNECT_TIMEOUT,
        "CELERY_TASK_PUBLISH_RETRY_POLICY": RETRY_ONCE,
        "CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS": {"visibility_timeout": visibility_timeout,
                                                    "retry_policy": RETRY_ONCE},
        "CELERY_REDIS_SOCKET_TIMEOUT": REDIS_SOCKET_TIMEOUT,
        "CELERY_REDIS_SOCKET_CONNECT_TIMEOUT": REDIS_CONNECT_TIMEOUT,
        "CELERY_REDIS_SOCKET_KEEPALIVE": True,
        "CELERY_REDIS_BACKEND_HEALTH_CHECK_INTERVAL": REDIS_HEALTH_CHECK_INTERVAL,
        "REDIS_SOCKET_TIMEOUT": REDIS_SOCKET_TIMEOUT,
        "DB_CONNECT_TIMEOUT": DB_CONNECT_TIMEOUT,
        "DB_STATEMENT_TIMEOUT_MS": DB_STATEMENT_TIMEOUT_MS,
    }
