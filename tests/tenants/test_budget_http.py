"""A spent budget over HTTP: /v1 answers OpenAI's quota error (the SDK raises
RateLimitError), /api/chat its own error family; both with Retry-After. No worker is
needed: the refusal comes at admission, before anything is enqueued."""

from __future__ import annotations

import openai
import pytest

from tenants import actions
from tenants.budgets.periods import seconds_to_reset
from tenants.models import ChatExchange
from tests.tenants.conftest import token_client

CHAT = {"model": "kvinject", "max_tokens": 8,
        "messages": [{"role": "user", "content": "What should I cook?"}]}


def spend_it(world, tokens=10):
    actions.do_set_budget(world.tenant, member=world.user, tokens=tokens, period="day")


@pytest.mark.django_db
def test_v1_answers_openais_quota_error_with_retry_after(acme):
    spend_it(acme)
    r = token_client(acme.user_key).post("/v1/chat/completions", CHAT,
                                         content_type="application/json")
    assert r.status_code == 429, r.content
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("insufficient_quota", "budget_exceeded")
    assert "budget" in error["message"] and error["scope"] == "member"
    assert 0 < int(r["Retry-After"]) <= seconds_to_reset("day")
    assert not ChatExchange.objects.filter(member=acme.user).exists()  # nothing claimed


@pytest.mark.django_db
def test_v1_streamed_request_is_refused_before_the_stream_starts(acme):
    spend_it(acme)
    r = token_client(acme.user_key).post("/v1/chat/completions", {**CHAT, "stream": True},
                                         content_type="application/json")
    assert r.status_code == 429 and r.json()["error"]["type"] == "insufficient_quota"
    assert "Retry-After" in r


@pytest.mark.django_db
def test_api_chat_answers_its_own_error_family(acme):
    actions.do_set_budget(acme.tenant, tokens=10, period="month")
    r = token_client(acme.user_key).post("/api/chat", {"message": "What should I cook?"},
                                         content_type="application/json")
    assert r.status_code == 429, r.content
    assert r.json()["error"]["code"] == "budget_exceeded"
    assert r.json()["error"]["scope"] == "tenant" and r.json()["error"]["period"] == "month"
    assert int(r["Retry-After"]) == pytest.approx(seconds_to_reset("month"), abs=5)


@pytest.mark.django_db(transaction=True)
def test_the_openai_sdk_raises_rate_limit_error(live_server):
    from tests.tenants.conftest import make_world

    world = make_world("sdk", "sdk secret")
    spend_it(world)
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=world.user_key,
                           max_retries=0, timeout=60)
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(**CHAT)
    assert raised.value.status_code == 429
    assert raised.value.code == "budget_exceeded"
    assert raised.value.body["type"] == "insufficient_quota"
    assert int(raised.value.response.headers["retry-after"]) > 0
