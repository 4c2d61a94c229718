"""Every kind of L2 entry within its tenant's byte budget, on a real Redis: segments and
leans (``tenant_quota_bytes``, a ledger of their own) as conversation links are
(``link_quota_bytes``, tests/injection/test_l2_links.py). One tenant filling its budget
loses its own oldest entries; another tenant's stay, and so does its other budget."""

from __future__ import annotations

import pytest

from injection.base import CacheKey
from injection.engine.guidance.probe import LEAN_PREFIX
from injection.kvcache.redis_tier import RedisKVTier
from injection.kvcache.signing import CacheKeySigner
from tests.injection.test_l2_links import SECRET, blob_size, kv, link_key, make_tier
from tests.throwaway import ThrowawayRedis


@pytest.fixture
def signer() -> CacheKeySigner:
    return CacheKeySigner(SECRET)


@pytest.fixture
def full_redis(tmp_path):
    """A throwaway Redis with 2 MB of room above what it uses empty (noeviction)."""
    server = ThrowawayRedis(tmp_path / "redis").start()
    client = server.client()
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 2 * 1024**2)
    yield client
    client.close()
    server.kill()


def segment(tenant: str, i: int, user: str = "u1") -> CacheKey:
    return CacheKey(tenant, user, f"segment-{i}", "fp")


def lean(tenant: str, user: str) -> CacheKey:
    return CacheKey(tenant, user, LEAN_PREFIX + "digest", "fp")


def test_a_tenant_over_its_budget_loses_its_own_oldest_segments_only(redis_client, signer):
    size = blob_size(_one(redis_client, signer), segment("sizing", 0))
    tier = make_tier(redis_client, signer, tenant_quota_bytes=3 * size + size // 2,
                     link_quota_bytes=10**9)
    for i in range(3):
        assert tier.put(segment("other", i), kv(i))
    assert tier.put(link_key("acme", 0), kv(50), link=True)
    for i in range(6):  # members' segments (and a lean's: the same key space) of one tenant
        assert tier.put(segment("acme", i, user=f"u{i}"), kv(10 + i))
    assert [tier.get(segment("acme", i, user=f"u{i}")) is not None for i in range(6)] == [
        False, False, False, True, True, True]
    assert tier.entries.usage("acme") == {"entries": 3, "bytes": 3 * size}
    assert tier.stats()["per_tenant"]["acme"]["entry_evictions"] == 3
    # another tenant's entries, and acme's own link (its other budget), stay
    assert all(tier.get(segment("other", i)) is not None for i in range(3))
    assert tier.entries.usage("other") == {"entries": 3, "bytes": 3 * size}
    assert tier.get(link_key("acme", 0), link=True) is not None
    stats = tier.stats(scan=True)["per_tenant"]["acme"]
    assert (stats["ledger_entries"], stats["link_entries"], stats["entries"]) == (3, 1, 4)
    _clean(tier, "acme", "other", "sizing")


def test_a_lean_counts_in_the_budget_and_one_larger_than_it_is_refused(redis_client, signer):
    size = blob_size(_one(redis_client, signer), segment("sizing", 0))
    tier = make_tier(redis_client, signer, tenant_quota_bytes=size + size // 2)
    assert tier.put(segment("acme", 0), kv(0))
    assert tier.put(lean("acme", "u1"), kv(1))  # room made from the older segment
    assert tier.get(segment("acme", 0)) is None and tier.get(lean("acme", "u1")) is not None
    assert tier.put(segment("acme", 1), kv(2, T=256)) is False  # alone over the budget
    assert tier.stats()["refused_writes"] == 1 and tier.get(lean("acme", "u1")) is not None
    _clean(tier, "acme", "sizing")


def test_evicting_a_member_or_discarding_takes_its_entries_off_the_budget(redis_client,
                                                                          signer):
    tier = make_tier(redis_client, signer, tenant_quota_bytes=10**9)
    for i in range(3):
        assert tier.put(segment("acme", i), kv(i))
    assert tier.put(segment("acme", 9, user="u2"), kv(9))
    assert tier.put(segment("acme", 0), kv(5, T=32))  # the same name again: counted once
    sizes = [blob_size(tier, segment("acme", i)) for i in range(3)]
    u2 = blob_size(tier, segment("acme", 9, user="u2"))
    assert tier.entries.usage("acme") == {"entries": 4, "bytes": sum(sizes) + u2}
    assert tier.discard(segment("acme", 1))
    assert tier.evict("acme", "u1") == 2  # u1's entries leave the tenant's budget
    assert tier.entries.usage("acme") == {"entries": 1, "bytes": u2}
    assert tier.evict("acme") == 1  # the ledger goes with the tenant's entries
    assert not redis_client.exists(*tier.signer.entry_ledger_keys("acme"))


def test_without_a_budget_segments_are_written_as_before_with_no_ledger(redis_client, signer):
    tier = make_tier(redis_client, signer)
    for i in range(3):
        assert tier.put(segment("acme", i), kv(i))
    assert not redis_client.exists(*tier.signer.entry_ledger_keys("acme"))
    assert tier.entries.usage("acme") == {"entries": 0, "bytes": 0}
    _clean(tier, "acme")


def test_a_full_redis_takes_room_from_the_writing_tenants_own_segments(full_redis, signer):
    """A budget above what Redis holds: a write Redis refuses (maxmemory) is retried once
    after the writing tenant's own oldest segments made room; a tenant with none is
    refused, and nothing of another tenant goes for it."""
    tier = make_tier(full_redis, signer, tenant_quota_bytes=10**9)
    for i in range(150):  # about 5 MB of segments into 2 MB of room
        assert tier.put(segment("acme", i), kv(i)), i
    held = tier.entries.usage("acme")
    assert 3 < held["entries"] < 150
    assert tier.stats()["entry_evictions"] == 150 - held["entries"]
    assert tier.put(segment("globex", 0), kv(0)) is False
    assert tier.entries.usage("acme") == held and tier.stats()["errors"] == 0


def _one(client, signer: CacheKeySigner) -> RedisKVTier:
    """A tier holding one segment of tenant ``sizing`` (its stored size: the blob's)."""
    tier = make_tier(client, signer)
    assert tier.put(segment("sizing", 0), kv(0))
    return tier


def _clean(tier: RedisKVTier, *tenants: str) -> None:
    for t in tenants:
        tier.evict(t)
