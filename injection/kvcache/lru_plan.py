"""The eviction plan of a :class:`~injection.kvcache.lru.TenantLRU` put, on a simulation.

Per-tenant bytes/counts and LRU cursors as they would be after the put, so a refused
put evicts nothing (the planner in ``lru.py`` walks it).
"""

from __future__ import annotations

from typing import Any

from injection.base import CacheKey

__all__ = ["_NEW", "_Simulation"]


_NEW = object()  # marks the entry being inserted in a _Simulation


class _Simulation:
    """Per-tenant bytes/counts and LRU cursors as they would be after a put."""

    def __init__(self, tenants: dict[str, Any], key: CacheKey, size: int, tick: int):
        self._tenants, self._key, self._size, self._tick = tenants, key, size, tick
        self.bytes = {n: t.bytes for n, t in tenants.items() if t.entries}
        self.count = {n: len(t.entries) for n, t in tenants.items() if t.entries}
        old = tenants[key.tenant].entries.get(key) if key.tenant in tenants else None
        self.bytes[key.tenant] = self.bytes.get(key.tenant, 0) + size - (old.nbytes if old else 0)
        self.count[key.tenant] = self.count.get(key.tenant, 0) + (0 if old else 1)
        self.total_bytes, self.total_count = sum(self.bytes.values()), sum(self.count.values())
        self.evicted: list[CacheKey] = []
        self._cursors: dict[str, Any] = {}
        self._heads: dict[str, tuple[Any, int, int]] = {}

    def _walk(self, name: str):
        """(key, nbytes, tick) oldest first, skipping a replaced entry, newcomer last."""
        t = self._tenants.get(name)
        for k, e in t.entries.items() if t else ():
            if k != self._key:
                yield k, e.nbytes, e.tick
        if name == self._key.tenant:
            yield _NEW, self._size, self._tick

    def head(self, name: str) -> tuple[Any, int, int]:
        if name not in self._heads:
            cur = self._cursors.setdefault(name, self._walk(name))
            self._heads[name] = next(cur)
        return self._heads[name]

    def pop(self, name: str) -> None:
        k, nbytes, _ = self.head(name)
        del self._heads[name]
        self.bytes[name] -= nbytes
        self.count[name] -= 1
        self.total_bytes -= nbytes
        self.total_count -= 1
        self.evicted.append(k)
