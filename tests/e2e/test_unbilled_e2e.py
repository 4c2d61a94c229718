"""Nothing generated goes unbilled (issue 33), end to end: web-side claim and dispatch ->
real Celery worker -> Postgres and Redis.

* a reply the worker generates to its end after its claim was abandoned (no cancel flag:
  the web process died, or the claim's deadline passed) is not stored but billed once;
* a chat that is not streamed stops on the cancel flag the web sets when it stops waiting,
  within a few tokens, and what it generated is billed.

No sleeps: the tests wait for the worker's own marks (its stream's first piece, its audit
row) and for the web-side wait to return.
"""

from __future__ import annotations

import pytest

from gpu_worker.channels import streams
from gpu_worker.client import dispatch as client
from gpu_worker.routing import registry
from tenants import actions
from tenants.budgets import ledger
from tenants.errors import ChatAbandoned
from tenants.models import AuditEvent, AuditLog, ChatExchange, Message, TokenBudget, UsageDay
from tests.e2e.conftest import LONG_TOKENS, send_chat
from tests.workers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def spent(member) -> int:
    return sum(r.prompt_tokens + r.completion_tokens
               for r in UsageDay.objects.filter(tenant=member.tenant, member_ref=member.pk))


def billing_row(member, event: AuditEvent) -> AuditLog:
    return wait_for(lambda: AuditLog.objects.filter(tenant=member.tenant,
                                                    event_type=event).first(),
                    120, f"the worker's {event} audit row")


def assert_billed_once(member, row: AuditLog) -> None:
    used = row.data["prompt_tokens"] + row.data["completion_tokens"]
    assert row.data["prompt_tokens"] > 0
    assert spent(member) == used  # in the rollup, once
    st = ledger.standing(TokenBudget.objects.get(member=member))
    assert (st.spent, st.reserved) == (used, 0)  # against the budget; reservation released
    assert not Message.objects.filter(tenant=member.tenant).exists()  # nothing stored
    assert ChatExchange.objects.get(request_id=row.data["request_id"]).state == "abandoned"
    assert AuditLog.objects.filter(data__request_id=row.data["request_id"], event_type__in=(
        "chat.request", "chat.cancelled", "chat.discarded")).count() == 1


def test_a_reply_finished_after_its_claim_was_abandoned_is_billed(gpu_worker, member_key):
    member, _ = member_key
    actions.do_set_budget(member.tenant, member=member, tokens=100_000, period="month")
    params = {"max_new_tokens": LONG_TOKENS, "stream": True}
    message = "Tell me a long story."
    request_id = client.claim_chat(member, None, message, params).request_id
    client.dispatch_chat(member.pk, None, message, params, request_id)
    key = streams.stream_key(request_id)
    wait_for(lambda: registry.redis_client().xlen(key), 120, "the worker's first piece")
    # it is generating under its live claim; the web that dispatched it dies (no cancel
    # flag): the claim is abandoned, the worker generates to the end for nobody
    actions.do_abandon_chat(member, request_id, reason="web_died")
    row = billing_row(member, AuditEvent.CHAT_DISCARDED)
    assert row.data["request_id"] == request_id
    assert row.data["completion_tokens"] > LONG_TOKENS // 2  # not cancelled: to its end
    assert_billed_once(member, row)
    wait_for(lambda: not registry.redis_client().exists(key)
             or registry.redis_client().xrevrange(key, count=1)[0][1].get(b"end"),
             30, "the stream's end mark")
    registry.redis_client().delete(key)


def test_a_chat_that_is_not_streamed_stops_on_the_webs_cancel_flag(gpu_worker, member_key):
    member, _ = member_key
    actions.do_set_budget(member.tenant, member=member, tokens=100_000, period="month")
    sent = send_chat(member, "Tell me a long story.", max_new_tokens=LONG_TOKENS)
    request_id = sent.result.id
    # the web stops waiting (dispatch.finish_chat sets this flag; tests/gpu_worker/
    # test_chat_billing.py): the claim stays live here, so the worker starts the chat
    # whenever it takes it and meets the flag while generating
    assert streams.flag_cancelled(request_id)
    with pytest.raises(ChatAbandoned):
        client.wait_chat(sent, timeout=120)
    row = billing_row(member, AuditEvent.CHAT_CANCELLED)
    assert row.data["request_id"] == request_id
    assert 1 <= row.data["completion_tokens"] < LONG_TOKENS // 2  # stopped, not at the end
    assert_billed_once(member, row)
    registry.redis_client().delete(streams.cancel_key(request_id))
