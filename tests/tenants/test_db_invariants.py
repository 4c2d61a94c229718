"""Invariants enforced by Postgres itself, whatever the write path."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, transaction

from tenants import actions
from tenants.models import AuditLog, Preference

pytestmark = pytest.mark.django_db


@pytest.fixture
def member():
    tenant = actions.do_create_tenant("acme")
    return actions.do_add_member(tenant, "alice", preference="tea")


def test_preference_version_bumped_by_every_write_path(member):
    pref = member.preference
    assert pref.version == 1
    actions.do_set_preference(member, text="coffee")
    pref.refresh_from_db()
    assert pref.version == 2
    Preference.objects.filter(pk=pref.pk).update(text="water")  # bypasses signals and actions
    pref.refresh_from_db()
    assert (pref.version, pref.text) == (3, "water")
    Preference.objects.filter(pk=pref.pk).update(version=1)  # cannot be rolled back by hand
    pref.refresh_from_db()
    assert pref.version == 3
    Preference.objects.filter(pk=pref.pk).update(enabled=False)
    pref.refresh_from_db()
    assert pref.version == 4


def test_audit_log_is_append_only(member):
    row = AuditLog.objects.filter(tenant=member.tenant).first()
    assert row is not None
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditLog.objects.filter(pk=row.pk).update(target="forged")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditLog.objects.filter(pk=row.pk).delete()
    row.refresh_from_db()
    assert row.target == str(member)


def test_preference_change_audited_old_to_new(member):
    actions.do_set_preference(member, text="coffee", alpha=0.5)
    row = AuditLog.objects.filter(event_type="preference.changed").get()
    assert row.data["old"]["text"] == "tea"
    assert row.data["new"] == {"text": "coffee", "enabled": True, "alpha": 0.5}
    assert row.data["version"] == 2


def test_alpha_range_checked(member):
    from tenants.errors import InvalidInput

    with pytest.raises(InvalidInput):
        actions.do_set_preference(member, alpha=1.5)
    with pytest.raises(DatabaseError), transaction.atomic():
        Preference.objects.filter(pk=member.preference.pk).update(alpha=2.0)
