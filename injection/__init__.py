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
    "ModelAdapter": "model.adapter", "load_adapter": "model.loading",
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
    adapter: PreferenceModel, *, redis_client: Any = None,
    signing_secret: str | bytes | None = None, alpha_cap: float = ALPHA_CAP,
    l1_max_bytes: int = 2 * GiB, l1_max_entries: int = 1024,
    l1_tenant_quota_bytes: int = 512 * MiB, l2_ttl_seconds: int = 86400,
    l2_enabled: bool = True, l2_link_tenant_bytes: int = 0, l2_writer_max_bytes: int = 0,
    l2_segment_tenant_bytes: int = 0, key_generation: str = "0", metrics: Metrics | None = None,
    batch_max: int = 0, batch_kv_budget_bytes: int = 0, batch_join_wait_ms: float = 0.0,
    batch_prefill_chunk: int = 512, batch_prefill_pace: float = 0.0,
    batch_prefill_group: int | None = None,
    conversation_max_bytes: int = 128 * MiB, conversation_l1_max_bytes: int = 1 * GiB,
    conversation_member_max_bytes: int | None = None,
    conversation_prefill_opening: bool | None = None,
    tenant_protect_idle_seconds: float = 600.0, pinned_pool_max_bytes: int | None = None,
    memory_segment_tokens: int = 256, memory_recall_top_k: int = 3,
    memory_recall_min_similarity: float = 0.1, memory_lean: bool = True,
) -> InjectionExecutor:
    """An executor with a TenantLRU L1 and, given a Redis client, an HMAC-signed L2.

    L2 (with ``l2_enabled`` and ``redis_client``) needs ``signing_secret`` (fail closed) and
    the ``key_generation`` maintenance signs with; a tenant's links there are held to
    ``l2_link_tenant_bytes``, its segments and leans to ``l2_segment_tenant_bytes`` (0: no
    budget), the L2 writer's queue to ``l2_writer_max_bytes`` (0: by count only). ``batch_max``
    >= 1 puts a BatchEngine in front of the model (0: one request at a time); ``batch_*``: its
    K/V budget, join wait, prefill chunk, pace and group (``injection.engine.prefill``).
    ``conversation_*``: conversation K/V reuse in an L1 of its own, one member's share of it
    (None: a quarter, at least one conversation), the next turn's opening prefilled (None: on a
    CPU, ``injection.engine.turns``). A tenant segment is protected from eviction while its
    tenant has members in L1 or used it within ``tenant_protect_idle_seconds``. Host copies
    reuse a pool of pinned buffers of ``pinned_pool_max_bytes`` (None: L1's bound and a
    quarter; ``injection.hostmem``). ``memory_*``: the member segment's budget and recall
    (``injection.memory``). ``memory_lean``: a one-memory first turn leans with the member's
    lean measured once (``injection.engine.guidance.probe``; False: a guide row). Models with
    layers other than full or sliding-window attention never batch.
    """
    from injection.engine.executor import InjectionExecutor
    from injection.hostmem import HOST_POOL
    from injection.kvcache.lru import TenantLRU
    from injection.memory.recall import RecallOptions

    HOST_POOL.max_bytes = int(pinned_pool_max_bytes if pinned_pool_max_bytes is not None
                              else l1_max_bytes + l1_max_bytes // 4)
    l1 = TenantLRU(max_bytes=l1_max_bytes, max_entries=l1_max_entries,
                   tenant_quota_bytes=min(l1_tenant_quota_bytes, l1_max_bytes),
                   protect_idle_seconds=tenant_protect_idle_seconds)
    l2 = _l2(redis_client, signing_secret, key_generation, l2_ttl_seconds, l2_link_tenant_bytes,
             l2_writer_max_bytes, l2_segment_tenant_bytes) if l2_enabled else None
    engine = _engine(adapter, batch_max, batch_kv_budget_bytes, batch_join_wait_ms,
                     batch_prefill_chunk, batch_prefill_pace, batch_prefill_group)
    conv_l1 = _conversation_l1(l1_max_entries, l1_tenant_quota_bytes, conversation_max_bytes,
                               conversation_l1_max_bytes, conversation_member_max_bytes
                               ) if engine is not None and conversation_max_bytes > 0 else None
    executor = InjectionExecutor(
        adapter, l1=l1, l2=l2, alpha_cap=alpha_cap, metrics=metrics, engine=engine,
        conversation_max_bytes=conversation_max_bytes, conversation_l1=conv_l1,
        memory=RecallOptions(memory_segment_tokens, memory_recall_top_k,
                             memory_recall_min_similarity), memory_lean=memory_lean)
    if conversation_prefill_opening is not None:
        executor.turns.prefill_opening = conversation_prefill_opening
    return executor


def _engine(adapter: PreferenceModel, batch_max: int, kv_budget_bytes: int,
            join_wait_ms: float, prefill_chunk: int, pace: float, group: int | None) -> Any:
    """The batch engine (None: ``batch_max`` < 1, or a model that cannot batch)."""
    if batch_max < 1 or not getattr(adapter, "supports_batching", False):
        return None
    from injection.engine.batch import BatchEngine

    return BatchEngine(adapter, max_batch=batch_max, kv_budget_bytes=kv_budget_bytes,
                       join_wait_ms=join_wait_ms, prefill_chunk=prefill_chunk, pace=pace,
                       group_prefill=batch_max if group is None else group)


def _conversation_l1(max_entries: int, tenant_quota_bytes: int, conversation_max_bytes: int,
                     max_bytes: int, member_max_bytes: int | None) -> Any:
    """Conversation links in an L1 of their own: they never evict tenant/member segments."""
    from injection.kvcache.lru import TenantLRU

    return TenantLRU(max_bytes=max_bytes, max_entries=max_entries,
                     tenant_quota_bytes=min(tenant_quota_bytes, max_bytes),
                     user_quota_bytes=(max(conversation_max_bytes, max_bytes // 4)
                                       if member_max_bytes is None else member_max_bytes))


def _l2(redis_client: Any, signing_secret: str | bytes | None, key_generation: str,
        ttl_seconds: int, link_tenant_bytes: int, writer_max_bytes: int,
        segment_tenant_bytes: int = 0) -> Any:
    """The signed Redis tier (None without a client); refuses to run unsigned."""
    if redis_client is None:
        return None
    if not signing_secret:
        raise ValueError("an L2 Redis tier needs a signing_secret")
    from injection.kvcache.redis_tier import RedisKVTier
    from injection.kvcache.signing import CacheKeySigner

    signer = CacheKeySigner(signing_secret, key_generation=key_generation)
    return RedisKVTier(redis_client, signer, ttl_seconds=ttl_seconds,
                       link_quota_bytes=link_tenant_bytes, max_inflight_bytes=writer_max_bytes,
                       tenant_quota_bytes=segment_tenant_bytes)
