"""Single-flight: concurrent callers for the same key share one computation.

Thread-based (the GPU worker serves requests from threads). The first caller
for a key runs the function; callers arriving while it runs wait for it and
get the same result, or the same exception, unless the exception was the leader's own
rather than the computation's: a time limit raised into the leader's thread (Celery's
``SoftTimeLimitExceeded``, delivered by ``gpu_worker.serving.limits``), an interrupt or exit.
Then a waiting caller tries again itself (leading, or following a new leader) instead of
failing with another request's deadline. A finished key is forgotten at once, so a later
miss computes again and nothing accumulates.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

__all__ = ["SingleFlight", "leaders_own"]

# errors raised into a caller's thread from outside (by name: no Celery import here)
_LEADERS_OWN = frozenset({"SoftTimeLimitExceeded", "TimeLimitExceeded"})

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
        waited on another caller's computation. Errors propagate to every caller, but
        for the leader's own (``leaders_own``): a waiting caller then tries again.
        """
        while True:
            done, out = self._once(key, fn)
            if done:
                return out

    def _once(self, key: Hashable, fn: Callable[[], T]) -> tuple[bool, tuple[T, bool]]:
        """One attempt: ``(False, _)`` when the leader this caller waited for failed with
        an error of its own."""
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
                if leaders_own(call.error):
                    return False, (None, True)
                raise call.error
            return True, (call.result, True)
        try:
            call.result = fn()
        except BaseException as exc:
            call.error = exc
            raise
        finally:
            with self._lock:
                del self._calls[key]
            call.done.set()
        return True, (call.result, False)

    def waiters(self, key: Hashable) -> int:
        """Callers currently waiting on ``key``'s computation (besides its leader)."""
        with self._lock:
            call = self._calls.get(key)
            return call.waiters if call is not None else 0


def leaders_own(error: BaseException) -> bool:
    """Whether ``error`` ended the leader's call rather than the computation: an exception
    raised into its thread from outside (a task's time limit) or not an ``Exception`` at
    all (an interrupt, an exit)."""
    return not isinstance(error, Exception) or type(error).__name__ in _LEADERS_OWN
