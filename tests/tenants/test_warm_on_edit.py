"""An edit of a member's preference or memories warms that member again after commit
(``actions.warm_on_commit``, ``KV_WARM_ON_EDIT``): one signed ``warm_member`` message per
member per transaction, on real Postgres and the real Redis broker, behind every chat.

The messages go to a queue of this test's own (``KV_WARM_QUEUE``), which no worker reads,
and are read back from Redis as the worker would receive them.
"""

from __future__ import annotations

import base64
import json
import uuid

import pytest
from django.db import transaction
from kombu import Connection

from config import taskauth
from config.celery import app
from tenants import actions, ports
from tenants.models import KVInvalidation

pytestmark = pytest.mark.django_db(transaction=True)
SEP = "\x06\x16"  # kombu's Redis transport: a queue's priority list is <queue><SEP><priority>


@pytest.fixture
def queue(settings):
    name = f"kvi-test-warm-{uuid.uuid4().hex[:8]}"
    settings.KV_WARM_ON_EDIT = True
    settings.KV_WARM_QUEUE = name
    yield name
    drop(name)


def drop(queue: str) -> None:
    client = app.connection_for_write().default_channel.client
    client.delete(queue, *(f"{queue}{SEP}{p}" for p in range(10)))


def sent(queue: str) -> list[dict]:
    """The warm messages waiting on ``queue``'s background list, oldest first."""
    client = app.connection_for_write().default_channel.client
    raw = client.lrange(f"{queue}{SEP}{ports.BACKGROUND_PRIORITY}", 0, -1)
    out = []
    for item in reversed(raw):  # kombu LPUSHes and BRPOPs: the oldest is last
        msg = json.loads(item)
        args, kwargs, _ = json.loads(base64.b64decode(msg["body"]))
        headers = msg["headers"]
        assert taskauth.is_authentic(headers["task"], headers["id"], args, kwargs,
                                     headers[taskauth.HEADER])
        out.append({"task": headers["task"], "args": args, "kwargs": kwargs,
                    "expires": headers["expires"], "priority": msg["properties"]["priority"]})
    return out


@pytest.fixture
def pair(queue):
    """Two members with a preference, their own warms (``test_a_new_member...``) dropped."""
    tenant = actions.do_create_tenant("acme")
    out = (actions.do_add_member(tenant, "alice", preference="I am vegetarian."),
           actions.do_add_member(tenant, "bob", preference="Answer in French."))
    drop(queue)
    return out


def test_a_new_member_with_a_preference_is_warmed_before_their_first_chat(queue):
    tenant = actions.do_create_tenant("acme")
    alice = actions.do_add_member(tenant, "alice", preference="I am vegetarian.")
    actions.do_add_member(tenant, "carol")  # nothing to warm: no preference, no memory
    assert [m["args"] for m in sent(queue)] == [[alice.pk]]


def test_a_preference_edit_queues_one_warm_of_that_member_after_commit(queue, pair):
    alice, _ = pair
    actions.do_set_preference(alice, text="I am vegan.")
    (msg,) = sent(queue)
    assert msg["task"] == ports.WARM_MEMBER_TASK and msg["args"] == [alice.pk]
    assert msg["priority"] == ports.BACKGROUND_PRIORITY and msg["expires"]
    last = KVInvalidation.objects.filter(member_ref=alice.pk).order_by("pk").last()
    assert msg["kwargs"] == {"after_outbox": last.pk, "background": True}


@pytest.mark.parametrize("change", ["create", "update", "delete", "reorder"])
def test_each_memory_change_queues_a_warm_of_its_member(queue, pair, change):
    alice, _ = pair
    first = actions.member_memories(alice).get()
    if change == "create":
        actions.do_create_memory(alice, text="I live in Lyon.")
    elif change == "update":
        actions.do_update_memory(alice, first.pk, pinned=True)
    elif change == "delete":
        actions.do_delete_memory(alice, first.pk)
    else:
        second = actions.do_create_memory(alice, text="I live in Lyon.")
        sent_before = len(sent(queue))
        actions.do_reorder_memories(alice, [second.pk, first.pk])
        assert len(sent(queue)) == sent_before + 1
        return
    assert [m["args"] for m in sent(queue)] == [[alice.pk]]


def test_one_transaction_of_edits_queues_one_warm_per_member(queue, pair):
    alice, bob = pair
    with transaction.atomic():
        actions.do_set_preference(alice, text="I am vegan.")
        actions.do_create_memory(alice, text="I live in Lyon.")
        actions.do_create_memory(alice, text="My cat is called Miso.")
        actions.do_set_preference(bob, text="Answer in German.")
        assert sent(queue) == []  # nothing before commit
    msgs = sent(queue)
    assert sorted(m["args"][0] for m in msgs) == sorted([alice.pk, bob.pk])
    for m in msgs:  # each after its member's last invalidation of the commit
        last = KVInvalidation.objects.filter(member_ref=m["args"][0]).order_by("pk").last()
        assert m["kwargs"] == {"after_outbox": last.pk, "background": True}
    actions.do_create_memory(alice, text="I play the cello.")  # the next transaction: again
    assert [m["args"][0] for m in sent(queue)].count(alice.pk) == 2


def test_a_rolled_back_edit_queues_nothing_and_the_next_edit_still_warms(queue, pair):
    alice, _ = pair
    with pytest.raises(RuntimeError), transaction.atomic():
        actions.do_set_preference(alice, text="I am vegan.")
        raise RuntimeError("rolled back")
    assert sent(queue) == []
    actions.do_set_preference(alice, text="I am vegan.")
    assert [m["args"] for m in sent(queue)] == [[alice.pk]]


def test_clears_and_inactive_members_are_not_warmed(queue, pair):
    alice, bob = pair
    actions.do_clear_kv_cache([alice])  # a clear means: drop it
    with transaction.atomic():
        actions.do_set_preference(bob, text="Answer in German.")
        bob.active = False
        bob.save(update_fields=["active"])
    assert sent(queue) == []


def test_the_backlog_of_warms_is_a_metric_of_its_own(queue, pair):
    from gpu_worker.ops import metrics

    actions.do_set_preference(pair[0], text="I am vegan.")
    actions.do_set_preference(pair[1], text="Answer in German.")
    assert metrics.warm_backlog() == f"{queue}{SEP}{ports.BACKGROUND_PRIORITY}"
    family = next(iter(metrics.QueueCollector().collect()))  # kvi_queue_depth
    assert ("warm", 2.0) in [(s.labels["queue"], s.value) for s in family.samples]


def test_off_queues_nothing(queue, pair, settings):
    settings.KV_WARM_ON_EDIT = False
    actions.do_set_preference(pair[0], text="I am vegan.")
    assert sent(queue) == []


def test_a_chat_sent_after_a_queued_warm_is_read_first(queue, pair):
    """What the worker's consumer does with the two (kombu on the real Redis broker): the
    warm waits behind a chat on its queue, whichever was sent first."""
    actions.do_set_preference(pair[0], text="I am vegan.")
    app.send_task("gpu_worker.tasks.chat", args=(1,), queue=queue)
    with Connection(app.conf.broker_url) as conn:
        box = conn.SimpleQueue(queue)
        try:
            order = []
            for _ in range(2):
                msg = box.get(timeout=10)
                msg.ack()
                order.append(msg.headers["task"])
        finally:
            box.close()
    assert order == ["gpu_worker.tasks.chat", ports.WARM_MEMBER_TASK]
