"""Every state change goes through a ``do_*`` function: one transaction, audit row included."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from tenants.errors import Conflict, InvalidInput, NotFound
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


def audit(
    tenant: Tenant | None, event: AuditEvent, *, actor=None, target: str = "", **data: Any
) -> AuditLog:
    """Write one audit row (call inside the transaction of the change it records)."""
    return AuditLog.objects.create(
        tenant=tenant, actor=actor, event_type=event, target=target[:200], data=data
    )


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


@transaction.atomic
def do_set_tenant_active(tenant: Tenant, active: bool, *, actor=None) -> Tenant:
    tenant.active = active
    tenant.save(update_fields=["active"])
    audit(tenant, AuditEvent.TENANT_CHANGED, actor=actor, target=tenant.slug, active=active)
    return tenant


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
    actor=None,
) -> Preference:
    """Create or change a member's preference; the version is bumped by the database."""
    _validate_preference(text, alpha)
    pref = Preference.objects.select_for_update().filter(member=member).first()
    if pref is None:
        pref = Preference.objects.create(
            tenant=member.tenant, member=member, text=text or "",
            enabled=True if enabled is None else enabled, alpha=1.0 if alpha is None else alpha,
        )
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
    pref = Preference.objects.filter(member=member).first()
    if pref is None:
        raise NotFound("This member has no preference.")
    old = {"text": pref.text, "enabled": pref.enabled, "alpha": pref.alpha}
    pref.delete()
    audit(member.tenant, AuditEvent.PREFERENCE_DELETED, actor=actor, target=str(member), old=old)


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
