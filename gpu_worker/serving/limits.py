"""Task time limits for the solo and threads pools, where Celery does not enforce them.

Under prefork Celery's pool enforces ``soft_time_limit``/``time_limit`` itself. The GPU
pools (solo, threads) run tasks in this process, so a :class:`Watchdog` (ticked by the
worker agent) does it: at the soft limit it raises ``SoftTimeLimitExceeded`` inside the
task's thread (delivered between two Python bytecodes: generation checks it every token);
at the hard limit the worker is wedged in native code, so ``on_hard`` marks the task as
poison and ends the process (its task is redelivered once, then failed).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from celery.exceptions import SoftTimeLimitExceeded

log = logging.getLogger(__name__)


@dataclass
class Running:
    task_id: str
    thread_id: int
    started: float
    soft: float | None
    hard: float | None
    soft_fired: bool = False


def _async_raise(thread_id: int, exc: type[BaseException] | None) -> None:
    """Schedule ``exc`` in ``thread_id`` (None cancels a scheduled one)."""
    arg = ctypes.py_object(exc) if exc is not None else ctypes.c_void_p(0)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), arg)


class Watchdog:
    """Tracks running tasks per thread and enforces their soft/hard limits on :meth:`check`."""

    def __init__(self, on_hard: Callable[[Running], None]) -> None:
        self._on_hard = on_hard
        self._lock = threading.Lock()
        self._running: dict[int, Running] = {}

    @contextmanager
    def guard(self, task_id: str, soft: float | None, hard: float | None) -> Iterator[None]:
        tid = threading.get_ident()
        entry = Running(task_id, tid, time.monotonic(), soft, hard)
        with self._lock:
            self._running[tid] = entry
        try:
            yield
        finally:
            self.finish(tid)

    def finish(self, thread_id: int | None = None) -> None:
        """Stop watching the thread's task and cancel a soft-limit exception not yet raised.

        Idempotent (also called from ``task_postrun``): the soft exception is scheduled
        at most once per task, and only while the task is registered, so after this
        returns nothing can interrupt the thread.
        """
        tid = threading.get_ident() if thread_id is None else thread_id
        while True:
            try:
                with self._lock:
                    entry = self._running.pop(tid, None)
                    if entry is not None and entry.soft_fired:
                        _async_raise(tid, None)
                return
            except SoftTimeLimitExceeded:  # arrived during cleanup: the task is done anyway
                continue

    def check(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        wedged = []
        with self._lock:
            for e in self._running.values():
                elapsed = now - e.started
                if e.soft and not e.soft_fired and elapsed >= e.soft:
                    e.soft_fired = True
                    log.warning("task %s passed its soft time limit (%.0fs)", e.task_id, e.soft)
                    _async_raise(e.thread_id, SoftTimeLimitExceeded)
                if e.hard and elapsed >= e.hard:
                    wedged.append(e)
        for e in wedged:
            self._on_hard(e)

    def running(self) -> list[Running]:
        with self._lock:
            return list(self._running.values())
