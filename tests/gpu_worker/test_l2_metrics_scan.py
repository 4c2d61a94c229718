"""What ``/metrics`` and ``kvcache stats`` read of the cache Redis, on real Redis: one SCAN
pass bucketed by tenant (not one per tenant) counts each tenant's entries and bytes as a
scan of its own prefix does; and one web process at a time scans, at most every
``METRICS_L2_SCAN_SECONDS``, the others serving the figures it shared."""

from __future__ import annotations

import pytest
import torch
from django.conf import settings

from gpu_worker.channels import kvstore
from gpu_worker.ops import l2metrics
from injection.base import CacheKey
from injection.kvcache.l2 import scan as l2_scan
from injection.kvcache.packed import PackedKV
from injection.kvcache.redis_tier import RedisKVTier
from injection.kvcache.signing import CacheKeySigner
from tests.gpu_worker.test_cancel_board import CountingRedis


def _kv(tokens: int) -> PackedKV:
    k = torch.zeros(2, 1, tokens, 4)
    return PackedKV(k, k, range(tokens))


@pytest.fixture
def tier():
    client = CountingRedis.from_url(settings.KV_CACHE_REDIS_URL)
    t = RedisKVTier(client, CacheKeySigner("scan-test-secret-0123456789abcdef"),
                    ttl_seconds=600, async_writes=False)
    yield t
    for tenant in ("scan-a", "scan-b", "scan-c"):
        t.evict(tenant)
    client.close()


def test_one_pass_counts_every_tenants_entries_and_bytes(tier):
    for i in range(3):
        assert tier.put(CacheKey("scan-a", f"u{i}", f"seg-{i}", "fp"), _kv(4 + i))
    assert tier.put(CacheKey("scan-a", "u0", "conv", "fp"), _kv(9), link=True)
    for i in range(2):
        assert tier.put(CacheKey("scan-b", "u0", f"seg-{i}", "fp"), _kv(3))
    client = tier.client
    want = {t: l2_scan.sizes(client, tier.signer.entry_match(t))
            for t in ("scan-a", "scan-b", "scan-c")}
    client.commands.clear()
    list(client.scan_iter(match=tier.signer.entry_match(None), count=l2_scan.SCAN_BATCH))
    one_pass = client.commands.count("SCAN")
    client.commands.clear()
    stats = tier.stats(scan=True, tenants=["scan-a", "scan-b", "scan-c"])
    assert client.commands.count("SCAN") == one_pass  # not one pass per tenant
    got = {t: {f: stats["per_tenant"][t][f] for f in ("entries", "bytes")} for t in want}
    assert got == want
    assert got["scan-a"]["entries"] == 4 and got["scan-b"]["entries"] == 2
    assert got["scan-c"] == {"entries": 0, "bytes": 0}
    assert stats["entries"] >= 6 and stats["bytes"] >= sum(w["bytes"] for w in want.values())


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def shared_figures():
    client = kvstore.cache_client()
    client.delete(l2metrics.FIGURES_KEY, l2metrics.LOCK_KEY)
    yield client
    client.delete(l2metrics.FIGURES_KEY, l2metrics.LOCK_KEY)


@pytest.mark.django_db
def test_one_web_process_scans_and_the_others_serve_its_figures(shared_figures, settings):
    settings.METRICS_L2_SCAN_SECONDS = 60.0
    clock = Clock()
    first, second = l2metrics.L2Collector(clock), l2metrics.L2Collector(clock)
    kinds = first.kinds()
    assert kinds is not None and set(kinds) == {"tenant", "member", "conversation"}
    assert second.kinds() == kinds and (first.scans, second.scans) == (1, 0)
    clock.now += 30  # still fresh for everyone
    assert first.kinds() == kinds and (first.scans, second.scans) == (1, 0)
    clock.now += 31  # stale: the next scrape, whichever process, scans once
    second.kinds()
    first.kinds()
    assert (first.scans, second.scans) == (1, 1)
    # while another process holds the lock, a stale figure is served, not scanned again
    clock.now += 61
    assert shared_figures.set(l2metrics.LOCK_KEY, b"1", nx=True, ex=60)
    assert first.kinds() == kinds and second.kinds() == kinds
    assert (first.scans, second.scans) == (1, 1)
    shared_figures.delete(l2metrics.LOCK_KEY)
    assert first.kinds() is not None and first.scans == 2
    assert not shared_figures.exists(l2metrics.LOCK_KEY)  # released after the scan
