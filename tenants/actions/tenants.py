"""Tenant lookup, creation and changes."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils.text import slugify

from tenants import rules
from tenants.actions.base import assert_actor_may_manage, audit
from tenants.actions.cache import invalidate_on_commit
from tenants.errors import Conflict, InvalidInput, NotFound
from tenants.models import AuditEvent, Tenant


def get_tenant(slug: str) -> Tenant:
    try:
        return Tenant.objects.get(slug=slug)
    except Tenant.DoesNotExist:
        raise NotFound(f"Unknown tenant {slug!r}.") from None


@transaction.atomic
def do_create_tenant(slug: str, name: str = "", *, actor=None) -> Tenant:
    if slugify(slug) != slug or not slug:
        raise InvalidInput(f"Tenant slug {slug!r} must be lowercase letters, digits and dashes.")
    if Tenant.objects.filter(slug=slug).exists():
        raise Conflict(f"Tenant {slug!r} already exists.")
    tenant = Tenant.objects.create(slug=slug, name=name or slug, **rules.instruction_fields(""))
    audit(tenant, AuditEvent.TENANT_CREATED, actor=actor, target=slug, name=tenant.name)
    return tenant


TENANT_FIELDS = ("name", "active", "audit_message_text", "max_completion_tokens",
                 "memory_contrast", "memory_reminder", "decoding_constraints", "loop_guard",
                 "memory_writes_enabled", "instruction_rules_enabled")


def _strength_in_range(changes: dict[str, Any], field: str, high: int) -> None:
    """An optional per-tenant strength: empty (the model's default) or within [0, high]."""
    value = changes.get(field)
    if value is not None and not (isinstance(value, (int, float)) and 0 <= value <= high):
        raise InvalidInput(f"{field} must be between 0 and {high} (empty: the model's "
                           "default).", fields={field: [f"Between 0 and {high}."]})


@transaction.atomic
def do_update_tenant(tenant: Tenant, *, actor=None, **changes: Any) -> Tenant:
    """Change name/active/audit_message_text/max_completion_tokens; audited old -> new (only
    what changed)."""
    if unknown := set(changes) - set(TENANT_FIELDS):
        raise InvalidInput(f"Cannot change {', '.join(sorted(unknown))} of a tenant.")
    if "name" in changes and not (changes["name"] or "").strip():
        raise InvalidInput("A tenant needs a name.")
    _strength_in_range(changes, "memory_contrast", 4)
    for switch in ("memory_reminder", "decoding_constraints", "loop_guard"):
        if changes.get(switch) not in (None, True, False):
            raise InvalidInput(f"{switch} must be true, false or empty (the platform's "
                               "default).", fields={switch: ["true, false or empty."]})
    if changes.get("instruction_rules_enabled", True) not in (True, False):
        raise InvalidInput("instruction_rules_enabled must be true or false.",
                           fields={"instruction_rules_enabled": ["true or false."]})
    assert_actor_may_manage(actor, tenant)
    locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
    changed = {f: v for f, v in changes.items() if getattr(locked, f) != v}
    if not changed:
        return locked
    old = {f: getattr(locked, f) for f in changed}
    for field, value in changed.items():
        setattr(locked, field, value)
    locked.save(update_fields=sorted(changed))
    audit(locked, AuditEvent.TENANT_CHANGED, actor=actor, target=locked.slug, old=old,
          new=changed)
    return locked


def do_set_tenant_active(tenant: Tenant, active: bool, *, actor=None) -> Tenant:
    return do_update_tenant(tenant, active=active, actor=actor)


INSTRUCTIONS_MAX_CHARS = 4000


@transaction.atomic
def do_set_tenant_instructions(
    tenant: Tenant, text: str, *, expected_version: int | None = None, actor=None
) -> Tenant:
    """Change the tenant-wide instructions (versioned by the database, audited old -> new).

    Every member's injected system turn starts with them, so every cached K/V of the
    tenant is dropped after commit (keys cover the text: stale entries never hit anyway).
    """
    if len(text) > INSTRUCTIONS_MAX_CHARS:
        raise InvalidInput(f"Instructions are limited to {INSTRUCTIONS_MAX_CHARS} characters.")
    assert_actor_may_manage(actor, tenant)
    locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
    if expected_version is not None and locked.instructions_version != expected_version:
        raise Conflict("The instructions were changed meanwhile "
                       f"(now version {locked.instructions_version}).")
    if locked.instructions == text:
        return locked
    old = locked.instructions
    locked.instructions = text
    locked.save(update_fields=["instructions"])
    # read once (issue 57); a statement of its own: the text's update emptied the old rules
    Tenant.objects.filter(pk=locked.pk).update(**rules.instruction_fields(text))
    locked.refresh_from_db(fields=["instructions_version", "instruction_rules",
                                   "instruction_rules_version"])
    audit(locked, AuditEvent.TENANT_INSTRUCTIONS_CHANGED, actor=actor, target=locked.slug,
          old=old, new=text, version=locked.instructions_version)
    invalidate_on_commit(locked.pk)
    return locked
