"""The usage page and its CSV: a tenant admin sees only their tenant (URL tampering gives
404), a superuser every tenant or one, members see nothing; charts are server-rendered SVG."""

from __future__ import annotations

import csv
import io

import pytest
from django.test import Client

from tenants.admin.usage import CSV_HEADER
from tests.tenants.conftest import admin_client, token_client
from tests.tenants.test_usage import fail, record

pytestmark = pytest.mark.django_db


@pytest.fixture
def chats(acme, globex):
    record(acme.user, tier="l1", latency=80, prompt=11, completion=4)
    record(acme.user, tier="compute", latency=700, prompt=13, completion=6)
    record(acme.other, tier="l2", latency=40, prompt=7, completion=3)
    fail(acme.other)
    record(globex.user, tier="compute", latency=999, prompt=1000, completion=500)


def csv_rows(response) -> list[dict]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


def test_tenant_admin_sees_own_usage_with_charts(chats, acme):
    client = admin_client("acme-admin", "pw-admin-123")
    page = client.get("/admin/usage/")
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('<figure class="kvi-chart">') == 3
    assert "<title>" + page.context["report"].end.isoformat() + ": requests 3</title>" in html
    assert "globex" not in html
    total = dict(zip(CSV_HEADER, page.context["total_row"], strict=True))
    assert [total[c] for c in ("group", "requests", "errors", "tokens_in", "tokens_out")] == [
        "total", 3, 1, 31, 13]
    assert [total[f"hit_rate_{t}"] for t in ("l1", "l2", "compute", "none")] == [
        "33.3%", "33.3%", "33.3%", "0.0%"]
    assert [r[0] for r in page.context["member_rows"]] == ["acme/acme-user", "acme/acme-other"]
    assert 'href="/admin/usage/"' in client.get("/admin/").content.decode()


def test_tenant_admin_cannot_reach_another_tenant(chats, acme):
    client = admin_client("acme-admin", "pw-admin-123")
    for url in ("/admin/usage/?tenant=globex", "/admin/usage/export.csv?tenant=globex"):
        response = client.get(url)
        assert response.status_code == 404 and b"globex-user" not in response.content
    rows = csv_rows(client.get("/admin/usage/export.csv?by=member"))
    assert [r["group"] for r in rows] == ["acme/acme-user", "acme/acme-other"]
    assert rows[0]["tokens_in"] == "24" and rows[1]["errors"] == "1"


def test_superuser_sees_all_tenants_or_one(chats, superuser):
    client = admin_client("root", "pw-root-123")
    def counts(row):
        row = dict(zip(CSV_HEADER, row, strict=True))
        return [row[c] for c in ("requests", "errors", "tokens_in", "tokens_out")]

    assert counts(client.get("/admin/usage/").context["total_row"]) == [4, 1, 1031, 513]
    page = client.get("/admin/usage/?tenant=globex&days=7")
    assert counts(page.context["total_row"]) == [1, 0, 1000, 500]
    assert len(page.context["day_rows"]) == 7
    rows = csv_rows(client.get("/admin/usage/export.csv?tenant=globex&days=7&by=day"))
    assert len(rows) == 7 and sum(int(r["requests"]) for r in rows) == 1


def test_members_and_strangers_see_nothing(chats, acme):
    assert Client().get("/admin/usage/").status_code == 302  # to the login page
    user = acme.user.user
    user.is_staff = True  # staff flag without the tenant-admin role: still nothing
    user.save()
    client = admin_client("acme-user", "pw-user-123")
    assert client.get("/admin/usage/").status_code == 403
    assert client.get("/admin/usage/export.csv").status_code == 403
    assert token_client(acme.user_key).get("/admin/usage/").status_code == 302
