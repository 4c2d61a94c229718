"""A full cache Redis never stops chat (fault matrix: "cache Redis at maxmemory").

The K/V cache has a Redis of its own (``KV_CACHE_REDIS_URL``), so the broker and results
are never refused because of it. Here the cache is a throwaway Redis driven at and over
its ``maxmemory`` (noeviction, the documented policy: a write that still fits pushes it
over, and it stays over until keys expire). Members chat through ``/api/chat`` and ``/v1``
(plain, streamed, a conversation) with a real worker: every chat succeeds, cache writes
degrade to refusals (misses later), ``kvcache stats`` and the worker's ``/metrics`` show
them, and nothing another tenant had in the cache is evicted to make room.
"""

from __future__ import annotations

import json
import urllib.request
from io import StringIO

import openai
import pytest
from django.core.management import call_command

from gpu_worker.channels import kvstore
from tenants import actions
from tests.conftest import redis_url_with_db
from tests.e2e.conftest import only_these_consume, worker_stats
from tests.e2e.test_chat_e2e import post_chat
from tests.throwaway import ThrowawayRedis
from tests.workers import free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
QUESTIONS = ["What should I cook tonight?", "And for dessert?", "Which drink goes with it?"]


@pytest.fixture
def cache_redis(tmp_path, settings, start_workers):
    """A throwaway cache Redis, this test's worker on it (with a metrics server), and the
    web (this process) too; the broker stays the session's Redis."""
    rd = ThrowawayRedis(tmp_path / "cache-redis").start()
    settings.KV_CACHE_REDIS_URL = redis_url_with_db(rd.url, settings.TEST_REDIS_DB)
    port = free_port()
    (worker,) = start_workers("rfull", pool="threads", KV_CACHE_REDIS_URL=rd.url,
                              WORKER_METRICS_PORT=port, WORKER_METRICS_ADDR="127.0.0.1")
    try:
        with only_these_consume([worker]):
            yield rd, worker, port
    finally:
        worker.stop()
        rd.kill()


def converse(base: str, key: str, n: int = 3, worker=None) -> list[dict]:
    bodies, conversation = [], None
    for q in QUESTIONS[:n]:
        status, body = post_chat(base, key, {"message": q, "max_new_tokens": 4,
                                             **({"conversation": conversation}
                                                if conversation else {})})
        assert status == 200, (body, worker.log_tail(80) if worker is not None else "")
        bodies.append(body)
        conversation = body["conversation"]
    return bodies


def l2_of(tenant) -> dict:
    tid = str(tenant.pk)
    return kvstore.l2_tier().stats(scan=True, tenants=[tid])["per_tenant"][tid]


def fill_up(client) -> None:
    """maxmemory some MB above what Redis uses, then junk (with a TTL, as cache entries
    have) until a write is refused: Redis is at its maxmemory. Then, as after a write that
    still fitted, over it, by more than its clients' buffers move (they count, and swing by
    a few hundred KB as big K/V values come and go); it stays over until keys expire."""
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 4 * 1024**2)
    for i in range(10_000):
        try:
            client.set(f"junk:{i}", b"x" * 65536, ex=3600)
        except Exception as exc:  # redis' OutOfMemoryError
            assert "maxmemory" in str(exc)
            break
    else:
        raise AssertionError("Redis never filled up")
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 1024**2)


def test_a_full_cache_redis_refuses_cache_writes_and_every_chat_succeeds(live_server,
                                                                         cache_redis):
    rd, worker, metrics_port = cache_redis
    keep = actions.do_create_tenant("keep")
    carol = actions.do_add_member(keep, "carol", preference="I love spicy food.")
    converse(live_server.url, actions.do_create_api_token(carol), worker=worker)  # turn 3 keeps a link
    wait_for(lambda: kvstore.l2_tier().links.usage(str(keep.pk))["entries"] == 1, 30,
             "carol's conversation link in the cache Redis")
    before = l2_of(keep)
    assert before["entries"] == 2  # the member segment and the link (no instructions)

    fill_up(rd.client())
    shop = actions.do_create_tenant("shop")
    actions.do_set_tenant_instructions(shop, "You are Shop's assistant. Be brief.")
    alice = actions.do_add_member(shop, "alice", preference="I am vegetarian.")
    bodies = converse(live_server.url, actions.do_create_api_token(alice), worker=worker)
    assert [b["cache"]["tier"] for b in bodies] == ["compute", "l1", "l1"]  # never from L2
    bob = actions.do_add_member(shop, "bob", preference="I live in Oslo.")
    v1 = openai.OpenAI(base_url=f"{live_server.url}/v1", max_retries=0, timeout=180,
                       api_key=actions.do_create_api_token(bob))
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    for _ in range(3):  # a /v1 conversation: its third turn's link is refused too
        reply = v1.chat.completions.create(model="kvinject", max_tokens=4, messages=messages)
        assert reply.choices[0].message.content is not None
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": QUESTIONS[1]}]
    streamed = list(v1.chat.completions.create(model="kvinject", max_tokens=4, stream=True,
                                               messages=[{"role": "user", "content": "Hi"}]))
    assert streamed[-1].choices[0].finish_reason in ("stop", "length")

    # nothing of the other tenant was evicted to make room; shop's writes were refused
    memory = rd.client().info("memory")
    memory = {k: memory[k] for k in ("used_memory", "maxmemory")}
    assert memory["used_memory"] > memory["maxmemory"]
    assert l2_of(keep) == before
    wait_for(lambda: worker_stats(worker.hostname)["stats"]["l2"]["inflight"] == 0, 30,
             "the worker's L2 writer to finish")
    out = StringIO()
    call_command("kvcache", "stats", "--json", stdout=out)
    report = json.loads(out.getvalue())
    refused = report["tenants"]["shop"]["l2"]["refused_writes"]
    # the tenant segment, two members' segments and alice's link at least; nothing stored
    assert refused >= 4 and l2_of(shop)["entries"] == 0, refused
    assert report["tenants"]["shop"]["l2"]["errors"] == 0
    assert report["tenants"]["keep"]["l2"]["refused_writes"] == 0
    assert report["kv"]["bytes_per_token"] > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as r:
        text = r.read().decode()
    assert f"kvi_l2_refused_writes_total {float(refused)}" in text

    # once Redis has room again, writes resume by themselves
    rd.client().config_set("maxmemory", 0)
    converse(live_server.url, actions.do_create_api_token(
        actions.do_add_member(shop, "dan", preference="I am allergic to nuts.")), n=1)
    wait_for(lambda: l2_of(shop)["entries"] >= 1, 30, "shop's K/V in the cache Redis")
