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
from injection.kvcache.packed import PackedKV
from tenants import actions
from tenants.models import Member, Preference

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


def put_l2_entry(member: Member) -> CacheKey:
    """A real, signed L2 entry for the member, as a worker would have written it."""
    tier = kvstore.l2_tier()
    key = CacheKey(str(member.tenant_id), str(member.pk), member.preference.content_hash,
                   "test-fingerprint")
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


def test_deleting_a_conversation_drops_the_members_kv_links(member, subscriber):
    """A conversation's K/V links are filed under its member: deleting it invalidates the
    member's scope after commit (Redis entries of that member gone)."""
    from tenants.models import Conversation

    conv = Conversation.objects.create(tenant=member.tenant, member=member, title="t")
    key = put_l2_entry(member)
    subscriber.drain(0.3)
    actions.do_delete_conversation(member, conv.pk)
    messages = subscriber.drain(2.0, until=bool)
    assert [(m["op"], m["user"]) for m in messages] == [("invalidate", str(member.pk))]
    assert kvstore.l2_tier().get(key) is None



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
