"""A KV_SIGNING_SECRET rotation rolling out (docs/OPERATIONS.md, "Rotating secrets"), with a
real worker: one already on step 2 (the new secret, the old one its fallback) runs the chat
of a web still on step 1 (the old secret, the new one its fallback): the web's signed task
and sealed turn are accepted, and the web opens the worker's sealed reply. The same web
before step 1 (no fallback) cannot open that reply: the steps must finish in order."""

from __future__ import annotations

import pytest

from tenants.errors import SealedPayloadRejected
from tests.e2e.conftest import chat_now, member_with_preference

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
NEW = "the rotated-in kv signing secret " * 2


@pytest.fixture(scope="module")
def step2_worker(start_workers):
    from django.conf import settings

    (worker,) = start_workers("rot2", KV_SIGNING_SECRET=NEW,
                              KV_SIGNING_SECRET_FALLBACKS=settings.KV_SIGNING_SECRET)
    yield worker
    worker.stop()  # left running, it would take later tests' tasks from the shared queue


def test_a_worker_on_the_next_step_serves_a_web_on_the_step_before(step2_worker, settings):
    from gpu_worker.routing import registry
    from tenants.models import Message

    queue = registry.worker_queue(step2_worker.hostname)  # this worker, and only it
    member = member_with_preference("rotation", "alice", "Vegetarian.")

    settings.KV_SIGNING_SECRET_FALLBACKS = [NEW]  # this process: step 1
    result = chat_now(member, "What should I cook?", queue=queue)
    assert result["worker"] == step2_worker.hostname, result
    stored = Message.objects.filter(conversation__member=member, role="assistant")
    assert [m.content for m in stored] == [result["reply"]]

    settings.KV_SIGNING_SECRET_FALLBACKS = []  # before step 1: the reply does not open
    with pytest.raises(SealedPayloadRejected):
        chat_now(member, "And for dessert?", queue=queue)
    assert "refused task" not in step2_worker.log_tail(400)  # its own task was accepted
