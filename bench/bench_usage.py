"""Usage page with a million audit rows: the rollup vs aggregating the audit log.

    .venv/bin/python bench/bench_usage.py [--rows N] [--write-docs]

Starts its own embedded PostgreSQL under var/bench-usage (wiped first; DATABASE_URL is
ignored). 4 tenants x 50 members; N chat audit rows (default 1,000,000; 2% abandoned)
spread over 90 days are generated in SQL, then the ``UsageDay`` rollup is rebuilt from
them (``tenants.usage.rebuild``). Timed, median of 5: the usage report of the busiest
tenant over 30 days from the rollup (what /admin/usage/ runs) against the same figures
aggregated straight from the audit rows (the ``audit_tenant_time`` index; percentiles
with ``percentile_cont``). Ratios are audit-scan time / rollup time in the same run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var" / "bench-usage"
shutil.rmtree(VAR, ignore_errors=True)
os.environ["VAR_DIR"] = str(VAR)
for var in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
    os.environ.pop(var, None)
os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
sys.path.insert(0, str(ROOT))

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from mdsection import machine, table, write_section  # noqa: E402

from tenants import actions  # noqa: E402
from tenants.models import Member, Tenant  # noqa: E402
from tenants.usage import rebuild as usage_rebuild  # noqa: E402
from tenants.usage import report as usage_report  # noqa: E402

GENERATE = """
INSERT INTO tenants_auditlog (tenant_id, actor_id, actor_kind, event_type, target, data,
                              created_at)
SELECT m.tenant_id, m.user_id, 'member',
       CASE WHEN r < 0.02 THEN 'chat.abandoned' ELSE 'chat.request' END, 'bench',
       CASE WHEN r < 0.02 THEN jsonb_build_object('reason', 'timeout') ELSE jsonb_build_object(
         'prompt_tokens', 20 + (r * 400)::int, 'completion_tokens', 5 + (r * 60)::int,
         'cache_tier', (ARRAY['l1','l1','l1','l2','compute','none'])[1 + (r * 5.99)::int],
         'latency_ms', round((30 + 2000 * r * r)::numeric, 1)) END,
       now() - (g % 90) * interval '1 day' - (g % 86400) * interval '1 second'
FROM (SELECT g, random() AS r, 1 + (random() * (%(members)s - 1))::int AS k
      FROM generate_series(1, %(rows)s) g) s
JOIN (SELECT row_number() OVER (ORDER BY id) AS k, tenant_id, user_id FROM tenants_member) m
  USING (k)
"""
DIRECT = """
SELECT (created_at AT TIME ZONE 'UTC')::date, count(*) FILTER (WHERE event_type='chat.request'),
  count(*) FILTER (WHERE event_type='chat.abandoned'),
  sum((data->>'prompt_tokens')::bigint), sum((data->>'completion_tokens')::bigint),
  count(*) FILTER (WHERE data->>'cache_tier'='l1'),
  percentile_cont(0.5) WITHIN GROUP (ORDER BY (data->>'latency_ms')::float8),
  percentile_cont(0.95) WITHIN GROUP (ORDER BY (data->>'latency_ms')::float8)
FROM tenants_auditlog WHERE tenant_id = %s AND created_at >= now() - interval '30 days'
  AND event_type IN ('chat.request', 'chat.abandoned') GROUP BY 1
"""


def seed(rows: int) -> Tenant:
    call_command("migrate", interactive=False, verbosity=0)
    for t in range(4):
        tenant = actions.do_create_tenant(f"t{t}")
        for m in range(50):
            actions.do_add_member(tenant, f"t{t}-m{m}")
    with connection.cursor() as cur:
        cur.execute(GENERATE.replace("%(members)s", str(Member.objects.count()))
                    .replace("%(rows)s", str(rows)))
        cur.execute("ANALYZE")
    return Tenant.objects.get(slug="t0")


def timed(fn, repeat: int = 5) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs) * 1000


def direct(tenant: Tenant) -> None:
    with connection.cursor() as cur:
        cur.execute(DIRECT, [tenant.pk])
        cur.fetchall()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    t0 = time.perf_counter()
    tenant = seed(args.rows)
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rollup_rows = usage_rebuild.rebuild()
    rebuild_s = time.perf_counter() - t0
    one = Tenant.objects.filter(pk=tenant.pk)
    report = usage_report.build(one, days=30)
    rollup_ms = timed(lambda: usage_report.build(one, days=30))
    direct_ms = timed(lambda: direct(tenant))
    all_ms = timed(lambda: usage_report.build(Tenant.objects.all(), days=90))
    rows = [["audit rows", f"{args.rows:,}"], ["rollup rows", f"{rollup_rows:,}"],
            ["tenant t0, 30 days: requests in report", f"{report.total.requests:,}"],
            ["report from the rollup (ms, median of 5)", f"{rollup_ms:.1f}"],
            ["same figures aggregated from audit rows (ms)", f"{direct_ms:.1f}"],
            ["ratio audit scan / rollup", f"{direct_ms / rollup_ms:.1f}x"],
            ["all tenants, 90 days, from the rollup (ms)", f"{all_ms:.1f}"],
            ["generate audit rows (s)", f"{gen_s:.1f}"],
            ["rebuild rollup from audit rows (s)", f"{rebuild_s:.1f}"]]
    body = ("### Usage page over a million audit rows\n\n"
            f"`.venv/bin/python bench/bench_usage.py --rows {args.rows}` on {machine()}\n\n"
            + table(["measure", "value"], rows))
    print(body)
    if args.write_docs:
        write_section("usage", body)


if __name__ == "__main__":
    main()
