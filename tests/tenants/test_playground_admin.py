"""The playground page without a worker: who may open it, which members it offers, the
"try this preference" hand-over, and that a foreign member never reaches a worker."""

from __future__ import annotations

import pytest
from django.test import Client

from tenants.models import AuditEvent, AuditLog
from tests.tenants.conftest import admin_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme_admin(acme, globex):
    return admin_client("acme-admin", "pw-admin-123")


def test_offers_only_own_members(acme_admin, acme, globex):
    page = acme_admin.get("/admin/playground/")
    assert page.status_code == 200
    choices = {m.pk for m in page.context["form"].fields["member"].queryset}
    assert choices == {acme.admin.pk, acme.user.pk, acme.other.pk}
    assert b"globex" not in page.content


def test_opens_on_a_member_with_the_saved_preference(acme_admin, acme):
    page = acme_admin.get(f"/admin/playground/?member={acme.user.pk}")
    form = page.context["form"]
    assert form.initial["preference"] == "acme-secret vegetarian, no spicy food"
    assert form.initial["member"] == acme.user


def test_foreign_members_are_404_and_never_sent(acme_admin, globex):
    before = AuditLog.objects.count()
    for url in (f"/admin/playground/?member={globex.user.pk}", "/admin/playground/?member=x",
                "/admin/playground/?member=999999"):
        response = acme_admin.get(url)
        assert response.status_code == 404 and b"globex" not in response.content
    response = acme_admin.post("/admin/playground/", {"member": globex.user.pk,
                                                      "message": "leak?", "preference": ""})
    assert response.status_code == 200 and "results" not in response.context
    assert "member" in response.context["form"].errors  # not a valid choice: nothing ran
    assert b"globex-secret" not in response.content
    assert AuditLog.objects.count() == before  # nothing audited, nothing enqueued


def test_only_tenant_admins_and_superusers(acme, globex, superuser):
    assert Client().get("/admin/playground/").status_code == 302  # login page
    user = acme.user.user
    user.is_staff = True
    user.save()
    assert admin_client("acme-user", "pw-user-123").get("/admin/playground/").status_code == 403
    root = admin_client("root", "pw-root-123")
    page = root.get(f"/admin/playground/?member={globex.user.pk}")
    assert page.status_code == 200 and page.context["form"].initial["member"] == globex.user


def test_try_this_preference_hands_over_the_unsaved_edit(acme_admin, acme):
    pref = acme.user.preference
    page = acme_admin.get(f"/admin/tenants/preference/{pref.pk}/change/").content.decode()
    assert 'name="_try"' in page
    assert f'formaction="/admin/playground/?member={acme.user.pk}"' in page
    response = acme_admin.post(f"/admin/playground/?member={acme.user.pk}", {
        "_try": "1", "text": "unsaved: loves chilli", "alpha": "0.6", "enabled": "on",
        "seen_version": pref.version})
    form = response.context["form"]
    assert form.initial["preference"] == "unsaved: loves chilli"
    assert form.initial["alpha"] == "0.6" and form.initial["member"] == acme.user
    assert "results" not in response.context  # nothing runs before a message is typed
    pref.refresh_from_db()
    assert pref.text == "acme-secret vegetarian, no spicy food"  # the edit stays unsaved
    assert not AuditLog.objects.filter(event_type=AuditEvent.PLAYGROUND_USED).exists()
