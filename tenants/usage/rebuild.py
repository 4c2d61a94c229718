"""Recompute the ``UsageDay`` rollup from the audit log (backfill, or after a repair).

Three grouped scans of the chat audit rows (totals, latency buckets, TTFT buckets;
cancelled, discarded and failed generations add their tokens only),
assembled here and written in one transaction. ``tenants.usage.accounting`` keeps the rollup
current row by row; this is the batch path over the same definition.
"""

from __future__ import annotations

from django.db import connection, transaction

from tenants.budgets import ledger
from tenants.budgets.estimate import served_model
from tenants.models import UsageDay
from tenants.usage.accounting import BASE_MS, NBUCKETS, RATIO, TIERS

_FROM = """
FROM tenants_auditlog a LEFT JOIN tenants_member m ON m.user_id = a.actor_id
WHERE a.event_type IN ('chat.request', 'chat.abandoned', 'chat.cancelled', 'chat.discarded',
                       'chat.failed')
  AND a.tenant_id IS NOT NULL
  {extra}
GROUP BY a.tenant_id, coalesce(m.id, -a.actor_id), (a.created_at AT TIME ZONE 'UTC')::date,
  coalesce(a.data->>'model', %(model)s)
"""
_KEY = ("a.tenant_id, coalesce(m.id, -a.actor_id), (a.created_at AT TIME ZONE 'UTC')::date, "
        "coalesce(a.data->>'model', %(model)s)")
_TOTALS = f"""
SELECT {_KEY}, max(a.target),
  count(*) FILTER (WHERE a.event_type = 'chat.request'),
  count(*) FILTER (WHERE a.event_type = 'chat.abandoned'),
  coalesce(sum((a.data->>'prompt_tokens')::bigint), 0),
  coalesce(sum((a.data->>'completion_tokens')::bigint), 0),
  coalesce(sum((a.data->>'cached_tokens')::bigint), 0),
  coalesce(sum((a.data->>'guide_prefill_tokens')::bigint), 0),
  coalesce(sum((a.data->>'guide_decode_tokens')::bigint), 0),
  {", ".join(f"count(*) FILTER (WHERE a.data->>'cache_tier' = '{t}')" for t in TIERS)}
"""
# bucket_of() in SQL: ceil(log_RATIO(ms / BASE_MS)), clamped to [0, NBUCKETS - 1]
_BUCKET = ("least({n}, greatest(0, ceil(ln(greatest((a.data->>'{f}')::float8, {b}) / {b})"
           " / ln({r}))))::int")


def _hist_sql(field_name: str) -> str:
    bucket = _BUCKET.format(n=NBUCKETS - 1, f=field_name, b=BASE_MS, r=RATIO)
    return (f"SELECT {_KEY}, {bucket}, count(*)"
            + _FROM.format(extra=f"AND a.event_type = 'chat.request' "
                                 f"AND a.data ? '{field_name}'") + f", {bucket}")


def _fetch(sql: str):
    with connection.cursor() as cur:
        cur.execute(sql, {"model": served_model()})
        yield from cur


@transaction.atomic
def rebuild() -> int:
    """Replace the whole rollup by what the audit log says; returns the row count."""
    rows: dict[tuple, UsageDay] = {}
    for key, label, req, err, pin, pout, cached, gpre, gdec, *tiers in (
            (r[:4], *r[4:]) for r in _fetch(_TOTALS + _FROM.format(extra=""))):
        rows[key] = UsageDay(
            tenant_id=key[0], member_ref=key[1], day=key[2], model=key[3], member_label=label,
            requests=req, errors=err, prompt_tokens=pin, completion_tokens=pout,
            cached_tokens=cached, guide_prefill_tokens=gpre, guide_decode_tokens=gdec,
            **{f"tier_{t}": n for t, n in zip(TIERS, tiers, strict=True)},
            latency_hist=[], ttft_hist=[])  # empty until a first sample, as live
    for attr, name in (("latency_hist", "latency_ms"), ("ttft_hist", "ttft_ms")):
        for tenant_id, member_ref, day, model, bucket, n in _fetch(_hist_sql(name)):
            row = rows[(tenant_id, member_ref, day, model)]
            hist = getattr(row, attr) or [0] * NBUCKETS
            hist[bucket] += n
            setattr(row, attr, hist)
    UsageDay.objects.all().delete()
    UsageDay.objects.bulk_create(rows.values(), batch_size=2000)
    transaction.on_commit(ledger.forget_past_spend)  # this process's sums of past days
    return len(rows)
