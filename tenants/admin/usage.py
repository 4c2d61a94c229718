"""The usage page (/admin/usage/): a tenant admin sees their tenant, a superuser every
tenant or one of them. Read from the ``UsageDay`` rollup, never from the audit log."""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.template.response import TemplateResponse

from tenants.admin import charts
from tenants.admin.csvexport import csv_response
from tenants.admin.scoping import admin_scope, scope_queryset
from tenants.models import Tenant
from tenants.usage import billing
from tenants.usage import report as usage_report
from tenants.usage.accounting import TIERS, Totals

# (CSV column, the page's title): CSV keeps stable machine names, the page speaks plainly.
COLUMNS = (
    ("group", ""), ("requests", "Replies"), ("errors", "Failed"),
    ("tokens_in", "Prompt tokens"), ("tokens_in_cached", "of which from cache"),
    ("tokens_in_computed", "of which computed"), ("tokens_out", "Completion tokens"),
    # the contrastive guide row's work (docs/API.md, "Usage"): in neither column above
    ("guide_prefill_tokens", "Guide prefill tokens"),
    ("guide_decode_tokens", "Guide decode tokens"),
    ("hit_rate_l1", "Personalisation from worker memory"), ("hit_rate_l2", "from Redis"),
    ("hit_rate_compute", "recomputed"), ("hit_rate_none", "none injected"),
    ("latency_p50_ms", "Latency, median (ms)"), ("latency_p95_ms", "Latency, 95th pct (ms)"),
    ("ttft_p50_ms", "First token, median (ms)"), ("ttft_p95_ms", "First token, 95th pct (ms)"),
)
CSV_HEADER = tuple(name for name, _ in COLUMNS)
TITLES = tuple(title for _, title in COLUMNS)


def _report(request) -> usage_report.Report:
    scope = admin_scope(request)
    if scope is None:
        raise PermissionDenied("Only tenant admins and superusers see usage.")
    tenants = scope_queryset(Tenant.objects.all(), scope)
    slug = request.GET.get("tenant", "")
    if slug:
        tenants = tenants.filter(slug=slug)
        if not tenants.exists():  # unknown and foreign tenants alike
            raise Http404("No such tenant.")
    try:
        days = int(request.GET.get("days", 30))
    except ValueError:
        days = 30
    return usage_report.build(tenants, days=days)


def _tenant_ids(request, report: usage_report.Report) -> list[int]:
    """The tenants the report covers (one, or every tenant the viewer may see)."""
    if report.tenant is not None:
        return [report.tenant.pk]
    tenants = scope_queryset(Tenant.objects.all(), admin_scope(request))
    return list(tenants.values_list("pk", flat=True))


def _fmt(value, pct=False) -> str:
    if value is None:
        return ""
    return f"{value:.1%}" if pct else f"{value:.0f}"


def csv_row(t: Totals) -> tuple:
    return (t.label, t.requests, t.errors, t.prompt_tokens, t.cached_tokens,
            t.prompt_tokens - t.cached_tokens, t.completion_tokens,
            t.guide_prefill_tokens, t.guide_decode_tokens,
            *(_fmt(t.hit_rate(tier), pct=True) for tier in TIERS),
            _fmt(t.p("latency", 50)), _fmt(t.p("latency", 95)),
            _fmt(t.p("ttft", 50)), _fmt(t.p("ttft", 95)))


def usage_view(request):
    report = _report(request)
    labels = [d.label for d in report.days]
    day_charts = [
        charts.bars("Requests and errors per day", labels,
                    [("requests", [d.requests for d in report.days]),
                     ("errors", [d.errors for d in report.days])]),
        charts.bars("Tokens per day", labels,
                    [("prompt, computed", [d.prompt_tokens - d.cached_tokens
                                           for d in report.days]),
                     ("prompt, from cache", [d.cached_tokens for d in report.days]),
                     ("completion", [d.completion_tokens for d in report.days])]),
        charts.bars("Latency per day (ms)", labels,
                    [("p50", [d.p("latency", 50) for d in report.days]),
                     ("p95", [d.p("latency", 95) for d in report.days])], unit=""),
    ]
    scope = admin_scope(request)
    ids = _tenant_ids(request, report)
    context = {
        **admin.site.each_context(request), "title": "Usage", "report": report,
        "charts": day_charts, "header": TITLES,
        "budgets": billing.budgets(ids), "alerts": billing.alerts(ids),
        "total_row": csv_row(report.total),
        "day_rows": [csv_row(d) for d in reversed(report.days)],
        "member_rows": [csv_row(m) for m in report.members],
        "tenants": Tenant.objects.all() if scope.everything else None,
        "query": request.GET.urlencode(),
    }
    return TemplateResponse(request, "admin/kvi_usage.html", context)


def usage_csv(request):
    report = _report(request)
    by = request.GET.get("by", "day")
    if by == "line":  # billing: one line per member, model and UTC day
        ids = _tenant_ids(request, report)
        name = report.tenant.slug if report.tenant else "all-tenants"
        lines = billing.rows(ids, report.start, report.end)
        return csv_response(f"usage-{name}-by-member-model-day.csv", billing.FIELDS,
                            [[line[f] for f in billing.FIELDS] for line in lines])
    groups = report.members if by == "member" else report.days
    name = report.tenant.slug if report.tenant else "all-tenants"
    return csv_response(f"usage-{name}-by-{'member' if by == 'member' else 'day'}.csv",
                        CSV_HEADER, [csv_row(t) for t in groups])
