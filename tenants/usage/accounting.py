"""Usage accounting and reading: the ``UsageDay`` rollup behind the admin's usage page.

``account_chat`` runs inside the transaction that writes a chat's audit row, so the
rollup and the audit log never disagree; ``rebuild`` recomputes it from the audit log.
Latency percentiles come from geometric histograms: bucket ``i`` holds values up to
``BUCKETS[i]`` ms (each bound 25% above the previous), so a percentile is exact to 25%.
"""

from __future__ import annotations

import datetime as dt
import math
import operator
from dataclasses import dataclass, field

from django.db import transaction

from tenants.budgets.estimate import served_model
from tenants.models import Member, UsageDay

BASE_MS, RATIO, NBUCKETS = 10.0, 1.25, 44
BUCKETS = tuple(BASE_MS * RATIO ** i for i in range(NBUCKETS))  # 10 ms .. ~180 s
TIERS = ("l1", "l2", "compute", "none")
# the contrastive guide row's tokens (docs/API.md, "Usage"): beside, never inside, the others
GUIDE_FIELDS = ("guide_prefill_tokens", "guide_decode_tokens")


def bucket_of(ms: float) -> int:
    """Same formula as the SQL of ``tenants.usage.rebuild`` (keep them in step)."""
    if ms <= BASE_MS:
        return 0
    return min(NBUCKETS - 1, math.ceil(math.log(ms / BASE_MS) / math.log(RATIO)))


def percentile(hist: list[int], p: float) -> float | None:
    """Upper bound (ms) of the bucket holding the ``p``-th percentile; None if empty."""
    total = sum(hist)
    if not total:
        return None
    rank, seen = p / 100 * total, 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= rank:
            return BUCKETS[i]
    return BUCKETS[-1]


def _add(hist: list[int], ms: float | None) -> list[int]:
    """``hist`` with one more sample; an empty list stays empty until a first sample."""
    if ms is None:
        return hist
    hist = list(hist) or [0] * NBUCKETS
    hist[bucket_of(ms)] += 1
    return hist


def _add_guide(row: UsageDay, prefill: int, decode: int) -> None:
    row.guide_prefill_tokens += max(0, int(prefill or 0))
    row.guide_decode_tokens += max(0, int(decode or 0))


def _locked_row(member: Member, day: dt.date | None, model: str | None) -> UsageDay:
    key = {"tenant_id": member.tenant_id, "member_ref": member.pk,
           "day": day or dt.datetime.now(dt.UTC).date(), "model": model or served_model()}
    UsageDay.objects.bulk_create([UsageDay(**key, member_label=str(member))],
                                 ignore_conflicts=True)
    return UsageDay.objects.select_for_update().get(**key)


@transaction.atomic
def account_tokens(member: Member, *, prompt_tokens: int = 0, completion_tokens: int = 0,
                   cached_tokens: int = 0, day: dt.date | None = None,
                   model: str | None = None, guide_prefill_tokens: int = 0,
                   guide_decode_tokens: int = 0) -> None:
    """Tokens of a chat that stored no reply but was served (a streamed reply its client
    cancelled: what was streamed was seen): billed and held against budgets, counted
    neither as a reply nor as a failure."""
    row = _locked_row(member, day, model)
    row.prompt_tokens += prompt_tokens
    row.completion_tokens += completion_tokens
    row.cached_tokens += min(max(0, cached_tokens), prompt_tokens)
    _add_guide(row, guide_prefill_tokens, guide_decode_tokens)
    row.save(update_fields=["prompt_tokens", "completion_tokens", "cached_tokens",
                            *GUIDE_FIELDS])


@transaction.atomic
def account_chat(member: Member, *, ok: bool, prompt_tokens: int = 0,
                 completion_tokens: int = 0, cached_tokens: int = 0, tier: str | None = None,
                 latency_ms: float | None = None, ttft_ms: float | None = None,
                 day: dt.date | None = None, model: str | None = None,
                 guide_prefill_tokens: int = 0, guide_decode_tokens: int = 0) -> None:
    """Count one chat (``ok``) or one failed chat in the member's row of today (UTC) for
    ``model`` (default: the served model). ``cached_tokens``: of ``prompt_tokens``, those
    served from cache rather than computed."""
    row = _locked_row(member, day, model)
    if not ok:
        row.errors += 1
        row.save(update_fields=["errors"])
        return
    row.requests += 1
    row.prompt_tokens += prompt_tokens
    row.completion_tokens += completion_tokens
    row.cached_tokens += min(max(0, cached_tokens), prompt_tokens)
    _add_guide(row, guide_prefill_tokens, guide_decode_tokens)
    if tier in TIERS:
        setattr(row, f"tier_{tier}", getattr(row, f"tier_{tier}") + 1)
    row.latency_hist = _add(row.latency_hist, latency_ms)
    row.ttft_hist = _add(row.ttft_hist, ttft_ms)
    row.save()


@dataclass
class Totals:
    """One line of the usage page (a day, a member, or everything)."""

    label: str
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    guide_prefill_tokens: int = 0
    guide_decode_tokens: int = 0
    tiers: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    latency: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    ttft: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))

    def merge(self, other: Totals) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cached_tokens += other.cached_tokens
        self.guide_prefill_tokens += other.guide_prefill_tokens
        self.guide_decode_tokens += other.guide_decode_tokens
        for tier in TIERS:
            self.tiers[tier] += other.tiers[tier]
        self.latency = list(map(operator.add, self.latency, other.latency))
        self.ttft = list(map(operator.add, self.ttft, other.ttft))

    def hit_rate(self, tier: str) -> float | None:
        return self.tiers[tier] / self.requests if self.requests else None

    def error_rate(self) -> float | None:
        attempts = self.requests + self.errors
        return self.errors / attempts if attempts else None

    def p(self, which: str, pct: float) -> float | None:
        return percentile(self.latency if which == "latency" else self.ttft, pct)
