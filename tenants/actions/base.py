"""What every action shares: the audit row and the cross-tenant guard."""

from __future__ import annotations

from typing import Any

from tenants import origin
from tenants.errors import Forbidden
from tenants.models import AuditEvent, AuditLog, Member, Tenant


def audit(
    tenant: Tenant | None, event: AuditEvent, *, actor=None, target: str = "",
    actor_kind: str | None = None, **data: Any
) -> AuditLog:
    """Write one audit row (call inside the transaction of the change it records).

    ``actor_kind`` defaults to who is acting now (``tenants.origin``)."""
    return AuditLog.objects.create(
        tenant=tenant, actor=actor, event_type=event, target=target[:200], data=data,
        actor_kind=actor_kind or origin.current_kind(),
    )


def assert_actor_may_manage(actor, tenant: Tenant | None) -> None:
    """Defence in depth for admin-originated changes: an actor that is not a superuser
    may only touch its own tenant (None = system/shell, trusted)."""
    if actor is None or actor.is_superuser:
        return
    member = Member.objects.filter(user=actor).only("tenant_id").first()
    if member is None or tenant is None or member.tenant_id != tenant.pk:
        raise Forbidden("Not allowed for this tenant.")
