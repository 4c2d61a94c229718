"""A tenant segment served from L1 keeps its Redis copy alive: the L1 hit refreshes the
entry's TTL (rate-limited per key), so an entry in use on every worker never expires."""

from __future__ import annotations

import torch

from injection import build_executor
from injection.base import CacheKey
from injection.kvcache.chain import TENANT_USER
from injection.kvcache.packed import PackedKV
from injection.kvcache.redis_tier import RedisKVTier
from injection.kvcache.signing import CacheKeySigner
from injection.metrics import Metrics  # its own counters: never the process-wide ones

SECRET = "touch-test-secret-0123456789abcdef"


def kv() -> PackedKV:
    k = torch.randn(1, 1, 3, 8)
    return PackedKV(k, torch.randn_like(k), range(3))


def test_touch_refreshes_ttl_once_per_window(redis_client):
    signer = CacheKeySigner(SECRET)
    tier = RedisKVTier(redis_client, signer, ttl_seconds=800, async_writes=False)
    key = CacheKey("t", TENANT_USER, "h", "fp")
    assert tier.put(key, kv())
    name = signer.with_namespace("kvi").redis_key(key)
    redis_client.expire(name, 5)  # as if it had idled in Redis for a long time
    assert tier.touch(key) and redis_client.ttl(name) > 700
    redis_client.expire(name, 5)
    assert not tier.touch(key)  # touched within ttl/8: no Redis call
    assert redis_client.ttl(name) <= 5
    assert not tier.touch(CacheKey("t", TENANT_USER, "gone", "fp"))  # nothing to refresh


def test_l1_hits_of_the_chain_refresh_the_redis_copy(adapter, redis_client):
    ex = build_executor(adapter, metrics=Metrics(), redis_client=redis_client, signing_secret=SECRET,
                        l2_ttl_seconds=800)
    try:
        assert ex.warm("t", "m", "I like short answers.", "Be polite.") is not None
        ex.l2.flush(10)
        keys = [k for k in _l1_keys(ex) if k.user == TENANT_USER]
        assert len(keys) == 1
        name = ex.l2.signer.redis_key(keys[0])
        redis_client.expire(name, 5)
        ex.l2._touched.clear()  # the window of the warm-up's own write
        ex.warm("t", "m2", "I like long answers.", "Be polite.")  # tenant segment: an L1 hit
        assert redis_client.ttl(name) > 700
    finally:
        ex.close()


def _l1_keys(ex):
    with ex.l1._lock:
        return [k for t in ex.l1._tenants.values() for k in t.entries]
