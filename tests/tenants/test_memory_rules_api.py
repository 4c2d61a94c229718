"""The rules read from a member's memories through the API (issue 57): shown on
``GET /api/memories`` and ``GET /api/preference``, switched by ``PATCH`` (``rules_enabled``),
audited; another member's or tenant's memory is a 404 and stays switched on; the tenant's
instruction rules are never in a member's answer. Real DRF and Postgres."""

from __future__ import annotations

import json

import pytest

from gpu_worker.serving.chat_service import load_memories
from injection.prompting.rules import NONE
from tenants import actions
from tenants.models import AuditEvent, AuditLog, Memory
from tests.tenants.conftest import token_client

pytestmark = pytest.mark.django_db

LOWER = "Always answer in lowercase."


def patch(client, url: str, body: dict):
    return client.patch(url, data=json.dumps(body), content_type="application/json")


def test_memories_and_preference_show_their_rules(acme):
    client = token_client(acme.user_key)
    actions.do_set_preference(acme.user, text=LOWER)
    actions.do_create_memory(acme.user, text="Reply in French.")
    actions.do_create_memory(acme.user, text="I live in Lyon.")
    shown = [m["rules"] for m in client.get("/api/memories").json()["results"]]
    assert shown == [
        {"constraints": ["lowercase"], "language": None, "standing": True, "enabled": True},
        {"constraints": [], "language": "French", "standing": True, "enabled": True},
        {"constraints": [], "language": None, "standing": False, "enabled": True}]
    assert client.get("/api/preference").json()["rules"] == shown[0]


def test_a_member_switches_a_memorys_rules_off_and_on(acme):
    client = token_client(acme.user_key)
    first = actions.member_memories(acme.user).get()
    actions.do_set_preference(acme.user, text=LOWER)
    url = f"/api/memories/{first.pk}"
    response = patch(client, url, {"rules_enabled": False})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["rules"] == {"constraints": ["lowercase"], "language": None,
                             "standing": True, "enabled": False}
    assert body["enabled"] is True and body["text"] == LOWER  # the memory stays
    assert load_memories(acme.user)[0].rules == NONE
    row = AuditLog.objects.get(event_type=AuditEvent.MEMORY_RULES_SWITCHED)
    assert row.actor_id == acme.user.user_id and row.actor_kind == "member"
    assert client.get("/api/preference").json()["rules"]["enabled"] is False
    response = patch(client, "/api/preference", {"rules_enabled": True})
    assert response.status_code == 200 and response.json()["rules"]["enabled"] is True
    assert load_memories(acme.user)[0].rules.constraints == ("lowercase",)
    # with other fields, in one request
    response = patch(client, url, {"pinned": True, "rules_enabled": False})
    assert response.status_code == 200 and response.json()["pinned"] is True
    assert response.json()["rules"]["enabled"] is False


def test_bad_switches_and_unknown_fields_are_400s_that_change_nothing(acme):
    client = token_client(acme.user_key)
    first = actions.member_memories(acme.user).get()
    url = f"/api/memories/{first.pk}"
    for body in ({"rules_enabled": "no"}, {"rules_enabled": 0}, {"rules": {"enabled": False}},
                 {"rules_enabled": False, "typo": 1}):
        response = patch(client, url, body)
        assert response.status_code == 400, body
        assert set(response.json()["error"]["fields"]) & {"rules_enabled", "rules", "typo"}
    # a new memory is created with its rules on: the switch is a PATCH of one that exists
    response = client.post("/api/memories", data=json.dumps(
        {"text": "hi", "rules_enabled": False}), content_type="application/json")
    assert response.status_code == 400 and "rules_enabled" in response.json()["error"]["fields"]
    assert Memory.objects.get(pk=first.pk).rules_enabled is True
    assert not AuditLog.objects.filter(event_type=AuditEvent.MEMORY_RULES_SWITCHED).exists()
    actions.do_set_preference(acme.user, text="")  # no text: nothing to switch
    response = patch(client, "/api/preference", {"rules_enabled": False})
    assert response.status_code == 400 and "rules_enabled" in response.json()["error"]["fields"]


def test_another_members_or_tenants_memory_is_a_404(acme, globex):
    client = token_client(acme.user_key)
    for member in (acme.other, globex.user):
        theirs = actions.member_memories(member).get()
        response = patch(client, f"/api/memories/{theirs.pk}", {"rules_enabled": False})
        assert response.status_code == 404
        assert Memory.objects.get(pk=theirs.pk).rules_enabled is True
    assert not AuditLog.objects.filter(event_type=AuditEvent.MEMORY_RULES_SWITCHED).exists()


def test_members_never_see_the_tenants_instruction_rules(acme):
    actions.do_set_tenant_instructions(acme.tenant, "Never use the word 'basically'. "
                                                    "Answer in German.")
    client = token_client(acme.user_key)
    for url in ("/api/memories", "/api/preference", "/api/me"):
        response = client.get(url)
        assert response.status_code == 200
        assert b"basically" not in response.content and b"German" not in response.content
    assert client.get("/api/tenant/instructions").status_code == 403  # admins only
