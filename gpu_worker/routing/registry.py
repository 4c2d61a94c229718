"""The worker registry in Redis: liveness, in-flight tasks, member affinity, delivery counts.

Keys (prefix ``kviw:``, never inside the L2 namespace ``kvi:<tag>:``)::

    kviw:workers             ZSET  worker id -> time of its last heartbeat
    kviw:hb:<worker>         JSON  {pid, pool, queue, state, ...}; expires after the TTL
    kviw:inflight:<worker>   HASH  task id -> JSON {tag, started}: delivered, not yet done
    kviw:aff:<member>        the worker that last served the member (its L1 holds the K/V)
    kviw:deliveries:<task>   how many times the task was delivered to a worker

A worker is alive while its heartbeat key exists. A dead worker's in-flight tasks are
put back on their queue (kombu's own unacked entry, restored by delivery tag) and its
private queue is drained into the shared one (:func:`reap_dead`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis
from django.conf import settings

from gpu_worker.channels.control import redis_client

log = logging.getLogger(__name__)
SHARED_QUEUE = "gpu"
WORKERS_KEY = "kviw:workers"
PRIORITY_SEP = "\x06\x16"  # kombu's Redis priority sub-queues: "<queue>\x06\x16<pri>"
PRIORITY_STEPS = (3, 6, 9)


def hb_key(worker: str) -> str:
    return f"kviw:hb:{worker}"


def inflight_key(worker: str) -> str:
    return f"kviw:inflight:{worker}"


def affinity_key(member_id: int | str) -> str:
    return f"kviw:aff:{member_id}"


def deliveries_key(task_id: str) -> str:
    return f"kviw:deliveries:{task_id}"


def worker_queue(worker: str) -> str:
    """The private queue a worker consumes besides the shared ``gpu`` queue."""
    return f"{settings.WORKER_QUEUE_PREFIX}{worker}"


def _text(v: bytes | str | None) -> str | None:
    return v.decode() if isinstance(v, bytes) else v


# -- heartbeats -----------------------------------------------------------------------
def heartbeat(worker: str, info: dict[str, Any], client: redis.Redis | None = None) -> None:
    """Refresh ``worker``'s liveness (TTL ``WORKER_HEARTBEAT_TTL``) and its info."""
    client = client or redis_client()
    now = time.time()
    body = json.dumps({**info, "worker": worker, "ts": now})
    ttl_ms = int(settings.WORKER_HEARTBEAT_TTL * 1000)
    with client.pipeline(transaction=True) as p:
        p.set(hb_key(worker), body, px=ttl_ms)
        p.zadd(WORKERS_KEY, {worker: now})
        p.execute()


def drop_heartbeat(worker: str, client: redis.Redis | None = None) -> None:
    """Stop routing to ``worker`` now (it stays in the registry until reaped)."""
    (client or redis_client()).delete(hb_key(worker))


def live_workers(client: redis.Redis | None = None) -> dict[str, dict[str, Any]]:
    """Heartbeat info of every live worker, with its queue backlog."""
    client = client or redis_client()
    names = [_text(n) for n in client.zrange(WORKERS_KEY, 0, -1)]
    if not names:
        return {}
    with client.pipeline(transaction=False) as p:
        for n in names:
            p.get(hb_key(n))
            p.llen(worker_queue(n))
            p.hlen(inflight_key(n))
        raw = p.execute()
    out = {}
    for i, n in enumerate(names):
        hb, queued, inflight = raw[3 * i: 3 * i + 3]
        if hb is not None:
            out[n] = {**json.loads(hb), "queued": int(queued), "inflight": int(inflight)}
    return out


# -- in-flight tasks and delivery counts ----------------------------------------------
def record_inflight(worker: str, task_id: str, delivery_tag: str | None,
                    client: redis.Redis | None = None) -> None:
    body = json.dumps({"tag": delivery_tag, "started": time.time()})
    (client or redis_client()).hset(inflight_key(worker), task_id, body)


def clear_inflight(worker: str, task_id: str, client: redis.Redis | None = None) -> None:
    (client or redis_client()).hdel(inflight_key(worker), task_id)


def count_delivery(task_id: str, client: redis.Redis | None = None) -> int:
    """This delivery's number (1 on first delivery); kept a day."""
    client = client or redis_client()
    with client.pipeline(transaction=True) as p:
        p.incr(deliveries_key(task_id))
        p.expire(deliveries_key(task_id), 86400)
        n, _ = p.execute()
    return int(n)


def mark_poison(task_id: str, client: redis.Redis | None = None) -> None:
    """Make the task's next delivery its last (it wedged or killed a worker)."""
    (client or redis_client()).set(
        deliveries_key(task_id), settings.WORKER_MAX_DELIVERIES, ex=86400
    )


def forget_deliveries(task_id: str, client: redis.Redis | None = None) -> None:
    (client or redis_client()).delete(deliveries_key(task_id))


# -- affinity ---------------------------------------------------------------------------
def record_affinity(member_id: int | str, worker: str, client: redis.Redis | None = None) -> None:
    (client or redis_client()).set(
        affinity_key(member_id), worker, ex=settings.WORKER_AFFINITY_TTL
    )


def affinity(member_id: int | str, client: redis.Redis | None = None) -> str | None:
    return _text((client or redis_client()).get(affinity_key(member_id)))


# -- recovery ----------------------------------------------------------------------------
def drain_queue(source: str, dest: str = SHARED_QUEUE,
                client: redis.Redis | None = None) -> int:
    """Move every message of ``source`` to ``dest``, oldest consumed first; returns count."""
    client = client or redis_client()
    moved = 0
    for key in [source, *(f"{source}{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS)]:
        target = dest if key == source else dest + key[len(source):]
        # kombu LPUSHes and consumes with BRPOP: take the newest from the left and push
        # it on the right of dest, so the oldest ends up next in line.
        while client.lmove(key, target, "LEFT", "RIGHT") is not None:
            moved += 1
    return moved


def claim_inflight(worker: str, client: redis.Redis | None = None) -> dict[bytes, bytes]:
    """Take ``worker``'s in-flight list (read and deleted in one transaction): of several
    reapers of the same dead worker, exactly one gets its entries."""
    with (client or redis_client()).pipeline(transaction=True) as p:
        p.hgetall(inflight_key(worker))
        p.delete(inflight_key(worker))
        entries, _ = p.execute()
    return entries


def restore_inflight(worker: str, client: redis.Redis | None = None,
                     dest: str = SHARED_QUEUE) -> list[str]:
    """Put ``worker``'s unacknowledged tasks back on the shared queue; returns their ids.

    The list is claimed first: a reaper that read it while another was restoring would
    otherwise restore a task again after a live worker took it back (a restored message
    keeps its delivery tag, so the new holder's unacked entry has the dead one's name).
    """
    from config.celery import app

    entries = claim_inflight(worker, client or redis_client())
    restored = []
    if entries:
        with app.connection_for_write() as conn:
            channel = conn.default_channel
            for task_id, body in entries.items():
                tag = json.loads(body).get("tag")
                if tag and _restore_to_shared(channel, tag, dest):
                    restored.append(_text(task_id))
    return restored


def _restore_to_shared(channel, tag: str, dest: str = SHARED_QUEUE) -> bool:
    """Move one unacked message (kombu's Redis ack emulation) to the front of ``dest``.

    Like kombu's ``QoS.restore_by_tag`` (one WATCH transaction, so a second reaper
    restores nothing), but always to the shared queue: restoring by routing key would
    put a task that came through a worker's own queue back there, and that worker may be
    gone too. The routing key is rewritten so a later restore also lands in ``gpu``.
    """
    restored = False

    def txn(pipe) -> None:
        nonlocal restored
        raw = pipe.hget(channel.unacked_key, tag)
        pipe.multi()
        pipe.zrem(channel.unacked_index_key, tag)
        pipe.hdel(channel.unacked_key, tag)
        restored = raw is not None
        if raw:
            payload = json.loads(raw)[0]
            props = payload.setdefault("properties", {})
            props.setdefault("delivery_info", {}).update(
                exchange=dest, routing_key=dest, redelivered=True
            )
            payload.setdefault("headers", {})["redelivered"] = True
            pipe.rpush(dest, json.dumps(payload))  # consumers BRPOP: next in line

    with channel.conn_or_acquire() as client:
        client.transaction(txn, channel.unacked_key)
    return restored


def reap_dead(client: redis.Redis | None = None, *, exclude: str | None = None) -> dict[str, Any]:
    """Recover the tasks of every registered worker whose heartbeat expired."""
    client = client or redis_client()
    report: dict[str, Any] = {}
    forget_before = time.time() - 3 * settings.WORKER_HEARTBEAT_TTL
    for name, last in client.zrange(WORKERS_KEY, 0, -1, withscores=True):
        worker = _text(name)
        if worker == exclude or client.exists(hb_key(worker)):
            continue
        restored = restore_inflight(worker, client)
        drained = drain_queue(worker_queue(worker), SHARED_QUEUE, client)
        if restored or drained:
            log.warning("worker %s is gone: restored %s, drained %d queued", worker,
                        restored, drained)
            report[worker] = {"restored": restored, "drained": drained}
        if last < forget_before:  # late arrivals in its queue were drained above
            client.zrem(WORKERS_KEY, worker)
    return report
