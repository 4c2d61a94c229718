"""Token budgets: set and clear them (audited), admit a chat within them, announce spend.

Superusers and operators (``manage.py tenant budget``) set a tenant's budget; tenant
admins set their own members' budgets, never above the tenant's own. Admission runs in
the transaction of the chat's idempotency claim, so a refused chat leaves no claim.
"""

from __future__ import annotations

from django.db import transaction

from tenants.actions.base import assert_actor_may_manage, audit
from tenants.actions.exchanges import Claim, do_claim_chat, take_claim
from tenants.budgets import ledger
from tenants.errors import Forbidden, InvalidInput
from tenants.models import AuditEvent, Member, Tenant, TokenBudget

MAX_DAYS_PER_MONTH = 31
PERIODS = tuple(TokenBudget.Period.values)


def _target(tenant: Tenant, member: Member | None) -> str:
    return str(member) if member is not None else tenant.slug


def _check_authority(tenant: Tenant, member: Member | None, actor) -> None:
    assert_actor_may_manage(actor, tenant)
    if member is None and actor is not None and not actor.is_superuser:
        raise Forbidden("Only superusers set a tenant's budget.")
    if member is not None and member.tenant_id != tenant.pk:
        raise Forbidden("Not allowed for this tenant.")


def _check_under_tenant(tenant: Tenant, tokens: int, period: str) -> None:
    """A member's budget may not hold more than the tenant's allows over the same span."""
    own = TokenBudget.objects.filter(tenant=tenant, member__isnull=True).first()
    if own is None:
        return
    cap = own.tokens
    if period == "month" and own.period == "day":
        cap = own.tokens * MAX_DAYS_PER_MONTH
    if tokens > cap:
        raise InvalidInput(f"A member's budget cannot exceed the tenant's ({own.tokens} tokens "
                           f"{own.get_period_display()}).", fields={"tokens": ["Above the "
                                                                               "tenant's budget."]})


def check_budget(tenant: Tenant, member: Member | None, tokens, period: str) -> None:
    """InvalidInput unless ``tokens``/``period`` make a valid budget here (forms call it)."""
    if period not in PERIODS:
        raise InvalidInput(f"The period must be one of {', '.join(PERIODS)}.")
    if not isinstance(tokens, int) or tokens < 1:
        raise InvalidInput("A budget is a whole number of tokens, at least 1.")
    if member is not None:
        _check_under_tenant(tenant, tokens, period)


@transaction.atomic
def do_set_budget(tenant: Tenant, *, tokens: int, period: str, member: Member | None = None,
                  actor=None) -> TokenBudget:
    """Create or change the budget of ``tenant`` (``member`` None) or of one member."""
    _check_authority(tenant, member, actor)
    check_budget(tenant, member, tokens, period)
    budget = TokenBudget.objects.select_for_update().filter(tenant=tenant, member=member).first()
    before = None if budget is None else {"tokens": budget.tokens, "period": budget.period}
    if budget is None:
        budget = TokenBudget(tenant=tenant, member=member)
    budget.tokens, budget.period = tokens, period
    budget.save()
    audit(tenant, AuditEvent.BUDGET_CHANGED, actor=actor, target=_target(tenant, member),
          scope="member" if member is not None else "tenant", tokens=tokens, period=period,
          before=before)
    return budget


@transaction.atomic
def do_clear_budget(tenant: Tenant, *, member: Member | None = None, actor=None) -> bool:
    """Remove the budget; False when there was none (nothing audited)."""
    _check_authority(tenant, member, actor)
    budget = TokenBudget.objects.select_for_update().filter(tenant=tenant, member=member).first()
    if budget is None:
        return False
    before = {"tokens": budget.tokens, "period": budget.period}
    budget.delete()
    audit(tenant, AuditEvent.BUDGET_CHANGED, actor=actor, target=_target(tenant, member),
          scope="member" if member is not None else "tenant", tokens=None, period=None,
          before=before)
    return True


@transaction.atomic
def do_claim_chat_within_budget(member: Member, key: str, request_id: str, asked: str,
                                timeout: float, *, prompt_tokens: int,
                                max_new_tokens: int) -> tuple[Claim, int | None]:
    """Claim the key (``do_claim_chat``) and, for a new attempt, reserve its tokens.

    Returns the claim and the completion tokens granted (None: no budget applies, or a
    replay, which costs nothing). BudgetExceeded rolls the claim back with it."""
    claim = do_claim_chat(member, key, request_id, asked, timeout)
    if claim.replay is not None:
        return claim, None
    return claim, ledger.reserve(member, claim.request_id, prompt_tokens, max_new_tokens)


@transaction.atomic
def do_admit_prompt(member: Member, request_id: str, *, prompt_tokens: int,
                    max_new_tokens: int) -> int:
    """The worker has rendered the chat's prompt (``prompt_tokens``, exact): settle the
    claim's reservation to it and return the completion tokens it may generate (at most
    ``max_new_tokens``). Admission reserved an estimate; this is what keeps concurrent
    chats within the budgets when the worker renders more than the web estimated.
    Raises ChatAbandoned (the claim is no longer live) or BudgetExceeded; either way
    nothing is generated, and the web's give-up releases the reservation."""
    claim = take_claim(member, request_id)
    return ledger.settle_prompt(member, claim, prompt_tokens, max_new_tokens)


def note_usage(member: Member) -> None:
    """After a chat's usage is written (same transaction): audit each budget threshold
    (80 %, 100 %) the spend crossed, once per period."""
    for st, percent in ledger.crossings(member):
        audit(member.tenant, AuditEvent.BUDGET_THRESHOLD, actor_kind="system",
              target=_target(member.tenant, st.budget.member), scope=st.scope,
              percent=percent, spent=st.spent, tokens=st.budget.tokens,
              period=st.budget.period, period_start=st.start.isoformat())
