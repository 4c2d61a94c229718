"""What the Django app needs from the worker layer, without importing it.

Layers point down (``injection`` <- ``tenants`` <- ``gpu_worker``/web): nothing under
``tenants/`` imports ``gpu_worker`` (tests/tenants/test_layering.py checks it). The worker
package plugs its implementations in when Django starts (``gpu_worker.apps``); tasks are
enqueued by name through the Celery app, never by importing the task module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from tenants.errors import WorkerUnavailable

log = logging.getLogger(__name__)
WARM_MEMBER_TASK = "gpu_worker.tasks.warm_member"

_impl: dict[str, Callable[..., Any]] = {}


def provide(name: str, fn: Callable[..., Any]) -> None:
    """Install the implementation of port ``name`` ("run_chat", "deliver_invalidations")."""
    _impl[name] = fn


def run_chat(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """One chat turn end to end (``gpu_worker.client.dispatch.run_chat``): its outcome (body, replayed)."""
    fn = _impl.get("run_chat")
    if fn is None:
        raise WorkerUnavailable("This deployment has no chat backend installed.")
    return fn(*args, **kwargs)


def start_stream(*args: Any, **kwargs: Any) -> Any:
    """Claim and dispatch a streamed chat turn (``gpu_worker.client.relay.start_chat``)."""
    fn = _impl.get("start_stream")
    if fn is None:
        raise WorkerUnavailable("This deployment has no chat backend installed.")
    return fn(*args, **kwargs)


def stream_events(member: Any, started: Any) -> Any:
    """Its async iterator of ("delta", text), then ("done", body) or ("error", exc)."""
    return _impl["stream_events"](member, started)


def task_events(task_id: str, timeout: float, wait: Callable[[str, float], dict]) -> Any:
    """A streamed task's async iterator of ("delta", text), then ("done", ``wait(id, s)``)."""
    return _impl["task_events"](task_id, timeout, wait)


def deliver_invalidations(ids: Sequence[int]) -> None:
    """Fast path after commit: delete L2 and broadcast to workers now (best effort).

    The outbox rows are the durable record: whatever this misses (Redis down, no
    implementation installed) the workers' outbox followers and sweeps deliver later.
    """
    fn = _impl.get("deliver_invalidations")
    if fn is None:
        return
    try:
        fn(list(ids))
    except Exception:  # a commit has happened; the outbox retries, never fail the caller
        log.exception("invalidation fast path failed; the outbox will deliver it")


def metrics_exposition() -> tuple[bytes, str]:
    """This web process's Prometheus exposition and its content type (``gpu_worker.ops.metrics``)."""
    fn = _impl.get("metrics_exposition")
    if fn is None:
        return b"", "text/plain; version=0.0.4; charset=utf-8"
    return fn()


# kombu's Redis transport polls a queue's priority lists lowest number first (no priority:
# 0, a chat's), so 9 waits behind every chat; AMQP reads priorities the other way round and
# only on queues declared with x-max-priority, so there the warm is sent without one (FIFO)
BACKGROUND_PRIORITY = 9
_REDIS_BROKERS = ("redis://", "rediss://", "redis+socket://")


def enqueue_warm(member_id: int, *, background: bool = False,
                 after_outbox: int | None = None) -> None:
    """Ask a GPU worker to precompute a member's K/V (by task name: no worker import).
    ``background``: after an edit (``KV_WARM_ON_EDIT``), on ``KV_WARM_QUEUE`` behind every
    chat and dropped if no worker took it within ``KV_WARM_EXPIRES`` seconds; otherwise an
    admin's request, routed like any GPU task. ``after_outbox``: the edit's invalidation,
    which the warming worker applies first (``gpu_worker.tasks.warm_member``)."""
    from django.conf import settings

    from config.celery import app

    if not background:
        app.send_task(WARM_MEMBER_TASK, args=(member_id,))
        return
    options: dict[str, Any] = {"queue": settings.KV_WARM_QUEUE,
                               "expires": settings.KV_WARM_EXPIRES}
    if str(app.conf.broker_url or "").startswith(_REDIS_BROKERS):
        options["priority"] = BACKGROUND_PRIORITY
    kwargs: dict[str, Any] = {"background": True}  # run only on an idle worker, else dropped
    if after_outbox is not None:
        kwargs["after_outbox"] = int(after_outbox)
    app.send_task(WARM_MEMBER_TASK, args=(member_id,), kwargs=kwargs, **options)
