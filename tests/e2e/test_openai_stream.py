"""stream=True through the real path: uvicorn (ASGI) <- Redis stream <- real Celery worker.

Driven with the official openai SDK. The replies are long enough (1800 tokens of the demo
model, a few seconds) that "the first piece arrives before the reply is stored" and "a
client that leaves stops the worker early" are observable without timing thresholds.
"""

from __future__ import annotations

import urllib.request

import openai
import pytest

from tenants.models import AuditEvent, AuditLog, ChatExchange, Conversation, Message
from tests.e2e.conftest import ASGI_METRICS_TOKEN, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
LONG = 1800


@pytest.fixture
def client(asgi_server, member_key):
    return openai.OpenAI(base_url=f"{asgi_server.url}/v1", api_key=member_key[1],
                         max_retries=0, timeout=180)


def stream(client, max_tokens, **kw):
    return client.chat.completions.create(
        model="kvinject", messages=[{"role": "user", "content": "What should I cook?"}],
        max_tokens=max_tokens, temperature=0, stream=True, **kw)


def test_chunks_arrive_while_generating_and_concatenate_to_the_stored_reply(
    client, gpu_worker, member_key
):
    member, _ = member_key
    chunks = stream(client, LONG, stream_options={"include_usage": True})
    pieces, stored_when_first = [], None
    for chunk in chunks:
        assert chunk.object == "chat.completion.chunk"
        if chunk.choices and chunk.choices[0].delta.content:
            if stored_when_first is None:  # the worker is still generating
                stored_when_first = AuditLog.objects.filter(
                    tenant=member.tenant, event_type=AuditEvent.CHAT_REQUEST).exists()
            pieces.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
            conv = chunk.model_extra["kvinject"]["conversation"]
    assert stored_when_first is False and len(pieces) > 10
    assert chunk.choices == [] and chunk.usage.completion_tokens >= 1  # include_usage
    assert chunk.usage.total_tokens == chunk.usage.prompt_tokens + chunk.usage.completion_tokens
    reply = Message.objects.get(conversation_id=conv, role="assistant").content
    assert "".join(pieces) == reply
    assert (finish == "length") == (chunk.usage.completion_tokens == LONG)
    assert Conversation.objects.get(pk=conv).member == member


def test_stream_matches_the_non_streamed_reply_and_honours_stop(client, gpu_worker):
    whole = client.chat.completions.create(
        model="kvinject", messages=[{"role": "user", "content": "What should I cook?"}],
        max_tokens=24, temperature=0).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in stream(client, 24)
                       if c.choices)
    assert streamed == whole
    stop = whole[len(whole) // 2:][:3]
    cut = [c.choices[0] for c in stream(client, 24, stop=stop) if c.choices]
    assert "".join(c.delta.content or "" for c in cut) == whole[:whole.find(stop)]
    assert cut[-1].finish_reason == "stop"


def test_client_disconnect_cancels_the_generation_on_the_worker(
    client, gpu_worker, member_key, asgi_server
):
    member, _ = member_key
    before = disconnects(asgi_server)  # the server is shared: other tests disconnect too
    response = stream(client, LONG)
    for chunk in response:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    request_id = chunk.id.removeprefix("chatcmpl-")
    response.close()  # the client goes away mid-reply

    row = wait_for(lambda: AuditLog.objects.filter(
        tenant=member.tenant, event_type=AuditEvent.CHAT_CANCELLED).first(), 60,
        "the worker's cancel audit row")
    assert row.data["request_id"] == request_id
    assert 1 <= row.data["completion_tokens"] < LONG // 2  # stopped early, not at the end
    assert not Message.objects.filter(tenant=member.tenant).exists()  # nothing stored
    assert ChatExchange.objects.get(request_id=request_id).state == "abandoned"
    # the worker is free again: the next request is answered
    again = "".join(c.choices[0].delta.content or "" for c in stream(client, 4) if c.choices)
    assert isinstance(again, str)
    wait_for(lambda: disconnects(asgi_server) == before + 1, 10, "the web's disconnect counter")


def disconnects(server) -> float:
    """The web's count of streams whose client went away (0 before the first)."""
    for line in web_metrics(server).splitlines():
        if line.startswith('kvi_chat_streams_total{outcome="disconnected"}'):
            return float(line.split()[-1])
    return 0.0


def web_metrics(server) -> str:
    req = urllib.request.Request(f"{server.url}/metrics")
    req.add_header("Authorization", f"Bearer {ASGI_METRICS_TOKEN}")
    return urllib.request.urlopen(req).read().decode()


def test_stream_errors_before_the_first_byte_are_openai_errors(client):
    with pytest.raises(openai.BadRequestError) as err:
        stream(client, 4, n=2)
    assert err.value.param == "n"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", stream=True,
                                       messages=[{"role": "user", "content": "hi"}])


def test_a_lost_piece_is_made_good_from_the_stored_reply(gpu_worker, member_key):
    """The stream is a fast path: with a piece missing, the relay stops relaying at the gap
    and sends the rest of the stored reply, so the client still gets exactly the reply."""
    import asyncio
    import uuid

    import redis
    from django.conf import settings
    from prometheus_client import REGISTRY

    from gpu_worker.channels import streams
    from gpu_worker.client import relay

    member, _ = member_key
    gaps = lambda: REGISTRY.get_sample_value("kvi_chat_streams_total", {"outcome": "gap"}) or 0  # noqa: E731
    before = gaps()
    started = relay.start_chat(member, None, "What should I cook?", {"max_new_tokens": LONG},
                               None, uuid.uuid4().hex)
    conn = redis.Redis.from_url(settings.REDIS_URL)
    key = streams.stream_key(started.request_id)
    entries = wait_for(lambda: len(conn.xrange(key)) >= 3 and conn.xrange(key), 60, "pieces")
    conn.xdel(key, entries[1][0])  # lost on the way

    async def collect():
        return [event async for event in relay.events(member, started)]

    events = asyncio.run(collect())
    kinds = [k for k, _ in events]
    assert kinds[-1] == "done" and gaps() == before + 1
    reply = events[-1][1]["reply"]
    assert "".join(v for k, v in events if k == "delta") == reply
    assert Message.objects.get(conversation_id=events[-1][1]["conversation"],
                               role="assistant").content == reply


def test_an_error_after_the_first_byte_is_an_openai_error_event(
    client, gpu_worker, demo_model_path
):
    """The web's context check is a lower bound (no template markup): a message just below
    it is refused by the worker after the stream began, as an SSE error event."""
    from tenants.api.context_limits import model_limits

    tokenizer, max_pos = model_limits(str(demo_model_path))
    fixed = len(tokenizer.encode("I am vegetarian.", add_special_tokens=False).ids)
    message = "vegetables"
    while fixed + 8 + len(tokenizer.encode(message + " vegetables").ids) <= max_pos:
        message += " vegetables"
    response = client.chat.completions.create(
        model="kvinject", messages=[{"role": "user", "content": message}], max_tokens=8,
        stream=True)
    with pytest.raises(openai.APIError) as err:
        list(response)
    assert err.value.body["code"] == "context_length_exceeded", err.value.body
    assert err.value.body["type"] == "invalid_request_error"
    assert not Message.objects.exists()


def test_idempotency_key_replays_across_streamed_and_plain_requests(client, gpu_worker):
    ask = dict(model="kvinject", max_tokens=8, temperature=0,
               messages=[{"role": "user", "content": "What should I cook?"}],
               extra_headers={"Idempotency-Key": "order-42"})
    streamed = "".join(c.choices[0].delta.content or ""
                       for c in client.chat.completions.create(stream=True, **ask) if c.choices)
    raw = client.chat.completions.with_raw_response.create(**ask)
    assert raw.headers["Idempotent-Replayed"] == "true"
    plain = raw.parse()
    assert plain.choices[0].message.content == streamed
    raw = client.chat.completions.with_raw_response.create(stream=True, **ask)
    assert raw.headers["Idempotent-Replayed"] == "true"
    again = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert again == streamed
    assert Conversation.objects.count() == 1  # generated and stored once


def test_open_streams_do_not_hold_a_thread_each(client, gpu_worker, asgi_server):
    """Streams are relayed from uvicorn's event loop (tenants.api.streaming), not by a thread
    per request: six open streams add no thread per stream to the web process."""
    import psutil

    server = psutil.Process(asgi_server.proc.pid)
    client.models.list()  # warm: connections and pools made
    before = server.num_threads()
    opened = [stream(client, LONG) for _ in range(6)]  # all open (queued on one worker)
    first = next(c for c in opened[0] if c.choices and c.choices[0].delta.content)
    during = server.num_threads()
    for s in opened:
        s.close()
    assert first.choices[0].delta.content and during <= before + 2, (before, during)
    # the worker cancels the six one by one, writing usage and audit rows: let it finish
    # before the test database is flushed (a TRUNCATE racing those writes can deadlock)
    wait_for(lambda: worker_idle(gpu_worker.hostname), 180, "the cancelled streams to end")


def worker_idle(hostname: str) -> bool:
    """Nothing queued for, or running on, the worker, and no chat claim still pending."""
    from gpu_worker.channels.control import redis_client
    from gpu_worker.routing import registry

    r = redis_client()
    names = [q + sub for q in (registry.SHARED_QUEUE, registry.worker_queue(hostname))
             for sub in ("", *(f"{registry.PRIORITY_SEP}{p}" for p in registry.PRIORITY_STEPS))]
    queued = sum(r.llen(name) for name in names)  # kombu keeps a list per priority
    running = r.hlen(registry.inflight_key(hostname))
    return queued == 0 and running == 0 and not ChatExchange.objects.filter(
        state="pending").exists()
