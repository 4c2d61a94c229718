"""Real Celery worker processes for end-to-end tests (no in-process fakes)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    """``predicate()``'s first truthy value, polled every ``interval`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def database_url_from_settings(sd: dict) -> str:
    """A DATABASE_URL naming the same server/database as a Django settings dict."""
    user, pw = quote(sd.get("USER") or ""), quote(sd.get("PASSWORD") or "")
    host, port, name = sd.get("HOST") or "", sd.get("PORT") or "", sd["NAME"]
    if host.startswith("/"):
        return f"postgresql://{user}:{pw}@/{name}?host={host}"
    return f"postgresql://{user}:{pw}@{host}:{port}/{name}"


class WorkerProcess:
    """One `celery worker` subprocess consuming the gpu queue."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path, *,
                 queues: str = "gpu", pool: str = "solo", extra: list[str] | None = None):
        self.name = name
        self.hostname = f"{name}@e2e"
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")
        cmd = [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", queues,
               "--pool", pool, "--hostname", self.hostname, "--loglevel", "INFO",
               "--without-gossip", "--without-mingle", *(extra or [])]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 120.0) -> None:
        from config.celery import app

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.log_tail()}")
            if app.control.ping(destination=[self.hostname], timeout=0.5):
                return
            time.sleep(0.5)
        raise TimeoutError(f"worker {self.name} not ready:\n{self.log_tail()}")

    def log_tail(self, n: int = 60) -> str:
        if not self._log.closed:  # after stop() the file is closed but still readable
            self._log.flush()
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # warm shutdown: finish the running task
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def worker_env(database_url: str, model_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
        "DATABASE_URL": database_url,
        "MODEL_PATH": str(model_path),
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    })
    return env


class AsgiServer:
    """The web process as deployed: uvicorn serving config.asgi (streams on the event loop)."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / "uvicorn.log"
        self._log = open(self.log_path, "ab")
        cmd = [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host",
               "127.0.0.1", "--port", str(self.port), "--no-access-log"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60.0) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"uvicorn exited:\n{self.log_tail()}")
            try:
                urllib.request.urlopen(f"{self.url}/healthz", timeout=1).close()
                return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"uvicorn not ready:\n{self.log_tail()}")

    def log_tail(self, n: int = 60) -> str:
        if not self._log.closed:
            self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
