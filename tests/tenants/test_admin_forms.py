"""Tokens (name, expiry, last used, key shown once with a copy button), human validation
messages (never a constraint name), alpha's help and cap, and the admin's 403/404 pages."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.test import Client
from django.utils import timezone

from tenants import actions
from tenants.models import ApiToken, AuditEvent, AuditLog, Preference
from tests.tenants.conftest import admin_client, token_client

pytestmark = pytest.mark.django_db
CONSTRAINTS = (b"preference_alpha_range", b"preference_one_per_member",
               b"member_unique_per_tenant", b"apitoken_prefix_per_tenant", b"Constraint")


@pytest.fixture
def acme_admin(acme, globex):
    return admin_client("acme-admin", "pw-admin-123")


def issue(client, member, **fields):
    future = timezone.localtime(timezone.now() + dt.timedelta(days=30))
    data = {"member": member.pk, "name": "mobile app",
            "expires_at_0": future.strftime("%Y-%m-%d"),
            "expires_at_1": future.strftime("%H:%M:%S"), **fields}
    return client.post("/admin/tenants/apitoken/add/", data)


def test_new_token_is_shown_once_with_a_copy_button(acme_admin, acme):
    response = issue(acme_admin, acme.user)
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    html = response.content.decode()
    key = re.search(r'id="kvi-new-key" value="(kvi_[^"]+)"', html).group(1)
    assert 'id="kvi-copy-key"' in html and "navigator.clipboard.writeText" in html
    token = ApiToken.objects.get(key_hash=ApiToken.hash_key(key))
    assert (token.name, token.member) == ("mobile app", acme.user)
    assert token.expires_at > timezone.now() + dt.timedelta(days=29)
    assert token_client(key).get("/api/me").status_code == 200
    listing = acme_admin.get("/admin/tenants/apitoken/").content.decode()
    assert key not in listing  # not in a session message either: shown only once
    assert "mobile app" in listing and '<td class="field-status">active</td>' in listing
    token.refresh_from_db()
    assert token.last_used_at is not None  # shown in the list's "last used" column
    row = AuditLog.objects.filter(event_type=AuditEvent.TOKEN_CREATED).latest("id")
    assert row.data["name"] == "mobile app" and row.data["expires_at"]


def test_expired_tokens_are_refused(acme):
    key = actions.do_create_api_token(acme.user, name="ci",
                                      expires_at=timezone.now() + dt.timedelta(hours=1))
    assert token_client(key).get("/api/me").status_code == 200
    ApiToken.objects.filter(key_hash=ApiToken.hash_key(key)).update(
        expires_at=timezone.now() - dt.timedelta(seconds=1))
    response = token_client(key).get("/api/me")
    assert response.status_code == 401 and "expired" in response.content.decode()


def test_expiry_in_the_past_is_a_form_error(acme_admin, acme):
    before = ApiToken.objects.count()
    response = issue(acme_admin, acme.user, expires_at_0="2001-01-01", expires_at_1="00:00")
    assert response.status_code == 200
    assert "Pick a moment in the future" in response.content.decode()
    assert ApiToken.objects.count() == before


def test_validation_errors_read_as_sentences(acme_admin, acme):
    pref = acme.user.preference
    response = acme_admin.post(f"/admin/tenants/preference/{pref.pk}/change/", {
        "text": "x", "enabled": "on", "alpha": "1.5", "seen_version": pref.version})
    assert response.status_code == 200
    assert b"Ensure this value is less than or equal to 1.0." in response.content
    Preference.objects.filter(member=acme.admin).delete()
    for member, alpha in ((acme.user, "0.5"), (acme.admin, "-1")):
        response = acme_admin.post("/admin/tenants/preference/add/", {
            "member": member.pk, "text": "tea", "enabled": "on", "alpha": alpha})
        assert response.status_code == 200
        for name in CONSTRAINTS:
            assert name not in response.content
    assert b"already has a preference" in acme_admin.post("/admin/tenants/preference/add/", {
        "member": acme.user.pk, "text": "tea", "enabled": "on", "alpha": "1"}).content


def test_alpha_help_explains_the_cap(acme_admin, acme, settings):
    pref = acme.user.preference
    page = acme_admin.get(f"/admin/tenants/preference/{pref.pk}/change/").content.decode()
    assert "caps alpha at 1 (KV_ALPHA_CAP): any value is applied as stored" in page
    settings.KV_ALPHA_CAP = 0.7
    page = acme_admin.get(f"/admin/tenants/preference/{pref.pk}/change/").content.decode()
    assert "a higher value is stored as entered but applied as 0.7" in page
    assert "0.7 (stored 1, capped by KV_ALPHA_CAP=0.7)" in page


def test_admin_403_and_404_pages_look_like_the_admin(acme_admin, acme, globex):
    pk = globex.user.preference.pk
    for url in (f"/admin/tenants/preference/{pk}/change/", "/admin/no-such-page/"):
        response = acme_admin.get(url)
        assert response.status_code == 404
        html = response.content.decode()
        assert 'id="kvi-error-status">404' in html and "kvinject administration" in html
        assert "globex" not in html
    user = acme.user.user
    user.is_staff = True
    user.save()
    response = admin_client("acme-user", "pw-user-123").get("/admin/usage/")
    assert response.status_code == 403 and 'id="kvi-error-status">403' in response.content.decode()
    api = Client().get("/api/nothing-here")
    assert api.status_code == 404 and api.json()["error"]["code"] == "not_found"


def test_cli_tokens_take_a_name_and_an_expiry(acme):
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    out = StringIO()
    call_command("tenant", "token", "acme", "acme-user", "--name", "cron job",
                 "--expires-days", "2", stdout=out)
    key = out.getvalue().strip().splitlines()[-1]
    token = ApiToken.objects.get(key_hash=ApiToken.hash_key(key))
    assert token.name == "cron job"
    assert dt.timedelta(days=1.9) < token.expires_at - timezone.now() < dt.timedelta(days=2)
    assert token_client(key).get("/api/me").status_code == 200
    with pytest.raises(CommandError, match="more than 0"):
        call_command("tenant", "token", "acme", "acme-user", "--expires-days", "0")


@pytest.mark.parametrize("switch", ["memory_reminder", "decoding_constraints", "loop_guard"])
def test_tenant_admin_switches_a_memory_mechanism_audited(acme_admin, acme, switch):
    """The tenant's ``memory_reminder`` / ``decoding_constraints`` / ``loop_guard``: off, then back to the
    default (empty), each change an audited tenant.changed row; the form shows the choice."""
    page = f"/admin/tenants/tenant/{acme.tenant.pk}/change/"
    assert f'name="{switch}"' in acme_admin.get(page).content.decode()
    for sent, stored in (("false", False), ("unknown", None)):
        response = acme_admin.post(page, {"name": acme.tenant.name, switch: sent})
        assert response.status_code == 302
        acme.tenant.refresh_from_db()
        assert getattr(acme.tenant, switch) is stored
    rows = AuditLog.objects.filter(event_type=AuditEvent.TENANT_CHANGED).order_by("id")
    assert [(r.data["old"], r.data["new"]) for r in rows] == [
        ({switch: None}, {switch: False}),
        ({switch: False}, {switch: None})]
