"""``kvcache stats``: per-tier entries, bytes and hit rates, per tenant, from every live worker.

L1 figures come from each worker process's reply to a control-channel ``stats`` request
(so they are current, not a heartbeat old); L2 sizes from a SCAN of Redis; L2 hits and
misses from the workers' own L2 counters.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from gpu_worker.channels import control, kvstore
from gpu_worker.ops.maintenance import Scope
from gpu_worker.routing import registry
from tenants.models import Tenant

_L1_FIELDS = ("entries", "bytes", "hits", "misses", "evictions")
_L2_FIELDS = ("hits", "misses", "rejects", "errors", "writes", "skipped_writes",
              "refused_writes", "link_evictions", "entry_evictions")


def hit_rate(hits: int, misses: int) -> float | None:
    total = hits + misses
    return round(hits / total, 4) if total else None


def cache_stats(scope: Scope) -> dict[str, Any]:
    replies = control.request("stats")
    tenants = (
        [scope.tenant] if scope.tenant is not None else list(Tenant.objects.order_by("slug"))
    )
    ids = [str(t.pk) for t in tenants]
    l1 = _sum_per_tenant(replies, "l1", _L1_FIELDS, ids)
    l2_counts = _sum_per_tenant(replies, "l2", _L2_FIELDS, ids)
    tier = kvstore.l2_tier()
    l2_sizes = tier.stats(scan=True, tenants=ids)
    out_tenants = {}
    for t, tid in zip(tenants, ids, strict=True):
        a, b = l1[tid], l2_counts[tid]
        size = (l2_sizes["per_tenant"].get(tid) or {})
        out_tenants[t.slug] = {
            "tenant_id": tid,
            "l1": {**a, "hit_rate": hit_rate(a["hits"], a["misses"])},
            "l2": {"entries": size.get("entries", 0), "bytes": size.get("bytes", 0), **b,
                   "link_entries": size.get("link_entries", 0),
                   "link_bytes": size.get("link_bytes", 0),
                   "ledger_entries": size.get("ledger_entries", 0),
                   "ledger_bytes": size.get("ledger_bytes", 0),
                   "hit_rate": hit_rate(b["hits"], b["misses"])},
        }
    report: dict[str, Any] = {
        "scope": scope.target,
        "key_generation": kvstore.key_generation(),
        "workers": [_worker_row(r, ids if scope.tenant is not None else None) for r in replies],
        "live_workers": sorted(registry.live_workers()),
        "workers_unconfirmed": replies.missing,
        "tenants": out_tenants,
        "kinds": _l2_kinds(_kinds(replies), tier, ids, l2_sizes),
        "kv": _kv_format(replies),
    }
    if scope.tenant is None:
        report["totals"] = _totals(out_tenants, l2_sizes)
    return report


def _kinds(replies) -> dict[str, dict[str, Any]]:
    """Tenant segments, member segments and conversation links, summed over the workers:
    L1 entries/bytes and hits/misses per tier (worker-wide, not per tenant)."""
    out: dict[str, dict[str, Any]] = {}
    for r in replies:
        for kind, row in (((r.get("stats") or {}).get("kinds")) or {}).items():
            agg = out.setdefault(kind, defaultdict(int))
            for f, n in row.items():
                agg[f] += int(n or 0)
    return {k: {**v, "hit_rate": hit_rate(v["l1_hits"] + v["l2_hits"],
                                          max(0, v["l1_misses"] - v["l2_hits"]))}
            for k, v in ((k, dict(v)) for k, v in out.items())}


def _kv_format(replies) -> dict[str, Any] | None:
    """K/V bytes per cached token of the loaded model (and its dtype), as a worker says."""
    for r in replies:
        kv = (r.get("stats") or {}).get("kv")
        if kv:
            return kv
    return None


def l2_kind_sizes(tier, ids: list[str], l2_sizes: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Redis entries/bytes per kind over tenants ``ids``: tenant segments (their own index),
    conversation links (each tenant's link ledger) and member segments (the rest)."""
    from injection.kvcache.chain import TENANT_USER

    seg, links, total = ({"entries": 0, "bytes": 0} for _ in range(3))
    for tid in ids:
        for f, n in tier.user_sizes(tid, TENANT_USER).items():
            seg[f] += n
        row = l2_sizes["per_tenant"].get(tid) or {}
        for f in total:
            total[f] += int(row.get(f, 0) or 0)
            links[f] += int(row.get(f"link_{f}", 0) or 0)
    rest = {f: total[f] - seg[f] - links[f] for f in total}
    return {"tenant": seg, "member": rest, "conversation": links}


def _l2_kinds(kinds: dict[str, dict[str, Any]], tier, ids: list[str],
              l2_sizes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    for kind, row in l2_kind_sizes(tier, ids, l2_sizes).items():
        kinds.setdefault(kind, {}).update(l2_entries=row["entries"], l2_bytes=row["bytes"])
    return kinds


def _sum_per_tenant(replies, tier: str, fields, ids) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {tid: dict.fromkeys(fields, 0) for tid in ids}
    for r in replies:
        per = (((r.get("stats") or {}).get(tier)) or {}).get("per_tenant") or {}
        for tid in ids:
            for f in fields:
                out[tid][f] += int((per.get(tid) or {}).get(f, 0) or 0)
    return out


def _worker_row(reply: dict[str, Any], only: list[str] | None) -> dict[str, Any]:
    """One worker process; with a tenant scope, only that tenant's L1 figures."""
    stats = reply.get("stats") or {}
    l1 = stats.get("l1") or {}
    if only is not None:
        per = l1.get("per_tenant") or {}
        agg = defaultdict(int)
        for tid in only:
            for f in _L1_FIELDS:
                agg[f] += int((per.get(tid) or {}).get(f, 0) or 0)
        l1 = dict(agg)
    row = {k: reply.get(k) for k in ("worker", "pid", "pool", "model_loaded", "key_generation")}
    row["kv_bytes_per_token"] = (stats.get("kv") or {}).get("bytes_per_token")
    row["profile"] = stats.get("profile")  # the loaded model's defaults (model/profiles.py)
    row["l1"] = {f: l1.get(f, 0) for f in _L1_FIELDS}
    row["l1"]["hit_rate"] = hit_rate(row["l1"]["hits"], row["l1"]["misses"])
    if only is None:  # engine-wide figures (not per tenant): the whole view only
        row["requests"] = ((stats.get("metrics") or {}).get("counters") or {}).get("requests", 0)
        row["batch"] = stats.get("batch")
        row["host_pool"] = stats.get("host_pool")
        row["l1"].update({f: int(l1.get(f, 0) or 0) for f in ("tensor_bytes", "pinned_bytes")})
    return row


def _totals(tenants: dict[str, Any], l2_sizes: dict[str, Any]) -> dict[str, Any]:
    l1 = {f: sum(t["l1"][f] for t in tenants.values()) for f in _L1_FIELDS}
    l2 = {f: sum(t["l2"][f] for t in tenants.values()) for f in _L2_FIELDS}
    l2.update(entries=l2_sizes.get("entries", 0), bytes=l2_sizes.get("bytes", 0))
    return {
        "l1": {**l1, "hit_rate": hit_rate(l1["hits"], l1["misses"])},
        "l2": {**l2, "hit_rate": hit_rate(l2["hits"], l2["misses"])},
    }
