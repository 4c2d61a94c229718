"""State changes through actions: audited in the same transaction, refused across tenants."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from tenants import actions
from tenants.errors import Conflict, Forbidden, InvalidInput
from tenants.models import AuditEvent, AuditLog, Member, Preference

pytestmark = pytest.mark.django_db


def test_actors_cannot_reach_across_tenants(acme, globex):
    intruder = acme.admin.user
    for call in (
        lambda: actions.do_set_preference(globex.user, text="x", actor=intruder),
        lambda: actions.do_delete_preference(globex.user, actor=intruder),
        lambda: actions.do_change_member(globex.user, active=False, actor=intruder),
        lambda: actions.do_delete_member(globex.user, actor=intruder),
        lambda: actions.do_update_tenant(globex.tenant, name="pwned", actor=intruder),
        lambda: actions.do_clear_kv_cache([globex.user], actor=intruder),
    ):
        with pytest.raises(Forbidden):
            call()
    globex.user.refresh_from_db()
    assert globex.user.active and globex.user.preference.text == "globex-secret loves durian"
    assert not AuditLog.objects.filter(tenant=globex.tenant, actor=intruder).exists()


def test_role_change_syncs_staff_flag_and_is_audited(acme):
    member = actions.do_change_member(acme.user, role="admin", actor=acme.admin.user)
    assert member.user.is_staff
    member = actions.do_change_member(acme.user, role="user", actor=acme.admin.user)
    assert not member.user.is_staff
    rows = AuditLog.objects.filter(event_type=AuditEvent.MEMBER_CHANGED).order_by("id")
    assert [r.data["new"]["role"] for r in rows] == ["admin", "user"]
    with pytest.raises(InvalidInput):
        actions.do_change_member(acme.user, role="owner")


def test_superuser_accounts_are_off_limits_to_tenant_admins(acme):
    root = get_user_model().objects.create_superuser("root-member", "r@example.com", "pw")
    member = Member.objects.create(tenant=acme.tenant, user=root, role="admin")
    with pytest.raises(Forbidden):
        actions.do_change_member(member, active=False, actor=acme.admin.user)
    with pytest.raises(Forbidden):
        actions.do_delete_member(member, actor=acme.admin.user)
    with pytest.raises(InvalidInput):
        actions.do_delete_member(acme.admin, actor=acme.admin.user)  # not yourself


def test_tenant_update_only_known_fields_and_only_changes(acme):
    with pytest.raises(InvalidInput):
        actions.do_update_tenant(acme.tenant, slug="other")
    with pytest.raises(InvalidInput):
        actions.do_update_tenant(acme.tenant, name="  ")
    actions.do_update_tenant(acme.tenant, name="Acme", active=True)  # nothing changes
    assert not AuditLog.objects.filter(event_type=AuditEvent.TENANT_CHANGED).exists()
    actions.do_set_tenant_active(acme.tenant, False)
    row = AuditLog.objects.get(event_type=AuditEvent.TENANT_CHANGED)
    assert row.data == {"old": {"active": True}, "new": {"active": False}}


def test_preference_expected_version_refuses_lost_updates(acme):
    pref = actions.do_set_preference(acme.user, text="first", expected_version=1)
    pref.refresh_from_db()
    assert pref.version == 2
    with pytest.raises(Conflict):
        actions.do_set_preference(acme.user, text="stale edit", expected_version=1)
    assert Preference.objects.get(member=acme.user).text == "first"


def test_member_deletion_audits_the_preference_it_removes(acme):
    actions.do_delete_member(acme.other, actor=acme.admin.user)
    row = AuditLog.objects.get(event_type=AuditEvent.MEMBER_DELETED)
    assert row.data["preference"] == {"text": "acme other secret", "enabled": True,
                                      "alpha": 1.0, "version": 1}
    assert not get_user_model().objects.filter(username="acme-other").exists()


def test_account_change_record_never_holds_password_material(acme):
    row = actions.do_record_account_change(acme.user.user, ["password", "is_active"],
                                           actor=None)
    assert row.data["fields"] == ["is_active"] and row.tenant == acme.tenant
    assert actions.do_record_account_change(acme.user.user, ["password"]) is None
