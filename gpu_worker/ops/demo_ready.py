"""Waits (in a thread) until the demo's web server answers /healthz and its worker answers
a Celery ping, then calls ``on_ready`` once: the banner comes after the services are up."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

POLL_SECONDS = 0.5
NOTICE_AFTER_SECONDS = 20.0


def web_ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def worker_ready() -> bool:
    from config.celery import app

    try:
        return bool(app.control.ping(timeout=1.0))
    except Exception:  # broker not reachable yet
        return False


class ReadyWatch(threading.Thread):
    def __init__(self, port: int, on_ready: Callable[[], None],
                 say: Callable[[str], None]) -> None:
        super().__init__(name="demo-ready", daemon=True)
        self.port, self.on_ready, self.say = port, on_ready, say
        self._stopped = threading.Event()

    def run(self) -> None:
        started, noticed = time.monotonic(), False
        while not self._stopped.is_set():
            web, worker = web_ready(self.port), worker_ready()
            if web and worker:
                self.on_ready()
                return
            if not noticed and time.monotonic() - started > NOTICE_AFTER_SECONDS:
                waiting = " and ".join(n for n, ok in (("web server", web), ("worker", worker))
                                       if not ok)
                self.say(f"      still waiting for the {waiting} (loading the model)…")
                noticed = True
            self._stopped.wait(POLL_SECONDS)

    def stop(self) -> None:
        self._stopped.set()
