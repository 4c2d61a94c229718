"""The audit log: one append-only row per state change, chat and billing event."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.fields.json import KeyTextTransform


class AuditEvent(models.TextChoices):
    TENANT_CREATED = "tenant.created"
    TENANT_CHANGED = "tenant.changed"
    TENANT_INSTRUCTIONS_CHANGED = "tenant.instructions_changed"
    MEMBER_CREATED = "member.created"
    MEMBER_CHANGED = "member.changed"
    MEMBER_DELETED = "member.deleted"
    TOKEN_CREATED = "token.created"
    TOKEN_REVOKED = "token.revoked"
    PREFERENCE_CREATED = "preference.created"
    PREFERENCE_CHANGED = "preference.changed"
    PREFERENCE_DELETED = "preference.deleted"
    ADMIN_LOGIN = "admin.login"
    ADMIN_LOGIN_FAILED = "admin.login_failed"
    CACHE_CLEARED = "cache.cleared"
    CACHE_WARMED = "cache.warmed"
    CACHE_KEY_ROTATED = "cache.key_rotated"
    CHAT_REQUEST = "chat.request"
    CHAT_ABANDONED = "chat.abandoned"
    CHAT_CANCELLED = "chat.cancelled"
    CHAT_DISCARDED = "chat.discarded"  # generated after its claim was abandoned: billed only
    CHAT_FAILED = "chat.failed"  # failed after generating (time limit, OOM): billed only
    CONVERSATION_DELETED = "conversation.deleted"
    PLAYGROUND_USED = "playground.used"
    BUDGET_CHANGED = "budget.changed"
    BUDGET_THRESHOLD = "budget.threshold"
    MEMORY_CREATED = "memory.created"
    MEMORY_CHANGED = "memory.changed"
    MEMORY_DELETED = "memory.deleted"
    MEMORY_REORDERED = "memory.reordered"
    MEMORY_RULES_SWITCHED = "memory.rules_switched"  # a memory's rules switched off or on


BILLED_CHAT_EVENTS = (AuditEvent.CHAT_REQUEST, AuditEvent.CHAT_CANCELLED,
                      AuditEvent.CHAT_DISCARDED, AuditEvent.CHAT_FAILED)


class AuditLog(models.Model):
    """Append-only: UPDATE/DELETE are refused by a Postgres trigger (see migrations)."""

    # Null tenant only for platform-level events (superuser login, key rotation).
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, null=True, blank=True, related_name="audit_logs"
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.DO_NOTHING, null=True, blank=True,
        db_constraint=False, related_name="+",
    )
    event_type = models.CharField(max_length=32, choices=AuditEvent.choices, db_index=True)
    # member / admin / cli / system (tenants.origin); null on rows written before 0009.
    actor_kind = models.CharField(max_length=16, null=True, blank=True)
    target = models.CharField(max_length=200, blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="audit_tenant_time")]
        constraints = [
            # Every chat attempt (request id) is billed by at most one of these rows: its
            # stored reply, its cancelled stream, its reply generated after the claim was
            # abandoned, or what it generated before it failed (tenants.actions.chat). A
            # second billing of the same attempt (a duplicate delivery of its task) is
            # refused here, not counted twice.
            models.UniqueConstraint(
                "tenant", KeyTextTransform("request_id", "data"), name="audit_chat_billed_once",
                condition=Q(event_type__in=BILLED_CHAT_EVENTS)),
        ]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.event_type} {self.target}"
