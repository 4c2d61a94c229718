"""Authenticated task messages against a real worker: a forged or altered message is
refused before any work, counted and logged without its content (config.taskauth)."""

from __future__ import annotations

import urllib.request

import pytest

from config import taskauth
from gpu_worker.client import dispatch
from gpu_worker.routing.affinity import Route
from tenants.errors import SealedPayloadRejected
from tests.e2e.conftest import chat_now, heartbeat, member_with_preference
from tests.workers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
SECRET_TEXT = "zebra-marmalade-omelette"  # must never reach a log line


def refused_count(worker) -> float:
    port = heartbeat(worker.hostname)["metrics_port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    line = next((ln for ln in text.splitlines() if ln.startswith(
        'kvi_worker_task_messages_refused_total{task="gpu_worker.tasks.chat"}')), None)
    return 0.0 if line is None else float(line.split()[-1])


def claimed(member):
    """A live claim, so a chat task that did run would generate and store its reply."""
    params = {"max_new_tokens": 2}
    request_id = dispatch.claim_chat(member, None, SECRET_TEXT, params).request_id
    return dispatch.chat_args(member.pk, None, SECRET_TEXT, params, request_id), request_id


def test_forged_and_altered_chat_messages_are_refused_unrun(worker_pair, settings):
    from gpu_worker.routing import registry
    from gpu_worker.tasks import chat
    from tenants.models import ChatExchange, Message

    worker = worker_pair[0]
    queue = registry.worker_queue(worker.hostname)  # this worker, and only it, takes them
    alice = member_with_preference("taskauth", "alice", "Vegetarian.")
    mallory = member_with_preference("taskauth", "mallory", "Anything.")
    before = refused_count(worker)

    # forged: signed with a key that is not the platform's
    forged_args, forged_id = claimed(alice)
    real_secret = settings.KV_SIGNING_SECRET
    settings.KV_SIGNING_SECRET = "an attacker's guess"
    forged = chat.apply_async(args=forged_args, queue=queue, task_id=forged_id)
    settings.KV_SIGNING_SECRET = real_secret

    # altered: mallory's authentic message, its member id changed to alice's
    mallory_args, altered_id = claimed(mallory)
    alice_args, _ = claimed(alice)
    sig = taskauth.signature(chat.name, altered_id, mallory_args, {})
    altered_args = (alice.pk, *mallory_args[1:])
    altered = chat.apply_async(args=altered_args, queue=queue, task_id=altered_id,
                               headers={taskauth.HEADER: sig})

    for result in (forged, altered):
        wait_for(lambda r=result: r.ready(), 120, "the worker to answer the message")
        assert result.state == "FAILURE"
        # what the web answers for it: once, at once, the clear 503 (a rotated secret)
        with pytest.raises(SealedPayloadRejected, match="KV_SIGNING_SECRET"):
            dispatch.wait_chat(dispatch.Dispatched(result, Route(queue, "explicit")), 10)
    assert refused_count(worker) == before + 2
    assert not ChatExchange.objects.filter(state=ChatExchange.State.DONE).exists()
    assert not Message.objects.filter(conversation__member__in=[alice, mallory]).exists()
    log = worker.log_tail(400)
    for task_id in (forged_id, altered_id):
        assert f"refused task gpu_worker.tasks.chat[{task_id}]" in log
    assert SECRET_TEXT not in log

    # the platform's own (signed) messages still run on that worker
    assert chat_now(alice, queue=queue, max_new_tokens=2)["reply"] is not None
