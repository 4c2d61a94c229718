"""The demo's process supervisor: keeps the web server, the worker and the embedded Redis up.

A child that exits is restarted after a backoff (1 s, doubling to 30 s; back to 1 s once
it has run for a minute), and every exit and restart is logged. A child that crashes
``CRASH_LIMIT`` times in a row, each time within a minute of starting, is a crash loop:
the supervisor stops everything and says which process failed, with its exit code and its
last log lines (each child's output is passed through and its tail kept). An embedded
Redis that stops answering is restarted on the port it had (its append-only file restores
queues and caches). Otherwise only an explicit stop (Ctrl-C, SIGTERM) stops everything.
The clock and the sleep are injectable: tests drive the supervisor without waiting.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

log = logging.getLogger("gpu_worker.demo")
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 30.0
STABLE_SECONDS = 60.0  # a child that ran this long starts again from the first backoff
TICK_SECONDS = 0.5
REDIS_CHECK_SECONDS = 2.0
CRASH_LIMIT = 5  # quick crashes in a row before the supervisor gives up
TAIL_LINES = 20  # of a child's output, kept for the final message


class CrashLoop(RuntimeError):
    """A child kept crashing: the supervisor stopped everything (the message says why)."""


def _echo(raw: bytes) -> None:
    sys.stdout.buffer.write(raw)
    sys.stdout.buffer.flush()


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
    quick_crashes: int = 0  # exits in a row, each before STABLE_SECONDS of running
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    _reader: threading.Thread | None = None

    def start(self, now: float | None = None,
              echo: Callable[[bytes], None] = _echo) -> None:
        # its own session: a terminal's Ctrl-C reaches only the supervisor, which stops
        # the children in order (no tracebacks or shutdown chatter from each of them)
        self.proc = subprocess.Popen(list(self.argv), env=self.env, start_new_session=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.tail.clear()
        self._reader = threading.Thread(target=self._pump, args=(self.proc.stdout, echo),
                                        name=f"supervise-{self.name}", daemon=True)
        self._reader.start()
        self.started_at = time.monotonic() if now is None else now
        self.restart_at = None

    def _pump(self, stream, echo: Callable[[bytes], None]) -> None:
        """Pass the child's output through, keeping its last lines."""
        with stream:
            for raw in iter(stream.readline, b""):
                self.tail.append(raw.decode(errors="replace").rstrip())
                try:
                    echo(raw)
                except (OSError, ValueError):  # our own stdout is gone: keep the tail
                    pass

    def output_done(self, timeout: float = 5.0) -> None:
        """Wait until the exited child's output is read to its end (for its tail)."""
        if self._reader is not None:
            self._reader.join(timeout)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Supervisor:
    def __init__(self, children: Sequence[Child], *, say: Callable[[str], None] = log.warning,
                 redis_check: Callable[[], str | None] | None = None,
                 backoff: tuple[float, float] = (BACKOFF_FIRST, BACKOFF_MAX),
                 crash_limit: int = CRASH_LIMIT,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 echo: Callable[[bytes], None] = _echo) -> None:
        self.children = list(children)
        self.say = say
        self.backoff_first, self.backoff_max = backoff
        self.crash_limit = crash_limit
        self.clock, self.sleep, self.echo = clock, sleep, echo
        self.redis_check = redis_check  # returns a message when it had to act
        self._next_redis_check = 0.0

    def run(self) -> None:
        """Until KeyboardInterrupt (SIGTERM is turned into one), then stop every child; or
        until a child crash-loops: then stop every child, say why and raise CrashLoop.

        SIGINT interrupts even where it was ignored at start (``make demo &``: a shell
        starts background jobs with SIGINT ignored, and ``kill -INT`` did nothing)."""
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self.start()
            while True:
                self.tick()
                self.sleep(TICK_SECONDS)
        except KeyboardInterrupt:
            self.say("stopping…")
        except CrashLoop as exc:
            self.say(str(exc))
            raise
        finally:
            self.stop()
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)

    def start(self) -> None:
        for child in self.children:
            child.backoff = self.backoff_first
            child.start(self.clock(), self.echo)

    def tick(self) -> None:
        """One look at every child (raises CrashLoop when one keeps crashing)."""
        now = self.clock()
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
                child.start(now, self.echo)
            return
        if child.running():
            return
        code = child.proc.returncode if child.proc is not None else None
        child.history.append(code)
        if now - child.started_at >= STABLE_SECONDS:
            child.backoff = self.backoff_first
            child.quick_crashes = 0
        child.quick_crashes += 1
        if child.quick_crashes >= self.crash_limit:
            raise CrashLoop(self._crash_loop_message(child, code))
        delay = child.backoff
        child.backoff = min(child.backoff * 2, self.backoff_max)
        child.restart_at = now + delay
        self.say(f"{child.name} exited with code {code}; restarting it in {delay:g}s")

    def _crash_loop_message(self, child: Child, code: int | None) -> str:
        child.output_done()
        lines = "\n".join(f"  | {line}" for line in child.tail) or "  | (no output)"
        return (f"giving up: {child.name} crashed {child.quick_crashes} times in a row, each "
                f"within {STABLE_SECONDS:g}s of starting (last exit code {code}); stopping "
                f"everything. The last lines {child.name} wrote:\n{lines}")

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


def embedded_redis_check(redis_url: str, cache_url: str | None = None
                         ) -> Callable[[], str | None] | None:
    """A check that restarts the embedded Redis servers (the platform's, and the K/V
    cache's at ``cache_url``) on their ports, or None if both are external."""
    from config import embedded

    checks = [c for c in (_instance_check(redis_url, embedded.MAIN),
                          _instance_check(cache_url, embedded.CACHE)) if c is not None]
    if not checks:
        return None

    def check() -> str | None:
        said = [m for m in (c() for c in checks) if m]
        return "; ".join(said) or None

    return check


def _instance_check(url: str | None, name: str) -> Callable[[], str | None] | None:
    from urllib.parse import urlparse

    from config import embedded

    u = urlparse(url or "")
    port = embedded.embedded_redis_port(name)
    if u.hostname != "127.0.0.1" or port is None or u.port != port:
        return None
    what = "embedded Redis" if name == embedded.MAIN else "embedded cache Redis"

    def check() -> str | None:
        if embedded.embedded_redis_port(name) == port:
            return None
        try:
            restarted = embedded.restart_embedded_redis(name)
        except (OSError, RuntimeError, subprocess.SubprocessError):
            restarted = None
        if restarted == port and embedded.embedded_redis_port(name) == port:
            return f"{what} was down; restarted it on port {port}"
        return f"{what} is down and could not be restarted on port {port}"

    return check


def _raise_interrupt(*_):
    raise KeyboardInterrupt
