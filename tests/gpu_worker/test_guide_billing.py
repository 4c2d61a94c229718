"""The contrastive guide row's tokens (issue 33, section 2), from the engine's result to
what is billed, on real Postgres and Redis: ``chat_service.record`` reports them in the
usage (beside, never inside, the prompt and completion tokens), in the chat's audit row
and the usage rollup (which a rebuild from the audit log reproduces), in a replay of the
stored answer, and in ``/v1``'s usage as a platform field; a cancelled or discarded guided
generation bills them too. The page, CSV and /api/usage: tests/tenants/test_usage_guide.py."""

from __future__ import annotations

import pytest

from gpu_worker.serving import chat_service
from injection.base import ExecutionResult, Tier
from tenants import actions
from tenants.errors import ChatAbandoned
from tenants.models import AuditEvent, AuditLog, ChatExchange, UsageDay
from tenants.usage import rebuild
from tenants.v1.shapes import usage as openai_usage
from tests.gpu_worker.test_chat_billing import member, request_id, turn  # noqa: F401

pytestmark = pytest.mark.django_db


def guided(finish_reason: str = "stop", completion_tokens: int = 9) -> ExecutionResult:
    return ExecutionResult(text="Soup" * completion_tokens, tier=Tier.L1, prompt_tokens=20,
                           completion_tokens=completion_tokens, cached_tokens=15,
                           finish_reason=finish_reason, contrast_effective=1.0,
                           guide_prefill_tokens=14, guide_decode_tokens=completion_tokens - 1)


def rollup(member) -> tuple[int, ...]:  # noqa: F811
    row = UsageDay.objects.get(member_ref=member.pk)
    return (row.requests, row.prompt_tokens, row.completion_tokens, row.guide_prefill_tokens,
            row.guide_decode_tokens)


def test_a_guided_reply_reports_and_stores_its_guide_tokens(member, request_id):  # noqa: F811
    body = chat_service.record(turn(member, request_id), guided(), 4)
    assert body["usage"] == {"prompt_tokens": 20, "completion_tokens": 9, "cached_tokens": 15,
                             "guide_prefill_tokens": 14, "guide_decode_tokens": 8}
    row = AuditLog.objects.get(event_type=AuditEvent.CHAT_REQUEST)
    assert (row.data["prompt_tokens"], row.data["completion_tokens"],
            row.data["guide_prefill_tokens"], row.data["guide_decode_tokens"]) == (20, 9, 14, 8)
    assert rollup(member) == (1, 20, 9, 14, 8)
    rebuild.rebuild()  # the audit log says the same
    assert rollup(member) == (1, 20, 9, 14, 8)
    # a retry with the same key answers the stored usage, guide tokens included
    assert ChatExchange.objects.get(request_id=request_id).usage == {
        "prompt_tokens": 20, "completion_tokens": 9, "cached_tokens": 15,
        "guide_prefill_tokens": 14, "guide_decode_tokens": 8}
    # /v1: OpenAI's counts untouched, the guide beside them
    assert openai_usage(body["usage"]) == {
        "prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29,
        "prompt_tokens_details": {"cached_tokens": 15}, "kvinject_guide_tokens": 22,
        "kvinject_guide_tokens_details": {"prefill_tokens": 14, "decode_tokens": 8}}


def test_an_unguided_reply_has_none(member, request_id):  # noqa: F811
    plain = ExecutionResult(text="Soup", tier=Tier.L1, prompt_tokens=20, completion_tokens=1,
                            finish_reason="stop")
    body = chat_service.record(turn(member, request_id), plain, 4)
    assert (body["usage"]["guide_prefill_tokens"], body["usage"]["guide_decode_tokens"]) == (
        0, 0)
    assert openai_usage(body["usage"])["kvinject_guide_tokens"] == 0
    assert rollup(member) == (1, 20, 1, 0, 0)


def test_cancelled_and_discarded_guided_generations_bill_their_guide_tokens(
        member, request_id):  # noqa: F811
    with pytest.raises(ChatAbandoned, match="cancelled after 3 tokens"):
        chat_service.record(turn(member, request_id), guided("cancelled", 3), 4)
    row = AuditLog.objects.get(event_type=AuditEvent.CHAT_CANCELLED)
    assert (row.data["guide_prefill_tokens"], row.data["guide_decode_tokens"]) == (14, 2)
    assert rollup(member) == (0, 20, 3, 14, 2)
    again = "r2-" + request_id
    actions.do_claim_chat(member, again, again, "h", 60.0)
    actions.do_abandon_chat(member, again, reason="client_disconnected")
    with pytest.raises(ChatAbandoned, match="not stored"):
        chat_service.record(turn(member, again), guided("length", 5), 4)
    row = AuditLog.objects.get(event_type=AuditEvent.CHAT_DISCARDED)
    assert (row.data["guide_prefill_tokens"], row.data["guide_decode_tokens"]) == (14, 4)
    assert rollup(member) == (0, 40, 8, 28, 6)
    rebuild.rebuild()
    assert rollup(member) == (0, 40, 8, 28, 6)
