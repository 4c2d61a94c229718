"""The contrastive guide row's tokens where a tenant reads its usage: the usage page, its
CSVs (by day, by member, billing lines) and GET /api/usage, each beside the prompt and
completion tokens and never added to them (real Postgres)."""

from __future__ import annotations

import uuid

import pytest

from tenants import actions
from tenants.admin.usage import CSV_HEADER
from tests.tenants.conftest import admin_client, token_client
from tests.tenants.test_usage_admin import csv_rows

pytestmark = pytest.mark.django_db


def store(member, prompt: int, completion: int, guide: tuple[int, int] = (0, 0)) -> None:
    request_id = uuid.uuid4().hex
    actions.do_claim_chat(member, request_id, request_id, "h", 60.0)
    actions.do_record_chat(member, None, message="q", reply="a", request_id=request_id,
                           usage={"prompt_tokens": prompt, "completion_tokens": completion,
                                  "guide_prefill_tokens": guide[0],
                                  "guide_decode_tokens": guide[1]},
                           cache={"tier": "l1"}, latency_ms=1.0)


@pytest.fixture
def chats(acme, globex):
    store(acme.user, 30, 5, guide=(12, 4))
    store(acme.user, 10, 2)
    store(acme.other, 7, 3, guide=(9, 2))
    store(globex.user, 999, 999, guide=(500, 500))


def test_the_usage_page_and_its_csvs_show_guide_tokens(chats, acme):
    client = admin_client("acme-admin", "pw-admin-123")
    page = client.get("/admin/usage/")
    assert "Guide prefill tokens" in page.content.decode()
    total = dict(zip(CSV_HEADER, page.context["total_row"], strict=True))
    assert [total[c] for c in ("tokens_in", "tokens_out", "guide_prefill_tokens",
                               "guide_decode_tokens")] == [47, 10, 21, 6]
    by_member = {r["group"]: r for r in csv_rows(client.get("/admin/usage/export.csv?by=member"))}
    assert [(r["tokens_in"], r["guide_prefill_tokens"], r["guide_decode_tokens"])
            for r in by_member.values()] == [("40", "12", "4"), ("7", "9", "2")]
    days = csv_rows(client.get("/admin/usage/export.csv?by=day&days=1"))
    assert [(d["guide_prefill_tokens"], d["guide_decode_tokens"]) for d in days] == [("21", "6")]
    lines = csv_rows(client.get("/admin/usage/export.csv?by=line"))
    mine = next(r for r in lines if r["member"] == "acme/acme-user")
    assert (mine["total_tokens"], mine["guide_prefill_tokens"], mine["guide_decode_tokens"]) == (
        "47", "12", "4")  # total_tokens: the reply's tokens only
    assert all(r["tenant"] == "acme" for r in lines)


def test_api_usage_reports_guide_tokens(chats, acme):
    body = token_client(acme.admin_key).get("/api/usage").json()
    lines = {row["member"]: row for row in body["data"]}
    mine = lines["acme/acme-user"]
    assert (mine["prompt_tokens"], mine["completion_tokens"], mine["total_tokens"],
            mine["guide_prefill_tokens"], mine["guide_decode_tokens"]) == (40, 7, 47, 12, 4)
    assert lines["acme/acme-other"]["guide_prefill_tokens"] == 9
