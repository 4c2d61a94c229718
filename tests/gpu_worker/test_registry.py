"""Worker registry on real Redis: heartbeats, delivery counts, queue drain, unacked restore."""

from __future__ import annotations

import json
import uuid

import pytest
from kombu import Exchange, Queue

from gpu_worker.routing import registry


@pytest.fixture
def name():
    n = f"unit-{uuid.uuid4().hex[:8]}"
    yield n
    client = registry.redis_client()
    client.delete(registry.hb_key(n), registry.inflight_key(n), n, f"{n}.dest")
    client.zrem(registry.WORKERS_KEY, n)


def test_heartbeat_makes_a_worker_live_with_its_backlog(name, settings):
    settings.WORKER_HEARTBEAT_TTL = 5
    registry.heartbeat(name, {"state": "serving", "queue": registry.worker_queue(name)})
    registry.record_inflight(name, "task-1", "tag-1")
    live = registry.live_workers()[name]
    assert live["state"] == "serving" and live["inflight"] == 1 and live["queued"] == 0
    assert 0 < registry.redis_client().pttl(registry.hb_key(name)) <= 5000
    registry.drop_heartbeat(name)
    assert name not in registry.live_workers()


def test_deliveries_are_counted_per_task_and_poison_marks_the_last(name, settings):
    settings.WORKER_MAX_DELIVERIES = 3
    task_id = f"{name}-task"
    assert [registry.count_delivery(task_id) for _ in range(2)] == [1, 2]
    registry.mark_poison(task_id)
    assert registry.count_delivery(task_id) == 4  # > max: the next run refuses
    registry.forget_deliveries(task_id)


def test_drain_moves_waiting_messages_ahead_of_newer_ones_in_order(name):
    client = registry.redis_client()
    dest = f"{name}.dest"
    client.lpush(dest, "x")  # kombu: LPUSH to publish, BRPOP to consume
    for m in ("a", "b", "c"):
        client.lpush(name, m)
    assert registry.drain_queue(name, dest) == 3
    assert [client.rpop(dest).decode() for _ in range(4)] == ["a", "b", "c", "x"]
    assert client.llen(name) == 0


def test_a_dead_consumers_unacked_message_is_restored_once(name):
    from config.celery import app

    queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
    client = registry.redis_client()
    with app.connection_for_write() as conn:
        conn.Producer().publish({"n": 1}, exchange=queue.exchange, routing_key=name,
                                declare=[queue], serializer="json")
        consumer = conn.SimpleQueue(queue, no_ack=False)
        msg = consumer.get(timeout=5)  # delivered, never acked: its worker "died"
        assert client.llen(name) == 0
        registry.record_inflight(name, "task-1", str(msg.delivery_tag))

        assert registry.restore_inflight(name, dest=name) == ["task-1"]
        assert registry.restore_inflight(name, dest=name) == []  # nothing twice
        raw = json.loads(client.lindex(name, 0))
        assert raw["properties"]["delivery_info"]["redelivered"] is True
        assert raw["properties"]["delivery_info"]["routing_key"] == name
        consumer.close()  # kombu restores its own unacked on close: already gone
        assert client.llen(name) == 1
        again = conn.SimpleQueue(queue, no_ack=False)
        redelivered = again.get(timeout=5)
        assert redelivered.payload == {"n": 1}
        redelivered.ack()
        again.close()
    assert client.llen(name) == 0


def test_reapers_of_one_dead_worker_restore_its_task_once_even_after_it_is_taken_again(name):
    """CI saw a task restored twice: a second reaper read the dead worker's list, the first
    restored the task, a live worker took it (same delivery tag), and the second restored
    it from under that worker. The list is now claimed atomically by one reaper."""
    from config.celery import app

    queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
    client = registry.redis_client()
    with app.connection_for_write() as conn:
        conn.Producer().publish({"n": 2}, exchange=queue.exchange, routing_key=name,
                                declare=[queue], serializer="json")
        dead = conn.SimpleQueue(queue, no_ack=False)
        msg = dead.get(timeout=5)
        tag = str(msg.delivery_tag)
        registry.record_inflight(name, "task-2", tag)

        first = registry.claim_inflight(name)
        assert registry.claim_inflight(name) == {}  # the other reaper gets nothing
        assert list(first) == [b"task-2"]
        assert registry.restore_inflight(name, dest=name) == []
        with conn.channel() as ch:
            assert registry._restore_to_shared(ch, tag, name) is True  # the first reaper
        live = conn.SimpleQueue(queue, no_ack=False)
        again = live.get(timeout=5)  # a live worker holds it, under the same tag
        assert str(again.delivery_tag) == tag and client.hexists("unacked", tag)
        assert registry.restore_inflight(name, dest=name) == []  # a late reaper: nothing
        assert client.hexists("unacked", tag) and client.llen(name) == 0
        again.ack()
        live.close()
        dead.close()
    assert client.llen(name) == 0
