"""A member's API request reads its member once (with the token) and its preference once
(the view's context check and the budget estimate share it)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from tenants import actions
from tenants.api.auth import MemberTokenAuthentication
from tenants.api.permissions import request_member

pytestmark = pytest.mark.django_db


def test_a_token_request_reads_its_member_and_its_preference_once():
    tenant = actions.do_create_tenant("reads")
    member = actions.do_add_member(tenant, "reads-1", preference="I like tea.")
    other = actions.do_add_member(tenant, "reads-2", preference="I like coffee.")
    key = actions.do_create_api_token(member)
    request = Request(APIRequestFactory().post("/v1/chat/completions",
                                               HTTP_AUTHORIZATION=f"Bearer {key}"),
                      authenticators=[MemberTokenAuthentication()])
    assert request.user == member.user
    with CaptureQueriesContext(connection) as queries:
        got = request_member(request)
    assert got.pk == member.pk and got.tenant_id == tenant.pk and len(queries) == 0
    with CaptureQueriesContext(connection) as queries:
        assert got.own_preference().text == "I like tea."
        assert got.own_preference().text == "I like tea."
    assert len(queries) == 1
    assert other.own_preference().text == "I like coffee."  # another member: its own
    bare = actions.do_add_member(tenant, "reads-3")
    with CaptureQueriesContext(connection) as queries:
        assert bare.own_preference() is None and bare.own_preference() is None
    assert len(queries) == 1
