"""This worker process's identity and the long-lived parts it started (one instance).

Read by the lifecycle steps (``runtime``) and by the control handlers (``handlers``).
"""

from __future__ import annotations

from gpu_worker.channels import control, outbox
from gpu_worker.routing.agent import WorkerAgent
from gpu_worker.serving.limits import Watchdog


class _State:
    worker: str | None = None  # the node's hostname (e.g. "gpu-0@node1")
    pool: str = "solo"
    agent: WorkerAgent | None = None
    listener: control.ControlListener | None = None
    follower: outbox.OutboxFollower | None = None
    watchdog: Watchdog | None = None
    metrics_port: int | None = None
    slots: int = 1  # tasks this worker runs at once (threads pool: its concurrency)


STATE = _State()
