"""The worker agent on real Redis: a stalled housekeeping pass never stops the heartbeat.

A worker whose heartbeat lapses is declared dead by its peers, which redeliver the task
it is still running (a duplicate run; past the delivery bound, a spurious poison failure).
Housekeeping (outbox sweep on Postgres, recovery of dead peers) can be slow, so it runs
on its own thread.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from gpu_worker.routing import registry
from gpu_worker.routing.agent import WorkerAgent
from tests.workers import wait_for


@pytest.fixture
def agent(settings):
    settings.WORKER_HEARTBEAT_INTERVAL = 0.1
    # a TTL no scheduling hiccup of a loaded machine reaches: the tests count beats
    # (events), they never bet on a thread being scheduled within a fraction of a second
    settings.WORKER_HEARTBEAT_TTL = 30
    name = f"agent-{uuid.uuid4().hex[:8]}"
    a = WorkerAgent(name, "solo")
    yield a
    a._halt.set()
    client = registry.redis_client()
    client.delete(registry.hb_key(name), registry.inflight_key(name))
    client.zrem(registry.WORKERS_KEY, name)


def test_heartbeat_stays_fresh_while_housekeeping_is_stalled(agent):
    stalled, release = threading.Event(), threading.Event()

    def stuck_housekeeping() -> None:  # e.g. a Postgres lock wait in the outbox sweep
        stalled.set()
        release.wait(10)

    agent.housekeep = stuck_housekeeping
    agent.start()
    try:
        assert stalled.wait(5), "housekeeping never ran"
        client = registry.redis_client()
        beats = agent.beats
        wait_for(lambda: agent.beats >= beats + 5, 30, "heartbeats while housekeeping stalls")
        assert stalled.is_set() and not release.is_set()  # still stalled all along
        assert client.exists(registry.hb_key(agent.worker)), "heartbeat lapsed"
        assert agent.worker in registry.live_workers()
    finally:
        release.set()


def test_a_stopped_agent_is_no_longer_routable(agent):
    agent.start()
    client = registry.redis_client()
    deadline = time.monotonic() + 5
    while not client.exists(registry.hb_key(agent.worker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert agent.worker in registry.live_workers()
    agent.stop()
    assert not agent.is_alive()
    assert agent.worker not in registry.live_workers()


def test_a_draining_worker_is_not_routable_but_not_reaped_either(agent):
    """Warm shutdown: the tasks still running (a whole batch, with the threads pool) are
    its own to finish; a peer must not restore them while it does."""
    member = f"m-{uuid.uuid4().hex[:8]}"
    registry.record_inflight(agent.worker, "t-running", "1")
    registry.record_affinity(member, agent.worker)
    agent.start()
    agent.drain()
    try:
        beats = agent.beats
        wait_for(lambda: agent.beats >= beats + 3, 30, "heartbeats while draining")
        info = registry.live_workers().get(agent.worker)
        assert info is not None and info["state"] == "draining"
        from gpu_worker.routing.affinity import choose_queue

        assert choose_queue(member).reason == "draining"
        assert agent.worker not in registry.reap_dead(registry.redis_client())
        assert registry.redis_client().hexists(registry.inflight_key(agent.worker), "t-running")
    finally:
        registry.redis_client().delete(registry.affinity_key(member))
