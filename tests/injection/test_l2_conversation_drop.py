"""Dropping one stored conversation's links from Redis (a deleted conversation), on a real
Redis: exactly its links go; its member's segment, lean and other conversations' links, and
every other member's and tenant's entries, stay; the link ledger and the user index follow."""

from __future__ import annotations

import torch

from injection.base import CacheKey
from injection.kvcache.chain import LEAN_PREFIX
from injection.kvcache.l2.links import link_conversation, link_hash
from injection.kvcache.packed import PackedKV
from injection.kvcache.redis_tier import RedisKVTier
from injection.kvcache.signing import CacheKeySigner

SECRET = "l2-conversation-drop-secret-0123"


def kv(seed: int, T: int = 16) -> PackedKV:
    g = torch.Generator().manual_seed(seed)
    return PackedKV(torch.randn(2, 2, T, 8, generator=g), torch.randn(2, 2, T, 8, generator=g),
                    range(T))


def link(tenant: str, user: str, conversation: str | None, digest: str) -> CacheKey:
    return CacheKey(tenant, user, link_hash(conversation, digest), "fp")


def make_tier(client) -> RedisKVTier:
    return RedisKVTier(client, CacheKeySigner(SECRET), ttl_seconds=600, async_writes=False,
                       link_quota_bytes=10**9)


def index_size(tier: RedisKVTier, tenant: str, user: str) -> int:
    return int(tier.client.scard(tier.signer.user_index_key(tenant, user)))


def test_link_keys_name_their_stored_conversation_only():
    assert link_conversation(link("acme", "u1", "12", "d" * 64)) == "12"
    assert link_conversation(link("acme", "u1", "api:12", "d" * 64)) == "api:12"
    assert link_conversation(link("acme", "u1", None, "d" * 64)) is None  # a /v1 link
    assert link_conversation(CacheKey("acme", "u1", LEAN_PREFIX + "x", "fp")) is None


def test_dropping_a_conversation_deletes_exactly_its_links(redis_client):
    tier = make_tier(redis_client)
    gone = [link("acme", "u1", "7", "a"), link("acme", "u1", "7", "b")]  # e.g. before an edit
    segment, lean = CacheKey("acme", "u1", "seg", "fp"), CacheKey("acme", "u1", LEAN_PREFIX + "l", "fp")
    kept_links = [link("acme", "u1", "8", "a"), link("acme", "u1", None, "a"),  # another; /v1
                  link("acme", "u2", "7", "a"), link("other", "u1", "7", "a")]
    for i, key in enumerate([*gone, *kept_links]):
        assert tier.put(key, kv(i), link=True)
    assert tier.put(segment, kv(10)) and tier.put(lean, kv(11, T=1))
    before = tier.links.usage("acme")

    assert tier.evict_conversation("acme", "u1", "7") == 2

    assert all(tier.get(k, link=True) is None for k in gone)
    assert all(tier.get(k, link=True) is not None for k in kept_links)
    assert tier.get(segment) is not None and tier.get(lean) is not None
    assert tier.links.usage("acme")["entries"] == before["entries"] - 2  # the ledger follows
    assert index_size(tier, "acme", "u1") == 4  # the segment, the lean, two links
    assert not tier.client.exists(tier.signer.conversation_index_key("acme", "u1", "7"))
    assert tier.evict_conversation("acme", "u1", "7") == 0  # nothing twice


def test_the_members_eviction_still_drops_a_conversations_links(redis_client):
    tier = make_tier(redis_client)
    key = link("acme", "u1", "9", "a")
    assert tier.put(key, kv(0), link=True)
    assert tier.evict("acme", "u1") == 1
    assert tier.get(key, link=True) is None and tier.links.usage("acme")["entries"] == 0
    assert tier.evict_conversation("acme", "u1", "9") == 0  # its index names nothing live
