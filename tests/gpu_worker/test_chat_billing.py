"""The worker's side of "nothing generated goes unbilled" (issue 33), on real Postgres and
Redis: what ``chat_service.record`` does with a generated result whose claim was abandoned
meanwhile, or which stopped on its cancel flag (streamed or not); and the web side that
sets the flag when it stops waiting (``dispatch.finish_chat``)."""

from __future__ import annotations

import time
import uuid

import pytest
from celery.result import AsyncResult

from gpu_worker.channels import streams
from gpu_worker.client import dispatch
from gpu_worker.routing import registry
from gpu_worker.routing.affinity import Route
from gpu_worker.serving import chat_service
from injection.base import ExecutionResult, Tier
from tenants import actions
from tenants.budgets import ledger
from tenants.errors import BudgetExceeded, ChatAbandoned, WorkerUnavailable
from tenants.models import (
    AuditEvent,
    AuditLog,
    ChatExchange,
    Message,
    TokenBudget,
    UsageDay,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def member():
    tenant = actions.do_create_tenant("acme")
    return actions.do_add_member(tenant, "alice", preference="I am vegetarian.")


@pytest.fixture
def request_id(member):
    rid = uuid.uuid4().hex
    actions.do_claim_chat(member, rid, rid, "h", 60.0)
    yield rid
    registry.redis_client().delete(streams.stream_key(rid), streams.cancel_key(rid))


def turn(member, request_id: str, stream=None) -> chat_service.Turn:
    return chat_service.Turn(member, None, "What should I cook?", {}, request_id, None, (),
                             stream, time.monotonic())


def result(finish_reason: str, completion_tokens: int = 9) -> ExecutionResult:
    return ExecutionResult(text="Soup" * completion_tokens, tier=Tier.L1, prompt_tokens=20,
                           completion_tokens=completion_tokens, cached_tokens=15,
                           finish_reason=finish_reason)


def billed(member) -> tuple[int, int, int, int]:
    row = UsageDay.objects.get(member_ref=member.pk)
    return row.requests, row.prompt_tokens, row.cached_tokens, row.completion_tokens


def stream_end(request_id: str) -> bytes | None:
    entries = registry.redis_client().xrange(streams.stream_key(request_id))
    return entries[-1][1].get(b"end") if entries else None


def test_a_reply_whose_claim_was_abandoned_is_billed_and_its_stream_ended(member, request_id):
    actions.do_abandon_chat(member, request_id, reason="client_disconnected")
    stream = streams.Publisher(registry.redis_client(), request_id)
    with pytest.raises(ChatAbandoned, match="9 tokens generated, not stored \\(billed\\)"):
        chat_service.record(turn(member, request_id, stream), result("length"), 4)
    assert not Message.objects.filter(tenant=member.tenant).exists()
    row = AuditLog.objects.get(event_type=AuditEvent.CHAT_DISCARDED)
    assert (row.data["request_id"], row.data["finish_reason"]) == (request_id, "length")
    assert billed(member) == (0, 20, 15, 9)
    assert stream_end(request_id) == b"cancelled"  # a reader still there stops at once


def test_a_stored_reply_is_billed_once_even_if_its_task_runs_twice(member, request_id):
    body = chat_service.record(turn(member, request_id), result("stop"), 4)
    assert body["usage"] == {"prompt_tokens": 20, "completion_tokens": 9, "cached_tokens": 15,
                             "guide_prefill_tokens": 0, "guide_decode_tokens": 0}
    with pytest.raises(ChatAbandoned, match="billed already"):  # a duplicate delivery
        chat_service.record(turn(member, request_id), result("stop"), 4)
    assert billed(member) == (1, 20, 15, 9)
    assert not AuditLog.objects.filter(event_type=AuditEvent.CHAT_DISCARDED).exists()


def test_a_generation_that_is_not_streamed_stops_on_its_cancel_flag_and_is_billed(
        member, request_id):
    watch = streams.cancel_watch(request_id)
    request = chat_service.build_request(member, None, [{"role": "user", "content": "hi"}],
                                         {}, None, None, (), watch=watch)
    assert not any(request.cancelled() for _ in range(4))  # no flag: it generates on
    assert streams.flag_cancelled(request_id)  # the web stopped waiting
    assert any(request.cancelled() for _ in range(2))  # seen within two tokens
    with pytest.raises(ChatAbandoned, match="cancelled after 3 tokens \\(billed\\)"):
        chat_service.record(turn(member, request_id), result("cancelled", 3), 4)
    assert ChatExchange.objects.get(request_id=request_id).state == "abandoned"
    row = AuditLog.objects.get(event_type=AuditEvent.CHAT_CANCELLED)
    assert (row.data["request_id"], row.data["completion_tokens"]) == (request_id, 3)
    assert billed(member) == (0, 20, 15, 3)


def test_the_web_that_stops_waiting_abandons_the_claim_and_flags_the_worker(
        member, request_id):
    never_answered = dispatch.Dispatched(AsyncResult(request_id), Route("gpu", "explicit"))
    with pytest.raises(WorkerUnavailable) as gave_up:
        dispatch.finish_chat(member, never_answered, request_id, request_id, timeout=0.2)
    assert gave_up.value.details["idempotency_key"] == request_id
    assert ChatExchange.objects.get(request_id=request_id).state == "abandoned"
    watch = streams.CancelWatch(registry.redis_client(), request_id, cancel_every=1)
    assert watch.cancelled()  # a genuine flag: the worker running it stops


def test_a_forged_or_foreign_cancel_flag_stops_nothing(member, request_id):
    other = uuid.uuid4().hex
    streams.flag_cancelled(other)
    registry.redis_client().set(streams.cancel_key(request_id), b"0" * 32)
    watch = streams.CancelWatch(registry.redis_client(), request_id, cancel_every=1)
    assert not watch.cancelled()
    registry.redis_client().delete(streams.cancel_key(other))


def test_the_request_settles_the_claims_budget_on_the_real_prompt(member, request_id):
    actions.do_set_budget(member.tenant, member=member, tokens=100, period="day")
    params = {"max_new_tokens": 64}
    request = chat_service.build_request(member, None, [{"role": "user", "content": "hi"}],
                                         params, None, None, (), request_id=request_id)
    assert request.admit(30) == 64 and request.max_new_tokens == 64
    assert ChatExchange.objects.get(request_id=request_id).reserved_tokens == 94
    assert request.admit(60) == 40  # the engine caps the reply to this
    with pytest.raises(BudgetExceeded):
        request.admit(100)  # not even one completion token: nothing is generated
    plain = chat_service.build_request(member, None, [{"role": "user", "content": "hi"}],
                                       params)
    assert plain.admit is None  # no claim named: nothing to settle


def test_a_failed_attempt_is_billed_for_what_it_generated_once(member, request_id):
    """A generation that failed after 7 tokens (its time limit, an OOM): billed as
    chat.failed, never twice (a duplicate delivery of its task fails alike); the claim is
    left to the web, whose abandon counts the one error."""
    from gpu_worker.serving.attempts import Attempt

    actions.do_set_budget(member.tenant, member=member, tokens=10_000, period="month")
    attempt = Attempt(member, request_id)
    attempt.prompt_tokens, attempt.completion_tokens = 20, 7
    attempt.failed(TimeoutError("soft time limit"))
    Attempt(member, request_id).failed(RuntimeError("not admitted, nothing generated"))
    again = Attempt(member, request_id)
    again.prompt_tokens, again.completion_tokens = 20, 7
    again.failed(TimeoutError("the same task, delivered twice"))
    row = AuditLog.objects.get(event_type=AuditEvent.CHAT_FAILED)
    assert (row.data["request_id"], row.data["error"]) == (request_id, "TimeoutError")
    assert billed(member) == (0, 20, 0, 7)
    assert ChatExchange.objects.get(request_id=request_id).state == "pending"
    actions.do_abandon_chat(member, request_id, reason="generation_failed")
    assert UsageDay.objects.get(member_ref=member.pk).errors == 1
    assert ledger.standing(TokenBudget.objects.get(member=member))[2:] == (27, 0)


def test_a_reply_whose_storing_failed_is_billed_once_and_a_stored_one_not_again(member,
                                                                               request_id):
    """A reply generated whole whose store failed (the time limit inside the transaction):
    billed as chat.failed; a reply already stored is never billed a second time that way."""
    from gpu_worker.serving.attempts import Attempt

    Attempt(member, request_id).failed(TimeoutError("while storing"), result("stop"))
    assert billed(member) == (0, 20, 0, 9)
    assert AuditLog.objects.get(event_type=AuditEvent.CHAT_FAILED).data["request_id"] == request_id

    other = uuid.uuid4().hex
    actions.do_claim_chat(member, other, other, "h", 60.0)
    chat_service.record(turn(member, other), result("stop"), 4)  # stored and billed
    Attempt(member, other).failed(RuntimeError("after the commit"), result("stop"))
    assert AuditLog.objects.filter(data__request_id=other).count() == 1
    assert billed(member) == (1, 40, 15, 18)
