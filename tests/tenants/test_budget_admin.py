"""Budgets in the admin: superusers set tenants' budgets, tenant admins their own members'
(never above the tenant's, never another tenant's); every write audited."""

from __future__ import annotations

import pytest

from tenants import actions
from tenants.models import AuditEvent, AuditLog, TokenBudget
from tests.tenants.conftest import admin_client

pytestmark = pytest.mark.django_db
URL = "/admin/tenants/tokenbudget/"


def audited(tenant) -> list[tuple]:
    rows = AuditLog.objects.filter(tenant=tenant, event_type=AuditEvent.BUDGET_CHANGED)
    return [(r.target, r.data["tokens"], r.actor.username if r.actor else None) for r in rows.order_by("id")]


def test_superuser_sets_a_tenants_budget(superuser, acme, globex):
    root = admin_client("root", "pw-root-123")
    r = root.post(f"{URL}add/", {"tenant": acme.tenant.pk, "member": "", "tokens": "5000",
                                 "period": "month"})
    assert r.status_code == 302, r.content.decode()[-2000:]
    budget = TokenBudget.objects.get(tenant=acme.tenant, member=None)
    assert (budget.tokens, budget.period) == (5000, "month")
    assert audited(acme.tenant) == [("acme", 5000, "root")]
    r = root.post(f"{URL}{budget.pk}/change/", {"tokens": "6000", "period": "day"})
    assert r.status_code == 302
    budget.refresh_from_db()
    assert (budget.tokens, budget.period) == (6000, "day")


def test_tenant_admin_sets_members_budgets_within_the_tenants(acme, globex):
    actions.do_set_budget(acme.tenant, tokens=1000, period="day")
    actions.do_set_budget(globex.tenant, member=globex.user, tokens=77, period="day")
    client = admin_client("acme-admin", "pw-admin-123")
    page = client.get(URL)
    assert page.status_code == 200 and b"acme (whole tenant)" in page.content
    assert b"globex" not in page.content
    over = client.post(f"{URL}add/", {"member": acme.user.pk, "tokens": "1001", "period": "day"})
    assert over.status_code == 200 and b"cannot exceed" in over.content
    own = client.post(f"{URL}add/", {"member": "", "tokens": "10", "period": "day"})
    assert own.status_code == 200 and not TokenBudget.objects.filter(
        tenant=acme.tenant, tokens=10).exists()
    foreign = client.post(f"{URL}add/", {"member": globex.user.pk, "tokens": "5",
                                         "period": "day"})
    assert foreign.status_code == 200  # not a choice here: a form error, nothing saved
    assert TokenBudget.objects.get(member=globex.user).tokens == 77
    ok = client.post(f"{URL}add/", {"member": acme.user.pk, "tokens": "300", "period": "day"})
    assert ok.status_code == 302
    assert TokenBudget.objects.get(member=acme.user).tokens == 300
    assert audited(acme.tenant)[-1] == ("acme/acme-user", 300, "acme-admin")
    tenant_budget = TokenBudget.objects.get(tenant=acme.tenant, member=None)
    assert client.post(f"{URL}{tenant_budget.pk}/change/",
                       {"tokens": "999999", "period": "day"}).status_code == 403
    assert client.post(f"{URL}{tenant_budget.pk}/delete/", {"post": "yes"}).status_code == 403
    foreign_budget = TokenBudget.objects.get(member=globex.user)
    assert client.get(f"{URL}{foreign_budget.pk}/change/").status_code == 404
    mine = TokenBudget.objects.get(member=acme.user)
    assert client.post(f"{URL}{mine.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not TokenBudget.objects.filter(member=acme.user).exists()
    assert audited(acme.tenant)[-1] == ("acme/acme-user", None, "acme-admin")
