"""GET /api/usage: tenant admins read their own tenant's billable usage (cached tokens
included) and budgets; members get 403; nothing of another tenant ever shows."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from tenants import actions
from tests.tenants.conftest import token_client

pytestmark = pytest.mark.django_db


def store_chat(member, prompt: int, completion: int, cached: int = 0) -> None:
    request_id = uuid.uuid4().hex
    actions.do_claim_chat(member, request_id, request_id, "h", 60.0)
    actions.do_record_chat(member, None, message="q", reply="a", request_id=request_id,
                           usage={"prompt_tokens": prompt, "completion_tokens": completion,
                                  "cached_tokens": cached},
                           cache={"tier": "l1"}, latency_ms=1.0)


def test_tenant_admin_reads_usage_per_member_model_and_day(acme, globex):
    store_chat(acme.user, 30, 5, cached=24)
    store_chat(acme.user, 10, 2)
    store_chat(acme.other, 7, 1, cached=7)
    store_chat(globex.user, 999, 999)
    actions.do_set_budget(acme.tenant, tokens=100, period="day")
    r = token_client(acme.admin_key).get("/api/usage")
    assert r.status_code == 200, r.content
    body = r.json()
    today = dt.datetime.now(dt.UTC).date()
    assert (body["tenant"], body["end"]) == ("acme", today.isoformat())
    lines = {row["member"]: row for row in body["data"]}
    assert set(lines) == {"acme/acme-user", "acme/acme-other"}
    mine = lines["acme/acme-user"]
    assert (mine["requests"], mine["prompt_tokens"], mine["cached_tokens"],
            mine["computed_tokens"], mine["completion_tokens"], mine["total_tokens"]) == (
        2, 40, 24, 16, 7, 47)
    assert mine["model"] and mine["day"] == today.isoformat()
    assert body["budgets"] == [{
        "tenant": "acme", "scope": "tenant", "member": None, "tokens": 100, "period": "day",
        "period_start": today.isoformat(), "spent": 55, "reserved": 0, "remaining": 45,
        "percent": 55.0}]
    assert b"globex" not in r.content


def test_members_are_refused_and_bad_periods_are_refused(acme):
    r = token_client(acme.user_key).get("/api/usage")
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    admin = token_client(acme.admin_key)
    # malformed: 400 naming the field (an empty or non-ISO date is no date)
    for query in ("days=0", "start=", "start=20260101", "start=2026-1-5", "end=2026-W05-1"):
        r = admin.get(f"/api/usage?{query}")
        assert r.status_code == 400, query
        assert query.split("=")[0] in r.json()["error"]["fields"], query
    # well-formed dates that make no period: 422
    for query in ("start=2026-02-01&end=2026-01-01", "start=2020-01-01&end=2026-01-01"):
        r = admin.get(f"/api/usage?{query}")
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_period", query
    old = admin.get("/api/usage?start=2020-01-01&end=2020-01-31")
    assert old.status_code == 200 and old.json()["data"] == []


def test_rebuild_from_the_audit_log_keeps_cached_tokens_and_the_model(acme):
    from tenants.models import UsageDay
    from tenants.usage.rebuild import rebuild

    store_chat(acme.user, 30, 5, cached=24)
    store_chat(acme.user, 10, 2, cached=3)
    store_chat(acme.other, 7, 1)

    def lines():
        return sorted((r.member_ref, r.model, r.requests, r.prompt_tokens, r.cached_tokens,
                       r.completion_tokens) for r in UsageDay.objects.all())

    live = lines()
    assert {(line[0], line[4]) for line in live} == {(acme.user.pk, 27), (acme.other.pk, 0)}
    UsageDay.objects.all().delete()
    assert rebuild() == 2 and lines() == live


def test_a_cancelled_stream_bills_what_it_used_and_spends_the_budget(acme):
    from tenants.budgets import ledger
    from tenants.models import TokenBudget, UsageDay
    from tenants.usage.rebuild import rebuild

    actions.do_set_budget(acme.tenant, member=acme.user, tokens=100, period="day")
    request_id = uuid.uuid4().hex
    actions.do_claim_chat(acme.user, request_id, request_id, "h", 60.0)
    actions.do_record_cancelled(acme.user, request_id, completion_tokens=9,
                                prompt_tokens=20, cached_tokens=15)
    row = UsageDay.objects.get(member_ref=acme.user.pk)
    assert (row.requests, row.errors, row.prompt_tokens, row.cached_tokens,
            row.completion_tokens) == (0, 0, 20, 15, 9)
    assert ledger.standing(TokenBudget.objects.get(member=acme.user)).spent == 29
    UsageDay.objects.all().delete()
    rebuild()
    again = UsageDay.objects.get(member_ref=acme.user.pk)
    assert (again.prompt_tokens, again.cached_tokens, again.completion_tokens) == (20, 15, 9)
