"""The demo's process supervisor: keeps the web server, the worker and the embedded Redis up.

A child that exits is restarted after a backoff (1 s, doubling to 30 s; back to 1 s once
it has run for a minute), and every exit and restart is logged. An embedded Redis that
stops answering is restarted on the port it had (its append-only file restores queues
and caches). Only an explicit stop (Ctrl-C, SIGTERM) stops everything.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

log = logging.getLogger("gpu_worker.demo")
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 30.0
STABLE_SECONDS = 60.0  # a child that ran this long starts again from the first backoff
TICK_SECONDS = 0.5
REDIS_CHECK_SECONDS = 2.0


@dataclass
class Child:
    name: str
    argv: Sequence[str]
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff: float = BACKOFF_FIRST
    restart_at: float | None = None  # pending restart (monotonic time)
    history: list[int] = field(default_factory=list)  # exit codes seen

    def start(self) -> None:
        # its own session: a terminal's Ctrl-C reaches only the supervisor, which stops
        # the children in order (no tracebacks or shutdown chatter from each of them)
        self.proc = subprocess.Popen(list(self.argv), env=self.env, start_new_session=True)
        self.started_at = time.monotonic()
        self.restart_at = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Supervisor:
    def __init__(self, children: Sequence[Child], *, say: Callable[[str], None] = log.warning,
                 redis_check: Callable[[], str | None] | None = None,
                 backoff: tuple[float, float] = (BACKOFF_FIRST, BACKOFF_MAX)) -> None:
        self.children = list(children)
        self.say = say
        self.backoff_first, self.backoff_max = backoff
        self.redis_check = redis_check  # returns a message when it had to act
        self._next_redis_check = 0.0

    def run(self) -> None:
        """Until KeyboardInterrupt (SIGTERM is turned into one); then stop every child."""
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            self.start()
            while True:
                self.tick()
                time.sleep(TICK_SECONDS)
        except KeyboardInterrupt:
            self.say("stopping…")
        finally:
            self.stop()
            signal.signal(signal.SIGTERM, previous)

    def start(self) -> None:
        for child in self.children:
            child.backoff = self.backoff_first
            child.start()

    def tick(self) -> None:
        now = time.monotonic()
        for child in self.children:
            self._watch(child, now)
        if self.redis_check is not None and now >= self._next_redis_check:
            self._next_redis_check = now + REDIS_CHECK_SECONDS
            message = self.redis_check()
            if message:
                self.say(message)

    def _watch(self, child: Child, now: float) -> None:
        if child.restart_at is not None:
            if now >= child.restart_at:
                child.restarts += 1
                self.say(f"restarting {child.name} (restart {child.restarts})")
                child.start()
            return
        if child.running():
            return
        code = child.proc.returncode if child.proc is not None else None
        child.history.append(code)
        if now - child.started_at >= STABLE_SECONDS:
            child.backoff = self.backoff_first
        delay = child.backoff
        child.backoff = min(child.backoff * 2, self.backoff_max)
        child.restart_at = now + delay
        self.say(f"{child.name} exited with code {code}; restarting it in {delay:g}s")

    def stop(self, grace: float = 20.0) -> None:
        procs = [c.proc for c in self.children if c.proc is not None]
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


def embedded_redis_check(redis_url: str) -> Callable[[], str | None] | None:
    """A check that restarts the embedded Redis on its port, or None if Redis is external."""
    from urllib.parse import urlparse

    from config import embedded

    u = urlparse(redis_url)
    port = embedded.embedded_redis_port()
    if u.hostname != "127.0.0.1" or port is None or u.port != port:
        return None

    def check() -> str | None:
        if embedded.embedded_redis_port() == port:
            return None
        try:
            restarted = embedded.restart_embedded_redis()
        except (OSError, RuntimeError, subprocess.SubprocessError):
            restarted = None
        if restarted == port and embedded.embedded_redis_port() == port:
            return f"embedded Redis was down; restarted it on port {port}"
        return f"embedded Redis is down and could not be restarted on port {port}"

    return check


def _raise_interrupt(*_):
    raise KeyboardInterrupt
