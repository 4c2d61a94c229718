"""The budget ledger in Postgres: admission under row locks, spend read from the rollup.

Why Postgres and not a Redis counter: a chat's reservation lives on its idempotency
claim (``ChatExchange.reserved_tokens``) and its real usage lands in ``UsageDay`` in the
same transaction that settles the reservation, so *spent + reserved* is always exact and
can never drift. The worker settles it three times: on its real prompt before generating
(``settle_prompt``: re-reserved, the reply capped), then by storing the reply (the claim
turns ``done``, the rollup holds the real usage) or by billing what it generated or
refusing (``release``). An abandoned claim keeps its reservation until then (its worker
may still be generating); no task runs past the deadline plus ``CHAT_HARD_TIME_LIMIT``,
so a reservation never outlives that. Admissions that
share a budget are serialised by ``SELECT ... FOR UPDATE`` on the ``TokenBudget`` rows
(tenant's first, then the member's: one lock order, no deadlock), so two web processes
can never both take the last tokens. Chats of tenants without budgets lock nothing.
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import NamedTuple

from django.conf import settings
from django.db import connection
from django.db.models import F, Q

from tenants.budgets.periods import now, period_start, seconds_to_reset
from tenants.errors import BudgetExceeded
from tenants.models import ChatExchange, Member, TokenBudget

THRESHOLDS = (80, 100)  # percent of a budget whose crossing is audited once per period

# One statement, so one snapshot: a chat settling concurrently is counted either as its
# reservation or as its real usage, never as neither. A chat is accounted on the UTC day
# its worker's clock says when it stores it, and commits a moment later, so yesterday's
# rows may still grow after midnight (and by any clock skew between hosts): each
# admission sums yesterday's and today's rows live; the days before yesterday are fixed,
# summed once per period and day (``_settled``).
_STANDING = """
SELECT
  (SELECT coalesce(sum(reserved_tokens + carried_tokens), 0) FROM tenants_chatexchange
    WHERE tenant_id = %(t)s AND (%(m)s::bigint IS NULL OR member_id = %(m)s)
      AND (reserved_tokens > 0 OR carried_tokens > 0) AND state <> 'done'
      AND deadline > now() - make_interval(secs => %(hold)s)),
  (SELECT coalesce(sum(prompt_tokens + completion_tokens), 0) FROM tenants_usageday
    WHERE tenant_id = %(t)s AND (%(m)s::bigint IS NULL OR member_ref = %(m)s)
      AND day >= %(start)s)
"""
_BEFORE = """
SELECT coalesce(sum(prompt_tokens + completion_tokens), 0) FROM tenants_usageday
WHERE tenant_id = %(t)s AND (%(m)s::bigint IS NULL OR member_ref = %(m)s)
  AND day >= %(start)s AND day < %(today)s
"""


class Standing(NamedTuple):
    """One budget in its current period."""

    budget: TokenBudget
    start: dt.date
    spent: int
    reserved: int

    @property
    def left(self) -> int:
        return self.budget.tokens - self.spent - self.reserved

    @property
    def percent(self) -> float:
        return 100.0 * self.spent / self.budget.tokens

    @property
    def scope(self) -> str:
        return "member" if self.budget.member_id else "tenant"


def standing(budget: TokenBudget, at: dt.datetime | None = None) -> Standing:
    """The budget's period holding ``at`` (default now; the clock tests inject)."""
    start = period_start(budget.period, at)
    live = max(start, live_since(at))
    with connection.cursor() as cur:
        cur.execute(_STANDING, {"t": budget.tenant_id, "m": budget.member_id, "start": live,
                                "hold": settings.CHAT_HARD_TIME_LIMIT})
        reserved, spent = cur.fetchone()
    earlier = _settled(budget.tenant_id, budget.member_id, start, live)
    return Standing(budget, start, int(spent) + earlier, int(reserved))


def live_since(at: dt.datetime | None = None) -> dt.date:
    """The first UTC day whose rollup rows may still change: yesterday (a chat stored at
    23:59:59.9 commits after midnight, on yesterday's row)."""
    return period_start("day", at) - dt.timedelta(days=1)


@functools.lru_cache(maxsize=4096)
def _settled(tenant_id: int, member_id: int | None, start: dt.date, until: dt.date) -> int:
    """Tokens spent from ``start`` to the day before ``until`` (fixed: ``live_since``)."""
    if start >= until:
        return 0
    with connection.cursor() as cur:
        cur.execute(_BEFORE, {"t": tenant_id, "m": member_id, "start": start, "today": until})
        return int(cur.fetchone()[0])


def forget_past_spend() -> None:
    """Drop the per-process sums of past days (after ``tenants.usage.rebuild``)."""
    _settled.cache_clear()


def _applicable(member: Member):
    return (TokenBudget.objects.filter(tenant_id=member.tenant_id)
            .filter(Q(member__isnull=True) | Q(member_id=member.pk))
            .order_by(F("member_id").asc(nulls_first=True)))


def reserve(member: Member, request_id: str, prompt_estimate: int,
            max_new_tokens: int) -> int | None:
    """Hold ``prompt_estimate`` + up to ``max_new_tokens`` on the claim of ``request_id``.

    Call inside the claim's transaction. Returns the completion tokens granted (at most
    ``max_new_tokens``, fewer when a budget holds less: the reply then ends with
    ``finish_reason: length``), None when no budget applies. Raises BudgetExceeded (429,
    ``retry_after`` = seconds until the exhausted period resets) when not even one
    completion token fits."""
    budgets = list(_applicable(member).select_for_update())
    if not budgets:
        return None
    standings = [standing(b) for b in budgets]
    _refuse_short(standings, prompt_estimate + 1)
    grant = min(max_new_tokens, min(s.left for s in standings) - prompt_estimate)
    ChatExchange.objects.filter(tenant_id=member.tenant_id, member=member,
                                request_id=request_id).update(
        reserved_tokens=prompt_estimate + grant)
    return grant


def settle_prompt(member: Member, claim: ChatExchange, prompt_tokens: int,
                  max_new_tokens: int) -> int:
    """The worker's real prompt, just before it generates: the claim's reservation becomes
    ``prompt_tokens`` + the completion tokens granted (at most ``max_new_tokens``, what
    the budgets hold besides it). Call with the claim row locked (``take_claim``), which
    keeps its reservation counted. Raises BudgetExceeded when the real prompt and one
    completion token do not fit: nothing is generated. Tenants without budgets: no change."""
    budgets = list(_applicable(member).select_for_update())
    if not budgets:
        return max_new_tokens
    own = claim.reserved_tokens  # in every standing's ``reserved``: it is live
    standings = [standing(b) for b in budgets]
    _refuse_short(standings, prompt_tokens + 1 - own)
    grant = min(max_new_tokens, min(s.left for s in standings) + own - prompt_tokens)
    claim.reserved_tokens = prompt_tokens + grant
    claim.save(update_fields=["reserved_tokens", "updated_at"])
    return grant


def release(member_id: int, request_id: str) -> None:
    """The attempt's worker is done with its reservation: it billed, refused or failed."""
    ChatExchange.objects.filter(member_id=member_id, request_id=request_id,
                                reserved_tokens__gt=0).update(reserved_tokens=0)


def retry_after(member: Member) -> int:
    """Seconds until the longest period of the member's budgets resets (a refusal whose
    own ``retry_after`` was lost on its way from a worker)."""
    periods = set(_applicable(member).values_list("period", flat=True)) or {"day"}
    return max(seconds_to_reset(p) for p in periods)


def _refuse_short(standings: list[Standing], need: int) -> None:
    """BudgetExceeded (``retry_after``: the longest reset of those short) unless every
    budget has ``need`` tokens left."""
    short = [s for s in standings if s.left < need]
    if short:
        worst = max(short, key=lambda s: seconds_to_reset(s.budget.period))
        raise BudgetExceeded(
            f"The token budget of this {worst.scope} is spent ({worst.budget.tokens} tokens "
            f"{worst.budget.get_period_display()}); it resets in "
            f"{seconds_to_reset(worst.budget.period)} s.",
            scope=worst.scope, period=worst.budget.period, limit=worst.budget.tokens,
            retry_after=seconds_to_reset(worst.budget.period))


def crossings(member: Member) -> list[tuple[Standing, int]]:
    """Thresholds newly crossed by the member's or tenant's spend (call after the usage
    is written, inside its transaction): each (standing, percent) once per period."""
    found = []
    for budget in _applicable(member):
        st = standing(budget)
        level = max((p for p in THRESHOLDS if st.spent * 100 >= p * budget.tokens), default=0)
        if level <= _announced(budget, st.start):
            continue
        locked = TokenBudget.objects.select_for_update().get(pk=budget.pk)
        if level <= _announced(locked, st.start):
            continue  # a concurrent chat announced it first
        locked.alerted_percent, locked.alerted_period = level, st.start
        locked.save(update_fields=["alerted_percent", "alerted_period"])
        found.append((st._replace(budget=locked), level))
    return found


def _announced(budget: TokenBudget, start: dt.date) -> int:
    return budget.alerted_percent if budget.alerted_period == start else 0


def tenant_standings(tenant_ids, at: dt.datetime | None = None) -> list[Standing]:
    """Every budget of these tenants in its current period (the usage page, the banner)."""
    budgets = (TokenBudget.objects.filter(tenant_id__in=list(tenant_ids))
               .select_related("tenant", "member__user")
               .order_by("tenant__slug", F("member_id").asc(nulls_first=True)))
    return [standing(b, at or now()) for b in budgets]
