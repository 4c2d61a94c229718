"""RedisKVTier against a real Redis: signed names, rejected forgeries, scoped eviction,
bounded async writes, and graceful degradation when Redis is down."""

from __future__ import annotations

import socket
import threading

import pytest
import redis
import torch
from redis.backoff import NoBackoff
from redis.retry import Retry

from injection.base import CacheKey
from injection.kvcache.packed import PackedKV
from injection.kvcache.redis_tier import RedisKVTier
from injection.kvcache.signing import CacheKeySigner

SECRET = "redis-tier-test-secret-0123456789"


def kv(seed: int = 0, dtype=torch.bfloat16, T: int = 5) -> PackedKV:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(2, 2, T, 8, generator=g).to(dtype)
    return PackedKV(k, torch.randn(2, 2, T, 8, generator=g).to(dtype), range(T))


def key(tenant="acme", user="u1", h="h1", fp="fp") -> CacheKey:
    return CacheKey(tenant, user, h, fp)


@pytest.fixture
def signer() -> CacheKeySigner:
    return CacheKeySigner(SECRET)


@pytest.fixture
def tier(redis_client, signer):
    t = RedisKVTier(redis_client, signer, ttl_seconds=600)
    yield t
    t.close()


def names(client) -> set[bytes]:
    return set(client.scan_iter(match="*"))


def test_put_get_round_trip_with_ttl_and_user_index(tier, redis_client, signer):
    k, p = key(), kv()
    assert tier.put(k, p) is True
    assert tier.flush(10)
    got = tier.get(k)
    assert got is not None and got.equal(p) and got.dtype == torch.bfloat16
    name = signer.redis_key(k)
    assert 0 < redis_client.ttl(name) <= 600
    index = signer.user_index_key("acme", "u1")
    assert redis_client.smembers(index) == {name.encode()}
    assert 0 < redis_client.ttl(index) <= 600
    assert tier.get(key(h="other")) is None
    s = tier.stats()
    assert (s["writes"], s["hits"], s["misses"], s["inflight"]) == (1, 1, 1, 0)
    assert s["per_tenant"]["acme"]["hits"] == 1


def test_sync_writes(redis_client, signer):
    t = RedisKVTier(redis_client, signer, async_writes=False, compress=True)
    assert t.put(key(), kv(dtype=torch.float16))
    assert t.get(key()).equal(kv(dtype=torch.float16))


def test_other_tenant_with_same_user_and_hash_misses(tier):
    tier.put(key("acme"), kv())
    tier.flush(10)
    assert tier.get(key("globex")) is None


def test_tampered_value_is_rejected_deleted_and_counted(tier, redis_client, signer):
    k = key()
    tier.put(k, kv())
    tier.flush(10)
    name = signer.redis_key(k)
    blob = bytearray(redis_client.get(name))
    blob[100] ^= 0xFF
    redis_client.set(name, bytes(blob))
    assert tier.get(k) is None
    assert redis_client.exists(name) == 0
    assert redis_client.smembers(signer.user_index_key("acme", "u1")) == set()
    s = tier.stats()
    assert s["rejects"] == 1 and s["hits"] == 0
    assert tier.get(k) is None and tier.stats()["misses"] == 1  # gone: now a plain miss


@pytest.mark.parametrize("target", [key(user="u2"), key(tenant="globex"), key(fp="fp2")])
def test_value_moved_under_another_key_is_rejected(tier, redis_client, signer, target):
    tier.put(key(), kv())
    tier.flush(10)
    redis_client.set(signer.redis_key(target), redis_client.get(signer.redis_key(key())))
    assert tier.get(target) is None
    assert redis_client.exists(signer.redis_key(target)) == 0
    assert tier.stats()["rejects"] == 1
    assert tier.get(key()) is not None  # the genuine entry is untouched


def test_rotated_secret_or_generation_makes_entries_unreachable_and_unverifiable(
    tier, redis_client
):
    tier.put(key(), kv())
    tier.flush(10)
    for new in (CacheKeySigner(SECRET, key_generation="1"), CacheKeySigner(SECRET + "x")):
        rotated = RedisKVTier(redis_client, new, async_writes=False)
        assert rotated.get(key()) is None and rotated.stats()["misses"] == 1
        report = rotated.verify()
        assert report["bad"] == 1 and report["deleted"] == 1
        tier.put(key(), kv())
        tier.flush(10)


def test_evict_user_only_touches_that_user(tier, redis_client, signer):
    for t in ("acme", "globex"):
        for u in ("u1", "u2"):
            for h in ("h1", "h2"):
                tier.put(key(t, u, h), kv())
    tier.flush(10)
    before = names(redis_client)
    assert tier.evict("acme", "u1") == 2
    gone = before - names(redis_client)
    assert gone == {
        signer.redis_key(key("acme", "u1", "h1")).encode(),
        signer.redis_key(key("acme", "u1", "h2")).encode(),
        signer.user_index_key("acme", "u1").encode(),
    }
    assert tier.get(key("globex", "u1", "h1")) is not None
    assert tier.evict("acme", "nobody") == 0


def test_evict_tenant_only_touches_that_tenant(tier, redis_client, signer):
    for t in ("acme", "globex"):
        for u in ("u1", "u2"):
            tier.put(key(t, u), kv())
    tier.flush(10)
    redis_client.set("unrelated", b"x")
    assert tier.evict("acme") == 2
    left = names(redis_client)
    assert not any(n.startswith(signer.tenant_prefix("acme").encode()) for n in left)
    assert sum(n.startswith(signer.tenant_prefix("globex").encode()) for n in left) == 4
    assert b"unrelated" in left


def test_evict_all_drops_every_tenant_and_generation_but_nothing_else(
    tier, redis_client, signer
):
    old = RedisKVTier(redis_client, CacheKeySigner(SECRET, key_generation="7"),
                      async_writes=False)
    old.put(key("acme", "u1"), kv())  # left behind by an earlier key generation
    for t in ("acme", "globex"):
        tier.put(key(t, "u1"), kv())
    tier.flush(10)
    others = [b"unrelated", b"kvi:keygen", b"kvi:rl:chat:m:1:123", b"kvix:" + b"a" * 32]
    for n in others:
        redis_client.set(n, b"x")
    assert tier.evict_all() == 3
    assert names(redis_client) == set(others)


def test_verify_reports_and_deletes_bad_entries(tier, redis_client, signer):
    for u in ("u1", "u2", "u3"):
        tier.put(key(user=u), kv())
    tier.put(key("globex"), kv())
    tier.flush(10)
    bad_name = signer.redis_key(key(user="u2"))
    blob = bytearray(redis_client.get(bad_name))
    blob[-1] ^= 1
    redis_client.set(bad_name, bytes(blob))
    junk = signer.tenant_prefix("acme") + "e:" + "0" * 64
    redis_client.set(junk, b"not an entry")
    wrong_type = signer.tenant_prefix("globex") + "e:" + "1" * 64
    redis_client.sadd(wrong_type, b"x")
    report = tier.verify("acme")
    assert (report["scanned"], report["ok"], report["bad"], report["deleted"]) == (4, 2, 2, 2)
    assert set(report["bad_keys"]) == {bad_name, junk}
    assert "MAC" in report["reasons"][bad_name]
    assert redis_client.exists(wrong_type) == 1  # other tenant: not scanned
    report = tier.verify()
    assert (report["scanned"], report["ok"], report["bad"]) == (4, 3, 1)
    assert report["bad_keys"] == [wrong_type] and redis_client.exists(wrong_type) == 0
    assert tier.get(key(user="u1")) is not None and tier.get(key(user="u2")) is None


def test_full_inflight_queue_skips_and_counts(redis_client, signer):
    t = RedisKVTier(redis_client, signer, max_inflight=1)
    redis_client.execute_command("CLIENT", "PAUSE", 5000, "WRITE")  # the writer blocks
    try:
        assert t.put(key(h="first"), kv()) is True
        assert t.put(key(h="second"), kv()) is False
        assert t.put(key(h="third"), kv()) is False
        s = t.stats()
        assert s["skipped_writes"] == 2 and s["inflight"] == 1
        assert s["per_tenant"]["acme"]["skipped_writes"] == 2
    finally:
        redis_client.execute_command("CLIENT", "UNPAUSE")
    assert t.flush(10)
    assert t.get(key(h="first")) is not None and t.get(key(h="second")) is None
    assert t.stats()["writes"] == 1
    t.close()
    assert t.put(key(h="after-close"), kv()) is False


def test_evict_drops_queued_writes_of_its_scope(redis_client, signer):
    t = RedisKVTier(redis_client, signer, max_inflight=8)
    redis_client.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
    unpause = threading.Timer(0.3, lambda: redis_client.execute_command("CLIENT", "UNPAUSE"))
    try:
        for h in ("h1", "h2", "h3"):
            assert t.put(key(user="gone", h=h), kv())
        assert t.put(key(user="stays"), kv())
        unpause.start()
        t.evict("acme", "gone")  # waits for the write in progress, drops the queued ones
    finally:
        unpause.join()
        redis_client.execute_command("CLIENT", "UNPAUSE")
    assert t.flush(10)
    assert all(t.get(key(user="gone", h=h)) is None for h in ("h1", "h2", "h3"))
    assert t.get(key(user="stays")) is not None
    t.close()


def test_stats_scan_counts_entries_and_bytes_per_tenant(tier, redis_client):
    tier.put(key("acme", "u1"), kv(T=5))
    tier.put(key("acme", "u2"), kv(T=5))
    tier.put(key("globex"), kv(T=9))
    tier.flush(10)
    s = tier.stats(scan=True, tenants=["initech"])
    per = s["per_tenant"]
    assert per["acme"]["entries"] == 2 and per["globex"]["entries"] == 1
    assert per["initech"] == {**per["initech"], "entries": 0, "bytes": 0}
    assert s["entries"] == 3 and s["bytes"] == per["acme"]["bytes"] + per["globex"]["bytes"]
    assert per["globex"]["bytes"] > per["acme"]["bytes"] // 2


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_redis_down_degrades_without_raising(signer):
    client = redis.Redis(
        port=_closed_port(),
        socket_timeout=0.2,
        socket_connect_timeout=0.2,
        retry=Retry(NoBackoff(), 0),
    )
    sync = RedisKVTier(client, signer, async_writes=False, retry_after_s=0.0)
    assert sync.get(key()) is None
    assert sync.put(key(), kv()) is False
    asyn = RedisKVTier(client, signer, retry_after_s=0.0)
    assert asyn.put(key(), kv()) is True  # accepted; the background write fails quietly
    assert asyn.flush(10)
    assert sync.stats()["errors"] == 2 and asyn.stats()["errors"] == 1
    assert asyn.stats()["per_tenant"]["acme"]["errors"] == 1
    with pytest.raises(redis.RedisError):
        sync.evict("acme", "u1")  # maintenance reports the fault to its caller
    asyn.close()


def test_after_a_fault_requests_bypass_redis_for_a_while(signer):
    client = redis.Redis(
        port=_closed_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    t = RedisKVTier(client, signer, async_writes=False, retry_after_s=60.0)
    assert t.get(key()) is None  # real attempt: fault
    assert t.get(key()) is None and t.put(key(), kv()) is False  # no attempt
    s = t.stats()
    assert (s["errors"], s["bypassed"]) == (1, 2)


def test_from_url_client_has_short_timeouts(redis_url, signer):
    t = RedisKVTier.from_url(redis_url, signer, socket_timeout=1.5, async_writes=False)
    kw = t.client.get_connection_kwargs()
    assert kw["socket_timeout"] == 1.5 and kw["socket_connect_timeout"] == 0.5
    t.client.close()


def test_constructor_validation(redis_url, signer):
    with pytest.raises(ValueError, match="decode_responses"):
        RedisKVTier(redis.Redis.from_url(redis_url, decode_responses=True), signer)
    with pytest.raises(ValueError):
        RedisKVTier(redis.Redis.from_url(redis_url), signer, max_inflight=0)


def test_non_cpu_entry_is_refused(tier):
    with pytest.raises(ValueError, match="CPU"):
        tier.put(key(), kv().to("meta"))

