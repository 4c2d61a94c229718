"""The worker's engine watchdog: a stuck or dead batch-engine scheduler restarts the process.

``injection.engine.watchdog.EngineWatchdog`` finds it and fails every in-flight and
waiting request with ``EngineUnavailable`` (the web answers 503 with Retry-After and the
request's Idempotency-Key: a retry runs it once). Then :func:`restart` counts the trip
(``kvi_engine_watchdog_trips``), waits for the failed tasks to report their error
(bounded by ``ENGINE_WATCHDOG_EXIT_GRACE``) and exits the process: a thread stuck in a
forward pass cannot be stopped, only its process, which Celery's pool or the supervisor
replaces (solo/threads: the process manager restarts the worker).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from django.conf import settings

from gpu_worker.ops import metrics
from injection.engine.watchdog import EngineWatchdog

log = logging.getLogger(__name__)
EXIT_CODE = 75  # EX_TEMPFAIL: restart me
_current: EngineWatchdog | None = None


def start(engine, *, stall_after: float | None = None, interval: float | None = None,
          on_trip: Callable[[str], None] | None = None) -> EngineWatchdog | None:
    """Watch ``engine`` (None, or ENGINE_WATCHDOG_SECONDS 0: nothing to watch); on a trip
    ``on_trip(reason)``, by default :func:`restart`."""
    global _current
    stall = settings.ENGINE_WATCHDOG_SECONDS if stall_after is None else stall_after
    if engine is None or not stall:
        return None
    stop()
    _current = EngineWatchdog(engine, stall_after=stall, interval=interval,
                              on_trip=on_trip or restart).start()
    return _current


def stop() -> None:
    global _current
    if _current is not None:
        _current.stop()
        _current = None


def restart(reason: str, *, exit_process: Callable[[int], object] = os._exit,
            running: Callable[[], int] | None = None, grace: float | None = None,
            settle: float = 0.5) -> None:
    """Count the trip, let the failed tasks report (they were failed already), exit.

    ``running`` counts tasks still in this process (their threads raise
    EngineUnavailable, then Celery stores that result: ``settle`` seconds more cover the
    store; a result lost anyway is redelivered once, as for any worker that dies)."""
    metrics.ENGINE_WATCHDOG.labels(reason).inc()
    grace = settings.ENGINE_WATCHDOG_EXIT_GRACE if grace is None else grace
    running = running or _tasks_running
    log.critical("batch engine scheduler %s: its requests failed (retryable); this worker "
                 "process exits (code %d) to be replaced", reason, EXIT_CODE)
    deadline = time.monotonic() + grace
    pause = threading.Event()
    while running() and time.monotonic() < deadline:
        pause.wait(0.05)  # the tasks' threads raise EngineUnavailable and report it
    pause.wait(settle)
    exit_process(EXIT_CODE)


def _tasks_running() -> int:
    from gpu_worker.serving.state import STATE

    return len(STATE.watchdog.running()) if STATE.watchdog is not None else 0
