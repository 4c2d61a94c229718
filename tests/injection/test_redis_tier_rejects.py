"""Malformed L2 values are rejects, never tier faults (issue 9, finding 7): a value of
the wrong Redis type, bad header, bad MAC or truncated is counted, deleted and reported
as a miss, and other members' valid entries keep being served (no bypass). Real Redis."""

from __future__ import annotations

import pytest

from injection.kvcache.redis_tier import RedisKVTier
from injection.kvcache.signing import CacheKeySigner
from tests.injection.test_redis_tier import SECRET, key, kv


@pytest.fixture
def signer() -> CacheKeySigner:
    return CacheKeySigner(SECRET)

def _malformed(client, name: str, how: str) -> None:
    """Replace the value at ``name`` with a malformed one of kind ``how``."""
    blob = client.get(name)
    client.delete(name)
    if how == "wrong_type":
        client.sadd(name, b"x")
    elif how == "bad_header":  # MAC intact-looking length, garbage header
        client.set(name, b"\0" * 64 + blob[64:])
    elif how == "bad_mac":
        client.set(name, blob[:-1] + bytes([blob[-1] ^ 1]))
    elif how == "truncated":
        client.set(name, blob[: len(blob) // 2])


@pytest.mark.parametrize("how", ["wrong_type", "bad_header", "bad_mac", "truncated"])
def test_malformed_entry_is_a_reject_not_a_fault(redis_client, signer, how):
    t = RedisKVTier(redis_client, signer, async_writes=False, retry_after_s=60.0)
    bad, other = key(user="u1"), key(user="u2")
    assert t.put(bad, kv()) and t.put(other, kv(1))
    name = signer.redis_key(bad)
    _malformed(redis_client, name, how)
    assert t.get(bad) is None
    assert redis_client.exists(name) == 0  # the bad value is deleted
    got = t.get(other)  # no bypass: another member's valid entry is still served
    assert got is not None and got.equal(kv(1))
    s = t.stats()
    assert (s["rejects"], s["errors"], s["bypassed"], s["hits"]) == (1, 0, 0, 1)
    assert t.put(bad, kv()) is True  # the recompute is stored again and served
    assert t.get(bad).equal(kv())


def test_wrong_type_user_index_is_dropped_and_the_write_lands(redis_client, signer):
    t = RedisKVTier(redis_client, signer, async_writes=False, retry_after_s=60.0)
    index = signer.user_index_key("acme", "u1")
    redis_client.set(index, b"not a set")
    assert t.put(key(), kv()) is True
    assert t.get(key()).equal(kv())
    assert redis_client.smembers(index) == {signer.redis_key(key()).encode()}
    s = t.stats()
    assert (s["rejects"], s["errors"], s["bypassed"], s["writes"]) == (1, 0, 0, 1)


def test_wrong_type_user_index_on_reject_and_evict(redis_client, signer):
    t = RedisKVTier(redis_client, signer, async_writes=False, retry_after_s=60.0)
    assert t.put(key(), kv())
    name, index = signer.redis_key(key()), signer.user_index_key("acme", "u1")
    _malformed(redis_client, name, "bad_mac")
    redis_client.delete(index)
    redis_client.rpush(index, b"x")  # the index is a LIST now
    assert t.get(key()) is None
    assert redis_client.exists(name) == 0 and redis_client.exists(index) == 0
    redis_client.rpush(index, b"x")
    assert t.evict("acme", "u1") == 0 and redis_client.exists(index) == 0
    s = t.stats()
    assert (s["rejects"], s["errors"], s["bypassed"]) == (3, 0, 0)
    assert t.put(key(), kv()) and t.get(key()) is not None  # not bypassed
