"""Memories in the scoped admin (issue 22): a tenant admin lists, adds, edits and deletes
only their own tenant's members' memories (another tenant's are 404 and never shown),
every write audited with old/new text through the actions. Real Django client, Postgres."""

from __future__ import annotations

import pytest

from tenants import actions
from tenants.models import AuditEvent, AuditLog, Memory
from tests.tenants.conftest import admin_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme_admin(acme, globex):
    return admin_client("acme-admin", "pw-admin-123")


def test_changelist_shows_only_own_tenant(acme_admin, acme, globex):
    actions.do_create_memory(globex.user, text="globex-secret lives in Oslo")
    response = acme_admin.get("/admin/tenants/memory/")
    assert response.status_code == 200
    assert b"acme-secret vegetarian" in response.content
    assert b"acme other secret" in response.content
    assert b"globex" not in response.content
    for query in ("?q=globex", f"?tenant__id__exact={globex.tenant.pk}",
                  "?member__tenant__slug=globex"):
        acme_admin.raise_request_exception = False
        response = acme_admin.get(f"/admin/tenants/memory/{query}")
        assert response.status_code in (200, 302, 400)
        assert b"globex-secret" not in response.content
    assert b"/admin/tenants/memory/" in acme_admin.get("/admin/").content


def test_foreign_memory_pages_are_404_and_untouched(acme_admin, globex):
    theirs = actions.member_memories(globex.user).get()
    for suffix in ("change/", "delete/", "history/"):
        response = acme_admin.get(f"/admin/tenants/memory/{theirs.pk}/{suffix}")
        assert response.status_code == 404 and b"globex" not in response.content
    response = acme_admin.post(f"/admin/tenants/memory/{theirs.pk}/change/",
                               {"text": "pwned", "enabled": "on"})
    assert response.status_code in (403, 404)
    response = acme_admin.post(f"/admin/tenants/memory/{theirs.pk}/delete/", {"post": "yes"})
    assert response.status_code in (403, 404)
    acme_admin.post("/admin/tenants/memory/", {"action": "delete_selected", "post": "yes",
                                              "_selected_action": [theirs.pk]})
    assert Memory.objects.get(pk=theirs.pk).text == "globex-secret loves durian"


def test_add_for_a_foreign_member_is_refused(acme_admin, globex):
    before = Memory.objects.count()
    response = acme_admin.post("/admin/tenants/memory/add/", {
        "member": globex.user.pk, "text": "planted", "enabled": "on"})
    assert response.status_code == 200 and b"Select a valid choice" in response.content
    assert Memory.objects.count() == before


def test_add_edit_delete_audited_with_old_and_new_text(acme_admin, acme):
    response = acme_admin.post("/admin/tenants/memory/add/", {
        "member": acme.user.pk, "text": "Prefers metric units.", "enabled": "on"})
    assert response.status_code == 302, response.content[:2000]
    memory = actions.member_memories(acme.user).get(text="Prefers metric units.")
    assert memory.source == "tenant_admin" and memory.tenant_id == acme.tenant.pk
    response = acme_admin.post(f"/admin/tenants/memory/{memory.pk}/change/", {
        "text": "Prefers imperial units.", "enabled": "on", "pinned": "on"})
    assert response.status_code == 302
    row = AuditLog.objects.get(event_type=AuditEvent.MEMORY_CHANGED)
    assert (row.data["old"]["text"], row.data["new"]["text"]) == (
        "Prefers metric units.", "Prefers imperial units.")
    assert row.actor == acme.admin.user and row.actor_kind == "admin"
    response = acme_admin.post(f"/admin/tenants/memory/{memory.pk}/change/", {
        "text": "   ", "enabled": "on"})
    assert response.status_code == 200 and b"errorlist" in response.content  # blank
    assert Memory.objects.get(pk=memory.pk).text == "Prefers imperial units."
    acme_admin.post("/admin/tenants/memory/", {"action": "disable_memories",
                                              "_selected_action": [memory.pk]})
    assert Memory.objects.get(pk=memory.pk).enabled is False
    response = acme_admin.post(f"/admin/tenants/memory/{memory.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    row = AuditLog.objects.get(event_type=AuditEvent.MEMORY_DELETED)
    assert row.data["old"]["text"] == "Prefers imperial units."
    assert not Memory.objects.filter(pk=memory.pk).exists()


def test_add_beyond_the_limit_is_a_form_error(acme_admin, acme, settings):
    settings.MEMORY_MAX_PER_MEMBER = 1
    response = acme_admin.post("/admin/tenants/memory/add/", {
        "member": acme.user.pk, "text": "one too many", "enabled": "on"})
    assert response.status_code == 200 and b"memories already" in response.content
    assert actions.member_memories(acme.user).count() == 1
