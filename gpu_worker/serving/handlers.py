"""Control-channel handlers run in every serving worker process (see control.py).

Each returns a JSON-safe reply (sent when the publisher asked for one) naming the
worker and process, so ``kvcache`` can tell which workers acted.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from gpu_worker.channels import linkcast
from gpu_worker.serving import host
from gpu_worker.serving.state import STATE

log = logging.getLogger(__name__)


def _identity() -> dict[str, Any]:
    ex = host.current_executor()
    return {"worker": STATE.worker, "pid": os.getpid(), "pool": STATE.pool,
            "model_loaded": ex is not None,
            "key_generation": host.key_generation_in_use()}


def on_invalidate(message: dict) -> dict[str, Any]:
    """Drop one tenant's (or one user's) K/V from this process's L1 (and pending L2 writes),
    or with ``conversation`` only that stored conversation's links; an outbox row's once
    (``apply_outbox``: a warm queued after it may have applied it)."""
    tenant, user = str(message["tenant"]), message.get("user")
    conv = message.get("conversation")
    conversation = None if conv is None else str(conv)
    if message.get("outbox") is None:
        return {**_identity(), "evicted": evict(tenant, user, conversation)}
    result = apply_outbox(int(message["outbox"]), tenant, user, conversation)
    return {**_identity(), "evicted": result if result is not None else "applied before"}


def apply_outbox(outbox_id: int, tenant: str, user: str | None,
                 conversation: str | None = None) -> dict[str, Any] | None:
    """Apply outbox row ``outbox_id`` (its scope: ``tenant``, ``user``; ``conversation``:
    only its links) here unless this process did already (its broadcast, the follower's
    poll, a warm: ``OutboxFollower.apply_once``); the eviction's result, or None when it
    was applied before. Without a follower: always."""
    if STATE.follower is None:
        return evict(tenant, user, conversation)
    done, result = STATE.follower.apply_once(
        outbox_id, lambda: evict(tenant, user, conversation))
    return result if done else None


def evict(tenant: str, user: str | None, conversation: str | None = None) -> dict[str, Any]:
    """Drop a tenant's (or user's) K/V from this process's L1 (and its pending L2 writes);
    with ``conversation`` (and its user), only that stored conversation's links.

    Called by the control channel and by the outbox follower (gpu_worker.channels.outbox).
    """
    executor = host.current_executor()
    result: dict[str, Any] = {}
    if executor is None:
        return result
    if conversation is None:
        result = executor.invalidate(tenant, user)
    elif user is not None:
        result = executor.drop_conversation(tenant, user, conversation)
    log.info("invalidated tenant=%s user=%s conversation=%s: %s", tenant, user, conversation,
             result)
    return result


def on_clear_all(message: dict) -> dict[str, Any]:
    """Drop every L1 entry and finish pending L2 writes (the caller then deletes L2)."""
    executor = host.current_executor()
    dropped = 0
    if executor is not None:
        dropped = executor.clear_l1()  # segments and conversation links
        if executor.l2 is not None:
            executor.l2.flush(timeout=5.0)
        executor.metrics.incr("invalidations")
    log.info("cleared L1 (%d entries)", dropped)
    return {**_identity(), "evicted": {"l1": dropped}}


def on_stats(message: dict) -> dict[str, Any]:
    from injection.hostmem import HOST_POOL
    from injection.model import profiles

    executor = host.current_executor()
    stats = ({**executor.stats(), "host_pool": HOST_POOL.stats(),
              "profile": profiles.summary(executor.adapter)}
             if executor is not None else None)
    return {**_identity(), "stats": stats}


def on_conv_link(message: dict) -> dict[str, Any] | None:
    """Another worker replaced a conversation's link: drop this process's stale copies
    (gpu_worker.channels.linkcast)."""
    executor = host.current_executor()
    if executor is None:
        return None
    old, new = linkcast.key_of(message.get("old")), linkcast.key_of(message.get("new"))
    if old.tenant != new.tenant or new.tenant != str(message.get("tenant")):
        raise ValueError("conv_link keys of different tenants")
    dropped = executor.conversations.drop_stale(old, new, int(message["tokens"]),
                                                str(message["digest"]))
    return {**_identity(), "dropped": dropped}


def on_rotate_key(message: dict) -> dict[str, Any]:
    """Sign L2 with the new key generation; drop L1 (it may hold entries read under the old)."""
    changed = host.set_key_generation(str(message["generation"]))
    return {**_identity(), "changed": changed}


HANDLERS = {
    "invalidate": on_invalidate,
    "clear_all": on_clear_all,
    "stats": on_stats,
    "rotate_key": on_rotate_key,
    linkcast.OP: on_conv_link,
}
