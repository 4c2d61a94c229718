"""Processes the end-to-end benchmarks start: Celery GPU workers (and their shutdown)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent


def celery_worker(name: str, env: dict[str, str], log: IO[bytes],
                  pool: str = "solo") -> subprocess.Popen:
    """A worker ``<name>@bench`` on the shared ``gpu`` queue: solo pool (one task at a time),
    or ``pool="threads"`` as deployed (WORKER_BATCH_MAX tasks feed one batch engine)."""
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "gpu", "--pool", pool,
         "--hostname", f"{name}@bench", "--without-gossip", "--without-mingle", "-l", "WARNING"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def stop(procs: list[subprocess.Popen]) -> None:
    """Warm shutdown (SIGTERM), killed after 30 s."""
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
