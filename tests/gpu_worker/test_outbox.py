"""The invalidation outbox on real Postgres and Redis: written with the change, delivered
until acknowledged, followed by txid so a late-committing transaction is never skipped."""

from __future__ import annotations

import threading

import pytest
import redis
import torch
from django.db import connection, transaction

from gpu_worker.channels import control, kvstore, outbox
from injection.base import CacheKey
from injection.kvcache.packed import PackedKV
from tenants import actions
from tenants.models import KVInvalidation

pytestmark = pytest.mark.django_db(transaction=True)
FAR = 10**12  # tenant/member ids no real row has: nothing of other tests is evicted


@pytest.fixture
def member():
    tenant = actions.do_create_tenant("obx")
    return actions.do_add_member(tenant, "obx-alice", preference="vegetarian")


def put_l2_entry(member) -> CacheKey:
    # the member's creation was broadcast to the session's live workers, which evict its L2
    # scope when they handle it: a later control request is answered by each of them only
    # after that, so the entry below cannot be deleted under the test by that broadcast
    control.request("stats", timeout=30)
    key = CacheKey(str(member.tenant_id), str(member.pk), member.preference.content_hash, "fp")
    return put(key)


def put(key: CacheKey, link: bool = False) -> CacheKey:
    tier = kvstore.l2_tier()
    kv = PackedKV(torch.zeros(2, 1, 3, 4), torch.ones(2, 1, 3, 4), [1, 2, 3])
    assert tier.put(key, kv, link=link)
    assert tier.flush(30)  # written, not only queued
    return key


def rows_for(member):
    return KVInvalidation.objects.filter(tenant_ref=member.tenant_id, member_ref=member.pk)


def test_row_is_written_with_the_change_and_rolled_back_with_it(member):
    before = rows_for(member).count()
    with pytest.raises(RuntimeError), transaction.atomic():
        actions.do_set_preference(member, text="vegan")
        assert rows_for(member).count() > before  # same transaction
        raise RuntimeError
    assert rows_for(member).count() == before
    actions.do_set_preference(member, text="vegan")
    row = rows_for(member).latest("id")
    assert row.txid > 0 and row.l2_done_at is not None  # Redis up: acknowledged at once


def test_redis_down_keeps_the_row_pending_until_a_sweep_deletes_l2(member, settings,
                                                                   monkeypatch):
    key = put_l2_entry(member)
    live = settings.REDIS_URL
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there: an outage
    actions.do_delete_preference(member)  # stored and audited
    row = rows_for(member).latest("id")
    assert row.l2_done_at is None
    monkeypatch.setattr(outbox, "SWEEP_GRACE_SECONDS", 0.0)
    with transaction.atomic():
        # the row locked here: the session's live workers' sweeps skip it (SKIP LOCKED),
        # so only this test's sweeps may deliver it
        KVInvalidation.objects.select_for_update().get(pk=row.pk)
        with pytest.raises(redis.RedisError):  # the sweep cannot acknowledge it either
            outbox.sweep()
        row.refresh_from_db()
        assert row.l2_done_at is None
        settings.REDIS_URL = live
        # the session's live workers reach Redis: their outbox followers may have evicted
        # the member's L2 scope already (when they poll is not the test's to decide), so
        # the entry is written again; the sweep, now that Redis answers, deletes it
        put(key)  # (flushed: written, not only queued)
        assert outbox.sweep() >= 1
        assert kvstore.l2_tier().get(key) is None
    row.refresh_from_db()
    assert row.l2_done_at is not None
    assert outbox.sweep() == 0  # acknowledged rows are not delivered again


def test_follower_applies_each_committed_row_once_even_when_it_commits_late():
    applied: list[tuple[str, str | None]] = []
    follower = outbox.OutboxFollower(lambda t, u, c: applied.append((t, u)), interval=0)
    follower.poll_once()  # sets the cursor
    inserted, release = threading.Event(), threading.Event()

    def slow_writer():
        try:
            with transaction.atomic():
                actions.invalidate_on_commit(FAR, FAR + 1)
                inserted.set()
                release.wait(20)
        finally:
            connection.close()

    thread = threading.Thread(target=slow_writer)
    thread.start()
    assert inserted.wait(20)
    actions.invalidate_on_commit(FAR, FAR + 2)  # a larger id, committed first
    assert follower.poll_once() == 1
    assert applied == [(str(FAR), str(FAR + 2))]
    release.set()
    thread.join(20)
    late = KVInvalidation.objects.get(member_ref=FAR + 1)
    assert late.pk < KVInvalidation.objects.get(member_ref=FAR + 2).pk  # a cursor on id skips it
    assert follower.poll_once() == 1
    assert applied[-1] == (str(FAR), str(FAR + 1))
    assert follower.poll_once() == 0  # nothing twice


def test_follower_skips_a_row_a_broadcast_already_applied_and_whole_tenant_rows():
    applied: list[tuple[str, str | None]] = []
    follower = outbox.OutboxFollower(lambda t, u, c: applied.append((t, u)), interval=0)
    follower.poll_once()
    actions.invalidate_on_commit(FAR, FAR + 3)
    broadcast = []  # its broadcast, applied here first
    follower.apply_once(KVInvalidation.objects.get(member_ref=FAR + 3).pk,
                        lambda: broadcast.append(1))
    assert broadcast == [1]
    actions.invalidate_on_commit(FAR + 4)  # member None: the whole tenant
    assert follower.poll_once() == 1
    assert applied == [(str(FAR + 4), None)]


def test_follower_hands_a_links_row_its_conversation():
    applied: list[tuple[str, str | None, str | None]] = []
    follower = outbox.OutboxFollower(lambda t, u, c: applied.append((t, u, c)), interval=0)
    follower.poll_once()
    actions.invalidate_on_commit(FAR + 5, FAR + 6, conversation_id=FAR + 7)
    actions.invalidate_on_commit(FAR + 5, FAR + 6)
    assert follower.poll_once() == 2
    assert applied == [(str(FAR + 5), str(FAR + 6), kvstore.conversation_key(FAR + 7)),
                       (str(FAR + 5), str(FAR + 6), None)]
    with pytest.raises(ValueError):  # a conversation's links are its member's
        actions.invalidate_on_commit(FAR + 5, conversation_id=FAR + 7)


def test_a_pending_links_row_is_swept_as_its_conversations_links_only(member, settings,
                                                                      monkeypatch):
    from injection.kvcache.l2.links import link_hash
    from tenants.models import Conversation

    segment = put_l2_entry(member)
    conv = Conversation.objects.create(tenant=member.tenant, member=member)
    tenant, user = str(member.tenant_id), str(member.pk)
    gone, kept = (put(CacheKey(tenant, user, link_hash(kvstore.conversation_key(c), "a"), "fp"),
                      link=True) for c in (conv.pk, conv.pk + 1))
    live = settings.REDIS_URL
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # an outage: the fast path cannot deliver
    actions.do_delete_conversation(member, conv.pk)
    row = KVInvalidation.objects.get(kind="links", conversation_ref=conv.pk)
    assert row.l2_done_at is None and row.member_ref == member.pk
    settings.REDIS_URL = live
    monkeypatch.setattr(outbox, "SWEEP_GRACE_SECONDS", 0.0)
    outbox.sweep()  # (or a live worker's agent did, a little earlier)
    row.refresh_from_db()
    tier = kvstore.l2_tier()
    assert row.l2_done_at is not None and tier.get(gone, link=True) is None
    assert tier.get(kept, link=True) is not None and tier.get(segment) is not None
