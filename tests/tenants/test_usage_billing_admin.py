"""The usage page bills: cached vs computed prompt tokens, a CSV per member x model x day,
spend against each budget, a banner past 80 %, and plain column titles."""

from __future__ import annotations

import csv
import io

import pytest

from tenants import actions
from tests.tenants.conftest import admin_client
from tests.tenants.test_usage_api import store_chat

pytestmark = pytest.mark.django_db


def csv_rows(response) -> list[dict]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


def test_page_shows_budgets_banner_and_plain_titles(acme, globex):
    actions.do_set_budget(acme.tenant, tokens=1000, period="month")
    actions.do_set_budget(acme.tenant, member=acme.user, tokens=50, period="day")
    actions.do_set_budget(globex.tenant, member=globex.user, tokens=10, period="day")
    store_chat(acme.user, 30, 12, cached=20)  # 42 of 50: past 80 %
    store_chat(globex.user, 20, 20)
    client = admin_client("acme-admin", "pw-admin-123")
    page = client.get("/admin/usage/")
    html = page.content.decode()
    assert page.status_code == 200 and "globex" not in html
    assert [(a["member"], a["spent"], a["percent"]) for a in page.context["alerts"]] == [
        ("acme/acme-user", 42, 84.0)]
    assert "Budget nearly spent" in html and "acme/acme-user has used 42 of 50 tokens" in html
    budgets = {(b["scope"], b["tokens"]): b["spent"] for b in page.context["budgets"]}
    assert budgets == {("tenant", 1000): 42, ("member", 50): 42}
    assert "of which from cache" in html and "hit_rate" not in html.lower()
    assert "streamed replies only" not in html
    total = page.context["total_row"]
    assert total[3:6] == (30, 20, 10)  # prompt tokens, of which cached, of which computed


def test_billing_csv_has_a_line_per_member_model_and_day(acme, globex):
    store_chat(acme.user, 30, 5, cached=24)
    store_chat(acme.other, 8, 2)
    store_chat(globex.user, 99, 9)
    client = admin_client("acme-admin", "pw-admin-123")
    rows = csv_rows(client.get("/admin/usage/export.csv?by=line"))
    assert [(r["member"], r["prompt_tokens"], r["cached_tokens"], r["computed_tokens"],
             r["completion_tokens"]) for r in rows] == [
        ("acme/acme-other", "8", "0", "8", "2"), ("acme/acme-user", "30", "24", "6", "5")]
    assert all(r["model"] and r["tenant"] == "acme" for r in rows)
    per_member = csv_rows(client.get("/admin/usage/export.csv?by=member"))
    assert {r["group"]: r["tokens_in_cached"] for r in per_member} == {
        "acme/acme-user": "24", "acme/acme-other": "0"}


def test_the_admin_home_shows_the_banner_to_the_tenants_admin_only(acme, globex):
    actions.do_set_budget(acme.tenant, tokens=40, period="day")
    store_chat(acme.user, 30, 12)  # 42 of 40: spent
    home = admin_client("acme-admin", "pw-admin-123").get("/admin/").content.decode()
    assert "Budget spent:" in home and "tenant acme has used 42 of 40 tokens" in home
    assert "New chats are refused" in home
    other = admin_client("globex-admin", "pw-admin-123").get("/admin/").content.decode()
    assert "kvi-budget-alert" not in other and "acme" not in other
