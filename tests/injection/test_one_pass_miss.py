"""The one-pass miss (issue 19): a member segment missing from L1 and L2 is computed in the
request's own prefill, right before its prompt, and the segment's slice of that prefill
is stored. Demo model, a real TenantLRU, a real Redis L2 and the batch engine."""

from __future__ import annotations

import pytest
import torch

from injection.base import CacheKey, ExecutionRequest, Tier
from injection.engine.batch import BatchEngine
from injection.engine.executor import InjectionExecutor
from injection.kvcache.chain import member_hash, tenant_key
from injection.kvcache.lru import TenantLRU
from injection.kvcache.redis_tier import RedisKVTier
from injection.kvcache.signing import CacheKeySigner
from injection.metrics import Metrics

INSTR = "You are the assistant of Acme Foods. Answer briefly and kindly."
PREF = "I am a vegetarian and I live in Oslo."
MSGS = [{"role": "user", "content": "What should I cook tonight?"}]


@pytest.fixture
def l2(redis_client):
    tier = RedisKVTier(redis_client, CacheKeySigner("one-pass-secret-0123456789abcdef"),
                       ttl_seconds=60, async_writes=False)
    tier.evict("op")
    yield tier
    tier.evict("op")
    tier.close()


@pytest.fixture
def engine(adapter):
    eng = BatchEngine(adapter, max_batch=4)
    yield eng
    eng.close()


def make(adapter, engine, l2=None) -> InjectionExecutor:
    return InjectionExecutor(adapter, l1=TenantLRU(max_bytes=256 * 1024**2), l2=l2,
                             metrics=Metrics(), engine=engine, conversation_max_bytes=0)


def ask(ex, user="u1", *, instructions=INSTR, pref=PREF, n=12, **kw):
    return ex.execute(ExecutionRequest("op", user, MSGS, pref, instructions=instructions,
                                       max_new_tokens=n, **kw))


def reference(adapter, context, n=12) -> str:
    """Greedy reply with ``context`` as a plain system message (nothing injected)."""
    ids = adapter.tokenizer(adapter.render_chat([{"role": "system", "content": context},
                                                 *MSGS]))["input_ids"]
    out = adapter.model.generate(input_ids=torch.tensor([ids]), max_new_tokens=n,
                                 do_sample=False)[0, len(ids):]
    return adapter.tokenizer.decode(out, skip_special_tokens=True)


def member_key(adapter, instructions=INSTR, pref=PREF):
    context = instructions + "\n\n" + pref
    parts = adapter.split_prompt(context, MSGS)
    split = adapter.split_segment(parts.segment, context, instructions)
    tkey = tenant_key("op", split.tenant_text, adapter.fingerprint)
    return split, tkey, CacheKey("op", "u1", member_hash(tkey, split.member_text),
                                 adapter.fingerprint)


def test_a_member_miss_is_one_prefill_and_stores_the_exact_segment(adapter, engine, l2):
    ex = make(adapter, engine, l2)
    ask(ex, "u0")  # the tenant segment is warm
    computes = ex.metrics.get("computes")
    cold = ask(ex)
    assert cold.tier is Tier.COMPUTE and cold.extra["segments"] == {
        "tenant": "l1", "member": "compute"}
    assert ex.metrics.get("computes") == computes + 1  # the member's, once
    assert ex.metrics.get("computes_one_pass") == 2  # u0's and u1's members
    assert engine.counters["segment_captures"] == 2
    # the stored slice is the member's K/V: the continuation of the tenant segment
    split, tkey, mkey = member_key(adapter)
    stored = ex.l1.get(mkey)
    assert stored.token_ids == split.member_ids and stored.keys.is_cpu
    expect = adapter.compute_kv_ids(split.member_ids, parent=ex.l1.get(tkey))
    assert torch.allclose(stored.keys, expect.keys, atol=1e-5)
    assert torch.allclose(stored.values, expect.values, atol=1e-5)
    assert l2.get(mkey).token_ids == split.member_ids  # and in Redis
    # the reply is the system message's, cold and warm; the warm one reads it all
    warm = ask(ex)
    assert cold.text == warm.text == reference(adapter, INSTR + "\n\n" + PREF)
    assert warm.tier is Tier.L1 and warm.cached_tokens == warm.kv_tokens == cold.kv_tokens
    assert cold.kv_tokens == len(split.tenant_ids + split.member_ids)
    assert cold.cached_tokens == len(split.tenant_ids)  # only what came from cache
    assert cold.prompt_tokens == warm.prompt_tokens
    assert ex.metrics.get("computes") == computes + 1


def test_a_whole_turn_without_a_tenant_split_is_one_pass_too(adapter, engine):
    ex = make(adapter, engine)
    cold = ask(ex, instructions="")
    warm = ask(ex, instructions="")
    assert cold.tier is Tier.COMPUTE and warm.tier is Tier.L1
    assert cold.text == warm.text == reference(adapter, PREF)
    assert ex.metrics.get("computes_one_pass") == 1 and ex.metrics.get("computes") == 1
    assert cold.kv_tokens == warm.kv_tokens == warm.cached_tokens
    assert cold.kv_bytes_cpu == warm.kv_bytes_cpu


def test_scaled_members_are_computed_apart(adapter, engine):
    ex = make(adapter, engine)
    half = ask(ex, alpha=0.5)  # values scaled before the prompt reads them: two passes
    assert half.tier is Tier.COMPUTE and ex.metrics.get("computes_one_pass") == 0
    assert engine.counters["segment_captures"] == 0


def test_a_failing_capture_costs_the_entry_never_the_reply(adapter, engine):
    ids = adapter.renderer.encode(PREF, first=True)
    prompt = adapter.renderer.encode(adapter.split_prompt(PREF, MSGS).prompt, first=False)

    def broken(kv):
        raise RuntimeError("store down")

    out = engine.run(None, 1.0, ids + prompt, 8, capture=broken, capture_tokens=len(ids))
    plain = engine.run(None, 1.0, ids + prompt, 8)
    assert out.token_ids == plain.token_ids
    assert engine.counters["capture_failures"] == 1
    got = []
    engine.run(None, 1.0, ids + prompt, 8, capture=got.append, capture_tokens=len(ids))
    assert got[0].token_ids == tuple(ids)
    assert torch.allclose(got[0].keys, adapter.compute_kv(PREF).keys, atol=1e-5)


def test_the_segment_is_stored_after_the_first_token_and_before_the_reply(adapter, engine):
    """Storing the captured segment (L1, the Redis queue) never delays a first token; a
    reply of one token still finds it stored when its caller wakes."""
    ids = adapter.renderer.encode(PREF, first=True)
    prompt = adapter.renderer.encode(adapter.split_prompt(PREF, MSGS).prompt, first=False)

    def order(tokens: int) -> list[str]:
        events: list[tuple[str, object]] = []
        out = engine.run(None, 1.0, ids + prompt, tokens, capture_tokens=len(ids),
                         capture=lambda kv: events.append(("stored", kv.token_ids)),
                         on_text=lambda piece: events.append(("text", piece)))
        events.append(("returned", len(out.token_ids)))
        assert dict(events)["stored"] == tuple(ids) and dict(events)["returned"] == tokens
        return [k for k, _ in events]

    many, one = order(8), order(1)
    assert many.count("stored") == 1 and many[0] == "text" and many[-1] == "returned"
    assert one.count("stored") == 1 and one.index("stored") < one.index("returned")


def test_an_anonymous_member_is_computed_in_one_pass_and_never_stored(adapter, engine):
    ex = make(adapter, engine)
    first = ask(ex, "")
    assert first.tier is Tier.COMPUTE and ex.metrics.get("computes_one_pass") == 1
    per = ex.l1.stats()["per_tenant"]["op"]
    assert per["entries"] == 1  # the tenant segment only
