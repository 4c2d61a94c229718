"""Operator commands for the K/V cache: ``kvcache stats|clear|warm|verify|rotate-key``.

Thin: parse, resolve tenant/user, call gpu_worker.ops.maintenance / cachestats / warming,
print a table or ``--json``. Unknown tenant or user, Redis down, a worker that fails or
does not answer: a clear message and a non-zero exit.
"""

from __future__ import annotations

import json
import sys

import redis
from django.core.management.base import BaseCommand, CommandError

from gpu_worker.ops import cachestats, maintenance, warming
from tenants.errors import PlatformError
from tenants.origin import CliCommandMixin

EXIT_BAD_ENTRIES = 3  # verify --strict found (and deleted) bad entries


class Command(CliCommandMixin, BaseCommand):
    help = "Inspect and maintain the K/V cache (L1 on every worker, L2 in Redis)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        stats = sub.add_parser("stats", help="Per-tier entries, bytes and hit rates per tenant.")
        clear = sub.add_parser("clear", help="Drop L1 on every worker and matching L2 entries.")
        warm = sub.add_parser("warm", help="Precompute K/V of every enabled preference.")
        verify = sub.add_parser("verify", help="Check every L2 entry's HMAC; delete bad ones.")
        rotate = sub.add_parser("rotate-key", help="New L2 signing-key generation.")
        for p in (stats, clear, warm, verify):
            p.add_argument("--tenant", help="Tenant slug (default: all tenants).")
        clear.add_argument("--user", help="Username within --tenant.")
        warm.add_argument("--timeout", type=float, default=600.0)
        verify.add_argument("--strict", action="store_true",
                            help=f"Exit {EXIT_BAD_ENTRIES} when bad entries were found.")
        for p in (stats, clear, warm, verify, rotate):
            p.add_argument("--json", action="store_true", help="Machine-readable output.")

    def handle(self, *args, **opts):
        action = opts["action"].replace("-", "_")
        try:
            scope = maintenance.resolve_scope(opts.get("tenant"), opts.get("user"))
            report = getattr(self, f"_{action}")(scope, opts)
        except PlatformError as exc:
            raise CommandError(exc.message) from exc
        except redis.RedisError as exc:
            raise CommandError(f"Redis is unavailable: {exc}") from exc
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc
        if opts["json"]:
            self.stdout.write(json.dumps(report, sort_keys=True, default=str))
        else:
            getattr(self, f"_print_{action}")(report)
        if report.get("workers_unconfirmed"):
            raise CommandError(f"{report['workers_unconfirmed']} worker process(es) did not "
                               "answer in time; their caches may be stale.")
        if action == "warm" and report["failed"]:
            raise CommandError(f"{len(report['failed'])} member(s) could not be warmed.")
        if action == "verify" and opts["strict"] and report["bad"]:
            sys.exit(EXIT_BAD_ENTRIES)

    # -- actions -----------------------------------------------------------------------
    def _stats(self, scope, opts):
        return cachestats.cache_stats(scope)

    def _clear(self, scope, opts):
        return maintenance.do_clear_cache(scope)

    def _warm(self, scope, opts):
        progress = None if opts["json"] else self._progress
        return warming.warm(scope, timeout=opts["timeout"], progress=progress)

    def _verify(self, scope, opts):
        return maintenance.verify_l2(scope)

    def _rotate_key(self, scope, opts):
        return maintenance.do_rotate_key()

    # -- human output ----------------------------------------------------------------------
    def _progress(self, n: int, total: int) -> None:
        width = 30
        filled = int(width * n / total) if total else width
        end = "\n" if n == total else ""
        self.stderr.write(f"\rwarming [{'#' * filled}{'.' * (width - filled)}] {n}/{total}",
                          ending=end)
        self.stderr.flush()

    def _print_stats(self, r):
        w = self.stdout.write
        w(f"key generation {r['key_generation']}; live workers: "
          f"{', '.join(r['live_workers']) or 'none'}")
        for row in r["workers"]:
            l1 = row["l1"]
            w(f"  worker {row['worker']} pid {row['pid']} ({row['pool']}): L1 {l1['entries']} "
              f"entries {_mb(l1['bytes'])} ({_mb(l1.get('pinned_bytes', 0))} pinned), "
              f"hit rate {_pct(l1['hit_rate'])}")
            if prof := row.get("profile"):
                w(f"    model profile: {prof['name']} (model key {prof['model_key']}, "
                  f"{'calibrated' if prof['calibrated'] else 'not calibrated'}), "
                  f"guidance default {prof['guidance']}, reminder "
                  f"{_onoff(prof.get('reminder'))}, constraints {_onoff(prof.get('constraints'))}"
                  f", loop guard {_onoff(prof.get('loop_guard'))}")
            pool = row.get("host_pool")
            if pool:
                w(f"    host pool: {_mb(pool['held_bytes'])} held of {_mb(pool['max_bytes'])}, "
                  f"{_mb(pool['in_use_bytes'])} in use, {pool['reused']} reused, "
                  f"{pool['overflow']} overflowed")
            batch = row.get("batch")
            if batch:
                w(f"    batch engine: {batch['active']} running, {batch['waiting']} waiting, "
                  f"max {batch['max_batch']}, peak {batch['peak_batch']}, "
                  f"{batch['batched_steps']}/{batch['steps']} steps batched, "
                  f"{batch['oom_shrinks']} OOM shrinks")
        w(f"{'tenant':<20} {'L1 entries':>10} {'L1 MB':>8} {'L1 hit':>7} "
          f"{'L2 entries':>10} {'L2 MB':>8} {'L2 hit':>7} {'L2 rejects':>10}")
        rows = list(r["tenants"].items()) + ([("(all)", r["totals"])] if "totals" in r else [])
        for slug, t in rows:
            a, b = t["l1"], t["l2"]
            w(f"{slug:<20} {a['entries']:>10} {_mb(a['bytes']):>8} {_pct(a['hit_rate']):>7} "
              f"{b['entries']:>10} {_mb(b['bytes']):>8} {_pct(b['hit_rate']):>7} "
              f"{b['rejects']:>10}")
        if r.get("kinds"):
            w(f"{'kind':<20} {'L1 entries':>10} {'L1 MB':>8} {'pinned MB':>9} {'L1 hits':>8} "
              f"{'L1 miss':>8} {'L2 hits':>8} {'L2 miss':>8} {'L2 entries':>10} {'L2 MB':>8}")
        for kind, k in (r.get("kinds") or {}).items():
            l2n, l2b = k.get("l2_entries"), k.get("l2_bytes")
            w(f"{kind:<20} {k.get('entries', 0):>10} {_mb(k.get('bytes', 0)):>8} "
              f"{_mb(k.get('pinned_bytes', 0)):>9} {k.get('l1_hits', 0):>8} "
              f"{k.get('l1_misses', 0):>8} {k.get('l2_hits', 0):>8} {k.get('l2_misses', 0):>8} "
              f"{'-' if l2n is None else l2n:>10} {'-' if l2b is None else _mb(l2b):>8}")
        if r.get("kinds"):
            w("(L2: the member row counts member segments and members' leans together; "
              "conversation links are counted apart, from each tenant's link ledger)")

    def _print_clear(self, r):
        self.stdout.write(f"cleared {r['scope']}: {r['l1_deleted']} L1 entries on "
                          f"{len(r['workers'])} worker process(es), {r['l2_deleted']} L2 entries")

    def _print_warm(self, r):
        tiers = ", ".join(f"{k} {v}" for k, v in sorted(r["tiers"].items())) or "-"
        self.stdout.write(f"warmed {r['warmed']}/{r['members']} members of {r['scope']} "
                          f"({tiers}); failed {len(r['failed'])}")
        for f in r["failed"]:
            self.stderr.write(f"  member {f['member']}: {f['error']}")

    def _print_verify(self, r):
        self.stdout.write(f"verified {r['scanned']} L2 entries of {r['scope']}: {r['ok']} ok, "
                          f"{r['bad']} bad, {r['deleted']} deleted")
        for name in r["bad_keys"]:
            self.stdout.write(f"  bad: {name}: {r['reasons'].get(name, '')}")

    def _print_rotate_key(self, r):
        self.stdout.write(
            f"signing key generation {r['old_generation']} -> {r['new_generation']}; "
            f"{r['workers_switched']}/{len(r['workers'])} worker process(es) switched; "
            f"purged {r['l2_purged']} old L2 entries"
        )


def _mb(n: int) -> str:
    return f"{n / 1024**2:.2f}"


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.1f}%"


def _onoff(flag: bool | None) -> str:
    return "-" if flag is None else ("on" if flag else "off")  # None: a worker without it
