"""The usage report: rollup rows summed per day and per member in SQL, within a scope.

The database does the work (GROUP BY over ``UsageDay``, histograms summed bucket by
bucket with ``unnest ... WITH ORDINALITY``), so the page costs the same for 10 or 10
million chats, and grows only with members x days (docs/OPERATIONS.md, "Usage rollup").
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import connection
from django.db.models import Max, Sum

from tenants.models import Tenant, UsageDay
from tenants.usage.accounting import GUIDE_FIELDS, TIERS, Totals

MAX_DAYS = 366
SUMMED = ("requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens",
          *GUIDE_FIELDS, *(f"tier_{t}" for t in TIERS))
# Both groupings in one pass over the unnested buckets (GROUPING SETS); empty arrays
# (no sample of that kind, e.g. TTFT of non-streamed chats) unnest to nothing.
_HIST = """
SELECT u.day, u.tenant_id, u.member_ref, GROUPING(u.day), h.i - 1, sum(h.v)
FROM tenants_usageday u, unnest(u.{column}) WITH ORDINALITY AS h(v, i)
WHERE u.tenant_id = ANY(%s) AND u.day BETWEEN %s AND %s AND h.v > 0
GROUP BY GROUPING SETS ((u.day, h.i), (u.tenant_id, u.member_ref, h.i))
"""


@dataclass
class Report:
    tenant: Tenant | None  # None: several tenants (superusers)
    start: dt.date
    end: dt.date
    total: Totals
    days: list[Totals]  # oldest first, one per calendar day (zero days included)
    members: list[Totals]  # busiest first


def _fill(totals: Totals, row: dict) -> None:
    totals.requests, totals.errors = row["requests"], row["errors"]
    totals.prompt_tokens, totals.completion_tokens = row["prompt_tokens"], \
        row["completion_tokens"]
    totals.cached_tokens = row["cached_tokens"]
    for f in GUIDE_FIELDS:
        setattr(totals, f, row[f])
    totals.tiers = {t: row[f"tier_{t}"] for t in TIERS}


def _histograms(ids: list[int], start, end, per_day: dict, per_member: dict) -> None:
    for column, attr in (("latency_hist", "latency"), ("ttft_hist", "ttft")):
        with connection.cursor() as cur:
            cur.execute(_HIST.format(column=column), [ids, start, end])
            for day, tenant_id, member_ref, by_member, bucket, n in cur.fetchall():
                totals = per_member[(tenant_id, member_ref)] if by_member else per_day[day]
                getattr(totals, attr)[bucket] += n


def _grouped(rows, by: tuple[str, ...]):
    return rows.values(*by).annotate(**{f: Sum(f) for f in SUMMED},
                                      label=Max("member_label")).order_by()


def build(tenants, *, days: int, today: dt.date | None = None) -> Report:
    """The usage of ``tenants`` (a queryset already limited to what the viewer may see)
    over the last ``days`` UTC days, today included."""
    days = max(1, min(int(days), MAX_DAYS))
    end = today or dt.datetime.now(dt.UTC).date()
    start = end - dt.timedelta(days=days - 1)
    ids = list(tenants.values_list("pk", flat=True))
    rows = UsageDay.objects.filter(tenant__in=ids, day__gte=start, day__lte=end)
    per_day = {start + dt.timedelta(days=i): Totals(str(start + dt.timedelta(days=i)))
               for i in range(days)}
    for row in _grouped(rows, ("day",)):
        _fill(per_day[row["day"]], row)
    per_member: dict[tuple, Totals] = {}
    for row in _grouped(rows, ("tenant_id", "member_ref")):
        _fill(per_member.setdefault((row["tenant_id"], row["member_ref"]),
                                    Totals(row["label"])), row)
    _histograms(ids, start, end, per_day, per_member)
    total = Totals("total")
    for day_totals in per_day.values():
        total.merge(day_totals)
    members = sorted(per_member.values(), key=lambda t: (-t.requests, t.label))
    only = tenants.get() if len(ids) == 1 else None
    return Report(only, start, end, total, list(per_day.values()), members)
