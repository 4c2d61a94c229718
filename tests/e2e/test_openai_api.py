"""/v1 driven by the official openai SDK: live HTTP server -> real Celery worker -> Postgres."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from gpu_worker.client.dispatch import wait_chat
from tenants.models import AuditEvent, AuditLog, Conversation

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def client(live_server, member_key):
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=member_key[1],
                         max_retries=0, timeout=180)


def ask(client, text="What should I cook?", **kw):
    return client.chat.completions.create(
        model="kvinject", messages=[{"role": "user", "content": text}], **kw)


def test_completion_is_stored_and_audited_like_api_chat(client, gpu_worker, member_key):
    member, _ = member_key
    raw = client.chat.completions.with_raw_response.create(
        model="kvinject", max_tokens=6, user="end-user-42", temperature=0,
        messages=[{"role": "system", "content": "Answer briefly."},
                  {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": [{"type": "text", "text": "What should I cook?"}]}])
    r = raw.parse()
    assert r.object == "chat.completion" and r.model == client.models.list().data[0].id
    choice = r.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert (choice.finish_reason == "length") == (r.usage.completion_tokens == 6)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    request_id = raw.headers["x-request-id"]
    assert r.id == f"chatcmpl-{request_id}"
    assert int(raw.headers["x-ratelimit-remaining-requests"]) >= 0
    assert raw.headers["x-ratelimit-limit-requests"] == "30"

    ext = r.model_extra["kvinject"]
    conv = Conversation.objects.get(pk=ext["conversation"], tenant=member.tenant, member=member)
    stored = [(m.role, m.content) for m in conv.messages.order_by("id")]
    assert stored == [("system", "Answer briefly."), ("user", "Hi"), ("assistant", "Hello!"),
                      ("user", "What should I cook?"), ("assistant", choice.message.content)]
    row = AuditLog.objects.get(tenant=member.tenant, event_type=AuditEvent.CHAT_REQUEST)
    assert row.data["request_id"] == request_id and row.data["end_user"] == "end-user-42"
    assert row.data["finish_reason"] == choice.finish_reason
    assert ext["cache"]["history_messages"] == 2  # the request's turns were the history


def test_stop_sequence_ends_the_reply_before_it(client, gpu_worker):
    full = ask(client, max_tokens=24, temperature=0).choices[0]
    assert full.finish_reason == "length", full
    text = full.message.content
    stop = text[len(text) // 2:][:3]
    cut = ask(client, max_tokens=24, temperature=0, stop=[stop, "never-appears"]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.message.content == text[:text.find(stop)]


def test_persisting_into_a_conversation_through_the_extension(client, gpu_worker):
    first = ask(client, max_tokens=3)
    conv = first.model_extra["kvinject"]["conversation"]
    second = ask(client, "And tomorrow?", max_tokens=3, extra_body={"kvinject": {
        "conversation": conv, "alpha": 0.5}})
    assert second.model_extra["kvinject"]["conversation"] == conv
    assert second.model_extra["kvinject"]["cache"]["alpha_effective"] == 0.5
    assert Conversation.objects.get(pk=conv).messages.count() == 4


def test_models_and_openai_errors(client, live_server, member_key, settings, demo_model_path):
    settings.MODEL_PATH = str(demo_model_path)  # the web reads its context length
    ids = [m.id for m in client.models.list().data]
    assert "kvinject" in ids and len(ids) == 2
    cases = [
        (openai.NotFoundError, dict(model="gpt-4o"), "model_not_found", "model"),
        (openai.BadRequestError, dict(n=2), "invalid_input", "n"),
        (openai.BadRequestError, dict(extra_body={"foo": 1}), "invalid_input", "foo"),
        (openai.BadRequestError, dict(presence_penalty=1.0), "invalid_input", "presence_penalty"),
        (openai.BadRequestError, dict(max_tokens=10**6), "context_length_exceeded",
         "max_tokens"),
        (openai.BadRequestError, dict(tools=[{"type": "function", "function": {"name": "f"}}],
                                      tool_choice="required"), "invalid_input", "tool_choice"),
        (openai.BadRequestError, dict(logprobs=True), "invalid_input", "logprobs"),
        (openai.NotFoundError, dict(extra_body={"kvinject": {"conversation": 999999}}),
         "not_found", None),
    ]
    for exc_type, kw, code, param in cases:
        kw.setdefault("model", "kvinject")
        with pytest.raises(exc_type) as err:
            client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **kw)
        assert (err.value.code, err.value.param) == (code, param), err.value.body
        assert err.value.type in ("invalid_request_error", "not_found_error")
    bad = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="kvi_wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        bad.models.list()
    assert err.value.type == "authentication_error"
    assert not AuditLog.objects.filter(event_type=AuditEvent.CHAT_REQUEST).exists()


def test_token_scheme_and_unknown_v1_urls_answer_openai_json(live_server, member_key):
    req = urllib.request.Request(f"{live_server.url}/v1/models")
    req.add_header("Authorization", f"Token {member_key[1]}")
    with urllib.request.urlopen(req) as resp:
        assert json.loads(resp.read())["object"] == "list"
        assert len(resp.headers["x-request-id"]) == 32
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{live_server.url}/v1/nope")
    body = json.loads(err.value.read())["error"]
    assert err.value.code == 404 and body["type"] == "not_found_error" and "param" in body


def test_rate_limit_and_timeout_are_openai_errors(client, gpu_worker, settings, member_key):
    from gpu_worker.routing import registry
    from tenants.api.throttling import KEY_PREFIX

    # member ids restart with each run's database, Redis dbs are reused: a run within the
    # last minute may have left this id's counters behind
    redis_client = registry.redis_client()
    for name in redis_client.scan_iter(f"{KEY_PREFIX}:chat:m:{member_key[0].pk}:*"):
        redis_client.delete(name)
    settings.CHAT_RATE_PER_MEMBER = "2/min"
    with pytest.raises(openai.BadRequestError):
        ask(client, n=3)  # counted: the limit applies before validation
    from tests.e2e.conftest import only_these_consume
    from tests.workers import wait_for

    # no worker takes the chat, so the web's wait certainly runs out (not a race with a
    # fast worker); the abandoned claim makes a worker refuse it later, unstarted
    settings.CHAT_RESULT_TIMEOUT = 0.3
    settings.WORKER_AFFINITY_ENABLED = False  # the shared queue, which nobody consumes
    with only_these_consume([]), pytest.raises(openai.InternalServerError) as err:
        ask(client, max_tokens=256)  # the web stops waiting
    wait_for(lambda: registry.redis_client().llen(registry.SHARED_QUEUE) == 0, 60,
             "a worker to take (and refuse) the abandoned chat")
    assert err.value.status_code == 503 and err.value.type == "service_unavailable_error"
    assert err.value.code == "worker_unavailable" and err.value.response.headers["Retry-After"]
    with pytest.raises(openai.RateLimitError) as err:
        ask(client)
    headers = err.value.response.headers
    assert err.value.type == "rate_limit_error" and int(headers["Retry-After"]) >= 1
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-limit-requests"] == "2"


def test_overload_is_refused_before_anything_is_claimed(client, gpu_worker, member_key,
                                                        settings):
    from tenants.models import ChatExchange
    from tests.e2e.conftest import only_these_consume, send_chat

    member, _ = member_key
    settings.CHAT_MAX_QUEUED = 1
    # the shared queue, which nobody consumes for now (an affinity key left in this Redis db
    # by an earlier run for the same member id would route to a live worker's own queue)
    settings.WORKER_AFFINITY_ENABLED = False
    with only_these_consume([]):
        waiting = send_chat(member, max_new_tokens=2)  # one request queued
        claims = ChatExchange.objects.count()
        with pytest.raises(openai.InternalServerError) as err:
            ask(client)
        assert err.value.status_code == 503 and err.value.code == "overloaded"
        assert err.value.type == "service_unavailable_error"
        assert err.value.response.headers["Retry-After"] == "2"
        assert ChatExchange.objects.count() == claims  # nothing claimed for the refusal
    assert wait_chat(waiting, 120)["reply"] is not None  # the queued one is served


def test_streaming_under_wsgi_falls_back_to_django_streaming(client, gpu_worker):
    """No ASGI relay here (the live server is WSGI): Django streams the same events."""
    streamed = "".join(c.choices[0].delta.content or ""
                       for c in ask(client, max_tokens=6, temperature=0, stream=True)
                       if c.choices)
    assert streamed == ask(client, max_tokens=6, temperature=0).choices[0].message.content
