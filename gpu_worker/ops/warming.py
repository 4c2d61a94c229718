"""``kvcache warm``: precompute the K/V of every enabled preference on the GPU workers.

One ``gpu_worker.tasks.warm_member`` task per member, routed like chat (a member with a
live affine worker warms there); each worker computes once (L1 here + L2 for every
other worker) and records the affinity, so the member's next chat hits L1.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from django.db import transaction

from gpu_worker.ops.maintenance import Scope
from gpu_worker.routing import registry
from gpu_worker.routing.affinity import choose_queue
from tenants.actions import audit
from tenants.errors import WorkerUnavailable
from tenants.models import AuditEvent, Member, Tenant

Progress = Callable[[int, int], None]


def members_to_warm(scope: Scope):
    qs = Member.objects.select_related("tenant").filter(
        active=True, tenant__active=True, user__is_active=True,
        preference__enabled=True,
    ).exclude(preference__text="").order_by("tenant_id", "pk")
    if scope.tenant is not None:
        qs = qs.filter(tenant=scope.tenant)
    return list(qs)


def warm(scope: Scope, *, timeout: float = 600.0, progress: Progress | None = None,
         actor=None) -> dict[str, Any]:
    """Warm every enabled preference in scope; returns a summary (audited per tenant)."""
    from gpu_worker.tasks import warm_member

    members = members_to_warm(scope)
    if members and not registry.live_workers():
        raise WorkerUnavailable("No live GPU worker to warm the cache on.")
    pending = {}
    for m in members:
        route = choose_queue(m.pk)
        pending[warm_member.apply_async(args=(m.pk,), queue=route.queue)] = m
    done: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    _report(progress, 0, len(members))
    while pending and time.monotonic() < deadline:
        for res in [r for r in pending if r.ready()]:
            m = pending.pop(res)
            if res.successful():
                done.append(res.result)
            else:
                failed.append({"member": m.pk, "error": f"{type(res.result).__name__}: "
                                                       f"{res.result}"})
            res.forget()
            _report(progress, len(done) + len(failed), len(members))
        time.sleep(0.05)
    for res, m in pending.items():  # timed out: revoke so no worker picks them up later
        res.revoke()
        failed.append({"member": m.pk, "error": "timed out"})
    summary = _summary(scope, members, done, failed)
    _audit(members, done, failed, actor)
    return summary


def _report(progress: Progress | None, n: int, total: int) -> None:
    if progress is not None:
        progress(n, total)


def _summary(scope, members, done, failed) -> dict[str, Any]:
    return {
        "scope": scope.target,
        "members": len(members),
        "warmed": len(done),
        "failed": failed,
        "tiers": dict(Counter(d["tier"] for d in done)),
        "workers": dict(Counter(d["worker"] for d in done)),
    }


@transaction.atomic
def _audit(members, done, failed, actor) -> None:
    by_tenant: dict[int, Counter] = {}
    tier_of = {d["member"]: d["tier"] for d in done}
    failed_ids = {f["member"] for f in failed}
    for m in members:
        c = by_tenant.setdefault(m.tenant_id, Counter())
        c["failed" if m.pk in failed_ids else tier_of.get(m.pk, "none")] += 1
    tenants = Tenant.objects.in_bulk(list(by_tenant))
    for tid, counts in by_tenant.items():
        audit(tenants[tid], AuditEvent.CACHE_WARMED, actor=actor, target=tenants[tid].slug,
              members=sum(counts.values()), **{f"tier_{k}": v for k, v in counts.items()})
