"""/v1 parameters that are accepted do what OpenAI documents, through the real path: the
official SDK -> live HTTP server -> real Celery worker (demo model) -> Postgres. The refusals
(400 naming the field) are in tests/tenants/test_v1_params.py."""

from __future__ import annotations

import openai
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

QUESTION = [{"role": "user", "content": "What should I cook?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@pytest.fixture
def client(live_server, member_key, settings, demo_model_path):
    settings.MODEL_PATH = str(demo_model_path)  # the web reads the served model's context
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=member_key[1],
                         max_retries=0, timeout=180)


def create(client, **kw):
    kw.setdefault("messages", QUESTION)
    return client.chat.completions.create(model="kvinject", **kw)


def test_tools_with_auto_or_none_answer_without_tool_calls(client, gpu_worker):
    plain = create(client, max_tokens=8, temperature=0).choices[0]
    for extra in ({}, {"tool_choice": "auto"}, {"tool_choice": "none"},
                  {"tool_choice": "auto", "parallel_tool_calls": False}):
        choice = create(client, max_tokens=8, temperature=0, tools=TOOLS, **extra).choices[0]
        # the template cannot render tools: the model sees the same prompt and says the same
        assert choice.message.content == plain.message.content, extra
        assert choice.message.tool_calls is None and choice.finish_reason != "tool_calls"
    chunks = list(create(client, max_tokens=8, temperature=0, tools=TOOLS, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        plain.message.content
    assert all(c.choices[0].delta.tool_calls is None for c in chunks if c.choices)


def test_neutral_fields_are_accepted_and_change_nothing(client, gpu_worker):
    plain = create(client, max_tokens=8, temperature=0)
    same = create(client, max_completion_tokens=8, temperature=0, logprobs=False,
                  response_format={"type": "text"}, metadata={"task": "title_generation"},
                  user="end-user-7", n=1, presence_penalty=0, frequency_penalty=0)
    assert same.choices[0].message.content == plain.choices[0].message.content
    assert same.usage.completion_tokens == plain.usage.completion_tokens <= 8
    assert same.choices[0].logprobs is None


def test_seed_makes_a_sampled_reply_repeatable(client, gpu_worker):
    def sampled(seed):
        return create(client, max_tokens=12, temperature=1.0, seed=seed).choices[0].message.content

    first = sampled(7)
    assert sampled(7) == first
    assert any(sampled(s) != first for s in (8, 9, 10))


def test_without_max_tokens_the_reply_runs_until_the_context_is_full(
    client, gpu_worker, settings, demo_model_path
):
    """OpenAI's default: no max_tokens is "until the model stops or the context is full";
    the demo model (2048 positions) seldom stops, so it fills the context here."""
    from tenants.api.context_limits import model_limits

    settings.CHAT_MAX_NEW_TOKENS = 10**6  # no server cap in the way
    _, max_pos = model_limits(str(demo_model_path))
    r = create(client, temperature=0)
    total = r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.completion_tokens > 1000  # far beyond the old default of 32
    assert total <= max_pos
    if r.choices[0].finish_reason == "length":
        assert total >= max_pos - 64  # stopped by the context, not by a platform default


def test_the_server_cap_bounds_a_reply_but_never_refuses_a_max_tokens_that_fits(
    client, gpu_worker, settings
):
    settings.CHAT_MAX_NEW_TOKENS = 6
    r = create(client, max_tokens=1000, temperature=0)  # Open WebUI's title task asks this
    assert r.usage.completion_tokens <= 6 and r.choices[0].message.content is not None
    assert (r.choices[0].finish_reason == "length") == (r.usage.completion_tokens == 6)
    r = create(client, temperature=0)
    assert r.usage.completion_tokens <= 6


def test_a_max_tokens_beyond_the_context_is_openais_error(client, demo_model_path):
    from tenants.api.context_limits import model_limits

    _, max_pos = model_limits(str(demo_model_path))
    with pytest.raises(openai.BadRequestError) as err:
        create(client, max_completion_tokens=max_pos)
    assert (err.value.code, err.value.param) == ("context_length_exceeded",
                                                 "max_completion_tokens")
    assert err.value.type == "invalid_request_error"
    assert f"maximum context length is {max_pos} tokens" in err.value.message


def test_a_tenants_own_cap_bounds_every_reply(client, gpu_worker, member_key, live_server):
    """Tenant.max_completion_tokens: /v1 without max_tokens runs to it (not the server's
    cap), a longer ask is answered up to it; /api/chat the same."""
    import requests

    from tenants import actions

    member, key = member_key
    actions.do_update_tenant(member.tenant, max_completion_tokens=3)
    for kw in ({}, {"max_tokens": 50}):
        reply = create(client, temperature=0, **kw)
        assert reply.usage.completion_tokens <= 3, kw
        assert reply.choices[0].finish_reason == "length" or reply.usage.completion_tokens < 3
    native = requests.post(f"{live_server.url}/api/chat", timeout=180,
                           headers={"Authorization": f"Token {key}"},
                           json={"message": "What should I cook?", "max_new_tokens": 50})
    assert native.status_code == 200, native.text
    assert native.json()["usage"]["completion_tokens"] <= 3
    actions.do_update_tenant(member.tenant, max_completion_tokens=None)  # the server's cap
    assert create(client, temperature=0, max_tokens=8).usage.completion_tokens <= 8
