"""TenantLRU protects a tenant segment while the tenant is active, caps one member's bytes,
and never deadlocks: a protected segment still goes when nothing else can."""

from __future__ import annotations

import torch

from injection.base import CacheKey
from injection.kvcache.chain import TENANT_USER
from injection.kvcache.lru import TenantLRU
from injection.kvcache.packed import PackedKV


def kv(tokens: int = 4) -> PackedKV:
    k = torch.randn(1, 1, tokens, 8)
    return PackedKV(k, torch.randn_like(k), range(tokens))


B = kv(1).nbytes


def seg(tenant: str) -> CacheKey:
    return CacheKey(tenant, TENANT_USER, "instr", "fp")


def mem(tenant: str, user: str, h: str = "h") -> CacheKey:
    return CacheKey(tenant, user, h, "fp")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_tenant_segment_outlives_older_member_entries_of_its_tenant():
    c = TenantLRU(max_bytes=100 * B, tenant_quota_bytes=20 * B, protect_idle_seconds=0)
    assert c.put(seg("t"), kv(8))  # the oldest entry of the tenant
    for i in range(5):  # members fill the quota: their own entries go, never the segment
        assert c.put(mem("t", f"m{i}"), kv(4))
    assert seg("t") in c and c.stats()["evictions"] == 2
    c.check_integrity()


def test_a_member_entry_that_only_the_protected_segment_could_make_room_for_is_refused():
    c = TenantLRU(max_bytes=100 * B, tenant_quota_bytes=20 * B, protect_idle_seconds=0)
    c.put(seg("t"), kv(8))
    c.put(mem("t", "a"), kv(2))
    assert not c.put(mem("t", "b"), kv(14))  # would need the segment's 8 tokens
    assert seg("t") in c and mem("t", "a") in c and c.stats()["rejected"] == 1
    c.check_integrity()


def test_global_bound_takes_unprotected_entries_of_other_tenants_before_a_protected_segment():
    c = TenantLRU(max_bytes=32 * B, protect_idle_seconds=3600)
    c.put(seg("a"), kv(16))  # oldest entry in the cache, a over its share, used just now
    c.put(mem("b", "x"), kv(8))
    assert c.put(mem("b", "y"), kv(16))  # both over their share: b's own entry goes
    assert seg("a") in c and mem("b", "x") not in c
    c.check_integrity()


def test_protection_ends_when_the_tenant_has_no_member_left_and_the_segment_idled():
    clock = Clock()
    c = TenantLRU(max_bytes=100 * B, tenant_quota_bytes=16 * B, protect_idle_seconds=60,
                  clock=clock)
    c.put(seg("t"), kv(8))
    c.put(mem("t", "a"), kv(8))
    c.evict("t", "a")  # the member left: the segment is protected by its last use only
    clock.now += 30
    assert not c.put(mem("t", "b"), kv(16))  # used 30 s ago: still protected
    clock.now += 31
    assert c.put(mem("t", "b"), kv(16))  # idle past protect_idle_seconds: plain LRU
    assert seg("t") not in c
    c.check_integrity()


def test_protected_segments_never_deadlock_the_cache():
    """Every tenant's protected segment cannot keep a new tenant out for good."""
    c = TenantLRU(max_bytes=32 * B, tenant_quota_bytes=32 * B, protect_idle_seconds=3600)
    for t in ("a", "b", "c", "d"):
        assert c.put(seg(t), kv(8))  # all protected (used just now)
    assert c.put(mem("e", "m"), kv(8))  # nothing unprotected anywhere: the oldest goes
    assert seg("a") not in c and mem("e", "m") in c
    c.check_integrity()


def test_invalidating_the_tenant_drops_its_protected_segment():
    c = TenantLRU(max_bytes=100 * B)
    c.put(seg("t"), kv(4))
    c.put(mem("t", "a"), kv(4))
    assert c.evict("t", "a") == 1 and seg("t") in c  # a member's scope keeps it
    assert c.evict("t") == 1 and seg("t") not in c  # the tenant's (edit, deletion) not


def test_per_member_cap_evicts_only_that_members_oldest_entries():
    c = TenantLRU(max_bytes=100 * B, user_quota_bytes=12 * B)
    c.put(mem("t", "quiet", "c1"), kv(4))
    for i in range(6):  # one member, many long conversations
        assert c.put(mem("t", "busy", f"c{i}"), kv(4))
    busy = [k for k in (mem("t", "busy", f"c{i}") for i in range(6)) if k in c]
    assert busy == [mem("t", "busy", f"c{i}") for i in (3, 4, 5)]
    assert mem("t", "quiet", "c1") in c  # the other member's link stays
    assert not c.put(mem("t", "busy", "huge"), kv(13))  # over the cap on its own
    c.check_integrity()


def test_per_member_cap_counts_a_replaced_entry_once():
    c = TenantLRU(max_bytes=100 * B, user_quota_bytes=8 * B)
    c.put(mem("t", "m", "x"), kv(4))
    c.put(mem("t", "m", "y"), kv(4))
    assert c.put(mem("t", "m", "y"), kv(4))  # same key replaced: nothing else evicted
    assert mem("t", "m", "x") in c and c.bytes_used == 8 * B
    c.check_integrity()


def test_a_global_bound_never_takes_the_tenants_own_protected_segment_for_its_member():
    c = TenantLRU(max_bytes=16 * B, protect_idle_seconds=0)
    c.put(seg("t"), kv(8))
    c.put(mem("t", "a"), kv(4))
    c.put(mem("u", "x"), kv(4))  # another tenant within its share
    assert not c.put(mem("t", "b"), kv(8))  # t's member would need t's own segment
    assert seg("t") in c and mem("t", "a") in c and mem("u", "x") in c
    c.check_integrity()
