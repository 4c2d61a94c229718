"""Every state change goes through a ``do_*`` function: one transaction, audit row included."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from tenants.errors import Conflict, Forbidden, InvalidInput, NotFound, WorkerUnavailable
from tenants.models import (
    ApiToken,
    AuditEvent,
    AuditLog,
    Conversation,
    Member,
    Message,
    Preference,
    Tenant,
)

User = get_user_model()
PREFERENCE_MAX_CHARS = 4000
log = logging.getLogger(__name__)


def audit(
    tenant: Tenant | None, event: AuditEvent, *, actor=None, target: str = "", **data: Any
) -> AuditLog:
    """Write one audit row (call inside the transaction of the change it records)."""
    return AuditLog.objects.create(
        tenant=tenant, actor=actor, event_type=event, target=target[:200], data=data
    )


def assert_actor_may_manage(actor, tenant: Tenant | None) -> None:
    """Defence in depth for admin-originated changes: an actor that is not a superuser
    may only touch its own tenant (None = system/shell, trusted)."""
    if actor is None or actor.is_superuser:
        return
    member = Member.objects.filter(user=actor).only("tenant_id").first()
    if member is None or tenant is None or member.tenant_id != tenant.pk:
        raise Forbidden("Not allowed for this tenant.")


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
    tenant = Tenant.objects.create(slug=slug, name=name or slug)
    audit(tenant, AuditEvent.TENANT_CREATED, actor=actor, target=slug, name=tenant.name)
    return tenant


TENANT_FIELDS = ("name", "active", "audit_message_text")


@transaction.atomic
def do_update_tenant(tenant: Tenant, *, actor=None, **changes: Any) -> Tenant:
    """Change name/active/audit_message_text; audited old -> new (only what changed)."""
    if unknown := set(changes) - set(TENANT_FIELDS):
        raise InvalidInput(f"Cannot change {', '.join(sorted(unknown))} of a tenant.")
    if "name" in changes and not (changes["name"] or "").strip():
        raise InvalidInput("A tenant needs a name.")
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


@transaction.atomic
def do_add_member(
    tenant: Tenant,
    username: str,
    *,
    admin: bool = False,
    password: str | None = None,
    preference: str | None = None,
    actor=None,
) -> Member:
    if not username or len(username) > 150:
        raise InvalidInput("Username must be 1-150 characters.")
    if User.objects.filter(username=username).exists():
        raise Conflict(f"User {username!r} already exists.")
    try:
        with transaction.atomic():
            user = User.objects.create_user(username=username, password=password)
    except IntegrityError:
        raise Conflict(f"User {username!r} already exists.") from None
    if admin:  # tenant admins use the scoped Django admin
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    role = Member.Role.ADMIN if admin else Member.Role.USER
    member = Member.objects.create(tenant=tenant, user=user, role=role)
    audit(tenant, AuditEvent.MEMBER_CREATED, actor=actor, target=username, role=role)
    if preference is not None:
        do_set_preference(member, text=preference, actor=actor)
    return member


def _refuse_superuser_target(member: Member, actor) -> None:
    if member.user.is_superuser and not (actor is None or actor.is_superuser):
        raise Forbidden("Only a superuser may change a superuser's account.")


@transaction.atomic
def do_change_member(
    member: Member, *, role: str | None = None, active: bool | None = None, actor=None
) -> Member:
    """Change a member's role/active flag; a tenant admin role carries Django staff status."""
    if role is not None and role not in Member.Role.values:
        raise InvalidInput(f"Unknown role {role!r}.")
    assert_actor_may_manage(actor, member.tenant)
    locked = Member.objects.select_for_update().select_related("user", "tenant").get(pk=member.pk)
    _refuse_superuser_target(locked, actor)
    old = {"role": locked.role, "active": locked.active}
    new = {"role": role or old["role"], "active": old["active"] if active is None else active}
    if new == old:
        return locked
    locked.role, locked.active = new["role"], new["active"]
    locked.save(update_fields=["role", "active"])
    staff = locked.role == Member.Role.ADMIN
    if locked.user.is_staff != staff and not locked.user.is_superuser:
        locked.user.is_staff = staff
        locked.user.save(update_fields=["is_staff"])
    audit(locked.tenant, AuditEvent.MEMBER_CHANGED, actor=actor, target=str(locked), old=old,
          new=new)
    return locked


@transaction.atomic
def do_delete_member(member: Member, *, actor=None) -> None:
    """Delete a member and its user account (preference, tokens and conversations go too)."""
    assert_actor_may_manage(actor, member.tenant)
    _refuse_superuser_target(member, actor)
    if actor is not None and member.user_id == actor.pk:
        raise InvalidInput("You cannot delete your own account.")
    tenant, target = member.tenant, str(member)
    pref = Preference.objects.filter(member=member).first()
    old_pref = None if pref is None else {"text": pref.text, "enabled": pref.enabled,
                                          "alpha": pref.alpha, "version": pref.version}
    audit(tenant, AuditEvent.MEMBER_DELETED, actor=actor, target=target, role=member.role,
          preference=old_pref)
    member.user.delete()  # cascades to the member and its rows; signals invalidate K/V


@transaction.atomic
def do_record_account_change(user, fields: Iterable[str], *, created: bool = False,
                             actor=None) -> AuditLog | None:
    """Audit a change of a Django user account made by a platform operator (field names
    only: never password material)."""
    fields = sorted(f for f in fields if "password" not in f)
    if not fields and not created:
        return None
    member = Member.objects.select_related("tenant").filter(user=user).first()
    return audit(member.tenant if member else None, AuditEvent.MEMBER_CHANGED, actor=actor,
                 target=user.get_username(), account=True, created=created, fields=fields)


def do_record_login(user, *, ip: str = "", path: str = "") -> AuditLog:
    """Audit a (session) login; the member's tenant, or no tenant for platform users."""
    member = Member.objects.select_related("tenant").filter(user=user).first()
    return audit(member.tenant if member else None, AuditEvent.ADMIN_LOGIN, actor=user,
                 target=user.get_username(), ip=ip, path=path, superuser=user.is_superuser)


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


@transaction.atomic
def do_create_api_token(member: Member, *, actor=None) -> str:
    """Create a token and return the key (shown once; only its hash is stored)."""
    key = f"kvi_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(
        tenant=member.tenant, member=member, key_hash=ApiToken.hash_key(key), prefix=key[:12]
    )
    audit(member.tenant, AuditEvent.TOKEN_CREATED, actor=actor, target=str(member),
          prefix=token.prefix)
    return key


@transaction.atomic
def do_revoke_api_token(token: ApiToken, *, actor=None) -> None:
    token.revoked = True
    token.save(update_fields=["revoked"])
    audit(token.tenant, AuditEvent.TOKEN_REVOKED, actor=actor, target=str(token.member),
          prefix=token.prefix)


def _validate_preference(text: str | None, alpha: float | None) -> None:
    if text is not None and len(text) > PREFERENCE_MAX_CHARS:
        raise InvalidInput(f"Preference text is limited to {PREFERENCE_MAX_CHARS} characters.")
    if alpha is not None and not 0.0 <= alpha <= 1.0:
        raise InvalidInput("alpha must be between 0 and 1.")


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
    pref = Preference.objects.select_for_update().filter(member=member).first()
    if pref is not None and expected_version is not None and pref.version != expected_version:
        raise Conflict(f"The preference was changed meanwhile (now version {pref.version}).")
    if pref is None:
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
              new={"text": pref.text, "enabled": pref.enabled, "alpha": pref.alpha})
        return pref
    old = {"text": pref.text, "enabled": pref.enabled, "alpha": pref.alpha}
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
    return pref


@transaction.atomic
def do_delete_preference(member: Member, *, actor=None) -> None:
    assert_actor_may_manage(actor, member.tenant)
    pref = Preference.objects.select_for_update().filter(member=member).first()
    if pref is None:
        raise NotFound("This member has no preference.")
    old = {"text": pref.text, "enabled": pref.enabled, "alpha": pref.alpha}
    old["version"] = pref.version
    pref.delete()
    audit(member.tenant, AuditEvent.PREFERENCE_DELETED, actor=actor, target=str(member), old=old)


def get_conversation(member: Member, conversation_id: int) -> Conversation:
    """The member's own conversation; NotFound for unknown and foreign ids alike."""
    conv = Conversation.objects.filter(
        pk=conversation_id, tenant=member.tenant, member=member
    ).first()
    if conv is None:
        raise NotFound("Unknown conversation.")
    return conv


@transaction.atomic
def do_delete_conversation(member: Member, conversation_id: int, *, actor=None) -> None:
    conv = get_conversation(member, conversation_id)
    count = conv.messages.count()
    conv.delete()
    audit(member.tenant, AuditEvent.CONVERSATION_DELETED, actor=actor, target=str(member),
          conversation=conversation_id, messages=count)


@transaction.atomic
def do_record_chat(
    member: Member,
    conversation: Conversation | None,
    *,
    message: str,
    reply: str,
    usage: dict[str, int],
    cache: dict[str, Any],
    latency_ms: float,
    request_id: str,
) -> Conversation:
    """Store the exchange and its audit row (message text only if the tenant opted in)."""
    tenant = member.tenant
    if conversation is None:
        conversation = Conversation.objects.create(
            tenant=tenant, member=member, title=message[:80]
        )
    Message.objects.create(
        tenant=tenant, conversation=conversation, role=Message.Role.USER, content=message,
        token_count=usage.get("message_tokens", 0),
    )
    Message.objects.create(
        tenant=tenant, conversation=conversation, role=Message.Role.ASSISTANT, content=reply,
        token_count=usage.get("completion_tokens", 0),
    )
    conversation.save(update_fields=["updated_at"])
    data: dict[str, Any] = {
        "conversation": conversation.pk,
        "request_id": request_id,
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
        "cache_tier": cache.get("tier"),
        "preference_version": cache.get("preference_version"),
        "latency_ms": round(latency_ms, 1),
    }
    if tenant.audit_message_text:
        data["message"] = message
        data["reply"] = reply
    audit(tenant, AuditEvent.CHAT_REQUEST, actor=member.user, target=str(member), **data)
    return conversation
