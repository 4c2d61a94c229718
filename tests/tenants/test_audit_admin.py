"""The audit log as a tenant admin reads it: exact times, who acted (member, admin, CLI,
system), search over the event's data, preference diffs, CSV export — still scoped to the
tenant and still append-only (real Postgres, real admin and API requests)."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.core.management import call_command
from django.db import DatabaseError, transaction
from django.test import Client

from tenants import actions
from tenants.models import AuditEvent, AuditLog
from tests.tenants.conftest import admin_client, token_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme_admin(acme, globex):
    return admin_client("acme-admin", "pw-admin-123")


def rows_of(response) -> list[dict]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


def test_every_row_names_its_actor_kind(acme, acme_admin):
    call_command("tenant", "adduser", "acme", "acme-cli", stdout=io.StringIO())
    pref = acme.user.preference
    acme_admin.post(f"/admin/tenants/preference/{pref.pk}/change/", {
        "text": "pescatarian", "enabled": "on", "alpha": "1.0", "seen_version": pref.version})
    token_client(acme.other_key).put("/api/preference", data=json.dumps({"text": "tea"}),
                                     content_type="application/json")
    actions.do_set_preference(acme.admin, text="set by a background job")
    kinds = {row.target: row.actor_kind for row in AuditLog.objects.filter(
        tenant=acme.tenant, event_type__in=[AuditEvent.MEMBER_CREATED,
                                            AuditEvent.PREFERENCE_CHANGED,
                                            AuditEvent.PREFERENCE_CREATED]).order_by("id")}
    assert kinds["acme-cli"] == "cli"
    assert kinds["acme/acme-user"] == "admin"
    assert kinds["acme/acme-other"] == "member"
    assert kinds["acme/acme-admin"] == "system"
    page = acme_admin.get("/admin/tenants/auditlog/").content.decode()
    for kind in ("cli", "admin", "member", "system"):
        assert f'<td class="field-actor_kind_label">{kind}</td>' in page
    assert "(system)" in page and "(cli)" in page  # no bare "-" for a missing actor


def test_times_have_seconds_and_zone(acme, acme_admin):
    row = AuditLog.objects.filter(tenant=acme.tenant).first()
    stamp = row.created_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert stamp in acme_admin.get("/admin/tenants/auditlog/").content.decode()
    assert stamp in acme_admin.get(f"/admin/tenants/auditlog/{row.pk}/change/").content.decode()


def test_search_covers_event_type_and_data_within_the_tenant(acme, globex, acme_admin):
    actions.do_set_preference(acme.user, text="loves aubergine")
    actions.do_set_preference(globex.user, text="loves aubergine too")
    cl = acme_admin.get("/admin/tenants/auditlog/?q=aubergine").context["cl"]
    assert [r.tenant for r in cl.result_list] == [acme.tenant]
    cl = acme_admin.get("/admin/tenants/auditlog/?q=preference.chang").context["cl"]
    assert cl.result_count == 1
    # the other tenant's data is not searchable, even by its exact words
    assert acme_admin.get("/admin/tenants/auditlog/?q=durian").context["cl"].result_count == 0


def test_preference_change_reads_as_before_and_after(acme, acme_admin):
    actions.do_set_preference(acme.user, text="acme-secret vegan, no spicy food", alpha=0.5)
    row = AuditLog.objects.get(event_type=AuditEvent.PREFERENCE_CHANGED)
    page = acme_admin.get(f"/admin/tenants/auditlog/{row.pk}/change/").content.decode()
    assert '<del class="kvi-del">vegetarian,</del>' in page
    assert '<ins class="kvi-ins">vegan,</ins>' in page
    assert '<tr class="kvi-changed"><th>alpha</th><td>1.0</td><td>0.5</td>' in page
    assert '<tr class="kvi-same"><th>enabled</th>' in page


def test_csv_export_is_scoped_and_follows_the_filters(acme, globex, acme_admin, superuser):
    rows = rows_of(acme_admin.get("/admin/tenants/auditlog/export.csv"))
    assert rows and {r["tenant"] for r in rows} == {"acme"}
    assert "globex" not in json.dumps(rows)
    assert all(r["actor kind"] in ("member", "admin", "cli", "system") for r in rows)
    assert rows[0]["time"].endswith(" UTC")
    rows = rows_of(acme_admin.get("/admin/tenants/auditlog/export.csv?event_type=member.created"))
    assert sorted(r["target"] for r in rows) == ["acme-admin", "acme-other", "acme-user"]
    root = admin_client("root", "pw-root-123")
    assert {r["tenant"] for r in rows_of(root.get("/admin/tenants/auditlog/export.csv"))} \
        >= {"acme", "globex"}
    anonymous = Client()
    assert anonymous.get("/admin/tenants/auditlog/export.csv").status_code == 302


def test_csv_cells_cannot_become_formulas(acme, acme_admin):
    actions.do_add_member(acme.tenant, "=cmd")
    rows = rows_of(acme_admin.get("/admin/tenants/auditlog/export.csv?q=cmd"))
    assert rows and all(r["target"] == "'=cmd" for r in rows)


def test_still_append_only(acme):
    row = AuditLog.objects.filter(tenant=acme.tenant).first()
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditLog.objects.filter(pk=row.pk).update(actor_kind="admin")
