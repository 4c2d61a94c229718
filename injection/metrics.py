"""Process-wide, thread-safe engine counters (exported by a later issue).

Plain integers and floats behind one lock. Counter names used by the executor:

* ``requests``, ``requests_tier_<tier>``: requests by where their K/V came from;
* ``l1_hits`` / ``l1_misses`` / ``l1_errors`` / ``l1_put_rejected``;
* ``l2_hits`` / ``l2_misses`` / ``l2_errors`` / ``l2_put_rejected``;
* ``computes``, ``compute_shared`` (single-flight waiters), ``kv_bytes_computed``;
* ``oom_retries``, ``oom_failures``, ``stripped_calls``, ``invalidations``.

Gauges (last value wins): ``l1_bytes``, ``l1_entries``. Tier-internal figures
(evictions, L2 rejects of bad entries) come from each tier's ``stats()``.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

__all__ = ["Metrics", "METRICS"]


class Metrics:
    """Counters and gauges; ``snapshot()`` gives a JSON-safe copy."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: defaultdict[str, int] = defaultdict(int)
        self._gauges: dict[str, float] = {}
        self._timings: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0.0])

    def incr(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] += n

    def set_gauge(self, name: str, value: float) -> None:
        with self._lock:
            self._gauges[name] = value

    def observe_ms(self, name: str, ms: float) -> None:
        """Accumulate a latency (count and total, for a mean)."""
        with self._lock:
            t = self._timings[name]
            t[0] += 1
            t[1] += ms

    def get(self, name: str) -> int:
        with self._lock:
            return self._counters.get(name, 0)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "counters": dict(self._counters),
                "gauges": dict(self._gauges),
                "latency_ms": {
                    k: {"count": c, "total": round(s, 3), "mean": round(s / c, 3) if c else 0.0}
                    for k, (c, s) in self._timings.items()
                },
            }

    def reset(self) -> None:
        with self._lock:
            self._counters.clear()
            self._gauges.clear()
            self._timings.clear()


METRICS = Metrics()  # the process-wide default
