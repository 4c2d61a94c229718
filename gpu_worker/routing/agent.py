"""The worker agent: one background thread per worker node.

Every tick it lets the :class:`~gpu_worker.serving.limits.Watchdog` enforce time limits, and every
``WORKER_HEARTBEAT_INTERVAL`` it refreshes the heartbeat (so web processes may route
members here). A second thread, the housekeeper, prunes stale in-flight entries, recovers
dead workers' tasks and sweeps the invalidation outbox (L2 deletions Redis missed;
gpu_worker.channels.outbox) on the same interval, and now and then deletes dead
idempotency claims (tenants.actions.do_prune_claims). The two are apart so that slow housekeeping
(a Postgres stall, a large recovery) never delays a heartbeat: a late heartbeat makes
peers declare this worker dead and redeliver the task it is still running.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

import redis
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from gpu_worker.channels import outbox
from gpu_worker.routing import registry
from gpu_worker.serving.limits import Watchdog
from tenants.actions import do_prune_claims

log = logging.getLogger(__name__)
TICK_SECONDS = 0.25
STALE_INFLIGHT_SECONDS = 30.0  # received but neither running nor reserved: forgotten


class WorkerAgent(threading.Thread):
    def __init__(self, worker: str, pool: str, watchdog: Watchdog | None = None,
                 info: dict[str, Any] | None = None) -> None:
        super().__init__(name="kvi-agent", daemon=True)
        self.worker, self.pool, self.watchdog = worker, pool, watchdog
        self.state = "serving"
        self.extra = dict(info or {})
        self.started_at = time.time()
        self._halt = threading.Event()
        self._wake = threading.Event()
        self.beats = 0
        self._next_prune = 0.0

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "pool": self.pool, "state": self.state,
                "queue": registry.worker_queue(self.worker), "started": self.started_at,
                **self.extra}

    def run(self) -> None:
        threading.Thread(target=self._housekeeping, name="kvi-housekeeper", daemon=True).start()
        next_beat = 0.0
        while not self._halt.is_set():
            if self.watchdog is not None:
                self.watchdog.check()
            now = time.monotonic()
            if now >= next_beat or self._wake.is_set():
                self._wake.clear()
                self.heartbeat()
                next_beat = now + settings.WORKER_HEARTBEAT_INTERVAL
            self._halt.wait(TICK_SECONDS)

    def beat(self) -> None:
        """Heartbeat and housekeeping once, synchronously (at startup)."""
        self.heartbeat()
        self.housekeep()

    def heartbeat(self) -> None:
        """Alive, with the state: a draining worker still beats (its running tasks are
        not a dead worker's to restore); routing sends nothing new to it."""
        try:
            registry.heartbeat(self.worker, self.info())
            self.beats += 1
        except redis.RedisError as exc:
            log.warning("agent: Redis unavailable (%s); retrying", exc)
        except Exception:  # the agent must outlive any single failure
            log.exception("agent: heartbeat failed")

    def _housekeeping(self) -> None:
        while not self._halt.wait(settings.WORKER_HEARTBEAT_INTERVAL):
            self.housekeep()

    def housekeep(self) -> None:
        try:
            client = registry.redis_client()
            self._prune_inflight(client)
            registry.reap_dead(client, exclude=self.worker)
        except redis.RedisError as exc:
            log.warning("agent: Redis unavailable for recovery (%s); retrying", exc)
        except Exception:
            log.exception("agent: recovery failed")
        self.sweep_outbox()
        if time.monotonic() >= self._next_prune:
            self.prune_claims()

    def prune_claims(self) -> int:
        """Delete idempotency claims dead for ``CHAT_CLAIM_RETENTION`` (abandoned, or
        pending past their deadline), at most every ``CHAT_CLAIM_PRUNE_INTERVAL``."""
        self._next_prune = time.monotonic() + settings.CHAT_CLAIM_PRUNE_INTERVAL
        try:
            close_old_connections()
            pruned = do_prune_claims(settings.CHAT_CLAIM_RETENTION)
        except DatabaseError as exc:
            log.warning("agent: could not prune claims (%s); retrying later", exc)
            return 0
        except Exception:  # the housekeeper must outlive any single failure
            log.exception("agent: pruning claims failed")
            return 0
        if pruned:
            log.info("agent: pruned %d dead idempotency claims", pruned)
        return pruned

    def sweep_outbox(self) -> None:
        """L2 deletions the fast path could not do (Redis was down), until acknowledged."""
        try:
            close_old_connections()
            outbox.sweep()
        except redis.RedisError:
            pass  # logged above by the heartbeat; rows stay pending
        except DatabaseError as exc:
            log.warning("agent: outbox unavailable (%s); retrying", exc)
        except Exception:
            log.exception("agent: outbox sweep failed")

    def drain(self) -> None:
        """Warm shutdown began: stop new routing here now (the running tasks finish).

        The heartbeat stays, saying "draining": dropping it would make peers reap this
        worker and restore tasks it is still finishing, which then run twice (with the
        threads pool a batch of them). It goes at :meth:`stop`, or expires if we die."""
        self.state = "draining"
        self.heartbeat()

    def stop(self) -> None:
        """Leave: no heartbeat, queued messages back to the shared queue."""
        self._halt.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout=5.0)
        try:
            registry.drop_heartbeat(self.worker)
            moved = registry.drain_queue(registry.worker_queue(self.worker))
            if moved:
                log.info("agent: moved %d queued tasks to the shared queue", moved)
        except redis.RedisError as exc:
            log.warning("agent: could not drain own queue (%s); peers will", exc)

    def _prune_inflight(self, client: redis.Redis) -> None:
        """Drop entries of tasks this worker no longer holds (revoked, rejected...)."""
        from celery.worker import state

        held = {r.id for r in list(state.reserved_requests)}
        held |= {r.id for r in list(state.active_requests)}
        cutoff = time.time() - STALE_INFLIGHT_SECONDS
        for task_id, body in client.hgetall(registry.inflight_key(self.worker)).items():
            tid = task_id.decode()
            if tid in held:
                continue
            if json.loads(body).get("started", 0) < cutoff:
                registry.clear_inflight(self.worker, tid, client)
