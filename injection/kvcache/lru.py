"""L1: a tenant-partitioned, byte-bounded LRU of CPU PackedKV.

The design's ``BoundedUserKVCache`` grown up for many tenants:

* entries are keyed by :class:`~injection.base.CacheKey`, stored per tenant;
* global ``max_bytes`` / ``max_entries`` bound the whole cache;
* ``tenant_quota_bytes`` caps one tenant: a tenant over quota evicts only its
  own least recently used entries;
* when a global bound is hit, the victim is the least recently used entry
  among tenants *over their fair share* (bound / active tenants). A tenant
  within its fair share is never evicted to make room for another, so one
  tenant's traffic cannot push out another's entries beyond its share. If
  the newcomer itself would have to go, the put is refused and nothing is
  evicted (evictions are planned on a simulation before any is applied).
* a tenant segment (user ``TENANT_USER``) is protected while its tenant is active: it
  has a member entry in this cache, or its segment was used within
  ``protect_idle_seconds``. A protected segment is not evicted for the tenant's own entries
  (that put is refused) and goes under a global bound only when no tenant over its
  share has anything else; invalidating the tenant (deletion, instructions edit)
  drops it as always (rules: ``lru_plan``). ("Pinned", here and in ``stats()``, means
  page-locked host memory only: an entry's tensors in it, ``injection.hostmem``.)
* ``user_quota_bytes`` caps one (tenant, user): a member over it gives up its own
  oldest entries first (the conversation L1: one member's conversations never flush
  the others').

Recency is a global tick per entry, so "least recently used among these
tenants" is O(tenants) per eviction. One lock guards everything.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from injection.base import CacheKey, KVStore
from injection.hostmem import held_bytes
from injection.kvcache.chain import TENANT_USER
from injection.kvcache.lru_plan import check_integrity, plan_put
from injection.kvcache.packed import PackedKV

__all__ = ["TenantLRU"]


@dataclass
class _Entry:
    kv: PackedKV
    nbytes: int
    tick: int
    used: float = 0.0  # clock() at the last put/get (a tenant segment's protection)
    pinned: bool = False  # page-locked host memory (nbytes: as the allocator rounds it)


@dataclass
class _Tenant:
    entries: OrderedDict[CacheKey, _Entry] = field(default_factory=OrderedDict)
    bytes: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    others: int = 0  # entries that are not the tenant segment (active members)


_TENANT_STATS = ("bytes", "hits", "misses", "evictions")


class TenantLRU(KVStore):
    """Thread-safe L1 cache of CPU :class:`PackedKV`, partitioned by tenant.

    Args:
        max_bytes: bound on the bytes all entries hold (``accounted_bytes``: pinned
            blocks as the allocator rounds them, not ``PackedKV.nbytes``).
        max_entries: bound on the number of entries.
        tenant_quota_bytes: per-tenant byte cap (default: ``max_bytes``).
        user_quota_bytes: per-(tenant, user) byte cap (default: none).
        protect_idle_seconds: a tenant segment stays protected from eviction this long
            after its last use even without member entries here (0: only member entries
            protect it).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        max_bytes: int = 2 * 1024**3,
        max_entries: int = 1024,
        tenant_quota_bytes: int | None = None,
        *,
        user_quota_bytes: int | None = None,
        protect_idle_seconds: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        quota = max_bytes if tenant_quota_bytes is None else tenant_quota_bytes
        if max_bytes <= 0 or max_entries <= 0 or quota <= 0:
            raise ValueError("max_bytes, max_entries and tenant_quota_bytes must be positive")
        self.max_bytes = int(max_bytes)
        self.max_entries = int(max_entries)
        self.tenant_quota_bytes = int(min(quota, max_bytes))
        self.user_quota_bytes = int(user_quota_bytes) if user_quota_bytes else None
        self.protect_idle_seconds, self._clock = float(protect_idle_seconds), clock
        self._lock = threading.Lock()
        self._tenants: dict[str, _Tenant] = {}
        self._bytes = 0
        self._count = 0
        self._tick = 0
        self._rejected = 0
        self._invalidations = 0

    # -- KVStore ----------------------------------------------------------------
    def get(self, key: CacheKey) -> PackedKV | None:
        """The entry for ``key`` (moved to most recently used), or None."""
        with self._lock:
            t = self._tenant(key.tenant)
            entry = t.entries.get(key)
            if entry is None:
                t.misses += 1
                return None
            t.hits += 1
            self._tick += 1
            entry.tick, entry.used = self._tick, self._clock()
            t.entries.move_to_end(key)
            return entry.kv

    def put(self, key: CacheKey, kv: PackedKV) -> bool:
        """Insert or replace; False if the entry can never fit (quota, bounds, fairness)."""
        # Cached tensors must live on CPU (GPU memory is per request only).
        if not (kv.keys.is_cpu and kv.values.is_cpu):
            raise ValueError(f"TenantLRU caches CPU tensors only, got {kv.device}")
        size = accounted_bytes(kv)
        with self._lock:
            plan = plan_put(self, key, size, self._protected(), TENANT_USER)
            if plan is None:  # nothing was changed
                self._rejected += 1
                return False
            t = self._tenant(key.tenant)
            self._remove(t, key)
            for victim in plan:
                vt = self._tenants[victim.tenant]
                self._remove(vt, victim)
                vt.evictions += 1
            self._tick += 1
            t.entries[key] = _Entry(kv, size, self._tick, self._clock(), kv.is_pinned())
            t.bytes += size
            t.others += key.user != TENANT_USER
            self._bytes += size
            self._count += 1
            return True

    def evict(self, tenant: str, user: str | None = None,
              where: Callable[[CacheKey], bool] | None = None) -> int:
        """Drop ``tenant``'s entries (only ``user``'s if given; only those ``where`` holds
        for, if given: one conversation's links); returns how many."""
        with self._lock:
            t = self._tenants.get(tenant)
            if t is None:
                return 0
            keys = [k for k in t.entries
                    if (user is None or k.user == user) and (where is None or where(k))]
            for k in keys:
                self._remove(t, k)
            self._invalidations += len(keys)
            return len(keys)

    def peek(self, key: CacheKey) -> PackedKV | None:
        """The entry for ``key`` without touching recency or counters."""
        with self._lock:
            t = self._tenants.get(key.tenant)
            entry = t.entries.get(key) if t is not None else None
            return entry.kv if entry is not None else None

    def discard(self, key: CacheKey) -> bool:
        """Drop one entry (a conversation's superseded link); True if it was there."""
        with self._lock:
            t = self._tenants.get(key.tenant)
            return t is not None and self._remove(t, key) is not None

    def usage_by(self, classify: Callable[[CacheKey], str]) -> dict[str, dict[str, int]]:
        """Entries and bytes per class of key (e.g. tenant / member segments)."""
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for t in self._tenants.values():
                for k, e in t.entries.items():
                    row = out.setdefault(classify(k), dict.fromkeys(USAGE_FIELDS, 0))
                    _add(row, e)
        return out

    def clear(self, tenant: str | None = None) -> int:
        """Drop every entry (of ``tenant`` if given); returns how many."""
        if tenant is not None:
            return self.evict(tenant)
        with self._lock:
            n = self._count
            for t in self._tenants.values():
                t.entries.clear()
                t.bytes = t.others = 0
            self._bytes = self._count = 0
            self._invalidations += n
            return n

    def stats(self) -> dict[str, Any]:
        """Totals and a ``per_tenant`` breakdown (JSON-safe)."""
        with self._lock:
            per = {
                name: {"entries": len(t.entries)} | {f: getattr(t, f) for f in _TENANT_STATS}
                for name, t in self._tenants.items()
            }
            return {
                "entries": self._count,
                "bytes": self._bytes,
                "max_bytes": self.max_bytes,
                "max_entries": self.max_entries,
                "tenant_quota_bytes": self.tenant_quota_bytes,
                **self._memory(),
                **{f: sum(p[f] for p in per.values()) for f in _TENANT_STATS[1:]},
                "invalidations": self._invalidations,
                "rejected": self._rejected,
                "per_tenant": per,
            }

    # -- extras -------------------------------------------------------------------
    @property
    def bytes_used(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return self._count

    def __contains__(self, key: object) -> bool:
        """Membership without touching recency or counters."""
        if not isinstance(key, CacheKey):
            return False
        with self._lock:
            t = self._tenants.get(key.tenant)
            return t is not None and key in t.entries

    def check_integrity(self) -> None:
        """Recompute every total from the entries; raise AssertionError on any drift."""
        with self._lock:
            check_integrity(self, accounted_bytes, TENANT_USER)

    # -- internals (caller holds the lock) --------------------------------------
    def _memory(self) -> dict[str, int]:
        """Bytes as tensors (``tensor_bytes``) and of them in pinned memory, accounted."""
        row = dict.fromkeys(USAGE_FIELDS, 0)
        for t in self._tenants.values():
            for e in t.entries.values():
                _add(row, e)
        return {"tensor_bytes": row["tensor_bytes"], "pinned_bytes": row["pinned_bytes"]}

    def _tenant(self, name: str) -> _Tenant:
        t = self._tenants.get(name)
        if t is None:
            t = self._tenants[name] = _Tenant()
        return t

    def _remove(self, t: _Tenant, key: CacheKey) -> _Entry | None:
        entry = t.entries.pop(key, None)
        if entry is not None:
            t.bytes -= entry.nbytes
            t.others -= key.user != TENANT_USER
            self._bytes -= entry.nbytes
            self._count -= 1
        return entry

    def _protected(self) -> frozenset[CacheKey]:
        """Tenant segments of active tenants (see the module doc)."""
        now, out = self._clock(), []
        for t in self._tenants.values():
            if len(t.entries) == t.others:
                continue  # no tenant segment here
            for k, e in t.entries.items():
                if k.user == TENANT_USER and (
                        t.others > 0 or now - e.used < self.protect_idle_seconds):
                    out.append(k)
        return frozenset(out)


USAGE_FIELDS = ("entries", "bytes", "tensor_bytes", "pinned_bytes")


def _add(row: dict[str, int], e: _Entry) -> None:
    """One entry into a usage row: bytes accounted, as tensors, accounted if pinned."""
    row["entries"] += 1
    row["bytes"] += e.nbytes
    row["tensor_bytes"] += e.kv.nbytes
    row["pinned_bytes"] += e.nbytes if e.pinned else 0


def accounted_bytes(kv: PackedKV) -> int:
    """What an entry holds in host memory: its storages as the allocator holds them
    (pinned blocks rounded up), not ``kv.nbytes`` (``injection.hostmem``)."""
    return held_bytes(kv.keys) + held_bytes(kv.values)
