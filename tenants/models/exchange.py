"""``ChatExchange``: one chat request's idempotency slot (tenants.actions.exchanges)."""

from __future__ import annotations

from django.db import models


class ChatExchange(models.Model):
    """One chat request's idempotency slot: the key's claim, then the stored answer.

    The web claims ``(tenant, member, key)`` before it enqueues (state ``pending``, with
    the attempt's ``request_id`` and a ``deadline`` on the database clock). The worker
    stores the exchange only by turning *its own* pending, unexpired claim into ``done``
    under a row lock; the web gives up by turning it into ``abandoned``. Whoever locks the
    row first wins, so a reply is either stored and returned, or neither — even when Redis
    state is lost. A retry with the same key replays a ``done`` row.
    """

    class State(models.TextChoices):
        PENDING = "pending"
        DONE = "done"
        ABANDONED = "abandoned"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    member = models.ForeignKey("tenants.Member", on_delete=models.CASCADE,
                               related_name="chat_exchanges")
    key = models.CharField(max_length=128)  # client Idempotency-Key, or the request id
    request_id = models.CharField(max_length=64)  # the current attempt (Celery task id)
    request_hash = models.CharField(max_length=64)  # what was asked: a reused key must match
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    deadline = models.DateTimeField()
    conversation = models.ForeignKey(
        "tenants.Conversation", on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    reply = models.ForeignKey(
        "tenants.Message", on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    usage = models.JSONField(default=dict, blank=True)
    # Tokens held against the member's and tenant's budgets for the current attempt (0: no
    # budget, or settled). Held until its worker settles them: storing the reply (done:
    # the real usage counts instead), billing what it generated, or refusing/failing; an
    # abandoned attempt's worker may still be generating, so abandoning does not release
    # them, except for an attempt never dispatched. At the latest they lapse
    # CHAT_HARD_TIME_LIMIT after the deadline (no task can run on past that).
    reserved_tokens = models.PositiveIntegerField(default=0)
    # An earlier attempt's unsettled reservation, carried when a retry with the same key
    # takes the claim over (its worker may still bill); dropped when the key is answered.
    carried_tokens = models.PositiveIntegerField(default=0)
    cache = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "member", "key"],
                                    name="chatexchange_key_per_member"),
            models.UniqueConstraint(fields=["tenant", "request_id"],
                                    name="chatexchange_request_per_tenant"),
        ]
        indexes = [models.Index(
            fields=["tenant", "member"], name="chatexchange_holding",
            condition=models.Q(reserved_tokens__gt=0) | models.Q(carried_tokens__gt=0))]

    def __str__(self) -> str:
        return f"chat {self.key} ({self.state})"

