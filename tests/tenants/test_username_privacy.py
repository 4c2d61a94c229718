"""Registration never tells one tenant that a username exists in another (issue 20).

Django usernames are global, so a name another tenant holds cannot be given out again; the
refusal is worded the same whoever holds it (another tenant, a platform account) and
names nothing of them. A name held in the caller's own tenant is named as such.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from tenants import actions
from tenants.errors import Conflict
from tenants.models import Member
from tests.tenants.conftest import admin_client

pytestmark = pytest.mark.django_db


def refusal(tenant, username: str) -> str:
    with pytest.raises(Conflict) as err:
        actions.do_add_member(tenant, username)
    return str(err.value.message)


def test_a_name_held_elsewhere_gets_the_same_neutral_refusal(acme, globex):
    get_user_model().objects.create_user("platform-ops")
    elsewhere = refusal(acme.tenant, "globex-user")  # a member of globex
    platform = refusal(acme.tenant, "platform-ops")  # no tenant at all
    assert elsewhere == platform == actions.UNAVAILABLE
    assert "globex" not in elsewhere and "exists" not in elsewhere
    own = refusal(acme.tenant, "acme-user")
    assert "already exists in this tenant" in own
    assert not Member.objects.filter(tenant=acme.tenant, user__username="globex-user").exists()


def test_the_admin_add_form_says_no_more_than_the_action(acme, globex):
    client = admin_client("acme-admin", "pw-admin-123")
    page = {"password": "", "role": "user", "active": "on"}
    foreign = client.post("/admin/tenants/member/add/", {**page, "username": "globex-user"})
    own = client.post("/admin/tenants/member/add/", {**page, "username": "acme-user"})
    assert foreign.status_code == own.status_code == 200  # the form again, with the error
    assert b"This username is not available" in foreign.content
    page_text = foreign.content.replace(b'value="globex-user"', b"")  # what was typed
    assert b"globex" not in page_text and b"taken" not in page_text
    assert b"already exists in this tenant" in own.content
    assert Member.objects.filter(user__username="globex-user").count() == 1
