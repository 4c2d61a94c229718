"""``manage.py demo`` supervises its processes: real demo, real servers, real kills.

Under a throwaway VAR_DIR (its own embedded Postgres and Redis, in var/test-demo/): killing the worker or
the Redis server restarts it and the demo answers chats again; after a Postgres restart,
stopping the demo still stops that (new) postmaster and the Redis it runs.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import psutil
import pytest

from tests import workers
from tests.gpu_worker.conftest import fresh_var_dir
from tests.workers import ROOT, free_port

pytestmark = pytest.mark.e2e
DROP = ("REDIS_URL", "KV_CACHE_REDIS_URL", "DATABASE_URL", "CELERY_BROKER_URL",
        "CELERY_RESULT_BACKEND", "KVI_TEST_REDIS_DB", "EMBEDDED_REDIS_PORT")


# each probe is a chat or a process scan against the running demo: poll gently
wait_for = functools.partial(workers.wait_for, interval=0.25)


def alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


class Demo:
    def __init__(self, var_dir, model_path) -> None:
        self.var_dir, self.port = var_dir, free_port()
        env = {k: v for k, v in os.environ.items() if k not in DROP}
        env.update(VAR_DIR=str(var_dir), MODEL_PATH=str(model_path), PORT=str(self.port),
                   DJANGO_SETTINGS_MODULE="config.settings", PYTHONUNBUFFERED="1",
                   OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        self.log_path = var_dir / "demo.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "manage.py", "demo"], cwd=ROOT, env=env,
                                     stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def token(self) -> str | None:
        for line in self.log().splitlines():
            if line.startswith("token alice"):
                return line.split()[-1]
        return None

    def worker_pids(self) -> list[int]:
        pids = []
        for kid in psutil.Process(self.proc.pid).children():
            try:
                if "celery" in " ".join(kid.cmdline()):
                    pids.append(kid.pid)
            except psutil.Error:  # exited (a zombie until the supervisor reaps it)
                pass
        return pids

    def chat(self) -> dict | None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/api/chat", method="POST",
            data=json.dumps({"message": "Dinner?", "max_new_tokens": 2}).encode(),
            headers={"Authorization": f"Token {self.token()}",
                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def pid_of(self, relative: str) -> int:
        return int((self.var_dir / relative).read_text().split()[0])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()


@pytest.fixture
def var_dir(stopped_demo_dirs):
    """A VAR_DIR a demo stopped cleanly in, else a fresh one (the tests here need a running
    demo, not a first run: test_demo_firstrun's is)."""
    path = stopped_demo_dirs.pop() if stopped_demo_dirs else fresh_var_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def demo(var_dir, demo_model_path):
    d = Demo(var_dir, demo_model_path)
    yield d
    d.stop()
    for rel in ("pg/postmaster.pid", "redis/redis.pid"):  # never leak a server
        try:
            os.kill(d.pid_of(rel), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def test_demo_restarts_crashed_children_and_stops_its_servers(demo, var_dir):
    wait_for(lambda: demo.proc.poll() is not None or demo.token(), 300, "the demo banner")
    assert demo.proc.poll() is None, demo.log()
    assert wait_for(demo.chat, 180, "a first chat")["reply"] is not None

    # 1. The worker crashes: the demo keeps running and starts a new one that answers.
    [old_worker] = demo.worker_pids()
    os.kill(old_worker, signal.SIGKILL)
    new = wait_for(lambda: [p for p in demo.worker_pids() if p != old_worker], 60,
                   "a restarted worker")
    assert demo.proc.poll() is None
    assert wait_for(demo.chat, 180, "a chat after the worker restart")["reply"] is not None
    assert "worker exited with code" in demo.log() and "restarting worker" in demo.log()
    assert new == demo.worker_pids()

    # 2. Redis crashes: restarted on the port it had; chats work again.
    port = (var_dir / "redis" / "port").read_text()
    os.kill(demo.pid_of("redis/redis.pid"), signal.SIGKILL)
    wait_for(lambda: "restarted it on port" in demo.log(), 30, "the Redis restart")
    assert (var_dir / "redis" / "port").read_text() == port
    assert wait_for(demo.chat, 180, "a chat after the Redis restart")["reply"] is not None

    # 3. Postgres is restarted behind the demo's back (a new postmaster pid) ...
    old_pg = demo.pid_of("pg/postmaster.pid")
    os.kill(old_pg, signal.SIGINT)
    wait_for(lambda: not alive(old_pg), 60, "postgres to stop")
    start = (f"import pgserver; pgserver.get_server({str(var_dir / 'pg')!r}, "
             "cleanup_mode=None)")
    subprocess.run([sys.executable, "-c", start], cwd=ROOT, check=True, timeout=120,
                   capture_output=True)
    new_pg, redis_pid = demo.pid_of("pg/postmaster.pid"), demo.pid_of("redis/redis.pid")
    assert new_pg != old_pg and alive(new_pg)

    # ... and stopping the demo still stops it, and its Redis.
    demo.proc.send_signal(signal.SIGTERM)
    demo.proc.wait(timeout=90)
    wait_for(lambda: not alive(new_pg), 30, "the restarted postgres to stop")
    wait_for(lambda: not alive(redis_pid), 30, "redis to stop")
