"""The memory reminder's switch through the real path: HTTP (/api/chat ``reminder``, /v1
``kvinject.reminder``) -> Celery worker (demo model, batch engine) -> ``prompt_tokens``,
which count the reminder's tokens; the request's switch over the tenant's
``memory_reminder`` over the default (on); a bad value is a 400 naming the field before
any worker is asked."""

from __future__ import annotations

import pytest

from tenants import actions
from tenants.errors import InvalidInput
from tenants.models import ChatExchange, Tenant
from tests.e2e.chat_http import post

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# three exchanges before the last message: past the reminder's depth (reminder.DEFAULT_AFTER)
DEEP = [m for k in range(3) for m in ({"role": "user", "content": f"Question {k}?"},
                                      {"role": "assistant", "content": f"Answer {k}."})]
DEEP.append({"role": "user", "content": "What should I cook?"})


def test_a_bad_reminder_is_a_400_naming_the_field(live_server, alice):
    member, key = alice
    for value in ("yes", 1, None):
        status, body = post(live_server.url, "/api/chat", key,
                            {"message": "hi", "reminder": value})
        assert status == 400 and "reminder" in body["error"]["fields"], body
    status, body = post(live_server.url, "/v1/chat/completions", key, {
        "model": "kvinject", "messages": [{"role": "user", "content": "hi"}],
        "kvinject": {"reminder": "maybe"}})
    assert status == 400 and body["error"]["param"] == "kvinject.reminder", body
    assert not ChatExchange.objects.exists()
    with pytest.raises(InvalidInput, match="memory_reminder"):
        actions.do_update_tenant(member.tenant, memory_reminder="off")


def _v1(base: str, key: str, **ext) -> int:
    status, body = post(base, "/v1/chat/completions", key, {
        "model": "kvinject", "max_tokens": 4, "temperature": 0, "messages": DEEP,
        **({"kvinject": ext} if ext else {})})
    assert status == 200, body
    return body["usage"]["prompt_tokens"]


def test_request_then_tenant_then_default(live_server, gpu_worker, alice,
                                          settings, demo_model_path):
    settings.MODEL_PATH = str(demo_model_path)
    member, key = alice
    on, off = _v1(live_server.url, key), _v1(live_server.url, key, reminder=False)
    assert on > off, gpu_worker.log_tail()  # the default reminds; its tokens are billed
    assert _v1(live_server.url, key, reminder=True) == on
    tenant = actions.do_update_tenant(Tenant.objects.get(pk=member.tenant_id),
                                      memory_reminder=False)
    assert _v1(live_server.url, key) == off  # the tenant's switch
    assert _v1(live_server.url, key, reminder=True) == on  # the request's wins
    actions.do_update_tenant(tenant, memory_reminder=None)
    assert _v1(live_server.url, key) == on  # empty: the default again


def _third_turn(base: str, key: str, **switch) -> dict:
    """A new /api/chat conversation of three turns; the third sent with ``switch``."""
    conv, body = None, {}
    for message in ("Question 0?", "Question 1?", "What should I cook?"):
        ask = {"message": message, "max_new_tokens": 4, **({"conversation": conv} if conv
                                                            else {})}
        status, body = post(base, "/api/chat", key, {**ask, **(
            switch if message.startswith("What") else {})})
        assert status == 200, body
        conv = body["conversation"]
    return body


def test_api_chat_reminder_off_on_a_deep_turn(live_server, gpu_worker, alice,
                                              settings, demo_model_path):
    settings.MODEL_PATH = str(demo_model_path)
    _, key = alice
    on = _third_turn(live_server.url, key)
    off = _third_turn(live_server.url, key, reminder=False)
    assert on["usage"]["prompt_tokens"] > off["usage"]["prompt_tokens"], gpu_worker.log_tail()
    again = _third_turn(live_server.url, key, reminder=True)
    assert again["usage"]["prompt_tokens"] == on["usage"]["prompt_tokens"]
