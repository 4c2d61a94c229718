"""Tenant-owned data. Every tenant-owned row carries a ``tenant`` FK; uniqueness is tenant-scoped.

State changes go through ``tenants.actions`` (``do_*``), which write the audit row
in the same transaction.
"""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.db import models
from django.db.models import Q

from injection.base import content_hash


class Tenant(models.Model):
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    active = models.BooleanField(default=True)
    # Opt-in: store chat message text in audit rows (off: only counts/metadata).
    audit_message_text = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Member(models.Model):
    class Role(models.TextChoices):
        ADMIN = "admin", "Tenant admin"
        USER = "user", "User"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="members")
    # A Django user belongs to exactly one tenant.
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="member"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.USER)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant__slug", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="member_unique_per_tenant"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.user.get_username()}"

    @property
    def is_tenant_admin(self) -> bool:
        return self.role == self.Role.ADMIN


class ApiToken(models.Model):
    """API key for a member. Only a SHA-256 of the key is stored; the key is shown once."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_tokens")
    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="api_tokens")
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)  # for display/identification only
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "prefix"], name="apitoken_prefix_per_tenant"),
        ]

    @staticmethod
    def hash_key(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    def __str__(self) -> str:
        return f"{self.prefix}…"


class Preference(models.Model):
    """A member's preference text, injected as K/V.

    ``version`` is bumped by a database trigger on every change of text/enabled/alpha,
    whatever the write path (admin, API, ``QuerySet.update()``, shell).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="preferences")
    member = models.OneToOneField(Member, on_delete=models.CASCADE, related_name="preference")
    text = models.TextField(blank=True, default="")
    enabled = models.BooleanField(default=True)
    alpha = models.FloatField(default=1.0)
    version = models.PositiveIntegerField(default=1)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "member"], name="preference_one_per_member"),
            models.CheckConstraint(
                condition=Q(alpha__gte=0.0) & Q(alpha__lte=1.0), name="preference_alpha_range"
            ),
        ]

    def __str__(self) -> str:
        return f"preference of {self.member} v{self.version}"

    @property
    def content_hash(self) -> str:
        """The engine's content hash of this text (what chat replies report)."""
        return content_hash(self.text)


class AuditEvent(models.TextChoices):
    TENANT_CREATED = "tenant.created"
    TENANT_CHANGED = "tenant.changed"
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
    CONVERSATION_DELETED = "conversation.deleted"


class AuditLog(models.Model):
    """Append-only: UPDATE/DELETE are refused by a Postgres trigger (see migrations)."""

    # Null tenant only for platform-level events (superuser login, key rotation).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, null=True, blank=True, related_name="audit_logs"
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.DO_NOTHING, null=True, blank=True,
        db_constraint=False, related_name="+",
    )
    event_type = models.CharField(max_length=32, choices=AuditEvent.choices, db_index=True)
    target = models.CharField(max_length=200, blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="audit_tenant_time")]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.event_type} {self.target}"


class Conversation(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="conversations")
    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["tenant", "member", "-updated_at"], name="conv_member")]


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField()
    token_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
