"""``TokenBudget``: a number of tokens (prompt + completion) per UTC day or month.

On a tenant (``member`` empty) or on one member; a member's chat is admitted only while
both its own budget and its tenant's hold tokens (``tenants.budgets.ledger``). Spend is
read from the ``UsageDay`` rollup and the pending reservations on ``ChatExchange`` rows,
so there is no separate counter to drift. ``alerted_*`` remember which threshold (80 or
100 %) was already announced in which period, so each crossing is audited once.
"""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q


class TokenBudget(models.Model):
    class Period(models.TextChoices):
        DAY = "day", "per day (UTC)"
        MONTH = "month", "per month (UTC)"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE,
                               related_name="budgets")
    member = models.ForeignKey("tenants.Member", on_delete=models.CASCADE, null=True,
                               blank=True, related_name="budgets",
                               help_text="Empty: the budget of the whole tenant.")
    tokens = models.PositiveBigIntegerField(
        validators=[MinValueValidator(1)],
        help_text="Tokens (prompt + completion) allowed per period.")
    period = models.CharField(max_length=8, choices=Period.choices, default=Period.MONTH)
    alerted_percent = models.PositiveSmallIntegerField(default=0)
    alerted_period = models.DateField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant__slug", "member_id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant"], condition=Q(member__isnull=True),
                                    name="budget_one_per_tenant"),
            models.UniqueConstraint(fields=["tenant", "member"],
                                    condition=Q(member__isnull=False),
                                    name="budget_one_per_member"),
            models.CheckConstraint(condition=Q(tokens__gte=1), name="budget_tokens_positive"),
        ]

    def __str__(self) -> str:
        who = self.member if self.member_id else self.tenant
        return f"budget {who}: {self.tokens} tokens {self.get_period_display()}"
