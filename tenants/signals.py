"""Model signals: cached K/V is dropped after commit whenever preference data changes or goes.

An edit of what a member's segment is rendered from also warms the member again in the
background (``actions.warm_on_commit``, ``KV_WARM_ON_EDIT``).

A save that changes nothing the member's segment is rendered from (the same text, enabled
flag, pin and order: an alpha-only change, an admin form saved as it was) invalidates and
warms nothing: the member's segment and lean would be computed again exactly as they are.
A deleted conversation drops only its own K/V links (nothing is rendered from it).

Correctness never depends on these: the worker reads the preference fresh from Postgres
and keys K/V by the SHA-256 of its text, so a changed text (even via ``QuerySet.update()``,
which sends no signal) can never hit an old entry. Invalidation frees the memory and
removes deleted or superseded preference data from L2 and every worker's L1.
"""

from __future__ import annotations

from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.db.models.signals import post_delete, post_init, post_save
from django.dispatch import receiver

from tenants import actions
from tenants.models import Conversation, Member, Memory, Preference, Tenant

# what a member's segment (and so their lean) is rendered from, per model
_RENDERED = {Preference: ("text", "enabled"), Memory: ("text", "enabled", "pinned", "position")}
_LOADED = "_kvi_rendered"  # the instance's rendered fields as loaded or last saved


def _rendered(instance) -> tuple | None:
    """The instance's rendered fields (None when one is deferred: never read from here)."""
    values = instance.__dict__
    names = _RENDERED[type(instance)]
    return tuple(values[n] for n in names) if all(n in values for n in names) else None


@receiver(post_init, sender=Preference, dispatch_uid="kvi-preference-loaded")
@receiver(post_init, sender=Memory, dispatch_uid="kvi-memory-loaded")
def _loaded(sender, instance, **kwargs) -> None:
    instance.__dict__[_LOADED] = _rendered(instance) if instance.pk is not None else None


def _unchanged(instance, kwargs) -> bool:
    """A save of a loaded row whose rendered fields are as they were (kept as saved)."""
    if "created" not in kwargs:  # a deletion
        return False
    before, now = instance.__dict__.get(_LOADED), _rendered(instance)
    instance.__dict__[_LOADED] = now
    return not kwargs["created"] and now is not None and before == now


@receiver(post_save, sender=Preference, dispatch_uid="kvi-preference-saved")
@receiver(post_delete, sender=Preference, dispatch_uid="kvi-preference-deleted")
def _preference_changed(sender, instance: Preference, **kwargs) -> None:
    if _unchanged(instance, kwargs):
        return
    row = actions.invalidate_on_commit(instance.tenant_id, instance.member_id)
    actions.warm_on_commit(instance.member_id, row)  # what is left is cached again


@receiver(post_save, sender=Memory, dispatch_uid="kvi-memory-saved")
@receiver(post_delete, sender=Memory, dispatch_uid="kvi-memory-deleted")
def _memory_changed(sender, instance: Memory, **kwargs) -> None:
    # the member's segment is rendered from their memories (issue 22)
    if _unchanged(instance, kwargs):
        return
    row = actions.invalidate_on_commit(instance.tenant_id, instance.member_id)
    actions.warm_on_commit(instance.member_id, row)


@receiver(post_delete, sender=Member, dispatch_uid="kvi-member-deleted")
def _member_deleted(sender, instance: Member, **kwargs) -> None:
    actions.invalidate_on_commit(instance.tenant_id, instance.pk)


@receiver(post_save, sender=Member, dispatch_uid="kvi-member-saved")
def _member_saved(sender, instance: Member, created: bool, **kwargs) -> None:
    if not created and not instance.active:  # a deactivated member's K/V is dead weight
        actions.invalidate_on_commit(instance.tenant_id, instance.pk)


@receiver(post_delete, sender=Conversation, dispatch_uid="kvi-conversation-deleted")
def _conversation_deleted(sender, instance: Conversation, **kwargs) -> None:
    # its K/V links only (an outbox row of kind "links"): the member's segments and lean
    # are not rendered from it, so they stay cached and nothing is warmed
    actions.invalidate_on_commit(instance.tenant_id, instance.member_id,
                                 conversation_id=instance.pk)


@receiver(post_save, sender=Tenant, dispatch_uid="kvi-tenant-saved")
def _tenant_saved(sender, instance: Tenant, created: bool, **kwargs) -> None:
    if not created and not instance.active:
        actions.invalidate_on_commit(instance.pk)


@receiver(user_login_failed, dispatch_uid="kvi-login-failed-audit")
def _login_failed(sender, credentials, request=None, **kwargs) -> None:
    meta = getattr(request, "META", {}) if request is not None else {}
    actions.do_record_login_failure(
        str(credentials.get("username", "")), ip=meta.get("REMOTE_ADDR", ""),
        path=getattr(request, "path", "") or "",
    )


@receiver(user_logged_in, dispatch_uid="kvi-login-audit")
def _logged_in(sender, request, user, **kwargs) -> None:
    meta = getattr(request, "META", {}) if request is not None else {}
    actions.do_record_login(
        user, ip=meta.get("REMOTE_ADDR", ""), path=getattr(request, "path", "") or ""
    )
