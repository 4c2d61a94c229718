"""Every generated token billed once (issue 60): a ``/v1`` stream that delivered content and
then failed on the worker's soft time limit is billed for what it generated, once.

The real path: uvicorn -> Redis -> a real Celery worker (solo pool, its own soft time
limit) -> Postgres. The fault is injected as test_chat_faults.py does: once the client has
content, the worker is paused (SIGSTOP, outside any transaction) past its soft time limit
and resumed; its own watchdog then raises the limit inside the generating task. No timing
is asserted: the pause only makes the limit certain to have passed.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request

import pytest

from tenants import actions
from tenants.budgets import ledger
from tenants.models import AuditEvent, AuditLog, ChatExchange, Message, TokenBudget
from tests.e2e.conftest import only_these_consume
from tests.e2e.test_chat_faults import pause_generating
from tests.workers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
SOFT_LIMIT = 20  # seconds: a first token of the demo model comes well within it
LONG = 1800  # far more than the worker can generate before its limit


def stream_until_content(base: str, token: str) -> tuple[object, list[str]]:
    body = {"model": "kvinject", "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": LONG, "stream": True}
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                 method="POST", headers={"Authorization": f"Bearer {token}",
                                                         "Content-Type": "application/json"})
    response = urllib.request.urlopen(req, timeout=180)
    events = []
    for raw in response:
        line = raw.decode().strip()
        if line.startswith("data: {"):
            events.append(line[6:])
            if json.loads(line[6:]).get("choices", [{}])[0].get("delta", {}).get("content"):
                return response, events
    raise AssertionError(f"the stream ended without content: {events}")


def rest_of(response, events: list[str]) -> list[dict]:
    for raw in response:
        line = raw.decode().strip()
        if line.startswith("data: {"):
            events.append(line[6:])
    return [json.loads(e) for e in events]


def usage_line(base: str, member) -> dict:
    admin = actions.do_add_member(member.tenant, "boss", admin=True)
    req = urllib.request.Request(f"{base}/api/usage", headers={
        "Authorization": f"Token {actions.do_create_api_token(admin)}"})
    with urllib.request.urlopen(req, timeout=30) as response:
        (line,) = [d for d in json.load(response)["data"] if d["member"] == str(member)]
    return line


LIMITS = {"CHAT_SOFT_TIME_LIMIT": str(SOFT_LIMIT), "CHAT_HARD_TIME_LIMIT": "120",
          "CHAT_MAX_NEW_TOKENS": str(LONG)}


@pytest.fixture
def web(worker_base_env, tmp_path):
    """A web process of its own: the time limits a task runs under are its sender's. It
    routes by no affinity: a member id an earlier test's worker served could be sent to that
    worker's own queue (only this test's worker consumes the shared one)."""
    from tests.workers import AsgiServer

    server = AsgiServer({**worker_base_env, **LIMITS, "WORKER_AFFINITY_ENABLED": "0"},
                        tmp_path)
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture
def fb_worker(start_workers):
    """A worker of this test's limits, stopped after it: left running, it would consume the
    shared queue beside later tests' workers and take their tasks (their logs never see
    them)."""
    # paused, the worker is not taken for dead by its peers (heartbeat TTL)
    (worker,) = start_workers("fb1", WORKER_HEARTBEAT_TTL=60, **LIMITS)
    yield worker
    worker.stop()


def test_a_stream_failing_after_content_bills_what_it_generated_once(web, fb_worker):
    worker = fb_worker
    tenant = actions.do_create_tenant("failbill")
    member = actions.do_add_member(tenant, "alice", preference="I am vegetarian.")
    actions.do_set_budget(tenant, member=member, tokens=100_000, period="month")
    with only_these_consume([worker]):
        response, events = stream_until_content(web.url,
                                                actions.do_create_api_token(member))
        pause_generating(worker)
        try:
            time.sleep(SOFT_LIMIT + 1)  # the fault: the task's soft limit passes
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        chunks = rest_of(response, events)
    error = chunks[-1].get("error")
    assert error and error["code"] == "generation_failed", (chunks[-2:], worker.log_tail())
    delivered = [c for c in chunks if c.get("choices")
                 and c["choices"][0].get("delta", {}).get("content")]
    row = wait_for(lambda: AuditLog.objects.filter(
        tenant=tenant, event_type=AuditEvent.CHAT_FAILED).first(), 60, "the chat.failed row")
    generated = row.data["completion_tokens"]
    assert generated >= len(delivered) > 0 and row.data["prompt_tokens"] > 0
    assert row.data["error"] == "SoftTimeLimitExceeded"
    rid = row.data["request_id"]
    assert AuditLog.objects.filter(data__request_id=rid, event_type__in=(
        "chat.request", "chat.cancelled", "chat.discarded", "chat.failed")).count() == 1
    assert not Message.objects.filter(tenant=tenant).exists()  # nothing stored
    assert ChatExchange.objects.get(request_id=rid).state == "abandoned"
    line = usage_line(web.url, member)
    assert (line["requests"], line["errors"]) == (0, 1)
    assert (line["prompt_tokens"], line["completion_tokens"]) == (row.data["prompt_tokens"],
                                                                  generated)
    standing = ledger.standing(TokenBudget.objects.get(member=member))
    assert (standing.spent, standing.reserved) == (row.data["prompt_tokens"] + generated, 0)
