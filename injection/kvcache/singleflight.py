"""Single-flight: concurrent callers for the same key share one computation.

Thread-based (the GPU worker serves requests from threads). The first caller
for a key runs the function; callers arriving while it runs wait for it and
get the same result, or the same exception. A finished key is forgotten at
once, so a later miss computes again and nothing accumulates.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

__all__ = ["SingleFlight"]

T = TypeVar("T")


class _Call:
    __slots__ = ("done", "result", "error", "waiters")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.waiters = 0


class SingleFlight(Generic[T]):
    """Deduplicates concurrent calls of ``fn`` per key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[Hashable, _Call] = {}

    def do(self, key: Hashable, fn: Callable[[], T]) -> tuple[T, bool]:
        """Run ``fn`` once for all concurrent callers of ``key``.

        Returns ``(result, shared)``; ``shared`` is True for callers that
        waited on another caller's computation. Errors propagate to every caller.
        """
        with self._lock:
            call = self._calls.get(key)
            leader = call is None
            if leader:
                call = self._calls[key] = _Call()
            else:
                call.waiters += 1
        if not leader:
            call.done.wait()
            if call.error is not None:
                raise call.error
            return call.result, True
        try:
            call.result = fn()
        except BaseException as exc:
            call.error = exc
            raise
        finally:
            with self._lock:
                del self._calls[key]
            call.done.set()
        return call.result, False

    def waiters(self, key: Hashable) -> int:
        """Callers currently waiting on ``key``'s computation (besides its leader)."""
        with self._lock:
            call = self._calls.get(key)
            return call.waiters if call is not None else 0
