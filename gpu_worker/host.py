"""Per-process model host: one adapter + executor per worker process, loaded lazily.

Nothing here touches CUDA at import time, so a prefork parent never initialises
CUDA before forking; the model is loaded in the process that serves requests.
"""

from __future__ import annotations

import fcntl
import logging
import threading
from pathlib import Path

from django.conf import settings

log = logging.getLogger(__name__)
_lock = threading.Lock()
_executor = None


def model_path() -> Path:
    """MODEL_PATH, or the demo model under var/models/demo (built on first use)."""
    if settings.MODEL_PATH:
        return Path(settings.MODEL_PATH)
    path = Path(settings.DEMO_MODEL_PATH)
    ensure_demo_model(path)
    return path


def ensure_demo_model(path: Path) -> Path:
    """Build the demo model once, even with several processes racing (file lock)."""
    from injection.demo_model import build_demo_model

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
    return _executor


def _build_executor():
    import redis

    from injection import build_executor, load_adapter

    path = model_path()
    log.info("loading model from %s", path)
    adapter = load_adapter(
        path, device=settings.MODEL_DEVICE or None, dtype=settings.MODEL_DTYPE or None
    )
    client = redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=2.0, socket_connect_timeout=2.0
    ) if settings.KV_L2_ENABLED else None
    executor = build_executor(
        adapter,
        redis_client=client,
        signing_secret=settings.KV_SIGNING_SECRET,
        alpha_cap=settings.KV_ALPHA_CAP,
        l1_max_bytes=settings.KV_L1_MAX_BYTES,
        l1_max_entries=settings.KV_L1_MAX_ENTRIES,
        l1_tenant_quota_bytes=settings.KV_L1_TENANT_QUOTA_BYTES,
        l2_ttl_seconds=settings.KV_L2_TTL_SECONDS,
        l2_enabled=settings.KV_L2_ENABLED,
    )
    log.info("model ready: fingerprint=%s device=%s", adapter.fingerprint[:16], adapter.device)
    return executor
