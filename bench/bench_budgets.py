"""Budget admission cost: summing the last two days' rollup rows live vs the whole period.

    .venv/bin/python bench/bench_budgets.py [--members N] [--days D]

Starts its own embedded PostgreSQL under var/bench-budgets (wiped first; DATABASE_URL is
ignored). One tenant with a monthly tenant-wide budget and one member's monthly budget;
N members x D days of ``UsageDay`` rows (default 1000 x 31) up to today. Timed, median of
200: what an admission reads under the budget rows' lock (``tenants.budgets.ledger.standing``,
yesterday's and today's rows live + the days before yesterday summed once per day) against
the plain query over the whole period (what it would cost without that), and a whole admission
(``do_claim_chat_within_budget``: claim + lock + standings + reservation) with both
budgets against a tenant without budgets. Ratios are measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var" / "bench-budgets"
shutil.rmtree(VAR, ignore_errors=True)
os.environ["VAR_DIR"] = str(VAR)
for var in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
    os.environ.pop(var, None)
os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
sys.path.insert(0, str(ROOT))

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from mdsection import machine  # noqa: E402

from tenants import actions  # noqa: E402
from tenants.budgets import ledger  # noqa: E402
from tenants.budgets.periods import period_start  # noqa: E402

ROWS = """
INSERT INTO tenants_usageday (tenant_id, member_ref, member_label, day, model, requests,
  errors, prompt_tokens, completion_tokens, cached_tokens, tier_l1, tier_l2, tier_compute,
  tier_none, latency_hist, ttft_hist)
SELECT %(t)s, m, 'm' || m, current_date - d, 'bench', 10, 0, 300, 60, 200, 10, 0, 0, 0,
       '{}', '{}'
FROM generate_series(1, %(members)s) m, generate_series(0, %(days)s - 1) d
"""


def median_ms(fn, n: int = 200) -> float:
    fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def whole_period(budget) -> int:
    with connection.cursor() as cur:
        cur.execute(ledger._STANDING, {"t": budget.tenant_id, "m": budget.member_id,
                                       "start": period_start(budget.period)})
        return int(cur.fetchone()[1])


def admit(member) -> None:
    request_id = uuid.uuid4().hex
    with transaction.atomic():
        actions.do_claim_chat_within_budget(member, request_id, request_id, "bench", 60.0,
                                            prompt_tokens=50, max_new_tokens=100)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--days", type=int, default=31)
    args = parser.parse_args()
    call_command("migrate", interactive=False, verbosity=0)
    tenant = actions.do_create_tenant("bench", "Bench")
    member = actions.do_add_member(tenant, "alice")
    free = actions.do_add_member(actions.do_create_tenant("free", "Free"), "bob")
    with connection.cursor() as cur:
        cur.execute(ROWS, {"t": tenant.pk, "members": args.members, "days": args.days})
        cur.execute("ANALYZE tenants_usageday")
    tenant_budget = actions.do_set_budget(tenant, tokens=10**12, period="month")
    member_budget = actions.do_set_budget(tenant, member=member, tokens=10**9, period="month")
    assert ledger.standing(tenant_budget).spent == whole_period(tenant_budget)
    rows = [
        ("tenant budget, month", median_ms(lambda: ledger.standing(tenant_budget)),
         median_ms(lambda: whole_period(tenant_budget))),
        ("member budget, month", median_ms(lambda: ledger.standing(member_budget)),
         median_ms(lambda: whole_period(member_budget))),
    ]
    print(f"`.venv/bin/python bench/bench_budgets.py --members {args.members} --days "
          f"{args.days}` on {machine()}; {args.members * args.days} rollup rows, "
          f"{period_start('month')} to today\n")
    print("| what an admission reads | 2 days live, past days once (ms) | whole period (ms) "
          "| ratio |\n|---|---|---|---|")
    for name, ours, plain in rows:
        print(f"| {name} | {ours:.2f} | {plain:.2f} | {plain / ours:.1f}x |")
    with_budgets, without = median_ms(lambda: admit(member)), median_ms(lambda: admit(free))
    print(f"\nWhole admission (claim, lock, standings, reservation): {with_budgets:.2f} ms "
          f"with a tenant and a member budget, {without:.2f} ms without budgets "
          f"({with_budgets / without:.1f}x).")


if __name__ == "__main__":
    main()
