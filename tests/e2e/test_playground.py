"""The admin playground against a real Celery worker on the demo model: both replies,
the saved preference served from the member's cache, an unsaved edit computed and never
cached, an audit row per use, and history written only when asked."""

from __future__ import annotations

import pytest

from tenants.models import AuditEvent, AuditLog, Conversation, Message
from tests.tenants.conftest import admin_client, make_world

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def acme():
    return make_world("acme", "acme-secret vegetarian, no spicy food")


def compare(client, member, message="What should I cook?", **extra):
    response = client.post("/admin/playground/", {"member": member.pk, "message": message,
                                                   "preference": member.preference.text,
                                                   **extra})
    assert response.status_code == 200
    assert "results" in response.context, (response.context.get("error"),
                                           response.context["form"].errors)
    return response


def test_both_replies_with_tiers_tokens_and_an_audit_row(gpu_worker, acme):
    client = admin_client("acme-admin", "pw-admin-123")
    messages_before = Message.objects.count()
    response = compare(client, acme.user)
    results = response.context["results"]
    mine, plain = results["personalised"], results["plain"]
    assert "error" not in mine and "error" not in plain, (results, gpu_worker.log_tail())
    assert mine["tier"] in ("compute", "l2") and plain["tier"] == "none"
    # the system turn (instructions + preference) is injected as K/V, not prompt text
    assert mine["kv_tokens"] > 0 and plain["kv_tokens"] == 0
    assert mine["prompt_tokens"] > 0 and plain["prompt_tokens"] > 0
    assert mine["completion_tokens"] >= 1 and plain["completion_tokens"] >= 1
    html = response.content.decode()
    assert 'id="kvi-personalised"' in html and 'id="kvi-plain"' in html
    assert f'<dd class="kvi-tier">{mine["tier"]}</dd>' in html
    row = AuditLog.objects.get(event_type=AuditEvent.PLAYGROUND_USED)
    assert (row.actor.username, row.actor_kind, row.target) == ("acme-admin", "admin",
                                                                  "acme/acme-user")
    assert row.data["personalised"]["tier"] == mine["tier"]
    assert row.data["saved_to_history"] is None and "message" not in row.data
    assert Message.objects.count() == messages_before  # no history written
    again = compare(client, acme.user).context["results"]["personalised"]
    # the member's own cache entry, like their chats (L2 when another live worker took it)
    assert again["tier"] in ("l1", "l2")
    # the worker logs no reply text (Celery's success line used to print the result)
    done = [line for line in gpu_worker.log_tail(2000).splitlines() if "succeeded in" in line]
    assert done and not any("reply" in line for line in done)


def test_unsaved_edit_is_computed_every_time_and_never_cached(gpu_worker, acme):
    client = admin_client("acme-admin", "pw-admin-123")
    assert compare(client, acme.other).context["results"]["personalised"]["tier"] \
        in ("compute", "l2")
    for _ in range(2):
        response = compare(client, acme.other, preference="acme other: loves chilli, hot")
        assert response.context["unsaved"] is True
        assert response.context["results"]["personalised"]["tier"] == "compute"
    # the member's cached K/V is still the saved preference's: served from L1
    saved = compare(client, acme.other).context["results"]["personalised"]
    assert saved["tier"] in ("l1", "l2")  # still cached (L2 when another worker took it)
    rows = AuditLog.objects.filter(event_type=AuditEvent.PLAYGROUND_USED).order_by("id")
    assert [r.data["unsaved_preference"] for r in rows] == [False, True, True, False]


def test_history_is_written_only_when_asked(gpu_worker, acme):
    client = admin_client("acme-admin", "pw-admin-123")
    response = compare(client, acme.user, message="Dinner idea?", save="on")
    conv = Conversation.objects.get(pk=response.context["saved"])
    assert conv.member == acme.user and conv.tenant == acme.tenant
    contents = list(conv.messages.values_list("role", "content"))
    reply = response.context["results"]["personalised"]["reply"]
    assert contents == [("user", "Dinner idea?"), ("assistant", reply)]
    row = AuditLog.objects.get(event_type=AuditEvent.PLAYGROUND_USED)
    assert row.data["saved_to_history"] == conv.pk
