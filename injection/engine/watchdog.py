"""EngineWatchdog: finds a batch engine whose scheduler thread is stuck or dead.

The scheduler beats (``BatchEngine.beat_at``, from the engine's ``clock``) before every
prefill and every decoding step while it has work. The watchdog trips when the engine is
busy and either its thread is gone ("dead": an exception no step caught) or its last
beat is older than ``stall_after`` seconds ("stuck": one forward pass that never ends, a
deadlocked callback). Tripping aborts the engine - every row and waiting request fails at
once with the retryable ``EngineUnavailable`` and new ones are refused - then calls
``on_trip(reason)``: the worker counts it and exits so its process is replaced (a stuck
thread cannot be killed, only its process). :meth:`check` takes ``now`` so tests drive
the clock; :meth:`start` runs it on a daemon thread every ``interval`` seconds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from injection.errors import EngineUnavailable

__all__ = ["EngineWatchdog"]

log = logging.getLogger(__name__)


class EngineWatchdog:
    """Watches one ``BatchEngine`` (see module docstring); trips at most once."""

    def __init__(self, engine: Any, *, stall_after: float,
                 on_trip: Callable[[str], None] | None = None,
                 interval: float | None = None) -> None:
        if stall_after <= 0:
            raise ValueError("stall_after must be > 0")
        self.engine, self.stall_after, self.on_trip = engine, float(stall_after), on_trip
        self.interval = interval if interval is not None else min(5.0, self.stall_after / 4)
        self.tripped: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self, now: float | None = None) -> str | None:
        """Trip if the scheduler is dead or stuck; returns the reason when it trips now."""
        if self.tripped is not None:
            return None
        busy, beat_at, alive = self.engine.progress()
        now = self.engine.clock() if now is None else now
        reason = None
        if busy and not alive:
            reason = "dead"
        elif busy and now - beat_at > self.stall_after:
            reason = "stuck"
        if reason is not None:
            self._trip(reason, now - beat_at)
        return reason

    def _trip(self, reason: str, silent_for: float) -> None:
        self.tripped = reason
        self.engine.counters["watchdog_trips"] += 1
        failed = self.engine.abort(EngineUnavailable(
            f"the model engine's scheduler is {reason}; the worker restarts, retry the request"
        ))
        log.critical("batch engine scheduler %s (no progress for %.1fs): failed %d requests",
                     reason, silent_for, failed)
        if self.on_trip is not None:
            self.on_trip(reason)

    def start(self) -> EngineWatchdog:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="engine-watchdog",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self.check() is not None:
                    return
            except Exception:  # a watchdog that dies watches nothing: report, go on
                log.exception("engine watchdog check failed")
