"""Routing decisions on real Redis, one reason each."""

from __future__ import annotations

import uuid

import pytest

from gpu_worker.routing import registry
from gpu_worker.routing.affinity import choose_queue


@pytest.fixture
def worker():
    w = f"unit-{uuid.uuid4().hex[:8]}@test"
    yield w
    client = registry.redis_client()
    client.delete(registry.hb_key(w), registry.inflight_key(w), registry.worker_queue(w))
    client.zrem(registry.WORKERS_KEY, w)


@pytest.fixture
def member():
    m = f"unit-member-{uuid.uuid4().hex[:8]}"
    yield m
    registry.redis_client().delete(registry.affinity_key(m))


def test_routes_by_affinity_only_while_the_worker_is_live_idle_and_serving(
    worker, member, settings
):
    settings.WORKER_AFFINITY_MAX_BACKLOG = 2
    assert choose_queue(member) == ("gpu", "no_affinity", None)
    registry.record_affinity(member, worker)
    assert choose_queue(member) == ("gpu", "worker_gone", worker)

    registry.heartbeat(worker, {"state": "serving"})
    assert choose_queue(member) == (registry.worker_queue(worker), "affinity", worker)

    registry.record_inflight(worker, "t1", "1")
    registry.redis_client().lpush(registry.worker_queue(worker), "queued-task")
    assert choose_queue(member).reason == "busy"

    registry.redis_client().delete(registry.worker_queue(worker))
    registry.heartbeat(worker, {"state": "draining"})
    assert choose_queue(member).reason == "draining"

    settings.WORKER_AFFINITY_ENABLED = False
    assert choose_queue(member) == ("gpu", "disabled", None)


def test_a_batching_worker_keeps_its_members_while_it_has_free_slots(worker, member, settings):
    settings.WORKER_AFFINITY_MAX_BACKLOG = 2
    registry.record_affinity(member, worker)
    registry.heartbeat(worker, {"state": "serving", "slots": 4})
    for i in range(4):  # 4 running on 4 slots: one more may queue (backlog 2 - 1)
        registry.record_inflight(worker, f"t{i}", str(i))
    assert choose_queue(member).reason == "affinity"
    registry.redis_client().lpush(registry.worker_queue(worker), "queued-task")
    assert choose_queue(member).reason == "busy"
    registry.heartbeat(worker, {"state": "serving", "slots": 8})  # same load, more slots
    assert choose_queue(member).reason == "affinity"
    registry.heartbeat(worker, {"state": "serving"})  # no slots advertised: one at a time
    assert choose_queue(member).reason == "busy"


def test_redis_down_routes_to_the_shared_queue(member, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    assert choose_queue(member) == ("gpu", "redis_error", None)
