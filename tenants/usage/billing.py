"""Usage that can bill: one line per tenant, member, model and UTC day, and budgets' spend.

Prompt tokens are split into those served from cache (the injected K/V, or a
conversation's reused prefix) and those computed, as providers bill them at different
rates. Read from the ``UsageDay`` rollup (the same rows the budgets are enforced on).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from tenants.budgets import ledger
from tenants.models import UsageDay

MAX_DAYS = 366
FIELDS = ("day", "tenant", "member", "member_id", "model", "requests", "errors",
          "prompt_tokens", "cached_tokens", "computed_tokens", "completion_tokens",
          "total_tokens", "guide_prefill_tokens", "guide_decode_tokens")


def window(start: dt.date | None, end: dt.date | None, days: int = 30) -> tuple[dt.date, dt.date]:
    """(start, end) UTC days, both included: default the last ``days``; ValueError when
    reversed or longer than MAX_DAYS."""
    end = end or dt.datetime.now(dt.UTC).date()
    start = start or end - dt.timedelta(days=days - 1)
    if start > end:
        raise ValueError("start is after end")
    if (end - start).days + 1 > MAX_DAYS:
        raise ValueError(f"at most {MAX_DAYS} days at once")
    return start, end


def rows(tenant_ids, start: dt.date, end: dt.date) -> list[dict[str, Any]]:
    """The billable lines of these tenants (already limited to what the caller may see)."""
    found = (UsageDay.objects.filter(tenant_id__in=list(tenant_ids), day__gte=start,
                                     day__lte=end)
             .select_related("tenant").order_by("day", "tenant__slug", "member_label", "model"))
    return [{
        "day": r.day.isoformat(), "tenant": r.tenant.slug, "member": r.member_label,
        "member_id": r.member_ref, "model": r.model, "requests": r.requests,
        "errors": r.errors, "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
        "computed_tokens": r.prompt_tokens - r.cached_tokens,
        "completion_tokens": r.completion_tokens,
        "total_tokens": r.prompt_tokens + r.completion_tokens,
        # the contrastive guide row's work, not in total_tokens (docs/API.md, "Usage")
        "guide_prefill_tokens": r.guide_prefill_tokens,
        "guide_decode_tokens": r.guide_decode_tokens,
    } for r in found]


def budgets(tenant_ids) -> list[dict[str, Any]]:
    """Every budget of these tenants against its spend in the current period."""
    return [{
        "tenant": st.budget.tenant.slug, "scope": st.scope,
        "member": str(st.budget.member) if st.budget.member_id else None,
        "tokens": st.budget.tokens, "period": st.budget.period,
        "period_start": st.start.isoformat(), "spent": st.spent, "reserved": st.reserved,
        "remaining": max(0, st.left), "percent": round(st.percent, 1),
    } for st in ledger.tenant_standings(tenant_ids)]


def alerts(tenant_ids) -> list[dict[str, Any]]:
    """Budgets at 80 % or more of their period (the admin's banner)."""
    return [b for b in budgets(tenant_ids) if b["percent"] >= ledger.THRESHOLDS[0]]
