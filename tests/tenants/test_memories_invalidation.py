"""Every memory change invalidates exactly its member's cached K/V, after commit, on real
Redis: observed as a worker would (the signed control channel and a real L2 entry), like
the preference's invalidation (tests/tenants/test_invalidation.py)."""

from __future__ import annotations

import pytest
from django.db import transaction

from gpu_worker.channels import kvstore
from tenants import actions
from tenants.models import KVInvalidation, Memory
from tests.tenants.test_invalidation import ControlSubscriber, put_l2_entry

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pair():
    tenant = actions.do_create_tenant("acme")
    alice = actions.do_add_member(tenant, "alice", preference="vegetarian")
    bob = actions.do_add_member(tenant, "bob", preference="loves durian")
    return alice, bob


@pytest.fixture
def subscriber(pair):
    sub = ControlSubscriber(pair[0].tenant_id)
    sub.drain(0.3)
    yield sub
    sub.close()


def last_invalidation() -> int:
    row = KVInvalidation.objects.order_by("-pk").first()
    return row.pk if row else 0


def invalidated(subscriber, member, after: int) -> set[str]:
    """Users invalidated until the broadcast of ``member``'s outbox row newer than
    ``after`` (this change's own row: an earlier change's message cannot stand in)."""
    def mine(m: dict) -> bool:
        return m["user"] == str(member.pk) and int(m.get("outbox") or 0) > after

    messages = subscriber.drain(30.0, until=lambda got: any(mine(m) for m in got))
    assert any(mine(m) for m in messages), messages
    return {m["user"] for m in messages if m["op"] == "invalidate"}


@pytest.mark.parametrize("change", ["create", "update", "delete", "reorder", "admin_save",
                                    "chat_forget"])
def test_each_memory_change_invalidates_only_that_member(pair, subscriber, change):
    alice, bob = pair
    alice_key, bob_key = put_l2_entry(alice), put_l2_entry(bob)
    first = actions.member_memories(alice).get()
    before = last_invalidation()
    if change == "create":
        actions.do_create_memory(alice, text="I live in Lyon.")
    elif change == "update":
        actions.do_update_memory(alice, first.pk, pinned=True)
    elif change == "delete":
        actions.do_delete_memory(alice, first.pk)
    elif change == "reorder":
        with transaction.atomic():
            second = Memory.objects.create(tenant=alice.tenant, member=alice, text="x",
                                           position=5)
        invalidated(subscriber, alice, before)  # the new memory's own invalidation
        alice_key, before = put_l2_entry(alice), last_invalidation()
        actions.do_reorder_memories(alice, [second.pk, first.pk])
    elif change == "admin_save":  # a plain model save (shell): the signal still fires
        first.text = "vegan"
        first.save()
    else:
        actions.do_update_tenant(alice.tenant, memory_writes_enabled=True)
        alice.refresh_from_db()
        got = actions.do_memory_from_chat(alice, "Forget that I am vegetarian.")
        assert got["op"] == "forgotten"
    assert invalidated(subscriber, alice, before) == {str(alice.pk)}
    assert kvstore.l2_tier().get(alice_key) is None
    assert kvstore.l2_tier().get(bob_key) is not None  # bob's K/V untouched
