"""No log line carries message or reply text: real chats through the live web and a real
worker (a successful turn, a continued one, a refused request and one the web gave up on
and revoked), then the worker's log file and every line the web process logged are
searched for the distinctive message and reply texts."""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid

import pytest
from django.conf import settings

from gpu_worker.client import dispatch as chat_client
from tenants import actions, errors
from tenants.models import Message
from tests.e2e.conftest import LONG_TOKENS
from tests.e2e.test_chat_e2e import post_chat

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def web_log(tmp_path):
    """Every line this process (the live server's requests) logs, formatted as in production."""
    path = tmp_path / "web.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(settings.LOGGING["formatters"]["plain"]["format"]))
    root = logging.getLogger()
    root.addHandler(handler)
    yield path
    root.removeHandler(handler)
    handler.close()


def secret(tag: str) -> str:
    return f"zanzibar-{tag}-{uuid.uuid4().hex}"


class WorkerLogs:
    """Every worker log of the session (any live worker may take a chat), from now on."""

    def __init__(self, base):
        self.base = base
        self.offsets = {p: p.stat().st_size for p in self._files()}

    def _files(self):
        return [p for p in self.base.rglob("*.log") if p.name != "web.log"]

    def text(self) -> str:
        return "\n".join(p.read_bytes()[self.offsets.get(p, 0):].decode(errors="replace")
                         for p in self._files())

    def wait_for(self, needle: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.text()
            if needle in text:
                return text
            time.sleep(0.2)
        raise AssertionError(f"{needle!r} in no worker log:\n{self.text()[-3000:]}")


def test_no_message_or_reply_text_in_worker_or_web_logs(live_server, gpu_worker, web_log,
                                                        tmp_path_factory):
    tenant = actions.do_create_tenant("logpriv")
    member = actions.do_add_member(tenant, "lp-user", preference="likes quiet gardens")
    key = actions.do_create_api_token(member)
    logs = WorkerLogs(tmp_path_factory.getbasetemp())
    texts, task_ids, conv = [], [], None
    for i in range(2):
        message = secret(f"q{i}")
        status, body = post_chat(live_server.url, key, {
            "message": message, "max_new_tokens": 12, **({"conversation": conv} if conv else {})})
        assert status == 200, body
        conv = body["conversation"]
        texts += [message, body["reply"]]
        task_ids.append(body["request_id"])
    refused = secret("refused")
    status, body = post_chat(live_server.url, key, {"message": refused, "max_new_tokens": 10**6})
    assert status == 400
    texts.append(refused)

    # the web gives up waiting and abandons the claim; the worker refuses the turn. The
    # worker is held (SIGSTOP) until the claim is abandoned, so the web's short wait
    # times out whatever the machine's speed (no race with a fast worker)
    abandoned = secret("abandoned")
    params = {"max_new_tokens": LONG_TOKENS}
    claim = chat_client.claim_chat(member, None, abandoned, params)
    os.kill(gpu_worker.pid, signal.SIGSTOP)
    try:
        dispatched = chat_client.dispatch_chat(member.pk, None, abandoned, params,
                                               claim.request_id)
        with pytest.raises(errors.WorkerUnavailable):
            chat_client.wait_chat(dispatched, timeout=0.5)
        assert actions.do_abandon_chat(member, claim.request_id, reason="test") is None
    finally:
        os.kill(gpu_worker.pid, signal.SIGCONT)
    texts.append(abandoned)

    for task_id in task_ids:
        logs.wait_for(f"[{task_id}] succeeded")
    worker_text = logs.wait_for(f"request_id={claim.request_id} refused")
    replies = Message.objects.filter(tenant=tenant, role=Message.Role.ASSISTANT)
    texts += [m.content for m in replies]
    assert all(len(t.strip()) >= 4 for t in texts), texts  # distinctive enough to grep
    web_text = web_log.read_text(errors="replace")
    assert "Bad Request: /api/chat" in web_text  # the web did log these requests
    for text in texts:
        for form in (text, repr(text)[1:-1]):
            assert form not in worker_text, f"worker log carries {form!r}"
            assert form not in web_text, f"web log carries {form!r}"
