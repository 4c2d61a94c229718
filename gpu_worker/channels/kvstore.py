"""Django-side access to the shared K/V cache: L2 tier, signer, and invalidation.

The L2 entries live on the cache Redis (``KV_CACHE_REDIS_URL``); the signing-key
generation, the control channel and everything else on ``REDIS_URL``.
Invalidation = delete the L2 entries here (works with no worker alive) + broadcast
an L1 eviction to every live worker over the control channel. Preference changes go
through the durable outbox (gpu_worker.channels.outbox), which calls this as its fast path.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from django.conf import settings

from gpu_worker.channels import control

log = logging.getLogger(__name__)
KEYGEN_KEY = "kvi:keygen"  # current signing-key generation (see `kvcache rotate-key`)


def key_generation(client: redis.Redis | None = None) -> str:
    """The current L2 signing-key generation ("0" until the first rotation).

    Raises ``redis.RedisError`` when Redis is unreachable: guessing "0" could make
    entries of a rotated-out key servable again (fail closed).
    """
    value = (client or control.redis_client()).get(KEYGEN_KEY)
    return value.decode() if value else "0"


def signer():
    from injection.kvcache.signing import CacheKeySigner

    return CacheKeySigner(settings.KV_SIGNING_SECRET, key_generation=key_generation())


_cache_clients: dict[str, redis.Redis] = {}


def cache_client() -> redis.Redis:
    """A shared fail-fast client for the cache Redis (``KV_CACHE_REDIS_URL``)."""
    url = settings.KV_CACHE_REDIS_URL
    client = _cache_clients.get(url)
    if client is None:
        client = _cache_clients.setdefault(url, control.make_client(2.0, url))
    return client


def l2_tier():
    """A synchronous RedisKVTier over the cache Redis (for maintenance, not requests)."""
    from injection.kvcache.redis_tier import RedisKVTier

    return RedisKVTier(cache_client(), signer(), ttl_seconds=settings.KV_L2_TTL_SECONDS,
                       async_writes=False, link_quota_bytes=settings.KV_L2_LINK_TENANT_BYTES,
                       tenant_quota_bytes=settings.KV_L2_SEGMENT_TENANT_BYTES)


def conversation_key(conversation_id: int | str) -> str:
    """The engine's id of a stored conversation (``ExecutionRequest.conversation_id``, the
    key its links are cached under): what a deleted conversation's links are dropped by."""
    return f"api:{conversation_id}"


def invalidate(tenant_id: int | str, member_id: int | str | None = None,
               outbox: int | None = None,
               conversation: int | str | None = None) -> dict[str, Any]:
    """Drop a member's (or a whole tenant's) K/V from L2 and from every worker's L1; with
    ``conversation`` (its :func:`conversation_key`), only that conversation's links.

    ``l2_deleted`` is None when Redis did not answer (then nothing was broadcast either).
    ``outbox``: the ``KVInvalidation`` row this delivers (workers then skip it).
    """
    tenant, user = str(tenant_id), (None if member_id is None else str(member_id))
    conv = None if conversation is None else str(conversation)
    if conv is not None and user is None:
        raise ValueError("a conversation's links are dropped within its member")
    try:
        tier = l2_tier()
        l2_deleted = (tier.evict(tenant, user) if conv is None
                      else tier.evict_conversation(tenant, user, conv))
    except redis.RedisError as exc:  # the outbox row is delivered later (gpu_worker.channels.outbox)
        log.warning("invalidate: L2 unavailable (%s)", exc)
        return {"l2_deleted": None, "workers_notified": 0}
    extra: dict[str, Any] = {} if outbox is None else {"outbox": int(outbox)}
    if conv is not None:
        extra["conversation"] = conv
    workers = control.publish("invalidate", tenant=tenant, user=user, **extra)
    return {"l2_deleted": l2_deleted, "workers_notified": workers}
