"""A threads-pool worker batches concurrent chats (each reply as if alone) and continues a
conversation's K/V on its next turn: real Celery, Postgres, Redis and the demo model."""

from __future__ import annotations

import pytest

from gpu_worker.client.dispatch import wait_chat
from tests.e2e.conftest import member_with_preference, only_these_consume, send_chat, worker_stats
from tests.workers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
TOKENS = 48


@pytest.fixture(scope="module")
def batching_worker(start_workers):
    (w,) = start_workers("batch1", pool="threads", WORKER_BATCH_MAX=4)
    yield w
    w.stop()  # later modules count on knowing which workers consume the shared queue


@pytest.fixture(scope="module")
def alone(demo_model_path):
    """The same engine in this process, one request at a time: the reference replies."""
    from injection import build_executor, load_adapter
    from injection.metrics import Metrics

    return build_executor(load_adapter(str(demo_model_path), device="cpu", dtype="fp32"),
                          metrics=Metrics())  # not this process's global counters


def _expected(alone, member, pref: str, message: str) -> str:
    from injection.base import ExecutionRequest

    req = ExecutionRequest(str(member.tenant_id), str(member.pk),
                           [{"role": "user", "content": message}], pref,
                           instructions=member.tenant.instructions, max_new_tokens=TOKENS)
    return alone.execute(req).text


def test_concurrent_chats_share_batches_and_each_reply_is_the_one_alone(batching_worker, alone):
    prefs = ["I am vegetarian.", "I love long hikes in the mountains every weekend.",
             "Answer like a pirate.", "I cannot eat gluten or nuts, and I dislike onions."]
    members = [member_with_preference(f"batch-t{i % 2}", f"b{i}", p) for i, p in enumerate(prefs)]
    with only_these_consume([batching_worker]):
        sent = [send_chat(m, "What should I cook?", max_new_tokens=TOKENS) for m in members]
        replies = [wait_chat(s, 120) for s in sent]  # the result is sealed
        stats = worker_stats(batching_worker.hostname)["stats"]["batch"]
        assert stats["max_batch"] == 4 and stats["peak_batch"] >= 2
        assert stats["batched_steps"] > 0
        for m, p, r in zip(members, prefs, replies, strict=True):
            assert r["worker"] == batching_worker.hostname
            assert r["reply"] == _expected(alone, m, p, "What should I cook?")

        # a first turn is not kept (admission); the second is, and the third continues its
        # K/V on the same worker
        conv = replies[0]["conversation"]
        nxt = send_chat(members[0], "And for dessert?", max_new_tokens=8, conversation=conv)
        second = wait_chat(nxt, 120)
        assert nxt.route.reason == "affinity"
        assert second["cache"]["tier"] == "l1" and second["cache"]["history_messages"] == 2
        assert second["cache"]["cached_tokens"] == second["cache"]["kv_tokens"] > 0
        third = wait_chat(send_chat(members[0], "And a drink?", max_new_tokens=8,
                                    conversation=conv), 120)
        assert third["cache"]["reused_tokens"] > second["cache"]["reused_tokens"]
        assert third["cache"]["reused_tokens"] > replies[0]["cache"]["kv_tokens"]
        assert third["usage"]["cached_tokens"] == (third["cache"]["kv_tokens"]
                                                   + third["cache"]["reused_tokens"])


def test_the_heartbeat_advertises_the_batch_slots(batching_worker):
    from gpu_worker.routing import registry

    info = wait_for(lambda: registry.live_workers().get(batching_worker.hostname), 30, "beat")
    assert info["slots"] == 4 and info["pool"] == "threads"
