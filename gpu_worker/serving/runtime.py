"""Per-process worker state and the lifecycle steps wired to Celery signals (signals.py).

Supported pools (docs/OPERATIONS.md):

* ``solo`` — the GPU configuration: one worker process per GPU, the model loaded once in
  that process, time limits enforced by :mod:`gpu_worker.serving.limits`;
* ``threads`` — one process, one model shared by N threads (one executor, one L1);
* ``prefork`` — CPU only: each child loads its own model at ``worker_process_init``;
  the parent never touches CUDA before forking (nothing here imports torch eagerly).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from django.conf import settings

from gpu_worker.channels import control, outbox
from gpu_worker.errors import RedeliveryLimitExceeded
from gpu_worker.ops import metrics
from gpu_worker.routing import registry
from gpu_worker.routing.agent import WorkerAgent
from gpu_worker.serving import enginewatch, host
from gpu_worker.serving.handlers import HANDLERS, evict
from gpu_worker.serving.limits import Running, Watchdog
from gpu_worker.serving.state import STATE

log = logging.getLogger(__name__)


def pool_name(pool_cls: Any) -> str:
    text = f"{getattr(pool_cls, '__module__', '')}.{getattr(pool_cls, '__name__', pool_cls)}"
    for name in ("prefork", "solo", "thread", "eventlet", "gevent"):
        if name in text:
            return "threads" if name == "thread" else name
    return str(pool_cls)


# -- lifecycle ---------------------------------------------------------------------------
def setup_node(worker: str, pool: str, queues: Any, concurrency: int | None = None) -> None:
    """Main process, before consuming: own queue, and recover a previous incarnation's tasks."""
    STATE.worker, STATE.pool = worker, pool
    STATE.slots = 1 if pool == "solo" else max(1, int(concurrency or 1))
    queues.select_add(registry.worker_queue(worker))
    try:
        restored = registry.restore_inflight(worker)
        if restored:
            log.warning("restored %d tasks left by a previous %s", len(restored), worker)
    except redis.RedisError as exc:
        log.warning("could not check for leftover tasks: %s", exc)
    if pool != "prefork":
        STATE.watchdog = Watchdog(on_hard=_on_hard_limit)
    log.info("worker %s (pool %s) consumes %s and %s", worker, pool, registry.SHARED_QUEUE,
             registry.worker_queue(worker))


def start_serving_process() -> None:
    """In the process that runs tasks: control listener, metrics server, model."""
    if STATE.listener is None:
        STATE.listener = control.ControlListener(HANDLERS)
        STATE.listener.start()
    if STATE.follower is None:  # before the model loads: L1 is empty at its first read
        STATE.follower = outbox.OutboxFollower(evict)
        STATE.follower.start()
    if STATE.metrics_port is None and settings.WORKER_METRICS_PORT:
        STATE.metrics_port = metrics.start_worker_server(
            settings.WORKER_METRICS_PORT, settings.WORKER_METRICS_ADDR
        )
    # a stuck or dead engine scheduler fails its requests and restarts this process
    host.on_executor_built(_watch_engine)
    if os.environ.get("WORKER_PRELOAD_MODEL", "1") == "1":
        host.get_executor()


def _watch_engine(executor: Any) -> None:
    enginewatch.start(executor.engine)


def start_agent() -> None:
    """Main process, once the worker is ready: heartbeats, watchdog, reaper."""
    if STATE.agent is None and STATE.worker:
        # routing sends a member's work here while it has free batch slots
        info = {"metrics_port": STATE.metrics_port, "slots": STATE.slots}
        STATE.agent = WorkerAgent(STATE.worker, STATE.pool, STATE.watchdog, info)
        STATE.agent.beat()  # routable as soon as ready
        STATE.agent.start()


def begin_shutdown() -> None:
    if STATE.agent is not None:
        STATE.agent.drain()


def shutdown() -> None:
    if STATE.agent is not None:
        STATE.agent.stop()
    if STATE.listener is not None:
        STATE.listener.stop()
    if STATE.follower is not None:
        STATE.follower.stop()
    close_serving_process()


def close_serving_process() -> None:
    """The process that served requests exits: queued L2 writes land first (bounded)."""
    enginewatch.stop()  # the engine closes now: that is no stall
    host.close_executor(settings.WORKER_L2_FLUSH_TIMEOUT)


def _on_hard_limit(entry: Running) -> None:
    """The task ignored its soft limit (stuck in native code): mark it poison and exit."""
    log.critical("task %s passed its hard time limit (%.0fs); exiting the worker",
                 entry.task_id, entry.hard or 0)
    try:
        registry.mark_poison(entry.task_id)
    finally:
        os._exit(70)  # EX_SOFTWARE; peers redeliver the task once, then fail it


# -- per task ----------------------------------------------------------------------------
def worker_id(task) -> str:
    return task.request.hostname or STATE.worker or "unknown"


@contextmanager
def serving(task, enqueued_at: float | None = None) -> Iterator[None]:
    """Around a GPU task: the redelivery bound, time limits and metrics."""
    task_id = task.request.id
    n = _count_delivery(task_id)
    if n > settings.WORKER_MAX_DELIVERIES:
        metrics.TASKS.labels(task.name, "poison").inc()
        log.error("task %s delivered %d times; failing it as poison", task_id, n)
        raise RedeliveryLimitExceeded(
            f"The request was abandoned after {n - 1} deliveries: every worker that took "
            "it died or timed out while handling it."
        )
    if n > 1:
        log.warning("task %s redelivered (delivery %d)", task_id, n)
    if enqueued_at:
        metrics.QUEUE_WAIT.observe(max(0.0, time.time() - float(enqueued_at)))
    hard, soft = task.request.timelimit or (None, None)
    soft, hard = soft or task.soft_time_limit, hard or task.time_limit
    started = time.monotonic()
    outcome = "error"
    try:
        if STATE.watchdog is not None:
            with STATE.watchdog.guard(task_id, soft, hard):
                yield
        else:
            yield
        outcome = "ok"
    finally:
        metrics.TASKS.labels(task.name, outcome).inc()
        metrics.TASK_SECONDS.labels(task.name).observe(time.monotonic() - started)


def _count_delivery(task_id: str) -> int:
    try:
        return registry.count_delivery(task_id)
    except redis.RedisError as exc:  # cannot count: serve rather than refuse
        log.warning("delivery count unavailable: %s", exc)
        return 1


def task_finished(task_id: str, worker: str | None, *, in_task_thread: bool = True) -> None:
    if in_task_thread and STATE.watchdog is not None:
        STATE.watchdog.finish()
    if worker:
        try:
            registry.clear_inflight(worker, task_id)
        except redis.RedisError as exc:
            log.warning("could not clear in-flight %s: %s", task_id, exc)
