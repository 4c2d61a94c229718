"""The injection engine: preference K/V computed once, cached per tenant and user, injected.

Plain torch + transformers + redis (no Django). Typical use::

    adapter = load_adapter(model_path)                      # cuda if available
    executor = build_executor(adapter, redis_client=r, signing_secret=secret)
    result = executor.execute(ExecutionRequest(tenant, user, prompt, preference_text))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from injection.base import PreferenceModel
    from injection.engine.executor import InjectionExecutor
    from injection.metrics import Metrics

# Public names, imported on first use (PEP 562): ``import injection.kvcache.signing`` (the web
# process invalidating L2) must not load transformers and the model adapter.
_EXPORTS = {
    "ModelAdapter": "model.adapter", "load_adapter": "model.adapter",
    "CacheKey": "base", "ExecutionRequest": "base", "ExecutionResult": "base",
    "GenerationOutput": "base", "KVStore": "base", "PreferenceModel": "base", "Tier": "base",
    "InjectionError": "errors", "InvalidRequest": "errors", "ModelLoadError": "errors",
    "ModelOOMError": "errors",
    "InjectionExecutor": "engine.executor", "content_hash": "base",
    "BatchEngine": "engine.batch",
    "TenantLRU": "kvcache.lru",
    "METRICS": "metrics", "Metrics": "metrics",
    "strip_retrieve_fact_calls": "prompting.output_filter",
    "PackedKV": "kvcache.packed",
    "RedisKVTier": "kvcache.redis_tier",
    "CacheKeySigner": "kvcache.signing",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'injection' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"injection.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


__all__ = [
    "BatchEngine", "CacheKey", "CacheKeySigner", "ExecutionRequest", "ExecutionResult", "GenerationOutput",
    "InjectionError", "InjectionExecutor", "InvalidRequest", "KVStore", "METRICS", "Metrics",
    "ModelAdapter", "ModelLoadError", "ModelOOMError", "PackedKV", "PreferenceModel",
    "RedisKVTier", "TenantLRU", "Tier", "build_executor", "content_hash", "load_adapter",
    "strip_retrieve_fact_calls",
]

from injection.base import ALPHA_CAP  # noqa: E402  (torch-free)

GiB, MiB = 1024**3, 1024**2


def build_executor(
    adapter: PreferenceModel,
    *,
    redis_client: Any = None,
    signing_secret: str | bytes | None = None,
    alpha_cap: float = ALPHA_CAP,
    l1_max_bytes: int = 2 * GiB,
    l1_max_entries: int = 1024,
    l1_tenant_quota_bytes: int = 512 * MiB,
    l2_ttl_seconds: int = 86400,
    l2_enabled: bool = True,
    l2_link_tenant_bytes: int = 0,
    l2_writer_max_bytes: int = 0,
    key_generation: str = "0",
    metrics: Metrics | None = None,
    batch_max: int = 0,
    batch_kv_budget_bytes: int = 0,
    batch_join_wait_ms: float = 0.0,
    batch_prefill_chunk: int = 512,
    batch_prefill_pace: float = 0.0,
    batch_prefill_group: int | None = None,
    conversation_max_bytes: int = 128 * MiB,
    conversation_l1_max_bytes: int = 1 * GiB,
    conversation_member_max_bytes: int | None = None,
    conversation_prefill_opening: bool | None = None,
    tenant_pin_idle_seconds: float = 600.0,
    pinned_pool_max_bytes: int | None = None,
    memory_segment_tokens: int = 256,
    memory_recall_top_k: int = 3,
    memory_recall_min_similarity: float = 0.1,
) -> InjectionExecutor:
    """An executor with a TenantLRU L1 and, given a Redis client, an HMAC-signed L2.

    L2 is used only when ``l2_enabled`` and ``redis_client`` is given; it then
    needs ``signing_secret`` (fail closed: no unsigned Redis cache).
    ``key_generation`` must match the one maintenance tools sign with. A tenant's
    conversation links in Redis are held to ``l2_link_tenant_bytes`` (0: no budget;
    ``injection.kvcache.l2.links``), and at most ``l2_writer_max_bytes`` of K/V wait for the
    L2 writer (0: bounded by count only).
    ``batch_max`` >= 1 puts a :class:`BatchEngine` in front of the model (continuous
    batching of up to that many rows, conversation K/V reuse up to
    ``conversation_max_bytes`` per conversation, in an L1 of ``conversation_l1_max_bytes``
    of its own, of which one member holds at most ``conversation_member_max_bytes``:
    default a quarter, never less than one conversation; ``conversation_prefill_opening``:
    the next turn's opening prefilled after a reply, None: where the model runs on a CPU,
    ``injection.engine.turns``); 0 generates one request at a
    time. A prompt is prefilled in chunks of at most ``batch_prefill_chunk`` tokens (0:
    whole), one between two decoding steps; while rows decode, a chunk is sized to cost
    about ``batch_prefill_pace`` of their steps (0: the cap; the worker passes
    WORKER_PREFILL_PACE, 1.5; ``injection.engine.prefill.pacing``).
    Up to ``batch_prefill_group`` rows waiting together are prefilled in one forward
    (``injection.engine.prefill.grouping``; None: the batch size).
    A tenant segment stays pinned in L1 while the tenant has member entries there
    or used it within ``tenant_pin_idle_seconds``. Device-to-host K/V copies reuse the
    process's pool of pinned buffers (``injection.hostmem``), bounded by
    ``pinned_pool_max_bytes`` (default: L1's bound and a quarter).
    Models with layers other than full or sliding-window attention (chunked, linear or
    recurrent state) always use the latter; sliding-window models batch (the model's mask
    applies the window over plain cache layers).
    A member's memories fill a cached segment of up to ``memory_segment_tokens``; of the
    rest, up to ``memory_recall_top_k`` with a cosine of at least
    ``memory_recall_min_similarity`` to the user's message are recalled per request
    (``injection.memory``).
    """
    from injection.engine.executor import InjectionExecutor
    from injection.hostmem import HOST_POOL
    from injection.kvcache.lru import TenantLRU
    from injection.kvcache.redis_tier import RedisKVTier
    from injection.kvcache.signing import CacheKeySigner
    from injection.memory.recall import RecallOptions

    HOST_POOL.max_bytes = int(pinned_pool_max_bytes if pinned_pool_max_bytes is not None
                              else l1_max_bytes + l1_max_bytes // 4)
    l1 = TenantLRU(
        max_bytes=l1_max_bytes, max_entries=l1_max_entries,
        tenant_quota_bytes=min(l1_tenant_quota_bytes, l1_max_bytes),
        pin_idle_seconds=tenant_pin_idle_seconds,
    )
    l2 = None
    if l2_enabled and redis_client is not None:
        if not signing_secret:
            raise ValueError("an L2 Redis tier needs a signing_secret")
        signer = CacheKeySigner(signing_secret, key_generation=key_generation)
        l2 = RedisKVTier(redis_client, signer, ttl_seconds=l2_ttl_seconds,
                         link_quota_bytes=l2_link_tenant_bytes,
                         max_inflight_bytes=l2_writer_max_bytes)
    engine = None
    if batch_max >= 1 and getattr(adapter, "supports_batching", False):
        from injection.engine.batch import BatchEngine

        group = batch_max if batch_prefill_group is None else batch_prefill_group
        engine = BatchEngine(adapter, max_batch=batch_max, kv_budget_bytes=batch_kv_budget_bytes,
                             join_wait_ms=batch_join_wait_ms, prefill_chunk=batch_prefill_chunk,
                             pace=batch_prefill_pace, group_prefill=group)
    # conversation links in an L1 of their own: they never evict tenant/member segments
    conv_l1 = TenantLRU(
        max_bytes=conversation_l1_max_bytes, max_entries=l1_max_entries,
        tenant_quota_bytes=min(l1_tenant_quota_bytes, conversation_l1_max_bytes),
        user_quota_bytes=(max(conversation_max_bytes, conversation_l1_max_bytes // 4)
                          if conversation_member_max_bytes is None
                          else conversation_member_max_bytes),
    ) if engine is not None and conversation_max_bytes > 0 else None
    executor = InjectionExecutor(
        adapter, l1=l1, l2=l2, alpha_cap=alpha_cap, metrics=metrics, engine=engine,
        conversation_max_bytes=conversation_max_bytes, conversation_l1=conv_l1,
        memory=RecallOptions(memory_segment_tokens, memory_recall_top_k,
                             memory_recall_min_similarity))
    if conversation_prefill_opening is not None:
        executor.turns.prefill_opening = conversation_prefill_opening
    return executor
