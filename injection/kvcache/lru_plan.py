"""The eviction plan of a :class:`~injection.kvcache.lru.TenantLRU` put, on a simulation
(and the cache's integrity check, which recomputes what the plans keep).

Per-tenant (and the newcomer's user's) bytes/counts and LRU cursors as they would be after
the put, so a refused put evicts nothing. The order in which a tenant gives up entries:
its unprotected entries oldest first, then its protected ones (a tenant segment while the
tenant has active members), the newcomer last. Rules, in order:

1. a member's cap (``user_quota_bytes``): the newcomer's user gives up its own oldest
   entries first (one member's conversations never flush the other members');
2. the tenant's quota: the tenant gives up its own entries; a protected tenant segment is
   never evicted to make room for one of its own member/conversation entries (that put
   is refused instead: the segment serves every member);
3. a global bound: the victim is the tenant over its fair share whose next entry is
   oldest, unprotected before protected: a protected segment goes only when no tenant over its
   share has anything else (never a deadlock: protection cannot fill the cache for good),
   and never for an entry of its own tenant (refused, as under rule 2).
"""

from __future__ import annotations

from typing import Any

from injection.base import CacheKey

__all__ = ["_NEW", "_Simulation", "check_integrity", "plan_put"]


_NEW = object()  # marks the entry being inserted in a _Simulation


class _Simulation:
    """Per-tenant bytes/counts and LRU cursors as they would be after a put."""

    def __init__(self, tenants: dict[str, Any], key: CacheKey, size: int, tick: int,
                 protected: frozenset[CacheKey] = frozenset()):
        self._tenants, self._key, self._size, self._tick = tenants, key, size, tick
        self.protected = protected
        self.bytes = {n: t.bytes for n, t in tenants.items() if t.entries}
        self.count = {n: len(t.entries) for n, t in tenants.items() if t.entries}
        old = tenants[key.tenant].entries.get(key) if key.tenant in tenants else None
        self.bytes[key.tenant] = self.bytes.get(key.tenant, 0) + size - (old.nbytes if old else 0)
        self.count[key.tenant] = self.count.get(key.tenant, 0) + (0 if old else 1)
        self.total_bytes, self.total_count = sum(self.bytes.values()), sum(self.count.values())
        self.evicted: list[CacheKey] = []
        self._gone: set[CacheKey] = set()
        self._cursors: dict[str, Any] = {}
        self._heads: dict[str, tuple[Any, int, int]] = {}

    def user_entries(self) -> list[tuple[CacheKey, int]]:
        """The newcomer's user's other entries, oldest first, with their bytes."""
        t = self._tenants.get(self._key.tenant)
        return [(k, e.nbytes) for k, e in (t.entries.items() if t else ())
                if k.user == self._key.user and k != self._key]

    def _walk(self, name: str):
        """(key, nbytes, tick): unprotected oldest first, then protected, the newcomer last."""
        t = self._tenants.get(name)
        items = [(k, e) for k, e in (t.entries.items() if t else ()) if k != self._key]
        for want_protected in (False, True):
            for k, e in items:
                if (k in self.protected) == want_protected and k not in self._gone:
                    yield k, e.nbytes, e.tick
        if name == self._key.tenant:
            yield _NEW, self._size, self._tick

    def head(self, name: str) -> tuple[Any, int, int]:
        while True:
            if name not in self._heads:
                cur = self._cursors.setdefault(name, self._walk(name))
                self._heads[name] = next(cur)
            k = self._heads[name][0]
            if k is _NEW or k not in self._gone:  # (evicted meanwhile by the user cap)
                return self._heads[name]
            del self._heads[name]

    def rank(self, name: str) -> tuple[int, int]:
        """Eviction preference of ``name``'s next entry: unprotected, protected, newcomer."""
        k, _, tick = self.head(name)
        return (2 if k is _NEW else 1 if k in self.protected else 0), tick

    def evict(self, k: CacheKey, nbytes: int) -> None:
        self.bytes[k.tenant] -= nbytes
        self.count[k.tenant] -= 1
        self.total_bytes -= nbytes
        self.total_count -= 1
        self.evicted.append(k)
        self._gone.add(k)

    def pop(self, name: str) -> None:
        k, nbytes, _ = self.head(name)
        del self._heads[name]
        self.evict(k, nbytes)


def plan_put(lru: Any, key: CacheKey, size: int, protected: frozenset[CacheKey],
             tenant_user: str) -> list[CacheKey] | None:
    """Victims that make room for ``key`` in ``lru`` (replacing any old entry); None to
    refuse (then nothing is evicted). ``tenant_user``: the user of tenant segments."""
    if size > lru.tenant_quota_bytes or (lru.user_quota_bytes and size > lru.user_quota_bytes):
        return None
    sim = _Simulation(lru._tenants, key, size, lru._tick + 1, protected)
    if lru.user_quota_bytes:  # the member's own oldest entries first
        mine = sim.user_entries()
        used = size + sum(n for _, n in mine)
        for k, nbytes in mine:
            if used <= lru.user_quota_bytes:
                break
            sim.evict(k, nbytes)
            used -= nbytes
    while sim.bytes[key.tenant] > lru.tenant_quota_bytes:
        k = sim.head(key.tenant)[0]
        if k in protected and key.user != tenant_user:
            return None  # only the protected tenant segment is left to give up
        sim.pop(key.tenant)  # own quota: own LRU entries only
    while sim.total_bytes > lru.max_bytes or sim.total_count > lru.max_entries:
        victim = _pick_victim(lru, sim, by_bytes=sim.total_bytes > lru.max_bytes)
        head = sim.head(victim)[0]
        if head is _NEW:
            return None  # only the newcomer is over its share
        if victim == key.tenant and head in protected and key.user != tenant_user:
            return None  # never the tenant's own protected segment for one of its entries
        sim.pop(victim)
    return sim.evicted


def _pick_victim(lru: Any, sim: _Simulation, by_bytes: bool) -> str:
    """Tenant over its fair share whose next entry goes first (unprotected, then oldest)."""
    active = [n for n, c in sim.count.items() if c > 0]
    bound = lru.max_bytes if by_bytes else lru.max_entries
    share = bound / len(active)
    over = [n for n in active if (sim.bytes[n] if by_bytes else sim.count[n]) > share]
    # Over a bound, some tenant is always over its share (pigeonhole).
    return min(over or active, key=sim.rank)


def check_integrity(lru: Any, accounted: Any, tenant_user: str) -> None:
    """Recompute every total of ``lru`` (lock held); AssertionError on any drift."""
    total_b = total_n = 0
    for name, t in lru._tenants.items():
        b, last = 0, 0
        for k, e in t.entries.items():
            _require(k.tenant == name, f"key {k} filed under tenant {name!r}")
            _require(e.nbytes == accounted(e.kv), f"entry {k} size drifted")
            _require(e.kv.keys.is_cpu and e.kv.values.is_cpu, f"entry {k} not on CPU")
            _require(last < e.tick <= lru._tick, f"tenant {name!r} recency broken at {k}")
            b, last = b + e.nbytes, e.tick
        _require(b == t.bytes, f"tenant {name!r} bytes {t.bytes} != recomputed {b}")
        others = sum(k.user != tenant_user for k in t.entries)
        _require(others == t.others, f"tenant {name!r} member count drifted")
        _require(b <= lru.tenant_quota_bytes, f"tenant {name!r} over quota")
        total_b += b
        total_n += len(t.entries)
    _require(total_b == lru._bytes, f"bytes {lru._bytes} != recomputed {total_b}")
    _require(total_n == lru._count, f"entries {lru._count} != recomputed {total_n}")
    _require(total_b <= lru.max_bytes, "over max_bytes")
    _require(total_n <= lru.max_entries, "over max_entries")


def _require(ok: bool, msg: str) -> None:
    if not ok:
        raise AssertionError(f"TenantLRU integrity: {msg}")
