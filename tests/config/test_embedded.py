"""The embedded Redis behaves like a service: one server, one port, persistent.

Real processes under a throwaway VAR_DIR (never the session's servers): a "platform"
process holds the embedded Redis, the server dies, and a ``manage.py`` command run during
the outage must fail (exit 1) instead of forking a second, empty Redis on a new port.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import redis
from django.db import connection

from tests.workers import ROOT, database_url_from_settings

HOLD = """
import sys, time
from config import embedded
print(embedded.ensure_embedded_redis(), flush=True)
try:
    sys.stdin.read()  # until the test closes our stdin (or interrupts us)
except KeyboardInterrupt:
    pass
"""


def clean_env(var_dir) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "KV_CACHE_REDIS_URL", "CELERY_BROKER_URL",
                        "KVI_TEST_REDIS_DB", "EMBEDDED_REDIS_PORT")}
    env.update(VAR_DIR=str(var_dir), PYTHONUNBUFFERED="1")
    return env


def server_pid(var_dir) -> int:
    return int((var_dir / "redis" / "redis.pid").read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still running"
        time.sleep(0.05)


@pytest.fixture
def platform(tmp_path):
    env = clean_env(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", HOLD], cwd=ROOT, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    port = int(proc.stdout.readline())
    yield tmp_path, env, port, proc
    if proc.poll() is None:
        proc.stdin.close()  # a clean exit: releases (and so stops) the embedded Redis
        proc.wait(timeout=30)
    pid_file = tmp_path / "redis" / "redis.pid"
    if pid_file.exists() and alive(server_pid(tmp_path)):
        os.kill(server_pid(tmp_path), signal.SIGKILL)


@pytest.mark.django_db
def test_outage_command_fails_without_forking_and_restart_keeps_port_and_data(platform):
    var_dir, env, port, holder = platform
    client = redis.Redis(port=port)
    client.rpush("queue", b"task-1")
    time.sleep(1.5)  # appendfsync everysec: the write is on disk
    pid = server_pid(var_dir)
    os.kill(pid, signal.SIGKILL)  # a crash, not a clean shutdown
    wait_gone(pid)

    env["DATABASE_URL"] = database_url_from_settings(connection.settings_dict)
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    out = subprocess.run([sys.executable, "manage.py", "kvcache", "stats"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Redis is unavailable" in out.stderr
    assert (var_dir / "redis" / "port").read_text() == str(port)  # not rewritten
    with pytest.raises(redis.ConnectionError):
        client.ping()  # nothing was started on the platform's port either

    restart = ("from config import embedded; print(embedded.restart_embedded_redis())")
    got = subprocess.run([sys.executable, "-c", restart], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    assert int(got.stdout) == port
    assert client.lrange("queue", 0, -1) == [b"task-1"]  # the append-only file restored it

    restarted = server_pid(var_dir)
    holder.stdin.close()  # the last user leaves: the server stops, the port stays recorded
    holder.wait(timeout=30)
    wait_gone(restarted)
    assert (var_dir / "redis" / "port").read_text() == str(port)


def test_a_stale_port_is_reused_when_no_platform_runs(tmp_path):
    env = clean_env(tmp_path)
    first = subprocess.run(
        [sys.executable, "-c", "from config import embedded; print(embedded.redis_url())"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    again = subprocess.run(
        [sys.executable, "-c", "from config import embedded; print(embedded.redis_url())"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert first.stdout == again.stdout  # stopped at exit, started again on its port


CACHE_PROBE = """
import json, redis
from config import embedded
cache, main = embedded.cache_redis_url(), embedded.redis_url()
c, m = redis.Redis.from_url(cache), redis.Redis.from_url(main)
print(json.dumps({"cache": cache, "main": main,
                  "cache_conf": {**c.config_get("maxmemory"), **c.config_get("maxmemory-policy"),
                                 **c.config_get("appendonly")},
                  "main_conf": {**m.config_get("maxmemory"), **m.config_get("appendonly")}}))
"""


def test_the_kv_cache_gets_a_redis_of_its_own_full_without_eviction(tmp_path):
    """A full K/V cache must never refuse (or evict) a task message: the embedded platform
    runs two servers, the cache's bounded by maxmemory with noeviction, the broker's not."""
    env = {**clean_env(tmp_path), "KV_CACHE_REDIS_MAXMEMORY": "64mb"}
    out = subprocess.run([sys.executable, "-c", CACHE_PROBE], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    got = json.loads(out.stdout)
    assert got["cache"] != got["main"]
    assert got["cache_conf"] == {"maxmemory": str(64 * 1024**2),
                                 "maxmemory-policy": "noeviction", "appendonly": "no"}
    assert got["main_conf"] == {"maxmemory": "0", "appendonly": "yes"}
    assert (tmp_path / "redis-cache" / "port").read_text() in got["cache"]
    # with REDIS_URL set and no KV_CACHE_REDIS_URL, the cache shares that Redis
    shared = {**clean_env(tmp_path), "REDIS_URL": got["main"]}
    same = subprocess.run(
        [sys.executable, "-c", "from config import embedded; print(embedded.cache_redis_url())"],
        cwd=ROOT, env=shared, capture_output=True, text=True, timeout=60, check=True)
    assert same.stdout.strip() == got["main"]
