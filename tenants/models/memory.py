"""``Memory``: one of a member's ordered memories (issue 22), injected as their member segment.

The member's *first* memory (lowest ``position``, then ``id``) is their preference: the
``Preference`` row mirrors its text and enabled flag, both ways (a database trigger copies
preference writes onto the first memory, whatever the write path; ``tenants.actions.memories``
copies memory writes back onto the preference). Every change invalidates the member's cached
segment (``tenants.signals``).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class Memory(models.Model):
    class Source(models.TextChoices):
        MEMBER = "member", "Member"
        TENANT_ADMIN = "tenant_admin", "Tenant admin"
        CHAT = "chat", "Chat (remember/forget request)"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE,
                               related_name="memories")
    member = models.ForeignKey("tenants.Member", on_delete=models.CASCADE,
                               related_name="memories")
    text = models.TextField(help_text="What the assistant should keep in mind for this member.")
    enabled = models.BooleanField(default=True, help_text="Disabled memories are kept but "
                                                           "not used in replies.")
    pinned = models.BooleanField(default=False, help_text="Pinned memories are always in the "
                                                          "member's cached segment.")
    position = models.IntegerField(default=0, help_text="Order among the member's memories "
                                                        "(lowest first).")
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.MEMBER)
    # What the text asks of every reply, read once when it is saved (``tenants.rules``):
    # ``injection.prompting.rules.to_json``, by the reader version ``rules_version`` (0 and
    # null: not read, e.g. written by the preference trigger; read again where used).
    rules = models.JSONField(null=True, blank=True, default=None, editable=False)
    rules_version = models.PositiveIntegerField(default=0, db_default=0, editable=False)
    rules_enabled = models.BooleanField(
        default=True, db_default=True, verbose_name="rules on",
        help_text="Off: the memory stays in replies, but no rule read from it is applied "
                  "(no decoding constraint, no language guidance, not a standing instruction).")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["member_id", "position", "id"]
        verbose_name_plural = "memories"
        indexes = [models.Index(fields=["tenant", "member", "position"], name="memory_order")]
        constraints = [
            models.CheckConstraint(condition=~Q(text=""), name="memory_text_not_empty",
                                   violation_error_message="A memory needs some text."),
        ]

    def __str__(self) -> str:
        preview = self.text if len(self.text) <= 40 else self.text[:39] + "…"
        return f"memory {self.pk} of {self.member_id}: {preview}"
