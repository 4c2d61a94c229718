"""A warm queued after an edit (``warm_member(..., background=True)``) is acknowledged at
once and held in the worker process (``serving.idlewarms``) until its engine is idle, one a
member, then run one at a time; nothing is put back on the broker. An admin's warm always
runs. The task body called in-process with a real executor on the demo model, its engine
held by the test; the held warms run by hand (``run_ready``), so nothing depends on time."""

from __future__ import annotations

import time
import uuid

import pytest

from gpu_worker import tasks
from gpu_worker.serving import host
from gpu_worker.serving.idlewarms import IdleWarms
from tenants import actions
from tests.injection.test_engine_forwards import _held

pytestmark = pytest.mark.django_db


@pytest.fixture
def executor(demo_model_path, redis_client, monkeypatch):
    from injection import build_executor, load_adapter

    ex = build_executor(load_adapter(str(demo_model_path), device="cpu"), batch_max=2,
                        redis_client=redis_client, signing_secret="x" * 32)
    host._executor, saved = ex, host._executor
    monkeypatch.setattr(tasks, "BACKGROUND_QUIET_S", 0.0)
    held = IdleWarms(tasks._run_held, tasks._idle)  # run by hand: no thread
    monkeypatch.setattr(tasks, "IDLE_WARMS", held)
    monkeypatch.setattr(held, "_start", lambda: None)
    yield ex
    host._executor = saved
    ex.close()


def warm(member_id: int, **kwargs) -> dict:
    """The task's body in this process, as a worker runs it (a request of its own id: the
    delivery count is per task id)."""
    tasks.warm_member.push_request(id=f"test-warm-{uuid.uuid4().hex}")
    try:
        return tasks.warm_member.run(member_id, **kwargs)
    finally:
        tasks.warm_member.pop_request()


def wait_idle(ex, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not ex.idle():
        assert time.monotonic() < deadline, ex.engine.stats()
        time.sleep(0.01)


def test_a_background_warm_is_held_until_the_engine_is_idle(executor, settings):
    settings.KV_WARM_ON_EDIT = False  # the set-up's own edits queue nothing
    tenant = actions.do_create_tenant("acme")
    alice = actions.do_add_member(tenant, "alice", preference="I am vegetarian.")
    bob = actions.do_add_member(tenant, "bob", preference="Answer in French.")
    ex, held = executor, tasks.IDLE_WARMS
    release, holder = _held(ex.engine)  # the scheduler in a forward of the test's
    ids = ex.adapter.renderer.encode("Hello there", first=True)
    job = ex.engine.start(None, 1.0, list(ids), 3)  # a chat's row, waiting
    try:
        assert not ex.idle()
        for m in (alice, bob, alice):  # alice edited twice: one warm
            assert warm(m.pk, background=True)["tier"] == "held"
        assert held.pending() == [alice.pk, bob.pk]
        assert held.run_ready() == 0  # busy: nothing runs, nothing goes back to the broker
        assert ex.l1.stats()["entries"] == 0
    finally:
        release.set()
        holder.join(60)
    job.wait()
    wait_idle(ex)
    assert held.run_ready() == 2 and held.pending() == []
    assert ex.l1.stats()["entries"] >= 2  # both members' segments computed
    assert warm(alice.pk)["tier"] == "l1"  # an admin's warm: whatever the load


def test_held_warms_are_bounded_merged_and_expire():
    ran, clock = [], [0.0]
    held = IdleWarms(lambda h: ran.append((h.member_id, h.after_outbox)), lambda: True,
                     max_members=2, expires_s=600.0, clock=lambda: clock[0])
    held._start = lambda: None
    assert held.add(1, 10, "w") and held.add(2, None, "w") and held.add(1, 12, "w")
    assert held.add(3, None, "w") is False  # full: dropped
    clock[0] = 599.0
    assert held.run_ready() == 2 and ran == [(1, 12), (2, None)]
    assert held.add(4, 5, "w")
    clock[0] = 1300.0  # held past KV_WARM_EXPIRES: dropped, not run
    assert held.run_ready() == 0 and held.pending() == []
