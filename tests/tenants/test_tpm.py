"""Tokens-per-minute limits on real Redis: stored chats count their tokens, a member (or
tenant) at its limit is refused with 429 + Retry-After before the request rate is
counted; other members and tenants are not affected."""

from __future__ import annotations

import json
import uuid

import pytest

from tenants import actions
from tenants.budgets import tpm
from tests.tenants.conftest import token_client

pytestmark = pytest.mark.django_db


def chat(key: str):
    # an empty message: the throttles run before validation (400 when admitted)
    return token_client(key).post("/api/chat", data=json.dumps({"message": ""}),
                                  content_type="application/json")


def store_chat(member, prompt: int, completion: int) -> None:
    request_id = uuid.uuid4().hex
    actions.do_claim_chat(member, request_id, request_id, "h", 60.0)
    actions.do_record_chat(member, None, message="q", reply="a", request_id=request_id,
                           usage={"prompt_tokens": prompt, "completion_tokens": completion},
                           cache={"tier": "compute"}, latency_ms=1.0)


def test_no_limits_by_default_and_nothing_counted(acme, settings):
    settings.CHAT_TPM_PER_MEMBER = settings.CHAT_TPM_PER_TENANT = ""
    assert tpm.limits() == {} and tpm.check(acme.tenant.pk, acme.user.pk) is None
    r = chat(acme.user_key)
    assert r.status_code == 400 and "x-ratelimit-limit-tokens" not in r


def test_a_member_at_its_limit_is_refused_until_the_minute_passes(
        acme, globex, settings, django_capture_on_commit_callbacks):
    settings.CHAT_TPM_PER_MEMBER, settings.CHAT_TPM_PER_TENANT = "100", ""
    with django_capture_on_commit_callbacks(execute=True):
        store_chat(acme.user, 40, 30)
    state = tpm.check(acme.tenant.pk, acme.user.pk)
    assert (state.limit, state.remaining) == (100, 30)
    admitted = chat(acme.user_key)
    assert admitted.status_code == 400  # 70 of 100: admitted (then refused as invalid)
    assert (admitted["x-ratelimit-limit-tokens"], admitted["x-ratelimit-remaining-tokens"]) == (
        "100", "30")
    assert admitted["x-ratelimit-reset-tokens"].endswith("s")
    with django_capture_on_commit_callbacks(execute=True):
        store_chat(acme.user, 20, 10)
    r = chat(acme.user_key)
    assert r.status_code == 429, r.content
    error = r.json()["error"]
    assert (error["code"], error["scope"], error["unit"]) == ("throttled", "member",
                                                             "tokens_per_minute")
    assert 1 <= int(r["Retry-After"]) <= 120
    assert chat(acme.other_key).status_code == 400  # the other member's minute is empty
    assert chat(globex.user_key).status_code == 400


def test_the_tenant_limit_holds_every_member(acme, globex, settings,
                                             django_capture_on_commit_callbacks):
    settings.CHAT_TPM_PER_MEMBER, settings.CHAT_TPM_PER_TENANT = "1000", "50"
    with django_capture_on_commit_callbacks(execute=True):
        store_chat(acme.user, 30, 25)
    r = chat(acme.other_key)
    assert r.status_code == 429 and r.json()["error"]["scope"] == "tenant"
    assert chat(globex.user_key).status_code == 400  # another tenant: its own counters
