"""Worker lifecycle: load the model in the serving process, start the control listener.

solo/threads pools (the GPU configuration): in the main process at ``worker_ready``.
prefork (CPU only): in each child at ``worker_process_init`` — the parent never
touches CUDA before forking.
"""

from __future__ import annotations

import logging
import os

from celery.signals import worker_process_init, worker_ready, worker_shutdown

from gpu_worker import control, host

log = logging.getLogger(__name__)
_listener: control.ControlListener | None = None


def _on_invalidate(message: dict) -> None:
    executor = host.current_executor()
    if executor is not None:
        result = executor.invalidate(str(message["tenant"]), message.get("user"))
        log.info("invalidated tenant=%s user=%s: %s", message["tenant"], message.get("user"),
                 result)


HANDLERS = {"invalidate": _on_invalidate}


def start_serving_process() -> None:
    global _listener
    if _listener is None:
        _listener = control.ControlListener(HANDLERS)
        _listener.start()
    if os.environ.get("WORKER_PRELOAD_MODEL", "1") == "1":
        host.get_executor()


@worker_ready.connect
def _ready(sender=None, **_):
    pool = getattr(sender, "pool", None)  # sender: the worker's Consumer
    if pool is not None and "prefork" in type(pool).__module__:
        return  # children load in worker_process_init
    start_serving_process()


@worker_process_init.connect
def _child_init(**_):
    start_serving_process()


@worker_shutdown.connect
def _shutdown(**_):
    if _listener is not None:
        _listener.stop()
