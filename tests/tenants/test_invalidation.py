"""Invalidation runs on commit, never before, on every write path that sends signals.

Observed from outside, on real Redis: a subscriber on the signed control channel (what
every worker's listener receives) and a real L2 entry written with the workers' signer.
"""

from __future__ import annotations

import time

import pytest
import redis
import torch
from django.conf import settings
from django.db import transaction

from gpu_worker.channels import control, kvstore
from injection.base import CacheKey
from injection.kvcache.l2.links import link_hash
from injection.kvcache.packed import PackedKV
from tenants import actions
from tenants.models import (
    AuditEvent,
    AuditLog,
    Conversation,
    KVInvalidation,
    Member,
    Preference,
)

pytestmark = pytest.mark.django_db(transaction=True)


class ControlSubscriber:
    """Collects verified control messages for one tenant."""

    def __init__(self, tenant_id: int) -> None:
        self.tenant = str(tenant_id)
        self.client = redis.Redis.from_url(settings.REDIS_URL)
        self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(control.channel())
        self.pubsub.get_message(timeout=1.0)  # the subscribe confirmation

    def drain(self, wait: float = 0.5, until=None) -> list[dict]:
        """Messages for our tenant within ``wait`` s (sooner once ``until(messages)``)."""
        got, deadline = [], time.monotonic() + wait
        while time.monotonic() < deadline and not (until and until(got)):
            msg = self.pubsub.get_message(timeout=0.05)
            if msg and msg["type"] == "message":
                body = control.verify(msg["data"])
                if body and body.get("tenant") == self.tenant:
                    got.append(body)
        return got

    def close(self) -> None:
        self.pubsub.close()
        self.client.close()


@pytest.fixture
def member():
    tenant = actions.do_create_tenant("acme")
    return actions.do_add_member(tenant, "alice", preference="vegetarian")


@pytest.fixture
def subscriber(member):
    sub = ControlSubscriber(member.tenant_id)
    sub.drain(0.3)  # whatever creating the member published
    yield sub
    sub.close()


def put_l2_entry(member: Member, content_hash: str | None = None) -> CacheKey:
    """A real, signed L2 entry for the member, as a worker would have written it."""
    tier = kvstore.l2_tier()
    key = CacheKey(str(member.tenant_id), str(member.pk),
                   content_hash or member.preference.content_hash, "test-fingerprint")
    kv = PackedKV(torch.zeros(2, 1, 3, 4), torch.ones(2, 1, 3, 4), [1, 2, 3])
    assert tier.put(key, kv)
    assert tier.get(key) is not None
    return key


def test_rolled_back_change_publishes_and_deletes_nothing(member, subscriber):
    key = put_l2_entry(member)

    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        actions.do_set_preference(member, text="vegan")
        assert subscriber.drain(0.3) == []  # not before commit
        raise Boom
    assert subscriber.drain(0.5) == []
    assert kvstore.l2_tier().get(key) is not None
    assert Preference.objects.get(member=member).text == "vegetarian"


def test_committed_change_invalidates_after_commit(member, subscriber):
    key = put_l2_entry(member)
    with transaction.atomic():
        actions.do_set_preference(member, text="vegan")
        assert subscriber.drain(0.3) == []  # inside the transaction: nothing yet
        assert kvstore.l2_tier().get(key) is not None
    messages = subscriber.drain(2.0, until=bool)
    assert [(m["op"], m["user"]) for m in messages] == [("invalidate", str(member.pk))]
    assert kvstore.l2_tier().get(key) is None


@pytest.mark.parametrize("path", ["save", "delete", "queryset_delete", "member_delete",
                                  "member_deactivate", "tenant_deactivate", "clear_action"])
def test_each_signalled_path_invalidates(member, subscriber, path):
    pref = member.preference
    if path == "save":  # e.g. the shell: plain model save, no action
        pref.text = "pescatarian"
        pref.save()
    elif path == "delete":
        pref.delete()
    elif path == "queryset_delete":
        Preference.objects.filter(pk=pref.pk).delete()
    elif path == "member_delete":
        actions.do_delete_member(member)
    elif path == "member_deactivate":
        actions.do_change_member(member, active=False)
    elif path == "tenant_deactivate":
        actions.do_update_tenant(member.tenant, active=False)
    else:
        actions.do_clear_kv_cache([member])
    expected = None if path == "tenant_deactivate" else str(member.pk)
    messages = subscriber.drain(2.0, until=lambda got: any(m["user"] == expected for m in got))
    assert expected in {m["user"] for m in messages if m["op"] == "invalidate"}, messages


def test_queryset_update_sends_no_signal_but_cannot_serve_old_text(member, subscriber):
    """update() bypasses signals: nothing is published, yet the version and the content
    hash (which the workers key K/V by, reading the row fresh) both change."""
    before = Preference.objects.get(member=member)
    Preference.objects.filter(pk=before.pk).update(text="durian")
    after = Preference.objects.get(member=member)
    assert subscriber.drain(0.5) == []
    assert after.version == before.version + 1
    assert after.content_hash != before.content_hash


def test_redis_down_never_breaks_the_write(member, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    pref = actions.do_set_preference(member, text="still saved")  # on_commit is robust
    assert Preference.objects.get(pk=pref.pk).text == "still saved"


def put_link(member: Member, conversation: int, digest: str = "d") -> CacheKey:
    """A real, signed L2 link of the member's stored conversation, as a worker keeps it."""
    tier = kvstore.l2_tier()
    key = CacheKey(str(member.tenant_id), str(member.pk),
                   link_hash(kvstore.conversation_key(conversation), digest), "test-fingerprint")
    kv = PackedKV(torch.zeros(2, 1, 3, 4), torch.ones(2, 1, 3, 4), [1, 2, 3])
    assert tier.put(key, kv, link=True)
    return key


def test_deleting_a_conversation_drops_its_links_only(member):
    """A deleted conversation's K/V links go (an outbox row of kind "links"); its member's
    segment and lean, its other conversations' links and every other member's and tenant's
    entries stay, so nothing is computed again."""
    from injection.kvcache.chain import LEAN_PREFIX

    control.request("stats", timeout=30)  # live workers handled the member's creation
    bob = actions.do_add_member(member.tenant, "bob", preference="vegan")
    other = actions.do_add_member(actions.do_create_tenant("globex"), "carol", preference="x")
    control.request("stats", timeout=30)
    conv, kept_conv = (Conversation.objects.create(tenant=member.tenant, member=member)
                       for _ in range(2))
    gone = [put_link(member, conv.pk, d) for d in ("a", "b")]  # e.g. before and after an edit
    kept = [put_l2_entry(member), put_link(member, kept_conv.pk),
            put_l2_entry(member, LEAN_PREFIX + "x"), put_link(bob, conv.pk),
            put_link(other, conv.pk), put_l2_entry(bob)]
    # subscribed only now: a subscriber that never replies would hold each sync above
    # for its whole timeout (a control request waits for every receiver)
    subscriber = ControlSubscriber(member.tenant_id)
    try:
        subscriber.drain(0.3)
        actions.do_delete_conversation(member, conv.pk)
        messages = subscriber.drain(2.0, until=bool)
    finally:
        subscriber.close()
    assert [(m["op"], m["user"], m.get("conversation")) for m in messages] == [
        ("invalidate", str(member.pk), kvstore.conversation_key(conv.pk))]
    tier = kvstore.l2_tier()
    assert [tier.get(k, link=True) for k in gone] == [None, None]
    assert all(tier.get(k) is not None for k in kept)
    row = KVInvalidation.objects.filter(member_ref=member.pk).latest("id")
    assert (row.kind, row.conversation_ref, row.l2_done_at is not None) == (
        "links", conv.pk, True)


def test_a_conversations_links_row_is_written_and_audited_with_its_deletion(member):
    """The links row and the deletion's audit row commit, or roll back, together."""
    conv = Conversation.objects.create(tenant=member.tenant, member=member)
    rows = KVInvalidation.objects.filter(kind="links", conversation_ref=conv.pk)
    audits = AuditLog.objects.filter(event_type=AuditEvent.CONVERSATION_DELETED,
                                     tenant=member.tenant)
    with pytest.raises(RuntimeError), transaction.atomic():
        actions.do_delete_conversation(member, conv.pk)
        assert rows.count() == 1 and audits.count() == 1
        raise RuntimeError
    assert rows.count() == 0 and audits.count() == 0
    scope_rows = KVInvalidation.objects.filter(member_ref=member.pk, kind="scope").count()
    actions.do_delete_conversation(member, conv.pk)
    assert rows.count() == 1 and audits.get().data["conversation"] == conv.pk
    # the member's whole scope is not invalidated (nor warmed: nothing was rendered from it)
    assert KVInvalidation.objects.filter(member_ref=member.pk, kind="scope").count() == scope_rows


def test_deactivating_a_tenant_drops_its_shared_tenant_segment_and_member_entries(
        member, subscriber):
    """The tenant segment is filed under the reserved user "~tenant", which no member's
    scope covers. Tenants are never deleted (their audit log protects them): deactivating
    one invalidates the whole tenant, segment included (Redis and every L1)."""
    from injection.kvcache.chain import TENANT_USER

    tier = kvstore.l2_tier()
    seg = CacheKey(str(member.tenant_id), TENANT_USER, "instructions-hash", "test-fingerprint")
    assert tier.put(seg, PackedKV(torch.zeros(2, 1, 3, 4), torch.ones(2, 1, 3, 4), [1, 2, 3]))
    mkey = put_l2_entry(member)
    subscriber.drain(0.3)
    actions.do_set_tenant_active(member.tenant, False)
    messages = subscriber.drain(3.0, until=lambda got: any(m["user"] is None for m in got))
    assert ("invalidate", None) in [(m["op"], m["user"]) for m in messages]
    assert tier.get(seg) is None and tier.get(mkey) is None
