"""Token budgets on real Postgres: set (CLI, actions), admit, cap, settle, release, alert."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from tenants import actions
from tenants.budgets import ledger
from tenants.budgets.periods import period_start, seconds_to_reset
from tenants.errors import BudgetExceeded, ChatAbandoned, Forbidden, InvalidInput
from tenants.models import AuditEvent, AuditLog, ChatExchange, TokenBudget, UsageDay

PARAMS = {"max_new_tokens": 50}


def tenant_cmd(*args) -> str:
    out = StringIO()
    call_command("tenant", *args, stdout=out)
    return out.getvalue()


def admit(member, prompt=20, max_new=50, key=None):
    """Claim a chat within the budgets: (request id, completion tokens granted)."""
    request_id = uuid.uuid4().hex
    asked = actions.request_hash(f"q {key or request_id}", None, PARAMS)
    claim, granted = actions.do_claim_chat_within_budget(
        member, key or request_id, request_id, asked, 60.0, prompt_tokens=prompt,
        max_new_tokens=max_new)
    return claim.request_id, granted


def settle(member, request_id, prompt, completion, cached=0):
    actions.do_record_chat(
        member, None, message="q", reply="a", request_id=request_id, latency_ms=1.0,
        usage={"prompt_tokens": prompt, "completion_tokens": completion,
               "cached_tokens": cached}, cache={"tier": "compute"})


def spent(member=None, tenant=None) -> int:
    rows = UsageDay.objects.filter(tenant=tenant or member.tenant)
    if member is not None:
        rows = rows.filter(member_ref=member.pk)
    return sum(r.prompt_tokens + r.completion_tokens for r in rows)


def run_concurrently(fn, members) -> None:
    """``fn(member)`` for each member, each on a thread of its own, all at once."""
    threads = [threading.Thread(target=fn, args=(m,)) for m in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


@pytest.mark.django_db
def test_the_command_sets_changes_and_clears_budgets_audited(acme):
    assert "1000 tokens per month" in tenant_cmd("budget", "acme", "--tokens", "1000")
    out = tenant_cmd("budget", "acme", "--member", "acme-user", "--tokens", "100",
                     "--period", "day")
    assert "acme/acme-user: 100 tokens per day" in out
    assert TokenBudget.objects.get(tenant=acme.tenant, member=acme.user).period == "day"
    with pytest.raises(CommandError, match="cannot exceed"):  # above the tenant's own
        tenant_cmd("budget", "acme", "--member", "acme-other", "--tokens", "5000")
    with pytest.raises(CommandError, match="Unknown user"):
        tenant_cmd("budget", "acme", "--member", "globex-user", "--tokens", "5")
    shown = tenant_cmd("budget", "acme").splitlines()
    assert shown == [
        "acme (whole tenant): 0 of 1000 tokens spent this month (since "
        f"{period_start('month')}, 0.0%), 0 held by running chats",
        f"acme/acme-user: 0 of 100 tokens spent this day (since {period_start('day')}, 0.0%), "
        "0 held by running chats"]
    assert len(tenant_cmd("budget", "acme", "--member", "acme-user").splitlines()) == 1
    assert "removed" in tenant_cmd("budget", "acme", "--member", "acme-user", "--clear")
    assert "had no budget" in tenant_cmd("budget", "acme", "--member", "acme-user", "--clear")
    rows = AuditLog.objects.filter(tenant=acme.tenant, event_type=AuditEvent.BUDGET_CHANGED)
    assert [(r.target, r.data["tokens"], r.actor_kind) for r in rows.order_by("id")] == [
        ("acme", 1000, "cli"), ("acme/acme-user", 100, "cli"), ("acme/acme-user", None, "cli")]


@pytest.mark.django_db
def test_tenant_admins_set_only_their_members_budgets(acme, globex):
    actions.do_set_budget(acme.tenant, tokens=500, period="day")
    admin_user = acme.admin.user
    with pytest.raises(Forbidden):  # a tenant's own budget is the superuser's
        actions.do_set_budget(acme.tenant, tokens=10**6, period="day", actor=admin_user)
    with pytest.raises(Forbidden):  # another tenant's member
        actions.do_set_budget(globex.tenant, member=globex.user, tokens=5, period="day",
                              actor=admin_user)
    with pytest.raises(InvalidInput):  # never above the tenant's (500 a day)
        actions.do_set_budget(acme.tenant, member=acme.user, tokens=501, period="day",
                              actor=admin_user)
    budget = actions.do_set_budget(acme.tenant, member=acme.user, tokens=400, period="month",
                                   actor=admin_user)
    assert budget.tokens == 400 and budget.member == acme.user


@pytest.mark.django_db
def test_admission_caps_completion_then_refuses_until_the_period_resets(acme):
    actions.do_set_budget(acme.tenant, member=acme.user, tokens=100, period="day")
    first, granted = admit(acme.user, prompt=20, max_new=50)
    assert granted == 50 and ChatExchange.objects.get(request_id=first).reserved_tokens == 70
    second, granted = admit(acme.user, prompt=20, max_new=50)
    assert granted == 10  # 100 - 70 held - 20 prompt: the reply will end with "length"
    with pytest.raises(BudgetExceeded) as refused:
        admit(acme.user, prompt=20)
    assert refused.value.status == 429 and refused.value.details["scope"] == "member"
    assert 0 < refused.value.details["retry_after"] <= seconds_to_reset("day") <= 86400
    assert not ChatExchange.objects.filter(member=acme.user).exclude(
        request_id__in=[first, second]).exists()  # the refused claim was rolled back
    # the other member is not held by acme-user's budget; no budget: nothing reserved
    assert admit(acme.other)[1] is None
    # a chat never dispatched releases its reservation when abandoned (one a worker
    # may be running holds it until the worker settles it); a settled one counts its
    # real usage
    actions.do_abandon_chat(acme.user, second, reason="worker_unavailable", dispatched=False)
    settle(acme.user, first, prompt=22, completion=30)
    st = ledger.standing(TokenBudget.objects.get(member=acme.user))
    assert (st.spent, st.reserved, st.left) == (52, 0, 48)
    assert admit(acme.user, prompt=20, max_new=50)[1] == 28


@pytest.mark.django_db
def test_a_replay_costs_nothing_and_the_tenant_budget_binds_every_member(acme):
    actions.do_set_budget(acme.tenant, tokens=60, period="month")
    request_id, granted = admit(acme.user, prompt=10, max_new=40, key="same")
    assert granted == 40
    settle(acme.user, request_id, prompt=10, completion=40)
    again, granted = admit(acme.user, prompt=10, max_new=40, key="same")
    assert (again, granted) == (request_id, None)  # the stored answer, no new reservation
    with pytest.raises(BudgetExceeded) as refused:  # 10 left, the prompt alone needs 10+1
        admit(acme.other, prompt=10)
    assert refused.value.details["scope"] == "tenant"
    assert refused.value.details["retry_after"] == pytest.approx(seconds_to_reset("month"), abs=5)


@pytest.mark.django_db
def test_crossing_80_and_100_percent_is_audited_once_per_period(acme):
    actions.do_set_budget(acme.tenant, member=acme.user, tokens=100, period="day")
    for completion, alerts in ((50, []), (30, [80]), (5, [80]), (15, [80, 100])):
        request_id = admit(acme.user, prompt=0, max_new=completion)[0]
        settle(acme.user, request_id, prompt=0, completion=completion)
        rows = AuditLog.objects.filter(event_type=AuditEvent.BUDGET_THRESHOLD).order_by("id")
        assert [r.data["percent"] for r in rows] == alerts
    assert rows.last().target == "acme/acme-user" and rows.last().data["spent"] == 100
    with pytest.raises(BudgetExceeded):
        admit(acme.user, prompt=0)


@pytest.mark.django_db
def test_usage_keeps_cached_tokens_and_the_model(acme):
    request_id = admit(acme.user)[0]
    settle(acme.user, request_id, prompt=30, completion=5, cached=24)
    row = UsageDay.objects.get(member_ref=acme.user.pk)
    assert (row.prompt_tokens, row.cached_tokens, row.completion_tokens) == (30, 24, 5)
    assert row.model  # the served model's id
    chat = AuditLog.objects.get(event_type=AuditEvent.CHAT_REQUEST, target=str(acme.user))
    assert chat.data["cached_tokens"] == 24 and chat.data["model"] == row.model


@pytest.mark.django_db(transaction=True)
def test_concurrent_chats_never_overshoot_a_budget_by_more_than_one_request():
    from tests.tenants.conftest import make_world

    world = make_world("race", "race secret")
    budget, prompt, max_new, extra = 400, 20, 50, 3  # each prompt 3 tokens above its estimate
    actions.do_set_budget(world.tenant, tokens=budget, period="day")
    start, refused, admitted = threading.Barrier(12), [], []

    def one_chat(member):
        try:
            start.wait()
            try:
                request_id, granted = admit(member, prompt=prompt, max_new=max_new)
            except BudgetExceeded:
                refused.append(member.pk)
                return
            admitted.append(granted)
            settle(member, request_id, prompt=prompt + extra, completion=granted)
        finally:
            connection.close()

    run_concurrently(one_chat, [world.user, world.other, world.admin] * 4)
    total, one_request = spent(tenant=world.tenant), prompt + extra + max_new
    assert refused and admitted and len(refused) + len(admitted) == 12
    assert budget - (prompt + 1) <= total <= budget + one_request
    assert total == sum(admitted) + len(admitted) * (prompt + extra)


@pytest.mark.django_db
def test_the_workers_real_prompt_settles_the_reservation(acme):
    """Admission reserved an estimate; the worker's prompt (all memories, reminders...)
    is larger: ``do_admit_prompt`` re-reserves it, caps the reply to what is left, or
    refuses before anything is generated."""
    actions.do_set_budget(acme.tenant, member=acme.user, tokens=100, period="day")
    first, granted = admit(acme.user, prompt=10, max_new=50)
    assert granted == 50  # 60 held
    other, _ = admit(acme.user, prompt=10, max_new=20)  # 30 held
    held = lambda rid: ChatExchange.objects.get(request_id=rid).reserved_tokens  # noqa: E731
    # the real prompt is 25: 100 - 30 (the other's) - 25 = 45 completion tokens at most
    assert actions.do_admit_prompt(acme.user, first, prompt_tokens=25, max_new_tokens=50) == 45
    assert held(first) == 70
    assert actions.do_admit_prompt(acme.user, first, prompt_tokens=25, max_new_tokens=50) == 45
    with pytest.raises(BudgetExceeded) as refused:  # 30 held, 70 by the first: no room
        actions.do_admit_prompt(acme.user, other, prompt_tokens=30, max_new_tokens=20)
    assert refused.value.details["scope"] == "member" and refused.value.details["retry_after"]
    assert held(other) == 30  # unchanged: its web releases it when it gives up
    assert actions.do_admit_prompt(acme.user, other, prompt_tokens=12, max_new_tokens=20) == 18
    settle(acme.user, first, prompt=25, completion=45)
    settle(acme.user, other, prompt=12, completion=18)
    assert spent(acme.user) == 100
    # no budget: nothing held, nothing capped; an abandoned claim: refused, not generated
    free, _ = admit(acme.other)
    assert actions.do_admit_prompt(acme.other, free, prompt_tokens=500, max_new_tokens=64) == 64
    assert held(free) == 0
    actions.do_abandon_chat(acme.other, free, reason="timeout")
    with pytest.raises(ChatAbandoned):
        actions.do_admit_prompt(acme.other, free, prompt_tokens=5, max_new_tokens=64)


@pytest.mark.django_db
def test_an_abandoned_chat_holds_its_reservation_until_its_worker_settles_it(acme):
    """A streaming client leaves (or the web times out): the claim is abandoned at once,
    but its worker stops a few tokens later and bills them. Until it has, the
    reservation still counts, so no other chat can take tokens it is about to bill."""
    from tenants.budgets.ledger import release

    budget = actions.do_set_budget(acme.tenant, member=acme.user, tokens=100, period="day")
    left = lambda: ledger.standing(TokenBudget.objects.get(pk=budget.pk)).left  # noqa: E731
    gone, _ = admit(acme.user, prompt=10, max_new=50)  # 60 held
    actions.do_abandon_chat(acme.user, gone, reason="client_disconnected")
    assert left() == 40  # still held: its worker may be generating
    assert admit(acme.user, prompt=10, max_new=50)[1] == 30  # only what is really free
    actions.do_record_cancelled(acme.user, gone, prompt_tokens=10, completion_tokens=7)
    assert left() == 100 - 17 - 40  # billed 17; the reservation settled with it
    # a retry with the same key takes the claim over: the earlier attempt's unsettled
    # reservation is carried until the key is answered
    key_first, _ = admit(acme.user, prompt=5, max_new=5, key="k")  # 10 held
    actions.do_abandon_chat(acme.user, key_first, reason="timeout")
    retry, granted = admit(acme.user, prompt=5, max_new=5, key="k")
    assert retry != key_first and granted == 5
    assert ChatExchange.objects.get(request_id=retry).carried_tokens == 10
    assert left() == 100 - 17 - 40 - 10 - 10
    release(acme.user.pk, key_first)  # the first attempt's worker refused: no row of its own
    settle(acme.user, retry, prompt=5, completion=5)
    row = ChatExchange.objects.get(request_id=retry)
    assert (row.reserved_tokens, row.carried_tokens) == (0, 0)
    assert left() == 100 - 17 - 40 - 10
    # at the latest, a reservation lapses CHAT_HARD_TIME_LIMIT after its claim's deadline
    lapsed, _ = admit(acme.user, prompt=1, max_new=1)
    actions.do_abandon_chat(acme.user, lapsed, reason="timeout")
    assert left() == 100 - 17 - 40 - 10 - 2
    ChatExchange.objects.filter(request_id=lapsed).update(
        deadline=timezone.now() - dt.timedelta(seconds=settings.CHAT_HARD_TIME_LIMIT + 1))
    assert left() == 100 - 17 - 40 - 10


@pytest.mark.django_db(transaction=True)
def test_concurrent_chats_whose_prompts_outgrow_their_estimates_never_overshoot():
    """Issue 33: every prompt is 30 tokens above admission's estimate (the worker renders
    more memories than the web counts); the worker settles its reservation on the real
    prompt before generating. Whatever the interleaving: spent <= budget, tenant and
    member alike."""
    from tests.tenants.conftest import make_world

    world = make_world("race", "race secret")
    estimate, real, max_new = 10, 40, 50
    actions.do_set_budget(world.tenant, tokens=500, period="day")
    actions.do_set_budget(world.tenant, member=world.user, tokens=200, period="day")
    start, outcomes = threading.Barrier(12), []

    def one_chat(member):
        try:
            start.wait()
            try:
                request_id, _ = admit(member, prompt=estimate, max_new=max_new)
                granted = actions.do_admit_prompt(member, request_id, prompt_tokens=real,
                                                  max_new_tokens=max_new)
            except BudgetExceeded:
                outcomes.append(None)
                return
            settle(member, request_id, prompt=real, completion=granted)
            outcomes.append(granted)
        finally:
            connection.close()

    run_concurrently(one_chat, [world.user, world.other, world.admin] * 4)
    answered = [g for g in outcomes if g is not None]
    assert len(outcomes) == 12 and answered and None in outcomes
    assert spent(tenant=world.tenant) <= 500 and spent(world.user) <= 200
    assert spent(tenant=world.tenant) == sum(answered) + len(answered) * real


@pytest.mark.django_db
def test_a_months_spend_counts_every_day_of_the_month_and_no_other(acme):
    import datetime as dt

    budget = actions.do_set_budget(acme.tenant, tokens=10_000, period="month")
    mine = actions.do_set_budget(acme.tenant, member=acme.user, tokens=500, period="month")
    at = dt.datetime(2026, 3, 15, 12, tzinfo=dt.UTC)
    for day, member, tokens in ((dt.date(2026, 2, 28), acme.user, 1000),
                                (dt.date(2026, 3, 1), acme.user, 100),
                                (dt.date(2026, 3, 14), acme.other, 20),
                                (dt.date(2026, 3, 15), acme.user, 3)):
        UsageDay.objects.create(tenant=acme.tenant, member_ref=member.pk, day=day,
                                member_label=str(member), model="m", prompt_tokens=tokens)
    assert ledger.standing(budget, at).spent == 123
    assert ledger.standing(mine, at).spent == 103
    # today's rows are read live; the days before are fixed once passed
    UsageDay.objects.filter(day=dt.date(2026, 3, 15)).update(prompt_tokens=30)
    assert ledger.standing(budget, at).spent == 150
    at_new_month = dt.datetime(2026, 4, 1, tzinfo=dt.UTC)  # a new period: nothing spent yet
    assert ledger.standing(budget, at_new_month).spent == 0


@pytest.mark.django_db
def test_a_chat_committed_just_after_midnight_is_not_missed_by_the_past_days_sum(acme):
    """A chat is accounted on the UTC day its worker's clock says when it stores it, and
    commits a moment later: a web process may already have summed "the days before
    today" at 00:00:00.1. That sum is kept for the whole period; it must not leave the
    late chat out. The clock is injected (``standing(..., at)``, ``account_tokens(day=)``)."""
    import datetime as dt

    from tenants.usage import accounting

    budget = actions.do_set_budget(acme.tenant, member=acme.user, tokens=10_000, period="month")
    accounting.account_tokens(acme.user, prompt_tokens=100, day=dt.date(2026, 3, 10))
    after_midnight = dt.datetime(2026, 3, 16, 0, 0, 0, 100_000, tzinfo=dt.UTC)
    assert ledger.standing(budget, after_midnight).spent == 100  # past days summed now
    # ... and the chat stored at 23:59:59.99 on the 15th commits
    accounting.account_tokens(acme.user, prompt_tokens=7, completion_tokens=5,
                              day=dt.date(2026, 3, 15))
    assert ledger.standing(budget, after_midnight).spent == 112
    a_day_later = dt.datetime(2026, 3, 17, 9, tzinfo=dt.UTC)
    assert ledger.standing(budget, a_day_later).spent == 112
    assert ledger.standing(budget, dt.datetime(2026, 4, 1, tzinfo=dt.UTC)).spent == 0


@pytest.mark.django_db
def test_the_prompt_estimate_counts_history_context_and_tools(acme):
    from tenants.budgets.estimate import TEMPLATE_TOKENS_PER_MESSAGE, prompt_estimate

    bare = prompt_estimate(acme.user, None, "What should I cook?", {"history": []})
    assert bare > 2 * TEMPLATE_TOKENS_PER_MESSAGE  # the message, preference, markup
    history = [{"role": "user", "content": "Hello there, I need help with dinner."},
               {"role": "assistant", "content": "Of course: what do you have at home?"}]
    tools = [{"type": "function", "function": {"name": "get_current_timestamp",
                                               "description": "The time now.",
                                               "parameters": {"type": "object"}}}]
    longer = prompt_estimate(acme.user, None, "What should I cook?", {"history": history})
    assert longer > bare + 2 * TEMPLATE_TOKENS_PER_MESSAGE
    assert prompt_estimate(acme.user, None, "What should I cook?",
                           {"history": [], "tools": tools}) > bare + 10
    stored = prompt_estimate(acme.user, acme.conversation.pk, "What should I cook?", {})
    assert stored > bare  # /api/chat: the stored conversation's messages count too
