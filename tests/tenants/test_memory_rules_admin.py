"""The rules read from memories, preferences and tenant instructions in the scoped admin
(issue 57): shown read-only (and in the playground), switched off and on per memory (change
page or list action), audited as the admin; another tenant's memories and tenant stay
untouched and unseen.
Real Django client, Postgres."""

from __future__ import annotations

import pytest

from tenants import actions
from tenants.models import AuditEvent, AuditLog, Memory, Preference, Tenant
from tests.tenants.conftest import admin_client

pytestmark = pytest.mark.django_db

LOWER = "Always answer in lowercase."


@pytest.fixture
def acme_admin(acme, globex):
    actions.do_set_preference(acme.user, text=LOWER)
    actions.do_set_preference(globex.user, text="Never use commas.")
    return admin_client("acme-admin", "pw-admin-123")


def switches() -> list[tuple]:
    return list(AuditLog.objects.filter(event_type=AuditEvent.MEMORY_RULES_SWITCHED).order_by(
        "id").values_list("actor_kind", "data__new__rules_enabled"))


def test_memory_page_shows_the_rules_and_switches_them(acme_admin, acme):
    memory = actions.member_memories(acme.user).get()
    url = f"/admin/tenants/memory/{memory.pk}/change/"
    page = acme_admin.get(url).content.decode()
    assert "lowercase, standing instruction" in page and 'name="rules_enabled"' in page
    assert "lowercase" in acme_admin.get("/admin/tenants/memory/").content.decode()
    response = acme_admin.post(url, {"text": LOWER, "enabled": "on"})  # the box unchecked
    assert response.status_code == 302
    assert Memory.objects.get(pk=memory.pk).rules_enabled is False
    assert "lowercase, standing instruction (off)" in acme_admin.get("/admin/tenants/memory/").content.decode()
    acme_admin.post("/admin/tenants/memory/", {"action": "rules_on",
                                              "_selected_action": [memory.pk]})
    assert Memory.objects.get(pk=memory.pk).rules_enabled is True
    assert switches() == [("admin", False), ("admin", True)]
    row = AuditLog.objects.filter(event_type=AuditEvent.MEMORY_RULES_SWITCHED).first()
    assert row.actor == acme.admin.user and row.tenant == acme.tenant


def test_preference_page_shows_its_first_memorys_rules_and_switch(acme_admin, acme):
    pref = Preference.objects.get(member=acme.user)
    url = f"/admin/tenants/preference/{pref.pk}/change/"
    page = acme_admin.get(url).content.decode()
    assert "lowercase, standing instruction" in page and 'name="rules_enabled"' in page
    response = acme_admin.post(url, {"text": LOWER, "enabled": "on", "alpha": "1.0",
                                     "seen_version": pref.version})
    assert response.status_code == 302
    assert actions.preference_rules(acme.user)["enabled"] is False
    assert switches() == [("admin", False)]


def test_another_tenants_memories_are_neither_shown_nor_switched(acme_admin, globex):
    theirs = actions.member_memories(globex.user).get()
    assert acme_admin.get(f"/admin/tenants/memory/{theirs.pk}/change/").status_code == 404
    response = acme_admin.post(f"/admin/tenants/memory/{theirs.pk}/change/",
                               {"text": "Never use commas.", "enabled": "on"})
    assert response.status_code in (403, 404)
    acme_admin.post("/admin/tenants/memory/", {"action": "rules_off",
                                              "_selected_action": [theirs.pk]})
    assert Memory.objects.get(pk=theirs.pk).rules_enabled is True
    assert b"no_comma" not in acme_admin.get("/admin/tenants/memory/").content
    assert switches() == []


def test_instruction_rules_shown_to_the_admin_and_switched_for_their_tenant_only(
        acme_admin, acme, globex):
    actions.do_set_tenant_instructions(acme.tenant, "Never use the word 'basically'.")
    actions.do_set_tenant_instructions(globex.tenant, "Answer in German.")
    page = acme_admin.get(f"/admin/tenants/tenant/{acme.tenant.pk}/change/").content.decode()
    assert "instruction rules read" in page.lower()
    acme_admin.post("/admin/tenants/tenant/", {
        "action": "instruction_rules_off",
        "_selected_action": [acme.tenant.pk, globex.tenant.pk]})
    assert Tenant.objects.get(pk=acme.tenant.pk).instruction_rules_enabled is False
    assert Tenant.objects.get(pk=globex.tenant.pk).instruction_rules_enabled is True
    assert acme_admin.get(f"/admin/tenants/tenant/{globex.tenant.pk}/change/").status_code == 404
    page = acme_admin.get(f"/admin/tenants/tenant/{acme.tenant.pk}/change/").content.decode()
    assert "switched off" in page


def test_the_playground_lists_the_members_memory_rules(acme_admin, acme):
    memory = actions.member_memories(acme.user).get()
    actions.do_set_memory_rules_enabled(acme.user, memory.pk, False)
    page = acme_admin.get(f"/admin/playground/?member={acme.user.pk}")
    assert page.context["member_rules"] == [{
        "id": memory.pk, "text": LOWER, "rules": "lowercase, standing instruction (off)",
        "enabled": True}]
    assert "lowercase, standing instruction (off)" in page.content.decode()
    assert acme_admin.get("/admin/playground/").context["member_rules"] == []  # no member
