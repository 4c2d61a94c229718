"""A member's preference: create/change (versioned, optimistic check) and delete."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from tenants import rules
from tenants.actions.base import assert_actor_may_manage, audit
from tenants.errors import Conflict, InvalidInput, NotFound
from tenants.models import AuditEvent, Member, Preference

PREFERENCE_MAX_CHARS = 4000


def _validate_preference(text: str | None, alpha: float | None) -> None:
    if text is not None and len(text) > PREFERENCE_MAX_CHARS:
        raise InvalidInput(f"Preference text is limited to {PREFERENCE_MAX_CHARS} characters.")
    if alpha is not None and not 0.0 <= alpha <= 1.0:
        raise InvalidInput("alpha must be between 0 and 1.")


def _snapshot(pref: Preference) -> dict:
    """The audited fields of a preference."""
    return {"text": pref.text, "enabled": pref.enabled, "alpha": pref.alpha}


@transaction.atomic
def do_set_preference(
    member: Member,
    *,
    text: str | None = None,
    enabled: bool | None = None,
    alpha: float | None = None,
    expected_version: int | None = None,
    actor=None,
) -> Preference:
    """Create or change a member's preference; the version is bumped by the database.

    ``expected_version``: refuse (Conflict) if the preference changed since the caller
    read it (checked under the row lock, so no concurrent edit is overwritten).
    """
    _validate_preference(text, alpha)
    assert_actor_may_manage(actor, member.tenant)
    # the member row first, as memory writes do: the preference is their first memory
    Member.objects.select_for_update().filter(pk=member.pk).values_list("pk").first()
    pref = Preference.objects.select_for_update().filter(member=member).first()
    if pref is None:
        pref = _create_preference(member, text, enabled, alpha, actor)
        rules.store(member)  # its first memory's rules (written by the trigger)
        return pref
    if expected_version is not None and pref.version != expected_version:
        raise Conflict(f"The preference was changed meanwhile (now version {pref.version}).")
    old = _snapshot(pref)
    new = {
        "text": old["text"] if text is None else text,
        "enabled": old["enabled"] if enabled is None else enabled,
        "alpha": old["alpha"] if alpha is None else alpha,
    }
    if new == old:
        return pref
    for field, value in new.items():
        setattr(pref, field, value)
    pref.save(update_fields=["text", "enabled", "alpha", "updated_at"])
    pref.refresh_from_db(fields=["version"])
    audit(member.tenant, AuditEvent.PREFERENCE_CHANGED, actor=actor, target=str(member),
          old=old, new=new, version=pref.version)
    rules.store(member)  # its first memory's rules (written by the trigger)
    return pref


def _create_preference(member: Member, text, enabled, alpha, actor) -> Preference:
    try:
        with transaction.atomic():
            pref = Preference.objects.create(
                tenant=member.tenant, member=member, text=text or "",
                enabled=True if enabled is None else enabled,
                alpha=1.0 if alpha is None else alpha,
            )
    except IntegrityError:  # created concurrently by another request
        raise Conflict("The preference was created meanwhile; retry.") from None
    audit(member.tenant, AuditEvent.PREFERENCE_CREATED, actor=actor, target=str(member),
          new=_snapshot(pref))
    return pref


@transaction.atomic
def do_delete_preference(member: Member, *, actor=None) -> None:
    assert_actor_may_manage(actor, member.tenant)
    pref = Preference.objects.select_for_update().filter(member=member).first()
    if pref is None:
        raise NotFound("This member has no preference.")
    old = {**_snapshot(pref), "version": pref.version}
    pref.delete()
    audit(member.tenant, AuditEvent.PREFERENCE_DELETED, actor=actor, target=str(member), old=old)
