"""Preference K/V cache: invalidation after commit, clearing and warming on request."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db import transaction

from tenants.actions.base import assert_actor_may_manage, audit
from tenants.errors import WorkerUnavailable
from tenants.models import AuditEvent, Member, Preference

# The logger keeps the name it had before actions became a package.
log = logging.getLogger("tenants.actions")


def invalidate_on_commit(tenant_id: int, member_id: int | None = None) -> None:
    """Drop cached K/V (L2 + every worker's L1) once the current transaction commits.

    Never before: a rolled-back change must not evict anything, and a worker that
    re-reads the row right after the eviction must see the committed text.
    """

    def run() -> None:
        from gpu_worker import kvstore

        result = kvstore.invalidate(tenant_id, member_id)
        log.info("invalidated K/V tenant=%s member=%s: %s", tenant_id, member_id, result)

    transaction.on_commit(run, robust=True)


@transaction.atomic
def do_clear_kv_cache(members: Iterable[Member], *, actor=None) -> int:
    """Drop the cached K/V of each member (L2 and every worker's L1) after commit."""
    count = 0
    for member in members:
        assert_actor_may_manage(actor, member.tenant)
        audit(member.tenant, AuditEvent.CACHE_CLEARED, actor=actor, target=str(member))
        invalidate_on_commit(member.tenant_id, member.pk)
        count += 1
    return count


def warm_task():
    """The workers' ``warm_member(member_id)`` task, or None when this build has none."""
    from gpu_worker import tasks

    return getattr(tasks, "warm_member", None)


@transaction.atomic
def do_warm_kv_cache(members: Iterable[Member], *, actor=None) -> int:
    """Ask a worker to precompute each member's preference K/V (after commit).

    Members without an enabled, non-empty preference have nothing to warm and are skipped.
    """
    task = warm_task()
    if task is None:
        raise WorkerUnavailable("Warming needs the workers' warm_member task, "
                                "which this deployment does not provide.")
    count = 0
    for member in members:
        assert_actor_may_manage(actor, member.tenant)
        pref = Preference.objects.filter(tenant=member.tenant, member=member).first()
        if pref is None or not pref.enabled or not pref.text:
            continue
        audit(member.tenant, AuditEvent.CACHE_WARMED, actor=actor, target=str(member),
              version=pref.version, content_hash=pref.content_hash)
        transaction.on_commit(lambda pk=member.pk: task.delay(pk), robust=True)
        count += 1
    return count
