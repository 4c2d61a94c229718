"""A background writer with a bounded in-flight quota (AIBrix's ``_l2_inflight_quota``).

``submit`` never blocks: when ``max_inflight`` jobs are queued or running, or their
values weigh ``max_bytes`` (a K/V's bytes, ``weigh``), it refuses (the caller counts a
skipped write), so what waits to be written is bounded in memory as well as in count. One daemon thread runs the jobs in
order; a job that raises is logged and dropped, never kills the thread.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["BoundedWriter"]

log = logging.getLogger(__name__)
K = TypeVar("K")
V = TypeVar("V")


class BoundedWriter(Generic[K, V]):
    """Runs ``fn(key, value)`` for submitted jobs on one background thread."""

    def __init__(self, fn: Callable[[K, V], object], max_inflight: int, name: str, *,
                 max_bytes: int = 0, weigh: Callable[[V], int] | None = None) -> None:
        if max_inflight <= 0 or max_bytes < 0:
            raise ValueError("max_inflight must be positive and max_bytes >= 0")
        self._fn, self.max_inflight, self._name = fn, max_inflight, name
        self.max_bytes, self._weigh = int(max_bytes), weigh or (lambda v: 0)
        self._bytes = 0  # weight of the queued jobs and the one running
        self._cv = threading.Condition()
        self._queue: collections.deque[tuple[K, V, int]] = collections.deque()
        self._inflight = 0  # queued + the one running
        self._running: K | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def inflight_bytes(self) -> int:
        return self._bytes

    def submit(self, key: K, value: V) -> bool:
        """Queue a job; False (and nothing queued) when full or closed."""
        weight = int(self._weigh(value))
        with self._cv:
            if self._closed or self._inflight >= self.max_inflight or (
                    self.max_bytes and self._bytes + weight > self.max_bytes):
                return False
            self._inflight += 1
            self._bytes += weight
            self._queue.append((key, value, weight))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cv.notify_all()
            return True

    def cancel(self, match: Callable[[K], bool], timeout: float = 10.0) -> int:
        """Drop queued jobs whose key matches and wait out a matching running job."""
        with self._cv:
            keep = collections.deque(job for job in self._queue if not match(job[0]))
            dropped = len(self._queue) - len(keep)
            self._bytes -= sum(job[2] for job in self._queue if match(job[0]))
            self._queue = keep
            self._inflight -= dropped
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._running is None or not match(self._running), timeout)
            return dropped

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every accepted job has finished; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: self._inflight == 0, timeout)

    def close(self, timeout: float | None = 5.0) -> None:
        """Finish accepted jobs (up to ``timeout``), then stop; later submits fail."""
        self.flush(timeout)
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                key, value, weight = self._queue.popleft()
                self._running = key
            try:
                self._fn(key, value)
            except Exception:  # the writer must survive any job
                log.exception("%s: job failed", self._name)
            finally:
                with self._cv:
                    self._running = None
                    self._inflight -= 1
                    self._bytes -= weight
                    self._cv.notify_all()
