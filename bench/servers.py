"""Processes the end-to-end benchmarks start: Celery GPU workers, the web (and their
shutdown)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent


def setup_django(var: Path) -> None:
    """Django on the embedded Postgres and Redis under ``var`` (any service URLs of the
    environment dropped), SmolLM2 unless MODEL_PATH is set, no rate limits; migrated."""
    os.environ["VAR_DIR"] = str(var)
    for name in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
        os.environ.pop(name, None)
    os.environ.setdefault("MODEL_PATH", str(ROOT / "var" / "models" / "smollm2-135m-instruct"))
    os.environ.update(DJANGO_SETTINGS_MODULE="config.settings", CHAT_RATE_PER_MEMBER="",
                      CHAT_RATE_PER_TENANT="", API_RATE_PER_MEMBER="", API_RATE_PER_TENANT="")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def celery_worker(name: str, env: dict[str, str], log: IO[bytes],
                  pool: str = "solo") -> subprocess.Popen:
    """A worker ``<name>@bench`` on the shared ``gpu`` queue: solo pool (one task at a time),
    or ``pool="threads"`` as deployed (WORKER_BATCH_MAX tasks feed one batch engine)."""
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "gpu", "--pool", pool,
         "--hostname", f"{name}@bench", "--without-gossip", "--without-mingle", "-l", "WARNING"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def worker_and_web(name: str, env: dict[str, str], logpath: Path, *, pool: str = "solo",
                   wait_s: float = 180) -> tuple[list[subprocess.Popen], str]:
    """One worker ``<name>@bench`` and the web under uvicorn on a free port, both logging to
    ``logpath``; returns them and the web's base URL once the worker is registered and the
    web answers ``/healthz`` (Django must be set up: the registry reads Redis)."""
    log = open(logpath, "ab")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [celery_worker(name, env, log, pool=pool), subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)]
    base = f"http://127.0.0.1:{port}"
    if wait_registered(name, procs, wait_s, health=f"{base}/healthz"):
        return procs, base
    stop(procs)
    raise SystemExit(f"servers did not start; see {logpath}")


def wait_registered(name: str, procs: list[subprocess.Popen], wait_s: float,
                    health: str | None = None) -> bool:
    """True once worker ``<name>@bench`` is in the live registry (and ``health`` answers,
    when given); False when one of ``procs`` exits or ``wait_s`` passes first."""
    from gpu_worker.routing import registry

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            return False
        try:
            if f"{name}@bench" in registry.live_workers():
                if health:
                    urllib.request.urlopen(health, timeout=2).close()
                return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def stop(procs: list[subprocess.Popen]) -> None:
    """Warm shutdown (SIGTERM), killed after 30 s."""
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
