"""K/V-aware routing and invalidation across two real worker processes."""

from __future__ import annotations

import pytest

from gpu_worker.channels import kvstore
from gpu_worker.client.dispatch import wait_chat
from gpu_worker.routing import registry
from gpu_worker.tasks import warm_member
from tests.e2e.conftest import (
    LONG_TOKENS,
    chat_now,
    heartbeat,
    l1_entries,
    l2_entries,
    member_with_preference,
    only_these_consume,
    send_chat,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def pair(worker_pair):
    with only_these_consume(worker_pair):
        yield worker_pair


def test_second_request_goes_to_the_worker_holding_the_members_kv(pair):
    hostnames = {w.hostname for w in pair}
    members = [member_with_preference("route", f"u{i}", f"I like dish number {i}.")
               for i in range(4)]
    first = {m.pk: chat_now(m) for m in members}
    for m in members:
        assert first[m.pk]["worker"] in hostnames
        assert first[m.pk]["cache"]["tier"] in ("compute", "l2")
        assert registry.affinity(m.pk) == first[m.pk]["worker"]

    for m in members:
        sent = send_chat(m, "And tomorrow?")
        assert sent.route.reason == "affinity"
        assert sent.route.queue == registry.worker_queue(first[m.pk]["worker"])
        second = wait_chat(sent, 120)  # the result is sealed
        assert second["worker"] == first[m.pk]["worker"]
        assert second["cache"]["tier"] == "l1"
        assert second["cache"]["content_hash"] == first[m.pk]["cache"]["content_hash"]


def test_busy_affine_worker_is_bypassed_and_the_other_serves_from_l2(pair, settings):
    settings.WORKER_AFFINITY_MAX_BACKLOG = 1
    busy, other = pair
    member = member_with_preference("route-busy", "carol", "Gluten free, please.")
    warm_member.apply_async(args=(member.pk,), queue=registry.worker_queue(busy.hostname)) \
        .get(timeout=120)
    assert registry.affinity(member.pk) == busy.hostname
    wait_for(lambda: l2_entries(member.tenant_id) == 1, 10, "L2 write")

    blocker_member = member_with_preference("route-busy", "dave", "Anything.")
    blocker = send_chat(blocker_member, queue=registry.worker_queue(busy.hostname),
                        max_new_tokens=LONG_TOKENS)
    wait_for(lambda: registry.redis_client().hexists(registry.inflight_key(busy.hostname),
                                                      blocker.result.id), 60, "blocker running")
    sent = send_chat(member)
    assert sent.route.reason == "busy"
    reply = wait_chat(sent, 120)
    assert reply["worker"] == other.hostname
    assert reply["cache"]["tier"] == "l2"  # written by the busy worker when it warmed
    wait_chat(blocker, 120)


def test_affinity_to_a_dead_worker_falls_back_to_the_shared_queue(pair):
    member = member_with_preference("route-gone", "erin", "No nuts.")
    registry.record_affinity(member.pk, "ghost@nowhere")
    sent = send_chat(member)
    assert sent.route == (registry.SHARED_QUEUE, "worker_gone", "ghost@nowhere")
    assert wait_chat(sent, 120)["worker"] in {w.hostname for w in pair}


def test_invalidation_reaches_the_l1_of_both_workers(pair):
    member = member_with_preference("inval", "frank", "I am vegan.")
    tenant = member.tenant_id
    for w in pair:  # the member's K/V into each worker's L1
        tier = warm_member.apply_async(args=(member.pk,), queue=registry.worker_queue(w.hostname))
        assert tier.get(timeout=120)["tier"] in ("compute", "l2", "l1")
        assert l1_entries(w.hostname, tenant) == 1

    out = kvstore.invalidate(tenant, member.pk)
    assert out["workers_notified"] >= 2
    for w in pair:
        wait_for(lambda w=w: l1_entries(w.hostname, tenant) == 0, 10, f"{w.name} L1 emptied")

    first, second = (chat_now(member, queue=registry.worker_queue(w.hostname)) for w in pair)
    assert [first["worker"], second["worker"]] == [w.hostname for w in pair]
    assert first["cache"]["tier"] == "compute"  # L2 was dropped too
    assert second["cache"]["tier"] in ("compute", "l2")  # never the stale L1


def test_each_worker_exports_its_engine_metrics_for_prometheus(pair):
    import urllib.request

    member = member_with_preference("metrics", "gus", "Tea, not coffee.")
    first = chat_now(member)
    chat_now(member)  # routed back: an L1 hit on the same worker
    ports = {w.hostname: heartbeat(w.hostname)["metrics_port"] for w in pair}
    assert len(set(ports.values())) == 2 and None not in ports.values()
    url = f"http://127.0.0.1:{ports[first['worker']]}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    hits = next(line for line in text.splitlines()
                if line.startswith('kvi_cache_hits_total{tier="l1"}'))
    assert float(hits.split()[-1]) >= 1
    assert f'kvi_l1_tenant_bytes{{tenant="{member.tenant_id}"}}' in text
    assert 'kvi_worker_tasks_total{outcome="ok",task="gpu_worker.tasks.chat"}' in text
    assert 'kvi_queue_depth{queue="gpu"}' in text and "kvi_l2_rejects_total" in text
