"""TenantLRU: recency, global bounds, per-tenant quota isolation, exact accounting."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from injection.base import CacheKey
from injection.kvcache.lru import TenantLRU
from injection.kvcache.packed import PackedKV


def kv(tokens: int = 4) -> PackedKV:
    """An fp32 PackedKV with L=1, H=1, D=8: exactly ``tokens * B`` bytes (B = 64)."""
    k = torch.randn(1, 1, tokens, 8)
    return PackedKV(k, torch.randn_like(k), range(tokens))


def key(tenant: str, user: str = "u", h: str = "h", fp: str = "fp") -> CacheKey:
    return CacheKey(tenant, user, h, fp)


B = kv(1).nbytes  # 64 bytes per token


def test_get_put_and_lru_order():
    c = TenantLRU(max_bytes=3 * 4 * B, max_entries=3)
    a, b, d = key("t", "a"), key("t", "b"), key("t", "d")
    for k in (a, b, d):
        assert c.put(k, kv())
    assert c.get(a) is not None  # a becomes MRU; b is now LRU
    assert c.put(key("t", "e"), kv())
    assert b not in c and a in c and d in c
    assert c.get(b) is None
    s = c.stats()
    assert (s["hits"], s["misses"], s["evictions"], s["entries"]) == (1, 1, 1, 3)
    c.check_integrity()


def test_get_returns_the_stored_object_and_never_another_tenants():
    c = TenantLRU(max_bytes=10**6, max_entries=10)
    x = kv()
    c.put(key("acme"), x)
    assert c.get(key("acme")) is x
    assert c.get(key("globex")) is None  # same user/hash/fingerprint, other tenant


def test_replace_same_key_keeps_exact_bytes():
    c = TenantLRU(max_bytes=10**6, max_entries=10)
    c.put(key("t"), kv(4))
    c.put(key("t"), kv(10))
    assert len(c) == 1 and c.bytes_used == 10 * B
    c.check_integrity()


def test_global_max_bytes_and_entries():
    c = TenantLRU(max_bytes=10 * B, max_entries=100)
    for i in range(6):
        assert c.put(key("t", str(i)), kv(3))
    assert c.bytes_used <= 10 * B and len(c) == 3
    assert all(key("t", u) in c for u in ("3", "4", "5"))
    c2 = TenantLRU(max_bytes=10**6, max_entries=2)
    for i in range(5):
        c2.put(key("t", str(i)), kv(1))
    assert len(c2) == 2
    c.check_integrity()
    c2.check_integrity()


def test_oversized_entries_are_refused():
    c = TenantLRU(max_bytes=10 * B, max_entries=10, tenant_quota_bytes=4 * B)
    c.put(key("t", "keep"), kv(2))
    assert c.put(key("t", "big"), kv(5)) is False  # > quota
    assert c.put(key("t", "huge"), kv(11)) is False  # > max_bytes
    assert key("t", "keep") in c and len(c) == 1
    assert c.stats()["rejected"] == 2


def test_cpu_only():
    c = TenantLRU(max_bytes=10**6, max_entries=10)
    meta = kv().to("meta")
    with pytest.raises(ValueError, match="CPU"):
        c.put(key("t"), meta)
    assert len(c) == 0


def test_tenant_over_quota_evicts_only_its_own_entries():
    c = TenantLRU(max_bytes=100 * B, max_entries=100, tenant_quota_bytes=8 * B)
    c.put(key("b", "b1"), kv(4))
    for i in range(20):
        assert c.put(key("a", f"a{i}"), kv(4))
    s = c.stats()["per_tenant"]
    assert s["a"]["bytes"] == 8 * B and s["a"]["entries"] == 2
    assert s["b"]["entries"] == 1 and s["b"]["evictions"] == 0
    assert key("a", "a19") in c and key("a", "a18") in c
    c.check_integrity()


def test_flooding_tenant_cannot_evict_other_tenant_within_quota():
    # Quotas fit the cache (3 x 10 <= 30): B's entries are untouchable by A.
    c = TenantLRU(max_bytes=30 * B, max_entries=1000, tenant_quota_bytes=10 * B)
    b_keys = [key("b", f"b{i}") for i in range(5)]
    for k in b_keys:
        c.put(k, kv(2))
    for i in range(500):
        c.put(key("a", f"a{i}"), kv(random.Random(i).randint(1, 5)))
        c.put(key("c", f"c{i}"), kv(3))
    assert all(k in c for k in b_keys)
    assert c.stats()["per_tenant"]["b"]["evictions"] == 0
    c.check_integrity()


def test_oversubscribed_cache_evicts_only_tenants_over_fair_share():
    # No per-tenant quota: the global bound is shared fairly between active tenants.
    c = TenantLRU(max_bytes=20 * B, max_entries=1000)
    b_keys = [key("b", f"b{i}") for i in range(4)]  # 8B, within a 10B fair share
    for k in b_keys:
        c.put(k, kv(2))
    for i in range(200):
        assert c.put(key("a", f"a{i}"), kv(3))
    assert all(k in c for k in b_keys)
    assert c.stats()["per_tenant"]["a"]["bytes"] <= 12 * B
    c.check_integrity()


def test_greedy_tenant_shrinks_to_fair_share_when_newcomer_arrives():
    c = TenantLRU(max_bytes=20 * B, max_entries=1000)
    for i in range(10):
        c.put(key("a", f"a{i}"), kv(2))  # a fills the whole cache
    for i in range(5):
        assert c.put(key("b", f"b{i}"), kv(2))
    per = c.stats()["per_tenant"]
    assert per["a"]["bytes"] == 10 * B and per["b"]["bytes"] == 10 * B
    assert per["b"]["evictions"] == 0
    # b at its fair share cannot push a below a's fair share: b evicts its own.
    assert c.put(key("b", "b5"), kv(2))
    per = c.stats()["per_tenant"]
    assert per["a"]["bytes"] == 10 * B and per["b"]["evictions"] == 1
    c.check_integrity()


def test_newcomer_trims_tenants_over_the_new_fair_share_evenly():
    c = TenantLRU(max_bytes=20 * B, max_entries=1000)
    for t in ("a", "b"):
        for i in range(5):
            c.put(key(t, f"{t}{i}"), kv(2))
    assert c.put(key("c"), kv(6))  # 3 tenants: fair share ~6.7B each
    per = c.stats()["per_tenant"]
    assert per["a"]["bytes"] + per["b"]["bytes"] == 14 * B
    assert {per["a"]["evictions"], per["b"]["evictions"]} == {1, 2}
    assert key("a", "a0") not in c and key("b", "b0") not in c  # oldest go first
    c.check_integrity()


def test_newcomer_larger_than_fair_share_is_refused_and_nothing_is_evicted():
    c = TenantLRU(max_bytes=20 * B, max_entries=1000)
    for t in ("a", "b"):
        for i in range(3):
            c.put(key(t, f"{t}{i}"), kv(2))  # 6B each, within a 3-tenant share
    assert c.put(key("c"), kv(10)) is False
    assert c.bytes_used == 12 * B and key("c") not in c
    assert c.stats()["evictions"] == 0 and c.stats()["rejected"] == 1
    c.check_integrity()


def test_refused_replacement_keeps_the_old_entry():
    c = TenantLRU(max_bytes=20 * B, max_entries=1000)
    for t in ("a", "b"):
        for i in range(3):
            c.put(key(t, f"{t}{i}"), kv(2))
    old = kv(2)
    c.put(key("c"), old)
    assert c.put(key("c"), kv(10)) is False
    assert c.get(key("c")) is old
    c.check_integrity()


def test_evict_and_clear_scopes():
    c = TenantLRU(max_bytes=10**6, max_entries=100)
    for t in ("a", "b"):
        for u in ("u1", "u2"):
            for h in ("h1", "h2"):
                c.put(key(t, u, h), kv())
    assert c.evict("a", "u1") == 2
    assert key("a", "u2", "h1") in c and key("b", "u1", "h1") in c
    assert c.evict("a") == 2 and c.evict("a") == 0 and c.evict("nobody") == 0
    assert len(c) == 4
    assert c.clear("b") == 4 and len(c) == 0
    c.put(key("a"), kv())
    assert c.clear() == 1 and c.bytes_used == 0
    assert c.stats()["invalidations"] == 9
    c.check_integrity()


def test_check_integrity_detects_drift():
    c = TenantLRU(max_bytes=10**6, max_entries=100)
    c.put(key("a"), kv())
    c._bytes += 1  # simulate an accounting bug
    with pytest.raises(AssertionError, match="bytes"):
        c.check_integrity()


def test_accounting_under_random_churn():
    rng = random.Random(7)
    c = TenantLRU(max_bytes=60 * B, max_entries=25, tenant_quota_bytes=25 * B)
    pool = [kv(n) for n in range(1, 9)]
    for _ in range(3000):
        k = key(rng.choice("abcd"), rng.choice(["u1", "u2", "u3"]), str(rng.randint(0, 6)))
        op = rng.random()
        if op < 0.55:
            c.put(k, rng.choice(pool))
        elif op < 0.9:
            c.get(k)
        elif op < 0.97:
            c.evict(k.tenant, k.user)
        else:
            c.clear(rng.choice([None, k.tenant]))
        c.check_integrity()
    s = c.stats()
    assert s["bytes"] == sum(p["bytes"] for p in s["per_tenant"].values())
    assert s["evictions"] > 0


def test_thread_safety_under_concurrent_churn():
    c = TenantLRU(max_bytes=80 * B, max_entries=30, tenant_quota_bytes=30 * B)
    pool = [kv(n) for n in range(1, 6)]
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(1500):
                k = key(rng.choice("abc"), rng.choice(["u1", "u2"]), str(rng.randint(0, 9)))
                r = rng.random()
                if r < 0.5:
                    c.put(k, rng.choice(pool))
                elif r < 0.95:
                    got = c.get(k)
                    assert got is None or got in pool
                else:
                    c.evict(k.tenant, k.user)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    c.check_integrity()
    s = c.stats()
    assert s["hits"] + s["misses"] > 0 and s["bytes"] == c.bytes_used


def test_constructor_validation():
    with pytest.raises(ValueError):
        TenantLRU(max_bytes=0, max_entries=1)
    assert (
        TenantLRU(max_bytes=100, max_entries=1, tenant_quota_bytes=10**9).tenant_quota_bytes == 100
    )
