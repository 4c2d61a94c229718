"""A warm queued after an edit (``warm_member(..., background=True)``) runs only on an idle
worker process, one at a time, and is put back for a few seconds otherwise (``Retry``: until
it finds the worker idle or its message expires); an admin's warm always runs. The task
body called in-process with a real executor on the demo model, its engine held by the test
(no timing)."""

from __future__ import annotations

import time
import uuid

import pytest
from celery.exceptions import Retry

from gpu_worker import tasks
from gpu_worker.serving import host
from tenants import actions
from tests.injection.test_engine_forwards import _held

pytestmark = pytest.mark.django_db


@pytest.fixture
def executor(demo_model_path, redis_client):
    from injection import build_executor, load_adapter

    ex = build_executor(load_adapter(str(demo_model_path), device="cpu"), batch_max=2,
                        redis_client=redis_client, signing_secret="x" * 32)
    host._executor, saved = ex, host._executor
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


def test_a_background_warm_runs_only_when_the_engine_is_idle(executor, settings):
    settings.KV_WARM_ON_EDIT = False  # the set-up's own edits queue nothing
    tenant = actions.do_create_tenant("acme")
    member = actions.do_add_member(tenant, "alice", preference="I am vegetarian.")
    ex = executor
    assert ex.idle()
    release, holder = _held(ex.engine)  # the scheduler in a forward of the test's
    ids = ex.adapter.renderer.encode("Hello there", first=True)
    job = ex.engine.start(None, 1.0, list(ids), 3)  # a chat's row, waiting
    try:
        assert not ex.idle()
        with pytest.raises(Retry):
            warm(member.pk, background=True)
        assert ex.l1.stats()["entries"] == 0  # nothing computed
    finally:
        release.set()
        holder.join(60)
    job.wait()
    wait_idle(ex)
    with tasks._BACKGROUND, pytest.raises(Retry):  # another background warm of this process
        warm(member.pk, background=True)
    assert warm(member.pk, background=True)["tier"] == "compute"
    assert warm(member.pk)["tier"] == "l1"  # an admin's warm: whatever the load
