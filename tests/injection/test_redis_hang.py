"""The K/V tier's Redis clients against a hung Redis (SIGSTOP: it accepts connections and
never answers), on a throwaway server of the test's own: a call fails within its socket
deadline, the tier degrades to a miss, and it works again once Redis answers (SIGCONT)."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from injection.kvcache.redis_client import connect
from injection.kvcache.redis_tier import RedisKVTier
from injection.kvcache.signing import CacheKeySigner
from tests.injection.test_redis_tier import SECRET, key, kv
from tests.throwaway import ThrowawayRedis

SOCKET_TIMEOUT = 0.5
BOUND_S = 30  # what a caller may wait at most (generous: a deadline, not a speed)


@pytest.fixture
def stoppable(tmp_path):
    rd = ThrowawayRedis(tmp_path / "redis").start()
    yield rd
    os.kill(rd.proc.pid, signal.SIGCONT)  # never leave a stopped process behind
    rd.kill()


def test_connect_bounds_every_call_and_checks_idle_connections(stoppable):
    client = connect(stoppable.url, socket_timeout=SOCKET_TIMEOUT)
    kw = client.get_connection_kwargs()
    assert kw["health_check_interval"] == 30 and kw["socket_keepalive"] is True
    assert client.ping()
    os.kill(stoppable.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            client.get("anything")
        assert time.monotonic() - started < BOUND_S
    finally:
        os.kill(stoppable.proc.pid, signal.SIGCONT)
    assert client.ping()  # the same client recovers by itself


def test_the_l2_tier_misses_instead_of_hanging_and_recovers(stoppable):
    signer = CacheKeySigner(SECRET)
    tier = RedisKVTier(connect(stoppable.url, socket_timeout=SOCKET_TIMEOUT), signer,
                       async_writes=False, retry_after_s=0.0)
    assert tier.put(key(), kv()) is True
    os.kill(stoppable.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        assert tier.get(key()) is None  # a fault: degrade to a miss
        assert time.monotonic() - started < BOUND_S
        assert tier.stats()["errors"] == 1
    finally:
        os.kill(stoppable.proc.pid, signal.SIGCONT)
    got = tier.get(key())
    assert got is not None and got.num_tokens == kv().num_tokens
    tier.close()


def test_a_full_redis_refuses_l2_writes_and_keeps_serving_reads(stoppable):
    """maxmemory reached with noeviction (the production setting): a write is refused and
    counted as a refusal, not a fault (no bypass: reads go on at once), the request goes on
    without L2; what is stored still reads back."""
    client = connect(stoppable.url, socket_timeout=SOCKET_TIMEOUT)
    tier = RedisKVTier(client, CacheKeySigner(SECRET), async_writes=False,
                       retry_after_s=3600.0)  # a fault would skip Redis for the whole test
    assert tier.put(key(user="kept"), kv()) is True
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", str(used + 1024))
    try:
        assert tier.put(key(user="new"), kv(T=512)) is False  # OOM: refused, not raised
        assert (tier.stats()["refused_writes"], tier.stats()["errors"]) == (1, 0)
        assert tier.get(key(user="new")) is None
        assert tier.get(key(user="kept")) is not None
        assert tier.stats()["bypassed"] == 0
    finally:
        client.config_set("maxmemory", "0")
    assert tier.put(key(user="new"), kv(T=512)) is True  # room again: writes resume
    tier.close()
