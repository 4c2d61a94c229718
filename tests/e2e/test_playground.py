"""The admin playground against a real Celery worker on the demo model: both replies,
the saved preference served from the member's cache, an unsaved edit computed and never
cached, an audit row per use, and history written only when asked."""

from __future__ import annotations

import json

import pytest
import requests

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


def _events(response) -> tuple[list[str], dict]:
    """(delta texts, done body) of one server-sent-event reply."""
    assert response["Content-Type"] == "text/event-stream"
    deltas, done = [], None
    for block in b"".join(response).decode().split("\n\n"):
        if not block.strip():
            continue
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        value = json.loads(fields["data"])
        if fields["event"] == "delta":
            deltas.append(value)
        else:
            assert fields["event"] == "done" and done is None
            done = value
    return deltas, done


def test_streamed_run_relays_both_replies_and_is_recorded_once(gpu_worker, acme):
    client = admin_client("acme-admin", "pw-admin-123")
    bad = client.post("/admin/playground/start/", {"member": acme.user.pk, "message": ""})
    assert bad.status_code == 400 and "message" in bad.json()["errors"]
    start = client.post("/admin/playground/start/", {
        "member": acme.user.pk, "message": "What should I cook?",
        "preference": acme.user.preference.text})
    assert start.status_code == 200, start.content
    run = start.json()
    assert run["member"] == "acme/acme-user" and run["unsaved"] is False
    # another tenant's admin cannot read or record this run (it lives in acme's session)
    globex = make_world("globex", "globex-secret loves durian")
    intruder = admin_client("globex-admin", "pw-admin-123")
    assert intruder.get(run["streams"]["personalised"]).status_code == 404
    assert intruder.post(run["record"]).status_code == 404

    done = {}
    for variant, url in run["streams"].items():
        deltas, done[variant] = _events(client.get(url))
        assert "error" not in done[variant], (done[variant], gpu_worker.log_tail())
        assert deltas and "".join(deltas) == done[variant]["reply"]  # pieces, then the whole
        assert done[variant]["ttft_ms"] > 0
    assert done["personalised"]["tier"] in ("compute", "l2") and done["plain"]["tier"] == "none"
    assert done["personalised"]["kv_tokens"] > 0

    assert client.post(run["record"]).json() == {"recorded": True, "saved": None}
    assert client.post(run["record"]).status_code == 404  # recorded once, then forgotten
    row = AuditLog.objects.get(event_type=AuditEvent.PLAYGROUND_USED)
    assert row.tenant == acme.tenant and row.actor.username == "acme-admin"
    assert row.data["personalised"]["tier"] == done["personalised"]["tier"]
    assert row.data["plain"]["ttft_ms"] == done["plain"]["ttft_ms"]
    assert not AuditLog.objects.filter(tenant=globex.tenant,
                                       event_type=AuditEvent.PLAYGROUND_USED).exists()


def test_streamed_run_under_uvicorn_sends_pieces_before_the_result(asgi_server, gpu_worker, acme):
    """As deployed: the admin's stream is relayed from the event loop (tenants.api.streaming)."""
    base = asgi_server.url
    browser = requests.Session()
    browser.get(f"{base}/admin/login/", timeout=10)
    login = browser.post(f"{base}/admin/login/?next=/admin/", timeout=10, data={
        "username": "acme-admin", "password": "pw-admin-123",
        "csrfmiddlewaretoken": browser.cookies["csrftoken"]})
    assert login.status_code == 200 and "sessionid" in browser.cookies
    csrf = {"csrfmiddlewaretoken": browser.cookies["csrftoken"]}
    start = browser.post(f"{base}/admin/playground/start/", timeout=10, data={
        **csrf, "member": acme.user.pk, "message": "Tell me a story.",
        "preference": acme.user.preference.text})
    assert start.status_code == 200, start.text
    run = start.json()
    for variant, url in run["streams"].items():
        with browser.get(base + url, stream=True, timeout=120) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            kinds = [line[len(b"event: "):].decode() for line in response.iter_lines()
                     if line.startswith(b"event: ")]
        assert kinds[0] == "delta" and kinds[-1] == "done" and kinds.count("done") == 1, variant
    assert browser.post(base + run["record"], data=csrf, timeout=30).json()["recorded"] is True
    assert AuditLog.objects.filter(event_type=AuditEvent.PLAYGROUND_USED,
                                   tenant=acme.tenant).count() == 1
