"""Tenant-owned data. Every tenant-owned row carries a ``tenant`` FK; uniqueness is tenant-scoped.

State changes go through ``tenants.actions`` (``do_*``), which write the audit row
in the same transaction.
"""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from injection.base import content_hash


class Tenant(models.Model):
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    active = models.BooleanField(default=True)
    # Opt-in: store chat message text in audit rows (off: only counts/metadata).
    audit_message_text = models.BooleanField(default=False)
    # Tenant-wide text that opens every member's injected system turn (before their
    # preference). The version is bumped by a database trigger whenever it changes.
    instructions = models.TextField(
        blank=True, default="",
        help_text="Tenant-wide instructions for the assistant, e.g. \"You are Acme's travel "
                  "assistant; answer briefly.\" Every member's replies are generated with these "
                  "instructions first, then the member's own preference, as the model's system "
                  "turn. Changing them recomputes every member's cached personalisation.",
    )
    instructions_version = models.PositiveIntegerField(default=1)
    # the rules read from ``instructions`` when they were saved (``tenants.rules``; as on
    # ``Memory``), and the admin's switch for them
    instruction_rules = models.JSONField(null=True, blank=True, default=None, editable=False)
    instruction_rules_version = models.PositiveIntegerField(default=0, db_default=0,
                                                            editable=False)
    instruction_rules_enabled = models.BooleanField(
        default=True, db_default=True, verbose_name="instruction rules on",
        help_text="Off: the instructions stay, but no rule read from them is applied to "
                  "members' replies (no decoding constraint, no language guidance).")
    # Most tokens one reply may generate for this tenant's members (empty: the server's
    # CHAT_MAX_NEW_TOKENS, which also bounds this). /v1 without max_tokens runs to it.
    max_completion_tokens = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Most tokens one reply may have (empty: the server's limit, "
                  "CHAT_MAX_NEW_TOKENS, which also bounds this value).")
    # contrastive guidance by the member's memories (injection/engine/guidance/contrast.py;
    # empty: the model's default)
    memory_contrast = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(4.0)],
        help_text="How strongly replies are steered by members' memories (each reply "
                  "against the same conversation without them), 0 (off) to 4; empty: the "
                  "model's default. Costs a second row per guided turn.")
    # the memory reminder (injection/prompting/reminder.py; empty: the model's default, its
    # profile's, else the platform's: on)
    memory_reminder = models.BooleanField(
        null=True, blank=True, default=None,
        help_text="Re-state members' memories at the start of their messages deep in a "
                  "conversation (\"(<memories>)\" before the message, from the third message "
                  "on; from the first with several memories). Its tokens count in "
                  "prompt_tokens. Empty: the model's default (on unless its profile says "
                  "off).")
    # decoding constraints (injection/prompting/constraints.py; empty: the model's default)
    decoding_constraints = models.BooleanField(
        null=True, blank=True, default=None,
        help_text="Keep the standing instructions (the tenant's and those in members' "
                  "memories) that the decoder can keep on every reply: lowercase, capitals, no "
                  "commas, a banned word, an opening or closing phrase; at any depth of a "
                  "conversation; the tenant's win over a member's. Empty: the model's "
                  "default (on unless its profile says off).")
    # the loop guard (injection/engine/decoding/loops.py; empty: the model's default)
    loop_guard = models.BooleanField(
        null=True, blank=True, default=None,
        help_text="Keep replies from looping: a reply never says the same run of its own "
                  "tokens twice (small models otherwise repeat a phrase until the token "
                  "limit). Empty: the model's default (its profile's; off without one).")
    memory_writes_enabled = models.BooleanField(
        default=False,
        help_text="Members may add or remove memories from a chat (\"remember that ...\", "
                  "\"forget ...\"); every write is audited and listed in /api/memories.")
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
            models.UniqueConstraint(
                fields=["tenant", "user"], name="member_unique_per_tenant",
                violation_error_message="This user is already a member of this tenant."),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.user.get_username()}"

    def own_preference(self) -> Preference | None:
        """This member's preference row, of its own tenant only, read at most once per loaded
        member: from ``select_related("preference")`` where it was loaded with the member
        (the worker), else one query, remembered on the member (the web's context check
        and budget estimate share it)."""
        cache = self._state.fields_cache
        if "preference" not in cache:
            cache["preference"] = Preference.objects.filter(
                tenant=self.tenant_id, member=self).first()
        pref = cache["preference"]
        return pref if pref is not None and pref.tenant_id == self.tenant_id else None

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
    name = models.CharField(max_length=100, blank=True, default="",
                            help_text="What the token is for, e.g. \"mobile app\" or "
                                      "\"CI\"; shown in lists and the audit log.")
    expires_at = models.DateTimeField(
        null=True, blank=True, verbose_name="expires",
        help_text="Optional. After this moment the token is refused; empty: never expires.")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "prefix"], name="apitoken_prefix_per_tenant",
                violation_error_message="A token with this prefix already exists; issue "
                                        "another one."),
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
    alpha = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="How strongly the preference shapes replies, 0 to 1. The preference is "
                  "injected as the model's system turn with its attention values scaled by "
                  "alpha: 1.0 reproduces exactly what the model does with the preference in "
                  "its prompt (and measured best) where the tenant's contrast and "
                  "memory reminder are off (the reminder and, on some models, contrast are on "
                  "by default); lower values weaken it gradually, and at "
                  "0.1 or below nothing is injected. The platform's cap (KV_ALPHA_CAP) bounds "
                  "the effective value: a higher alpha is applied as the cap.",
    )
    version = models.PositiveIntegerField(default=1)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "member"], name="preference_one_per_member",
                violation_error_message="This member already has a preference; edit it."),
            models.CheckConstraint(
                condition=Q(alpha__gte=0.0) & Q(alpha__lte=1.0), name="preference_alpha_range",
                violation_error_message="Alpha must be between 0 and 1."
            ),
        ]

    def __str__(self) -> str:
        return f"preference of {self.member} v{self.version}"

    @property
    def content_hash(self) -> str:
        """The engine's content hash of this text (what chat replies report)."""
        return content_hash(self.text)


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
        SYSTEM = "system"  # a client's own system message (/v1 requests)
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


class KVInvalidation(models.Model):
    """Outbox: one row per K/V invalidation, written in the transaction of the change.

    Delivered until acknowledged (docs/OPERATIONS.md, "Durable invalidation"): every
    serving worker process follows the table and evicts its own L1 (no Redis needed);
    ``l2_done_at`` is set once the matching L2 entries are deleted. An operational
    record, not tenant data: tenant, member and conversation are plain ids (no FK), so
    the row outlives the deletion it invalidates. ``txid`` is the writing transaction's
    id (``pg_current_xact_id()``); followers read by it, so a transaction that commits
    late (with a smaller ``id``) is never skipped. ``kind``: what goes (``Kind``).
    """

    class Kind(models.TextChoices):
        # the member's whole K/V (segments, lean, every link), or the tenant's (no member)
        SCOPE = "scope", "member or tenant K/V"
        # one stored conversation's links only (a deleted conversation)
        LINKS = "links", "one conversation's links"

    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.SCOPE)
    tenant_ref = models.BigIntegerField()
    member_ref = models.BigIntegerField(null=True, blank=True)  # None: the whole tenant
    conversation_ref = models.BigIntegerField(null=True, blank=True)  # kind "links" only
    txid = models.BigIntegerField(db_index=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    l2_done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["id"], condition=Q(l2_done_at__isnull=True),
                                name="kvinval_l2_pending")]
        constraints = [models.CheckConstraint(
            condition=Q(kind="scope", conversation_ref__isnull=True)
            | Q(kind="links", member_ref__isnull=False, conversation_ref__isnull=False),
            name="kvinval_kind_scope")]

    def __str__(self) -> str:
        who = "all" if self.member_ref is None else self.member_ref
        if self.kind == self.Kind.LINKS:
            return (f"drop links tenant={self.tenant_ref} member={who} "
                    f"conversation={self.conversation_ref}")
        return f"invalidate tenant={self.tenant_ref} member={who}"


# Models in modules of their own (they import this one's models by app label).
from tenants.models.audit import AuditEvent, AuditLog  # noqa: E402
from tenants.models.budget import TokenBudget  # noqa: E402
from tenants.models.exchange import ChatExchange  # noqa: E402
from tenants.models.memory import Memory  # noqa: E402
from tenants.models.usage import UsageDay  # noqa: E402

__all__ = ["ApiToken", "AuditEvent", "AuditLog", "ChatExchange", "Conversation",
           "KVInvalidation", "Member", "Memory", "Message", "Preference", "Tenant", "TokenBudget",
           "UsageDay"]
