"""K/V cache maintenance behind ``manage.py kvcache``: stats, clear, warm, verify, rotate-key.

State changes follow ``tenants.actions``: they run as one function that writes its audit
row inside ``transaction.atomic``. Workers are reached over the signed control channel
(request/reply), L2 directly in Redis. The engine's tenant id is ``str(Tenant.pk)``,
its user id ``str(Member.pk)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from gpu_worker.channels import control, kvstore
from tenants.actions import audit, get_tenant
from tenants.errors import InvalidInput, NotFound
from tenants.models import AuditEvent, Member, Tenant


@dataclass(frozen=True)
class Scope:
    tenant: Tenant | None = None
    member: Member | None = None

    @property
    def target(self) -> str:
        if self.member is not None:
            return f"{self.tenant.slug}/{self.member.user.username}"
        return self.tenant.slug if self.tenant is not None else "*"


def resolve_scope(tenant_slug: str | None, username: str | None = None) -> Scope:
    """Tenant by slug, user by username within it; NotFound / InvalidInput otherwise."""
    if username and not tenant_slug:
        raise InvalidInput("--user needs --tenant.")
    if not tenant_slug:
        return Scope()
    tenant = get_tenant(tenant_slug)
    if not username:
        return Scope(tenant)
    member = Member.objects.select_related("user").filter(
        tenant=tenant, user__username=username
    ).first()
    if member is None:
        raise NotFound(f"Unknown user {username!r} in tenant {tenant.slug!r}.")
    return Scope(tenant, member)


def _check_replies(replies: list[dict[str, Any]], op: str) -> None:
    failed = [r for r in replies if "error" in r]
    if failed:
        raise RuntimeError(f"{op}: {len(failed)} worker(s) failed: {failed[0]['error']}")


# -- clear -------------------------------------------------------------------------------
@transaction.atomic
def do_clear_cache(scope: Scope, *, actor=None) -> dict[str, Any]:
    """Drop L1 on every worker and the matching L2 entries; audited."""
    if scope.tenant is None:
        replies = control.request("clear_all")
        _check_replies(replies, "clear")
        l2_deleted = kvstore.l2_tier().evict_all()
    else:
        tid = str(scope.tenant.pk)
        uid = str(scope.member.pk) if scope.member is not None else None
        replies = control.request("invalidate", tenant=tid, user=uid)
        _check_replies(replies, "clear")
        l2_deleted = kvstore.l2_tier().evict(tid, uid)  # covers entries no worker knew of
        l2_deleted += sum((r.get("evicted") or {}).get("l2") or 0 for r in replies)
    report = {
        "scope": scope.target,
        "workers": sorted(f"{r.get('worker')}/{r.get('pid')}" for r in replies),
        "workers_unconfirmed": replies.missing,
        "l1_deleted": sum((r.get("evicted") or {}).get("l1") or 0 for r in replies),
        "l2_deleted": l2_deleted,
    }
    audit(scope.tenant, AuditEvent.CACHE_CLEARED, actor=actor, target=scope.target, **report)
    return report


# -- verify ------------------------------------------------------------------------------
def verify_l2(scope: Scope) -> dict[str, Any]:
    """Check every L2 entry's MAC and header (of the tenant, or all); delete bad ones."""
    tenant = str(scope.tenant.pk) if scope.tenant is not None else None
    report = kvstore.l2_tier().verify(tenant)
    report["scope"] = scope.target
    report["key_generation"] = kvstore.key_generation()
    return report


# -- rotate-key ----------------------------------------------------------------------------
@transaction.atomic
def do_rotate_key(*, actor=None) -> dict[str, Any]:
    """A new signing-key generation: workers swap their L2 signer and drop L1; entries
    signed under the old generation are never served again and are purged now."""
    client = control.redis_client()
    old = kvstore.key_generation(client)
    new = str(client.incr(kvstore.KEYGEN_KEY))
    replies = control.request("rotate_key", generation=new)
    _check_replies(replies, "rotate-key")
    tier = kvstore.l2_tier()
    purged = tier.verify(None)["deleted"]  # old-generation entries fail the new MAC
    purged_indexes = _purge_old_indexes(tier.client, tier.signer)
    report = {
        "old_generation": old,
        "new_generation": new,
        "workers": sorted(f"{r.get('worker')}/{r.get('pid')}" for r in replies),
        "workers_unconfirmed": replies.missing,  # they switch on their next request
        "workers_switched": sum(1 for r in replies if r.get("key_generation") == new),
        "l2_purged": purged,
        "l2_indexes_purged": purged_indexes,
    }
    audit(None, AuditEvent.CACHE_KEY_ROTATED, actor=actor, target="kv-signing-key", **report)
    return report


def _purge_old_indexes(client, signer) -> int:
    """User-index SETs and link ledgers whose tenant tag is not of the current generation."""
    current = {signer.tenant_tag(str(pk)) for pk in Tenant.objects.values_list("pk", flat=True)}
    stale = []
    for name in client.scan_iter(match=f"{signer.namespace}:*", count=500):
        parsed = signer.parse_name(name)
        if parsed is not None and parsed[1] != "e" and parsed[0] not in current:
            stale.append(name)
    for i in range(0, len(stale), 500):
        client.delete(*stale[i:i + 500])
    return len(stale)
