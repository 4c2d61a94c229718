"""``make demo``: the whole platform in the foreground on embedded defaults.

Embedded PostgreSQL/Redis are started by settings (unless DATABASE_URL/REDIS_URL are
set); this command migrates, builds the demo model, seeds, then runs a Celery worker
and the web server as children. Ctrl-C stops everything, servers included.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from io import StringIO

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from gpu_worker import host


class Command(BaseCommand):
    help = "Run web + GPU worker on embedded Postgres/Redis (Ctrl-C stops all)."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8000)))
        parser.add_argument("--no-serve", action="store_true", help="Prepare only, then exit.")

    def handle(self, *args, **opts):
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write("database migrated")
        if not settings.MODEL_PATH:
            path = host.ensure_demo_model(settings.DEMO_MODEL_PATH)
            self.stdout.write(f"demo model at {path}")
        buf = StringIO()
        call_command("seed_demo", json=True, stdout=buf)
        seed = json.loads(buf.getvalue())
        self._banner(seed, opts["port"])
        if opts["no_serve"]:
            return
        self._serve(opts["port"])

    def _banner(self, seed, port):
        base = f"http://127.0.0.1:{port}"
        su = seed["superuser"]
        w = self.stdout.write
        w("=" * 72)
        w(f"admin:  {base}/admin/  login {su['username']} / {su['password']}")
        w("        tenant admins: acme-admin / acme-admin-pw, globex-admin / globex-admin-pw")
        w(f"API docs: {base}/api/docs/")
        for name, key in seed["tokens"].items():
            w(f"token {name:<13} {key}")
        key = seed["tokens"]["alice"]
        w("try (alice @ acme):")
        w(f"  curl -s -X POST {base}/api/chat -H 'Authorization: Token {key}' "
          "-H 'Content-Type: application/json' -d '{\"message\": \"What should I cook tonight?\"}'")
        w("(the demo model has random weights: its replies are gibberish, by design)")
        w("=" * 72)

    def _serve(self, port):
        env = dict(os.environ)  # carries DATABASE_URL/REDIS_URL resolved by settings
        env.setdefault("PYTHONUNBUFFERED", "1")
        py = sys.executable
        # --pool solo: the GPU configuration (one process, the model loaded once in it,
        # time limits enforced by gpu_worker.limits); it also consumes gpu.w.gpu-demo@<host>.
        procs = [
            subprocess.Popen([py, "-m", "celery", "-A", "config", "worker", "-Q", "gpu",
                              "--pool", "solo", "--loglevel", "INFO",
                              "--hostname", "gpu-demo@%h"], env=env),
            subprocess.Popen([py, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
                             env=env),
        ]
        signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            while all(p.poll() is None for p in procs):
                time.sleep(0.5)
            self.stderr.write("a child process exited; stopping the demo")
        except KeyboardInterrupt:
            self.stdout.write("\nstopping…")
        finally:
            _stop(procs)


def _raise_interrupt(*_):
    raise KeyboardInterrupt


def _stop(procs, grace: float = 20.0):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
