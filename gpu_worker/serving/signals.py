"""Worker lifecycle, wired to Celery signals (the steps live in gpu_worker.serving.runtime).

* ``celeryd_after_setup`` (main process, before consuming): consume the worker's own
  queue ``gpu.w.<hostname>`` too; put back tasks a previous incarnation left unacked.
* ``worker_process_init`` / ``worker_ready``: load the model in the process that serves
  requests — each prefork child, or the main process for solo/threads (the GPU pools);
  the prefork parent never touches CUDA. Then the agent starts heartbeating.
* ``task_received`` / ``task_postrun``: the in-flight registry that lets peers redeliver
  this worker's task if it dies (kombu only would after the visibility timeout).
* ``task_prerun`` / ``task_postrun``: the task thread's database connection is kept across
  tasks (``CELERY_DB_REUSE_MAX``) and checked around each as Django checks a request's
  (``close_old_connections``: older than ``DB_CONN_MAX_AGE`` or broken, it goes).
* ``worker_shutting_down`` (SIGTERM): stop being routed to at once; the running task
  finishes (warm shutdown). ``worker_shutdown``: queued private tasks go back to ``gpu``,
  and the executor is closed so queued L2 writes land (bounded by
  ``WORKER_L2_FLUSH_TIMEOUT``); prefork children do the same at ``worker_process_shutdown``.
"""

from __future__ import annotations

import logging

import redis
from celery.signals import (
    celeryd_after_setup,
    task_postrun,
    task_prerun,
    task_received,
    task_rejected,
    task_revoked,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)
from django.db import close_old_connections

from gpu_worker.routing import registry
from gpu_worker.serving import runtime

log = logging.getLogger(__name__)


@celeryd_after_setup.connect
def _after_setup(sender=None, instance=None, **_):
    runtime.setup_node(str(sender), runtime.pool_name(instance.pool_cls), instance.app.amqp.queues,
                       concurrency=getattr(instance, "concurrency", None))


@worker_process_init.connect
def _process_init(**_):
    # prefork children; the solo pool also sends it, from the main process
    runtime.start_serving_process()


@worker_ready.connect
def _ready(sender=None, **_):
    if runtime.STATE.pool != "prefork":
        runtime.start_serving_process()  # threads pool (idempotent for solo)
    runtime.start_agent()


@task_received.connect
def _received(sender=None, request=None, **_):
    worker = runtime.STATE.worker
    if worker is None or request is None:
        return
    try:
        tag = request.message.delivery_tag
        registry.record_inflight(worker, request.id, str(tag) if tag is not None else None)
    except redis.RedisError as exc:
        log.warning("could not record in-flight %s: %s", request.id, exc)


@task_prerun.connect
def _prerun(sender=None, **_):
    _old_connections(sender)


@task_postrun.connect
def _postrun(sender=None, task_id=None, **_):
    worker = getattr(getattr(sender, "request", None), "hostname", None) or runtime.STATE.worker
    runtime.task_finished(task_id, worker)
    _old_connections(sender)


def _old_connections(task) -> None:
    """Around a task, as around a request: the thread's connection is closed when older than
    ``DB_CONN_MAX_AGE`` or broken, else kept (health-checked at its next use). Not for an
    eager task: its caller's connection (a test's transaction) is not the task's."""
    if not getattr(getattr(task, "request", None), "is_eager", False):
        close_old_connections()


@task_revoked.connect
def _revoked(sender=None, request=None, **_):
    if request is not None:
        runtime.task_finished(request.id, runtime.STATE.worker, in_task_thread=False)


@task_rejected.connect
def _rejected(sender=None, message=None, **_):
    task_id = (getattr(message, "headers", None) or {}).get("id")
    if task_id:
        runtime.task_finished(task_id, runtime.STATE.worker, in_task_thread=False)


@worker_shutting_down.connect
def _shutting_down(**_):
    runtime.begin_shutdown()


@worker_shutdown.connect
def _shutdown(**_):
    runtime.shutdown()


@worker_process_shutdown.connect
def _process_shutdown(**_):
    runtime.close_serving_process()  # prefork child (no-op where nothing was loaded)
