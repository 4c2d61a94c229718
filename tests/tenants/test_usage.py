"""The usage rollup: counted in the chat's own transaction, equal to what a rebuild from
the audit log says, scoped per tenant, and read back as day/member totals and percentiles."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from tenants import actions
from tenants.errors import ChatAbandoned
from tenants.models import ChatExchange, Tenant, UsageDay
from tenants.usage import accounting as usage
from tenants.usage import rebuild as usage_rebuild
from tenants.usage import report as usage_report

pytestmark = pytest.mark.django_db


def record(member, *, tier="l1", latency=120.0, prompt=10, completion=5):
    """One chat as the worker stores it (claim, then record: the real actions)."""
    request_id = uuid.uuid4().hex
    actions.do_claim_chat(member, request_id, request_id, "asked", 60.0)
    actions.do_record_chat(member, None, message="hi", reply="hello",
                           usage={"prompt_tokens": prompt, "completion_tokens": completion},
                           cache={"tier": tier}, latency_ms=latency, request_id=request_id)


def fail(member):
    request_id = uuid.uuid4().hex
    actions.do_claim_chat(member, request_id, request_id, "asked", 60.0)
    actions.do_abandon_chat(member, request_id, "timeout")


def snapshot():
    return sorted((r.tenant_id, r.member_ref, r.day, r.requests, r.errors, r.prompt_tokens,
                   r.completion_tokens, r.tier_l1, r.tier_l2, r.tier_compute, r.tier_none,
                   sum(r.latency_hist), usage.percentile(r.latency_hist or [0], 50))
                  for r in UsageDay.objects.all())


def test_percentiles_come_from_geometric_buckets():
    hist = [0] * usage.NBUCKETS
    for ms in [5] * 50 + [100] * 45 + [2000] * 5:
        hist[usage.bucket_of(ms)] += 1
    assert usage.percentile(hist, 50) == usage.BUCKETS[0]
    p95 = usage.percentile(hist, 95)
    assert 100 <= p95 < 125  # the bound of the bucket holding 100 ms: within 25%
    assert 2000 <= usage.percentile(hist, 99) < 2500
    assert usage.percentile([0] * usage.NBUCKETS, 50) is None



def test_chats_and_failures_are_counted_per_member_and_day(acme, globex):
    record(acme.user, tier="l1", latency=100, prompt=10, completion=5)
    record(acme.user, tier="compute", latency=900, prompt=20, completion=7)
    record(acme.other, tier="l2", latency=50)
    fail(acme.user)
    record(globex.user, tier="none", latency=30)
    row = UsageDay.objects.get(tenant=acme.tenant, member_ref=acme.user.pk)
    assert (row.requests, row.errors, row.prompt_tokens, row.completion_tokens) == (2, 1, 30, 12)
    assert (row.tier_l1, row.tier_l2, row.tier_compute, row.tier_none) == (1, 0, 1, 0)
    assert row.day == dt.datetime.now(dt.UTC).date() and row.member_label == "acme/acme-user"
    assert sum(row.latency_hist) == 2
    report = usage_report.build(Tenant.objects.filter(pk=acme.tenant.pk), days=7)
    assert report.total.requests == 3 and report.total.errors == 1
    assert report.total.hit_rate("l1") == pytest.approx(1 / 3)
    assert report.total.error_rate() == pytest.approx(1 / 4)
    assert [m.label for m in report.members] == ["acme/acme-user", "acme/acme-other"]
    assert len(report.days) == 7 and report.days[-1].requests == 3
    assert sum(d.requests for d in report.days[:-1]) == 0
    assert 50 <= report.total.p("latency", 50) < 125 and report.total.p("ttft", 50) is None


def test_a_rolled_back_chat_is_not_counted(acme):
    """The rollup moves with the audit row: a refused store counts nothing."""
    request_id = uuid.uuid4().hex
    actions.do_claim_chat(acme.user, request_id, request_id, "asked", 60.0)
    actions.do_abandon_chat(acme.user, request_id, "timeout")  # counted as an error
    with pytest.raises(ChatAbandoned):  # the claim is gone: nothing stored
        actions.do_record_chat(acme.user, None, message="hi", reply="late", usage={},
                               cache={"tier": "l1"}, latency_ms=5.0, request_id=request_id)
    row = UsageDay.objects.get(member_ref=acme.user.pk)
    assert (row.requests, row.errors) == (0, 1)
    assert not ChatExchange.objects.filter(state="done").exists()


def test_rebuild_from_the_audit_log_matches_the_live_rollup(acme, globex):
    for i, tier in enumerate(["l1", "l2", "compute", "none", "l1"]):
        record(acme.user, tier=tier, latency=7 + 300 * i, prompt=i, completion=2 * i)
    record(globex.user, tier="compute", latency=1234.5)
    fail(acme.other)
    live = snapshot()
    assert usage_rebuild.rebuild() == 3
    assert snapshot() == live


def test_reports_are_scoped_to_the_tenants_given(acme, globex):
    record(acme.user)
    record(globex.user)
    report = usage_report.build(Tenant.objects.filter(pk=globex.tenant.pk), days=1)
    assert [m.label for m in report.members] == ["globex/globex-user"]
    report = usage_report.build(Tenant.objects.all(), days=1)
    assert report.total.requests == 2 and report.tenant is None
