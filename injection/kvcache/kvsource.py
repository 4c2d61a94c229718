"""Preference K/V acquisition: L1 -> L2 (promoted to L1) -> recompute, single-flight per key.

The executor's ``_get_preference_kv`` in one place. Tier faults (a raising
``get``/``put``/``evict``, an entry not on CPU) are counted and degrade to the
next tier or to recompute; they never fail a request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from injection.base import CacheKey, KVStore, PreferenceModel, Tier, content_hash, run_here
from injection.kvcache.packed import PackedKV
from injection.kvcache.pieces import pooled
from injection.kvcache.singleflight import SingleFlight
from injection.metrics import Metrics

__all__ = ["PreferenceKVSource", "content_hash", "user_or_none"]

log = logging.getLogger(__name__)


def user_or_none(user: str | None) -> str | None:
    """An empty user id means no identity (never cached), not a shared '' user."""
    return user if user and user.strip() else None


class PreferenceKVSource:
    """Finds or computes a user's preference PackedKV (always on CPU). ``forward(kind,
    fn)`` runs each compute (``BatchEngine.forward``: on the engine's scheduler thread;
    default: here)."""

    def __init__(
        self, adapter: PreferenceModel, l1: KVStore | None, l2: KVStore | None, metrics: Metrics,
        forward: Callable[[str, Callable[[], Any]], Any] = run_here,
    ) -> None:
        self.adapter, self.l1, self.l2, self.metrics = adapter, l1, l2, metrics
        self.forward = forward
        self.flight: SingleFlight[PackedKV] = SingleFlight()

    def get(self, tenant: str, user: str | None, text: str) -> tuple[PackedKV, Tier, str]:
        """``(kv, tier, content_hash)``; ``user`` None computes without caching."""
        chash = content_hash(text)
        user = user_or_none(user)
        if user is None:
            return self.compute(text), Tier.COMPUTE, chash
        key = CacheKey(tenant, user, chash, self.adapter.fingerprint)
        kv, tier = self.fetch(key, lambda: self.adapter.compute_kv(text), kind="member")
        return kv, tier, chash

    def fetch(self, key: CacheKey, compute: Callable[[], PackedKV], *,
              kind: str, forward: str = "") -> tuple[PackedKV, Tier]:
        """``key``'s entry from L1 -> L2 (promoted to L1) -> ``compute()`` (single-flight,
        stored in L1 and L2). ``kind`` (tenant | member) splits the hit/miss counters;
        ``forward``: the compute's kind for the engine (default ``kind``)."""
        hit = self.lookup(key, kind=kind)
        if hit is not None:
            return hit
        kv, shared = self.flight.do(
            key, lambda: self._compute_and_store(key, compute, forward or kind))
        if shared:
            self.metrics.incr("compute_shared")
        return kv, Tier.COMPUTE

    def lookup(self, key: CacheKey, *, kind: str) -> tuple[PackedKV, Tier] | None:
        """``key``'s entry from L1, else L2 (promoted to L1), else None (a miss, counted)."""
        kv = self._get(self.l1, "l1", key, kind=kind)
        if kv is not None:
            touch = getattr(self.l2, "touch", None)  # in use: its Redis copy must not expire
            if touch is not None:
                try:
                    touch(key)
                except Exception as exc:  # noqa: BLE001 - the reply never depends on it
                    self.fault("l2", "touch", exc)
            return kv, Tier.L1
        kv = self._get(self.l2, "l2", key, kind=kind)
        if kv is not None:
            kv = pooled(kv)  # decoded -> pinned pool memory once (no copy without CUDA)
            self._put(self.l1, "l1", key, kv)
            return kv, Tier.L2
        return None

    def store(self, key: CacheKey | None, kv: PackedKV, compute_ms: float = 0.0) -> None:
        """A segment computed inside a request's own prefill (the one-pass miss): counted
        as a compute, stored in L1 and L2 (``key`` None: counted, never stored)."""
        assert kv.keys.is_cpu and kv.values.is_cpu, "cached K/V must live on CPU"
        self.metrics.incr("computes")
        self.metrics.incr("computes_one_pass")
        self.metrics.incr("kv_bytes_computed", kv.nbytes)
        if compute_ms:
            self.metrics.observe_ms("compute", compute_ms)
        if key is not None:
            self._put(self.l1, "l1", key, kv)
            self._put(self.l2, "l2", key, kv)

    def keep(self, key: CacheKey, kv: PackedKV) -> None:
        """An entry computed by the caller itself (a member's lean, ``guidance/probe.py``):
        stored in L1 and L2."""
        assert kv.keys.is_cpu and kv.values.is_cpu, "cached entries must live on CPU"
        self._put(self.l1, "l1", key, kv)
        self._put(self.l2, "l2", key, kv)

    def compute(self, text: str | Callable[[], PackedKV], kind: str = "member") -> PackedKV:
        """``text``'s K/V (or ``text()``'s), computed through ``forward`` as ``kind``."""
        t0 = time.perf_counter()
        kv = self.forward(kind, text if callable(text) else lambda: self.adapter.compute_kv(text))
        self.metrics.incr("computes")
        self.metrics.incr("kv_bytes_computed", kv.nbytes)
        self.metrics.observe_ms("compute", (time.perf_counter() - t0) * 1000.0)
        return kv

    def evict(self, tenant: str, user: str | None) -> dict[str, Any]:
        """Per tier: entries evicted, or None plus ``<tier>_error`` when the tier failed."""
        out: dict[str, Any] = {}
        for name, store in (("l1", self.l1), ("l2", self.l2)):
            try:
                out[name] = store.evict(tenant, user) if store is not None else 0
            except Exception as exc:  # a tier fault is reported, not raised
                self.fault(name, "evict", exc)
                out[name], out[f"{name}_error"] = None, type(exc).__name__
        return out

    def tier_stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, store in (("l1", self.l1), ("l2", self.l2)):
            try:
                out[name] = store.stats() if store is not None else None
            except Exception as exc:
                out[name] = {"error": type(exc).__name__}
        return out

    def fault(self, name: str, op: str, exc: BaseException) -> None:
        self.metrics.incr(f"{name}_errors")
        log.warning("cache tier %s %s failed (%s); degrading", name, op, type(exc).__name__)

    # -- internals ----------------------------------------------------------------------
    def _compute_and_store(self, key: CacheKey, compute: Callable[[], PackedKV],
                           kind: str) -> PackedKV:
        kv = self._recheck_l1(key)  # a racing leader may have stored it
        if kv is not None:
            return kv
        kv = self.compute(compute, kind)
        self._put(self.l1, "l1", key, kv)
        self._put(self.l2, "l2", key, kv)  # the tier writes asynchronously
        return kv

    def _recheck_l1(self, key: CacheKey) -> PackedKV | None:
        """L1 lookup that counts nothing (the request's miss was already counted)."""
        try:
            if self.l1 is None or key not in self.l1:  # type: ignore[operator]
                return None
        except TypeError:  # a KVStore without __contains__: skip the re-check
            return None
        return self._get(self.l1, "l1", key, count=False)

    def _get(
        self, store: KVStore | None, name: str, key: CacheKey, *, count: bool = True,
        kind: str = "",
    ) -> PackedKV | None:
        if store is None:
            return None
        try:
            kv = store.get(key)
        except Exception as exc:  # a faulty tier degrades to recompute
            self.fault(name, "get", exc)
            return None
        if kv is not None and not (kv.keys.is_cpu and kv.values.is_cpu):
            self.fault(name, "get", ValueError("entry not on CPU"))
            return None
        if count:
            outcome = "hits" if kv is not None else "misses"
            self.metrics.incr(f"{name}_{outcome}")
            if kind:
                self.metrics.incr(f"{kind}_{name}_{outcome}")
        return kv

    def _put(self, store: KVStore | None, name: str, key: CacheKey, kv: PackedKV) -> None:
        if store is None:
            return
        try:
            if not store.put(key, kv):
                self.metrics.incr(f"{name}_put_rejected")
        except Exception as exc:
            self.fault(name, "put", exc)
        used = getattr(store, "bytes_used", None)
        if name == "l1" and used is not None:
            self.metrics.set_gauge("l1_bytes", used)
            self.metrics.set_gauge("l1_entries", len(store))  # type: ignore[arg-type]
