"""Eviction racing another process's write, on real Redis: the write stays findable.

Workers evict a member's L2 entries on every invalidation while other processes write
new ones. An eviction that read the user index, then deleted the whole index, orphaned an
entry indexed in between: it outlived the next invalidation (seen as a flaky memory
invalidation test). The race is made deterministic here: a second, real client writes
right after the evicting client has read the index."""

from __future__ import annotations

import pytest
import redis

from injection.kvcache.redis_tier import RedisKVTier
from tests.conftest import ENGINE_TEST_DB, redis_url_with_db
from tests.injection.test_redis_tier import key, kv, signer  # noqa: F401 (fixture)


class WriteAfterIndexRead(redis.Redis):
    """A real client that runs ``hook`` once, right after its first SMEMBERS answered."""

    hook = None

    def smembers(self, name):
        members = super().smembers(name)
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return members


@pytest.fixture
def evicting(redis_url, redis_client, signer):  # noqa: F811
    client = WriteAfterIndexRead.from_url(redis_url_with_db(redis_url, ENGINE_TEST_DB))
    tier = RedisKVTier(client, signer, ttl_seconds=600, async_writes=False)
    yield tier, client
    tier.close()
    client.close()


@pytest.fixture
def writer(redis_client, signer):  # noqa: F811
    tier = RedisKVTier(redis_client, signer, ttl_seconds=600, async_writes=False)
    yield tier
    tier.close()


@pytest.mark.parametrize("scope", ["user", "tenant"])
def test_an_entry_indexed_during_an_eviction_is_found_by_the_next(evicting, writer, scope):
    tier, client = evicting
    old, new = key(h="old"), key(h="new")
    assert writer.put(old, kv(1))
    client.hook = lambda: writer.put(new, kv(2))  # lands between index read and delete

    tier.evict("acme", "u1" if scope == "user" else None)
    assert tier.get(old) is None
    assert tier.get(new) is not None  # written after the read: this eviction missed it

    tier.evict("acme", "u1")  # the next invalidation of the member
    assert tier.get(new) is None


def test_eviction_leaves_no_index_and_counts_entries(evicting, writer, redis_client):
    tier, _ = evicting
    for h in ("a", "b", "c"):
        assert writer.put(key(h=h), kv())
    assert writer.put(key(user="u2", h="a"), kv())
    assert tier.evict("acme", "u1") == 3
    assert tier.evict("acme") == 1
    assert set(redis_client.scan_iter(match="*")) == set()
