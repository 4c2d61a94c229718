"""Conversation links in Redis within a tenant's byte budget, and a full Redis (maxmemory,
noeviction) that refuses writes without stopping reads, on real Redis servers."""

from __future__ import annotations

import threading

import pytest
import redis
import torch

from injection.base import CacheKey
from injection.kvcache.l2.links import TOTAL_FIELD
from injection.kvcache.l2.writer import BoundedWriter
from injection.kvcache.packed import PackedKV
from injection.kvcache.redis_tier import RedisKVTier
from injection.kvcache.signing import CacheKeySigner
from tests.throwaway import ThrowawayRedis

SECRET = "l2-links-test-secret-0123456789"


def kv(seed: int, T: int = 64) -> PackedKV:
    g = torch.Generator().manual_seed(seed)
    return PackedKV(torch.randn(2, 2, T, 16, generator=g), torch.randn(2, 2, T, 16, generator=g),
                    range(T))


def link_key(tenant: str, i: int, user: str = "u1") -> CacheKey:
    return CacheKey(tenant, user, f"conv-{i}", "fp")


def blob_size(tier: RedisKVTier, key: CacheKey) -> int:
    return int(tier.client.strlen(tier.signer.redis_key(key)))


@pytest.fixture
def signer() -> CacheKeySigner:
    return CacheKeySigner(SECRET)


def make_tier(client, signer, **kw) -> RedisKVTier:
    return RedisKVTier(client, signer, ttl_seconds=600, async_writes=False, **kw)


def test_a_tenant_over_its_link_budget_loses_its_own_oldest_links_only(redis_client, signer):
    probe = make_tier(redis_client, signer)
    assert probe.put(link_key("other", 0), kv(0), link=True)
    size = blob_size(probe, link_key("other", 0))
    tier = make_tier(redis_client, signer, link_quota_bytes=3 * size + size // 2)  # 3 fit
    for i in range(1, 3):
        assert tier.put(link_key("other", i), kv(i), link=True)
    for i in range(6):
        assert tier.put(link_key("acme", i), kv(10 + i), link=True)
    # acme holds its 3 newest links; the 3 oldest went to make room; the ledger is exact
    assert [tier.get(link_key("acme", i), link=True) is not None for i in range(6)] == [
        False, False, False, True, True, True]
    assert tier.links.usage("acme") == {"entries": 3, "bytes": 3 * size}
    assert tier.stats()["per_tenant"]["acme"]["link_evictions"] == 3
    # the other tenant, within its own budget, lost nothing
    assert all(tier.get(link_key("other", i), link=True) is not None for i in range(3))
    assert tier.links.usage("other") == {"entries": 3, "bytes": 3 * size}


def test_a_link_larger_than_the_budget_is_refused_and_the_rest_stays(redis_client, signer):
    tier = make_tier(redis_client, signer, link_quota_bytes=1)
    assert tier.put(link_key("acme", 0), kv(0), link=True) is False
    assert tier.stats()["refused_writes"] == 1 and tier.stats()["writes"] == 0
    assert tier.get(link_key("acme", 0), link=True) is None
    # segments (tenant and member K/V) are not links: no link budget applies to them
    assert tier.put(CacheKey("acme", "u1", "pref", "fp"), kv(1)) is True


def test_rewriting_discarding_and_evicting_keep_the_ledger_exact(redis_client, signer):
    tier = make_tier(redis_client, signer, link_quota_bytes=10**9)
    for i in range(3):
        assert tier.put(link_key("acme", i), kv(i), link=True)
    assert tier.put(link_key("acme", 0), kv(5, T=32), link=True)  # the same name again
    sizes = [blob_size(tier, link_key("acme", i)) for i in range(3)]
    assert tier.links.usage("acme") == {"entries": 3, "bytes": sum(sizes)}
    assert tier.discard(link_key("acme", 1), link=True)
    assert tier.links.usage("acme") == {"entries": 2, "bytes": sizes[0] + sizes[2]}
    assert tier.put(link_key("acme", 7, user="u2"), kv(7), link=True)
    assert tier.evict("acme", "u1") == 2  # the member's links leave the tenant's budget
    assert tier.links.usage("acme") == {"entries": 1,
                                        "bytes": blob_size(tier, link_key("acme", 7, "u2"))}
    assert tier.evict("acme") == 1  # the tenant's ledger goes with its entries
    ledger, order = tier.signer.link_ledger_keys("acme")
    assert not redis_client.exists(ledger, order)


def test_a_ledger_of_the_wrong_type_is_rejected_and_the_write_lands(redis_client, signer):
    tier = make_tier(redis_client, signer, link_quota_bytes=10**9)
    ledger, _ = tier.signer.link_ledger_keys("acme")
    redis_client.set(ledger, b"not a hash")
    assert tier.put(link_key("acme", 0), kv(0), link=True)
    assert tier.stats()["rejects"] == 1 and tier.stats()["errors"] == 0
    assert int(redis_client.hget(ledger, TOTAL_FIELD)) == blob_size(tier, link_key("acme", 0))


@pytest.fixture
def full_redis(tmp_path):
    """A throwaway Redis with 2 MB of room above what it uses empty (noeviction)."""
    server = ThrowawayRedis(tmp_path / "redis").start()
    client = server.client()
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", used + 2 * 1024 * 1024)
    yield client
    client.close()
    server.kill()


def test_a_full_redis_refuses_writes_and_still_serves_reads(full_redis, signer):
    tier = make_tier(full_redis, signer)  # no link budget: Redis' maxmemory is the bound
    for i in range(150):  # about 5 MB of links into 2 MB of room
        assert tier.put(link_key("acme", i), kv(i), link=True), i
    # each write that found Redis full made room from acme's own oldest links
    stats = tier.stats()
    assert stats["refused_writes"] == 0 and stats["errors"] == 0 and stats["bypassed"] == 0
    held = tier.links.usage("acme")
    assert 3 < held["entries"] < 150 and stats["link_evictions"] == 150 - held["entries"]
    # the member's index names only the links still there (evicted ones left it)
    index = tier.signer.user_index_key("acme", "u1")
    assert full_redis.scard(index) == held["entries"]
    # another tenant with no links of its own is refused; nothing of acme's goes for it
    assert tier.put(link_key("globex", 0), kv(0), link=True) is False
    assert tier.put(CacheKey("globex", "u1", "pref", "fp"), kv(1)) is False
    assert tier.links.usage("acme") == held
    per = tier.stats()["per_tenant"]["globex"]
    assert per["refused_writes"] == 2 and per["errors"] == 0
    # reads go on at once (a refusal is no fault: no bypass), and what is there is served
    hits = [tier.get(link_key("acme", i), link=True) for i in range(150)]
    n = held["entries"]
    assert [h is not None for h in hits] == [False] * (150 - n) + [True] * n
    assert tier.stats()["bypassed"] == 0 and tier.stats()["hits"] == held["entries"]
    # deletes run on a full Redis (a MULTI block would be refused whole): a superseded link
    # is discarded, a member is evicted, and the ledger follows
    assert tier.discard(link_key("acme", 149), link=True)
    assert tier.links.usage("acme")["entries"] == n - 1
    assert tier.evict("acme", "u1") == n - 1
    assert tier.links.usage("acme") == {"entries": 0, "bytes": 0}
    assert tier.stats()["errors"] == 0


def test_the_writer_is_bounded_in_bytes(signer):
    release, started = threading.Event(), threading.Event()

    def slow(key, value):
        started.set()
        release.wait(10)

    w = BoundedWriter(slow, 64, "test-writer", max_bytes=1000, weigh=len)
    assert w.submit("a", b"x" * 600)
    assert started.wait(10)  # running: still counted until it finishes
    assert w.submit("b", b"x" * 300) and w.inflight_bytes == 900
    assert not w.submit("c", b"x" * 200)  # 1100 > 1000
    assert w.submit("d", b"x" * 100)
    assert w.cancel(lambda k: k == "d") == 1 and w.inflight_bytes == 900
    release.set()
    assert w.flush(10) and w.inflight_bytes == 0
    assert w.submit("e", b"x" * 1000)
    assert w.flush(10)


def test_redis_errors_other_than_a_full_redis_are_still_faults(signer):
    client = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    tier = make_tier(client, signer)
    assert tier.put(link_key("acme", 0), kv(0), link=True) is False
    assert tier.stats()["errors"] == 1 and tier.stats()["refused_writes"] == 0
