"""Nothing generated goes unbilled, and nothing is billed twice (issue 33), on real Postgres
and Redis: a reply generated after its claim was abandoned (the web gave up waiting, its
streaming client left after the last token, the claim's deadline passed) is not stored
but billed in its own transaction (usage, budgets, TPM, a ``chat.discarded`` audit row);
each attempt is billed by exactly one row whichever paths run (``audit_chat_billed_once``)."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import IntegrityError, connection, transaction

from tenants import actions
from tenants.budgets import ledger, tpm
from tenants.errors import ChatAbandoned
from tenants.models import AuditEvent, AuditLog, ChatExchange, Message, TokenBudget, UsageDay

pytestmark = pytest.mark.django_db
USAGE = {"prompt_tokens": 20, "completion_tokens": 9, "cached_tokens": 15}


def claim(member, key: str | None = None, timeout: float = 60.0) -> str:
    request_id = uuid.uuid4().hex
    return actions.do_claim_chat(member, key or request_id, request_id, "h", timeout).request_id


def store(member, request_id: str):
    return actions.do_record_chat(
        member, None, message="What should I cook?", reply="Soup.",
        usage={**USAGE, "message_tokens": 4}, cache={"tier": "l1"}, latency_ms=1.0,
        request_id=request_id)


def discard(member, request_id: str) -> bool:
    return actions.do_record_discarded(member, request_id, finish_reason="length", **USAGE)


def usage_row(member) -> tuple[int, ...]:
    row = UsageDay.objects.get(member_ref=member.pk)
    return (row.requests, row.errors, row.prompt_tokens, row.cached_tokens,
            row.completion_tokens)


def billing_rows(request_id: str) -> list[str]:
    return list(AuditLog.objects.filter(data__request_id=request_id).exclude(
        event_type=AuditEvent.CHAT_ABANDONED).values_list("event_type", flat=True))


def test_a_reply_generated_after_the_web_gave_up_is_billed_not_stored(
        acme, settings, django_capture_on_commit_callbacks):
    from tenants.usage.rebuild import rebuild

    settings.CHAT_TPM_PER_MEMBER, settings.CHAT_TPM_PER_TENANT = "1000", ""
    actions.do_set_budget(acme.tenant, member=acme.user, tokens=100, period="day")
    messages = Message.objects.count()
    request_id = claim(acme.user)
    assert actions.do_abandon_chat(acme.user, request_id, reason="timeout") is None
    with pytest.raises(ChatAbandoned):
        store(acme.user, request_id)  # the worker's store is refused and rolled back
    with django_capture_on_commit_callbacks(execute=True):
        assert discard(acme.user, request_id) is True  # ... and what it generated billed

    assert Message.objects.count() == messages  # nothing stored
    assert usage_row(acme.user) == (0, 1, 20, 15, 9)  # one failed request, its tokens billed
    st = ledger.standing(TokenBudget.objects.get(member=acme.user))
    assert (st.spent, st.reserved) == (29, 0)
    assert tpm.check(acme.tenant.pk, acme.user.pk).remaining == 1000 - 29
    row = AuditLog.objects.get(event_type=AuditEvent.CHAT_DISCARDED)
    assert row.data == {"request_id": request_id, "model": row.data["model"],
                        "finish_reason": "length", **USAGE}
    assert row.actor == acme.user.user and row.target == str(acme.user)
    UsageDay.objects.all().delete()
    rebuild()  # the audit log says the same as the rollup
    assert usage_row(acme.user) == (0, 1, 20, 15, 9)


def test_past_its_deadline_the_claim_is_abandoned_and_the_reply_billed(acme):
    request_id = claim(acme.user, timeout=0.0)  # its web process died: nobody abandoned it
    with pytest.raises(ChatAbandoned):
        store(acme.user, request_id)
    assert discard(acme.user, request_id) is True
    assert ChatExchange.objects.get(request_id=request_id).state == "abandoned"
    assert usage_row(acme.user) == (0, 0, 20, 15, 9)


def test_each_attempt_is_billed_once_whichever_paths_run(acme):
    # stored, then a duplicate run of the same task is refused: billed by the stored reply
    stored = claim(acme.user)
    store(acme.user, stored)
    assert discard(acme.user, stored) is False
    assert actions.do_record_cancelled(acme.user, stored, completion_tokens=3) is False
    # cancelled (its stream's client left), then a duplicate run generates to the end
    cancelled = claim(acme.user)
    assert actions.do_record_cancelled(acme.user, cancelled, **USAGE) is True
    assert discard(acme.user, cancelled) is False
    # discarded twice (two runs of a task whose claim was abandoned)
    late = claim(acme.user, key="k")
    actions.do_abandon_chat(acme.user, late, reason="timeout")
    assert discard(acme.user, late) is True and discard(acme.user, late) is False
    # a retry with the same key is a new attempt: generated again, billed again
    retry = claim(acme.user, key="k")
    assert retry != late
    store(acme.user, retry)

    for request_id, event in ((stored, "chat.request"), (cancelled, "chat.cancelled"),
                              (late, "chat.discarded"), (retry, "chat.request")):
        assert billing_rows(request_id) == [event]
    assert usage_row(acme.user) == (2, 1, 4 * 20, 4 * 15, 4 * 9)
    st = ledger.standing(TokenBudget(tenant=acme.tenant, member=acme.user, tokens=1000,
                                     period="day"))
    assert st.spent == 4 * 29


def test_the_billed_once_constraint_is_per_tenant_and_attempt(acme, globex):
    request_id = uuid.uuid4().hex

    def billing(tenant, event=AuditEvent.CHAT_CANCELLED):
        return AuditLog.objects.create(tenant=tenant, event_type=event,
                                       data={"request_id": request_id})

    billing(acme.tenant)
    billing(globex.tenant)  # another tenant's id space
    billing(acme.tenant, AuditEvent.CHAT_ABANDONED)  # not a billing row
    for event in (AuditEvent.CHAT_REQUEST, AuditEvent.CHAT_DISCARDED):
        with pytest.raises(IntegrityError), transaction.atomic():
            billing(acme.tenant, event)


@pytest.mark.django_db(transaction=True)
def test_concurrent_duplicate_runs_bill_one_of_them(acme):
    request_id = claim(acme.user)
    actions.do_abandon_chat(acme.user, request_id, reason="timeout")
    start, billed = threading.Barrier(2), []

    def run():
        try:
            start.wait()
            billed.append(discard(acme.user, request_id))
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(billed) == [False, True]
    assert usage_row(acme.user) == (0, 1, 20, 15, 9)
    assert billing_rows(request_id) == ["chat.discarded"]
