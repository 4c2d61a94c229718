"""``UsageDay``: the usage rollup, one row per tenant, member, model and UTC day.

Written in the transaction of every ``chat.request`` / ``chat.abandoned`` /
``chat.cancelled`` / ``chat.discarded`` (tokens only) audit row
(``tenants.usage.accounting.account_chat``), so the usage page reads a few hundred rows however many
million audit rows there are (docs/OPERATIONS.md, "Usage rollup"). Latencies are kept as
histograms with geometric buckets (``tenants.usage.accounting.BUCKETS``) from which p50/p95 are read.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models


class UsageDay(models.Model):
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    # Plain id + name (no FK): usage outlives a deleted member, like its audit rows.
    member_ref = models.BigIntegerField()
    member_label = models.CharField(max_length=200)
    day = models.DateField()
    # The served model's id (as /v1 names it); "" on rows written before 0015.
    model = models.CharField(max_length=200, blank=True, default="")
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    # Of prompt_tokens, those served from cache (not computed): billable at another rate.
    cached_tokens = models.BigIntegerField(default=0)
    # The contrastive guide row's work (docs/API.md, "Usage"), in neither of the above:
    # tokens it prefilled (computed) and decoding steps it ran beside the reply.
    guide_prefill_tokens = models.BigIntegerField(default=0)
    guide_decode_tokens = models.BigIntegerField(default=0)
    tier_l1 = models.PositiveIntegerField(default=0)
    tier_l2 = models.PositiveIntegerField(default=0)
    tier_compute = models.PositiveIntegerField(default=0)
    tier_none = models.PositiveIntegerField(default=0)
    latency_hist = ArrayField(models.IntegerField(), default=list)
    ttft_hist = ArrayField(models.IntegerField(), default=list)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "day", "member_ref", "model"],
                                    name="usageday_per_member_model_day"),
        ]

    def __str__(self) -> str:
        return f"usage {self.member_label} {self.day}"
