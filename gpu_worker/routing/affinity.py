"""K/V-aware routing: send a member's task to the worker whose L1 holds their K/V.

After serving a member a worker records ``kviw:aff:<member> -> worker``. A request goes
to that worker's own queue while the worker is alive (fresh heartbeat, not draining)
and its backlog (running + queued tasks) is below its batch slots (``slots`` in its
heartbeat: the tasks it runs at once) - 1 + ``WORKER_AFFINITY_MAX_BACKLOG``; otherwise to
the shared ``gpu`` queue, where any worker serves it from L2 or recompute. A batching
worker with free slots thus keeps its members even while it is busy.
Any Redis fault routes to the shared queue: routing is an optimisation, never a gate.
"""

from __future__ import annotations

import json
import logging
from typing import NamedTuple

import redis
from django.conf import settings

from gpu_worker.routing import registry
from injection.kvcache.redis_client import connect
from tenants.errors import Overloaded

log = logging.getLogger(__name__)
OVERLOAD_RETRY_AFTER = 2  # seconds
ROUTING_SOCKET_TIMEOUT = 0.5  # a hung Redis costs a chat ~1 s here, not seconds per read
_clients: dict[str, redis.Redis] = {}


def routing_client() -> redis.Redis:
    """Routing and the capacity check are optimisations, never gates: read with a short
    deadline (a dispatch that needs Redis reports a hung one itself)."""
    url = settings.REDIS_URL
    client = _clients.get(url)
    if client is None:
        client = _clients.setdefault(url, connect(
            url, socket_timeout=ROUTING_SOCKET_TIMEOUT, health_check_interval=30))
    return client


class Route(NamedTuple):
    queue: str
    reason: str  # affinity | disabled | no_affinity | worker_gone | draining | busy | redis_error
    worker: str | None = None


def choose_queue(member_id: int | str, client: redis.Redis | None = None) -> Route:
    shared = registry.SHARED_QUEUE
    if not settings.WORKER_AFFINITY_ENABLED:
        return Route(shared, "disabled")
    try:
        client = client or routing_client()
        worker = registry.affinity(member_id, client)
        if worker is None:
            return Route(shared, "no_affinity")
        queue = registry.worker_queue(worker)
        with client.pipeline(transaction=False) as p:
            p.get(registry.hb_key(worker))
            p.llen(queue)
            p.hlen(registry.inflight_key(worker))
            hb, queued, inflight = p.execute()
    except redis.RedisError as exc:
        log.warning("routing: Redis unavailable (%s); using the shared queue", exc)
        return Route(shared, "redis_error")
    if hb is None:
        return Route(shared, "worker_gone", worker)
    info = json.loads(hb)
    if info.get("state") != "serving":
        return Route(shared, "draining", worker)
    slots = max(1, int(info.get("slots") or 1))
    if int(queued) + int(inflight) >= slots - 1 + settings.WORKER_AFFINITY_MAX_BACKLOG:
        return Route(shared, "busy", worker)
    return Route(queue, "affinity", worker)


def check_capacity(client: redis.Redis | None = None) -> None:
    """Refuse a new chat (503 ``overloaded``) while ``CHAT_MAX_QUEUED`` tasks already wait
    on the shared queue (0: no limit). Nothing is claimed or queued for a refused chat."""
    limit = settings.CHAT_MAX_QUEUED
    if not limit:
        return
    try:
        depth = (client or routing_client()).llen(registry.SHARED_QUEUE)
    except redis.RedisError:
        return  # dispatching reports an unreachable broker itself
    if depth >= limit:
        raise Overloaded(f"{depth} requests are waiting for a model worker; retry later.",
                         retry_after=OVERLOAD_RETRY_AFTER)
