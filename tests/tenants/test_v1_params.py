"""/v1 chat-completions parameters: what cannot be honoured is a 400 naming it, lengths follow
OpenAI (no max_tokens: until the context is full, at most CHAT_MAX_NEW_TOKENS; more than fits:
context_length_exceeded). Real Django, Postgres and Redis; each refusal happens before any
worker is asked (nothing is claimed), so no worker runs here. The accepted cases are answered
by a real worker in tests/e2e/test_openai_params.py."""

from __future__ import annotations

import pytest

from tenants.api.context_limits import MARKUP_TOKENS, completion_room, model_limits
from tenants.errors import ContextLengthExceeded
from tenants.models import ChatExchange
from tests.tenants.conftest import token_client

pytestmark = pytest.mark.django_db

TOOL = {"type": "function", "function": {"name": "get_current_timestamp",
                                         "description": "Now.", "parameters": {
                                             "type": "object", "properties": {}}}}


def post(world, **body):
    body = {"model": "kvinject", "messages": [{"role": "user", "content": "hi"}], **body}
    return token_client(world.user_key).post("/v1/chat/completions", body,
                                              content_type="application/json")


REFUSED = [
    (dict(tools=[TOOL], tool_choice="required"), "tool_choice", "cannot call tools"),
    (dict(tools=[TOOL], tool_choice={"type": "function",
                                     "function": {"name": "get_current_timestamp"}}),
     "tool_choice", "cannot call tools"),
    (dict(tool_choice={"type": "function", "function": {"name": "x"}}), "tool_choice",
     "only allowed when tools"),
    (dict(tool_choice="sometimes"), "tool_choice", "must be"),
    (dict(tools=[{"type": "custom", "custom": {"name": "x"}}]), "tools.0", "function"),
    (dict(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools.0.function.name",
     "letters"),
    (dict(tools=[TOOL, TOOL]), "tools.1.function.name", "duplicate"),
    (dict(response_format={"type": "json_object"}), "response_format", "not supported"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
     "response_format", "not supported"),
    (dict(logprobs=True), "logprobs", "log probabilities"),
    (dict(logprobs=True, top_logprobs=3), "logprobs", "log probabilities"),
    (dict(top_logprobs=0), "top_logprobs", "log probabilities"),
    (dict(n=2), "n", ""),
    (dict(frequency_penalty=0.5), "frequency_penalty", "not supported"),
    (dict(presence_penalty=-1), "presence_penalty", "not supported"),
    (dict(logit_bias={"50256": -100}), "logit_bias", "not supported"),
    (dict(metadata={"task": 1}), "metadata", "string pairs"),
    (dict(max_tokens=5, max_completion_tokens=6), "max_tokens", "differ"),
    (dict(stream_options={"include_usage": True, "other": 1}), "stream_options.other",
     "unrecognized"),
    (dict(functions=[{"name": "x"}]), "functions", "unrecognized"),
    (dict(messages=[{"role": "assistant", "content": "x", "tool_calls": [{"id": "c"}]},
                    {"role": "user", "content": "hi"}]), "messages.0.tool_calls",
     "not supported"),
]


@pytest.mark.parametrize(("body", "param", "says"), REFUSED,
                         ids=[p + ":" + str(list(b.values())[0])[:20] for b, p, _ in REFUSED])
def test_what_cannot_be_honoured_is_a_400_naming_it(acme, body, param, says):
    response = post(acme, **body)
    error = response.json()["error"]
    assert response.status_code == 400, error
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error", "invalid_input", param), error
    assert says.lower() in error["message"].lower(), error
    assert not ChatExchange.objects.exists()  # refused before anything was claimed


@pytest.fixture
def real_model(settings, real_model_path):
    settings.MODEL_PATH = str(real_model_path)
    return model_limits(str(real_model_path))


@pytest.mark.real_model
@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_length_beyond_the_context_is_openais_context_length_error(acme, real_model, field):
    _, max_pos = real_model
    response = post(acme, **{field: max_pos})
    error = response.json()["error"]
    assert response.status_code == 400, error
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error", "context_length_exceeded", field)
    assert f"maximum context length is {max_pos} tokens" in error["message"]
    assert error["context_tokens"] == max_pos and error["needed_tokens"] > max_pos
    assert not ChatExchange.objects.exists()


@pytest.mark.real_model
def test_messages_that_leave_no_room_for_a_reply_name_messages(acme, real_model, settings):
    tokenizer, max_pos = real_model
    settings.CHAT_MAX_MESSAGE_CHARS = 10**6
    text = "vegetables " * max_pos
    assert len(tokenizer.encode(text).ids) > max_pos
    error = post(acme, messages=[{"role": "user", "content": text}]).json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")


def test_completion_room_follows_openai(real_model_path):
    tokenizer, max_pos = model_limits(str(real_model_path))
    texts = ["What should I cook tonight?", "I am vegetarian."]
    prompt = sum(len(tokenizer.encode(t, add_special_tokens=False).ids) for t in texts)
    room = max_pos - prompt - MARKUP_TOKENS * 3
    path = str(real_model_path)
    # no max_tokens: until the context is full, bounded by the server's cap
    assert completion_room(path, texts, requested=None, cap=10**6) == room
    assert completion_room(path, texts, requested=None, cap=300) == 300
    # a max_tokens that fits is served (up to the cap); the cap is no error
    assert completion_room(path, texts, requested=1000, cap=2048) == 1000
    assert completion_room(path, texts, requested=max_pos - prompt, cap=512) == 512
    with pytest.raises(ContextLengthExceeded) as err:
        completion_room(path, texts, requested=max_pos - prompt + 1, cap=10**6,
                        param="max_completion_tokens")
    assert err.value.details["param"] == "max_completion_tokens"
    # a max_tokens is refused only when it certainly cannot fit (no markup reserve)
    near = ["vegetables" + " vegetables" * (max_pos - 6)]
    left = max_pos - sum(len(tokenizer.encode(t, add_special_tokens=False).ids) for t in near)
    assert 1 <= left < MARKUP_TOKENS * 2
    assert completion_room(path, near, requested=left, cap=10**6) == left
    # earlier turns never make a request fail (the worker keeps what fits, newest first);
    # without max_tokens the room left is what they will take, up to the history cap
    turn = "Yesterday we had pasta."
    kept = len(tokenizer.encode(turn, add_special_tokens=False).ids) + MARKUP_TOKENS
    assert completion_room(path, texts, requested=None, cap=10**6, history=[turn]) == \
        room - kept
    assert completion_room(path, texts, requested=None, cap=10**6, history=[turn] * 500,
                           history_cap=1024) == room - 1024
    endless = ["vegetables " * max_pos]
    assert completion_room(path, texts, requested=None, cap=10**6, history=endless) == room
    assert completion_room(path, texts, requested=100, cap=10**6, history=endless) == 100
    # without a readable model dir nothing is refused here (the worker checks exactly)
    assert completion_room("/nonexistent", texts, requested=None, cap=77) == 77
    assert completion_room("/nonexistent", texts, requested=10**6, cap=77) == 77


def test_sampling_defaults_are_openais():
    from tenants.v1.shapes import CompletionRequestSerializer, chat_params

    def params(**body):
        s = CompletionRequestSerializer(data={"model": "kvinject", "messages": [
            {"role": "user", "content": "hi"}], **body})
        assert s.is_valid(), s.errors
        return chat_params(s.validated_data, 8)

    assert (params()["temperature"], params()["top_p"]) == (1.0, 1.0)  # OpenAI: 1 and 1
    assert params(temperature=0)["temperature"] == 0  # greedy when asked
    assert params(temperature=0.7, top_p=0.9, seed=3)["seed"] == 3
    assert params(stop="END")["stop"] == ["END"] and params()["stop"] == []
    # no template renders tools: the worker is asked exactly what it is asked without them
    assert params(tools=[TOOL], tool_choice="auto", parallel_tool_calls=True) == params()
