"""The worker reads a chat's member with its tenant, user and preference in one query."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpu_worker.serving.chat_service import load_member
from tenants import actions

pytestmark = pytest.mark.django_db


def test_the_member_and_its_preference_in_one_query():
    tenant = actions.do_create_tenant("loads")
    with_pref = actions.do_add_member(tenant, "loads-1", preference="I like tea.")
    without = actions.do_add_member(tenant, "loads-2")
    with CaptureQueriesContext(connection) as queries:
        member = load_member(with_pref.pk)
        pref = member.own_preference()
        assert member.tenant.slug == "loads" and member.user.username == "loads-1"
    assert len(queries) == 1 and pref.text == "I like tea." and pref.tenant_id == tenant.pk
    with CaptureQueriesContext(connection) as queries:
        assert load_member(without.pk).own_preference() is None
    assert len(queries) == 1
