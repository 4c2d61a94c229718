"""Tenant instructions: tenant admins edit them (API and admin), versioned, audited, scoped,
invalidated after commit; a chat that cannot fit the model's context is refused up front."""

from __future__ import annotations

import json

import pytest
from django.db import transaction

from tenants import actions
from tenants.models import AuditEvent, AuditLog, Tenant
from tests.tenants.conftest import admin_client, token_client
from tests.tenants.test_invalidation import ControlSubscriber

URL = "/api/tenant/instructions"


def put(client, body):
    return client.put(URL, data=json.dumps(body), content_type="application/json")


@pytest.mark.django_db
def test_tenant_admin_sets_and_reads_instructions_with_versions_and_audit(acme, globex):
    client = token_client(acme.admin_key)
    assert client.get(URL).json() == {"instructions": "", "version": 1}
    response = put(client, {"instructions": "You are Acme's travel assistant."})
    assert response.status_code == 200
    assert response.json() == {"instructions": "You are Acme's travel assistant.", "version": 2}
    row = AuditLog.objects.get(event_type=AuditEvent.TENANT_INSTRUCTIONS_CHANGED)
    assert row.tenant == acme.tenant and row.actor == acme.admin.user
    assert row.data == {"old": "", "new": "You are Acme's travel assistant.", "version": 2}
    # unchanged text: no new version, no audit row
    assert put(client, {"instructions": "You are Acme's travel assistant."}).json()["version"] == 2
    assert AuditLog.objects.filter(event_type=AuditEvent.TENANT_INSTRUCTIONS_CHANGED).count() == 1
    # another tenant's admin sees and changes only their own
    assert token_client(globex.admin_key).get(URL).json() == {"instructions": "", "version": 1}
    assert Tenant.objects.get(pk=globex.tenant.pk).instructions == ""


@pytest.mark.django_db
def test_members_cannot_and_bad_input_is_refused(acme):
    assert token_client(acme.user_key).get(URL).status_code == 403
    assert put(token_client(acme.user_key), {"instructions": "x"}).status_code == 403
    admin = token_client(acme.admin_key)
    too_long = put(admin, {"instructions": "x" * (actions.INSTRUCTIONS_MAX_CHARS + 1)})
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "invalid_input"
    for bad in ({"instructions": 42}, {"instructions": "x\x00"}, {},
                {"instructions": "v", "expected_version": "1"}):
        response = put(admin, bad)
        assert response.status_code == 400, bad  # strict JSON types, no coercion
    assert put(admin, {"instructions": "v2"}).json()["version"] == 2
    stale = put(admin, {"instructions": "v3", "expected_version": 1})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "conflict"
    assert Tenant.objects.get(pk=acme.tenant.pk).instructions == "v2"


@pytest.mark.django_db
def test_queryset_update_still_bumps_the_version(acme):
    Tenant.objects.filter(pk=acme.tenant.pk).update(instructions="Be brief.")
    assert Tenant.objects.get(pk=acme.tenant.pk).instructions_version == 2
    Tenant.objects.filter(pk=acme.tenant.pk).update(name="Acme 2")  # other fields: no bump
    assert Tenant.objects.get(pk=acme.tenant.pk).instructions_version == 2


@pytest.mark.django_db
def test_tenant_admin_edits_instructions_in_the_admin(acme, globex):
    client = admin_client("acme-admin", "pw-admin-123")
    page = client.get(f"/admin/tenants/tenant/{acme.tenant.pk}/change/")
    assert page.status_code == 200 and b"instructions" in page.content
    assert b"system turn" in page.content  # the help text explains what they do
    response = client.post(f"/admin/tenants/tenant/{acme.tenant.pk}/change/", {
        "name": "Acme", "audit_message_text": "", "instructions": "Answer in French."})
    assert response.status_code == 302
    tenant = Tenant.objects.get(pk=acme.tenant.pk)
    assert (tenant.instructions, tenant.instructions_version) == ("Answer in French.", 2)
    assert AuditLog.objects.filter(tenant=tenant, actor=acme.admin.user,
                                   event_type=AuditEvent.TENANT_INSTRUCTIONS_CHANGED).exists()
    assert client.get(f"/admin/tenants/tenant/{globex.tenant.pk}/change/").status_code in (
        302, 404)


@pytest.mark.django_db(transaction=True)
def test_changing_instructions_invalidates_the_whole_tenant_after_commit(acme):
    sub = ControlSubscriber(acme.tenant.pk)
    try:
        sub.drain(0.3)
        with transaction.atomic():
            actions.do_set_tenant_instructions(acme.tenant, "Be brief.")
            assert sub.drain(0.3) == []  # never before commit
        messages = sub.drain(2.0, until=bool)
        assert [(m["op"], m["user"]) for m in messages] == [("invalidate", None)]
    finally:
        sub.close()


@pytest.mark.django_db
def test_chat_that_cannot_fit_the_context_is_refused_before_dispatch(acme, settings,
                                                                      demo_model_path):
    settings.MODEL_PATH = str(demo_model_path)  # 2048 positions
    settings.CHAT_MAX_MESSAGE_CHARS = 100_000
    client = token_client(acme.user_key)
    body = {"message": "vegetables " * 2100, "max_new_tokens": 16}
    response = client.post("/api/chat", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["context_tokens"] == 2048
    assert error["needed_tokens"] > 2048
    assert not AuditLog.objects.filter(event_type=AuditEvent.CHAT_REQUEST).exists()


def test_a_chat_with_an_unknown_field_is_refused_naming_it(acme):
    """A typo ("contrats") is a 400 naming the field, never silently ignored (found by the
    live fuzzer: a body with odd extra keys reached the worker)."""
    client = token_client(acme.user_key)
    body = {"message": "hi", "contrats": 2}
    response = client.post("/api/chat", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 400
    assert "contrats" in response.json()["error"]["fields"]
    assert not AuditLog.objects.filter(event_type=AuditEvent.CHAT_REQUEST).exists()
