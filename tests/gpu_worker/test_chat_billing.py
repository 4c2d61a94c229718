"""The worker's side of "nothing generated goes unbilled" (issue 33), on real Postgres and
Redis: what ``chat_service.record`` does with a generated result whose claim was abandoned
meanwhile: not stored, billed once."""

from __future__ import annotations

import time
import uuid

import pytest

from gpu_worker.channels import streams
from gpu_worker.routing import registry
from gpu_worker.serving import chat_service
from injection.base import ExecutionResult, Tier
from tenants import actions
from tenants.errors import ChatAbandoned
from tenants.models import AuditEvent, AuditLog, Message, UsageDay

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
    assert body["usage"] == {"prompt_tokens": 20, "completion_tokens": 9, "cached_tokens": 15}
    with pytest.raises(ChatAbandoned, match="billed already"):  # a duplicate delivery
        chat_service.record(turn(member, request_id), result("stop"), 4)
    assert billed(member) == (1, 20, 15, 9)
    assert not AuditLog.objects.filter(event_type=AuditEvent.CHAT_DISCARDED).exists()
