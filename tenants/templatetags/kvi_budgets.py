"""``{% budget_alerts request as alerts %}``: the budgets at 80 % or more that the admin
user may see (their tenant's; a superuser's: every tenant's), for the banner."""

from __future__ import annotations

from django import template

from tenants.admin.scoping import admin_scope, scope_queryset
from tenants.models import Tenant
from tenants.usage import billing

register = template.Library()


@register.simple_tag
def budget_alerts(request) -> list[dict]:
    scope = admin_scope(request)
    if scope is None:
        return []
    ids = scope_queryset(Tenant.objects.all(), scope).values_list("pk", flat=True)
    return billing.alerts(ids)
