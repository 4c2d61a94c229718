"""The injected turn as a chain of segments (tenant -> member) on the demo model, a real
TenantLRU and a real Redis L2: exactness, sharing, isolation, alpha, edits, eviction."""

from __future__ import annotations

import pytest
import torch

from injection.base import CacheKey, ExecutionRequest, Tier
from injection.engine.executor import InjectionExecutor
from injection.kvcache.chain import TENANT_USER, member_hash, tenant_key
from injection.kvcache.lru import TenantLRU
from injection.kvcache.redis_tier import RedisKVTier
from injection.kvcache.signing import CacheKeySigner
from injection.metrics import Metrics
from injection.prompting.output_filter import strip_control_chars

INSTR = "You are the assistant of Acme Foods. Answer briefly and kindly."
PREFS = {"u1": "I am a vegetarian.", "u2": "I live in Oslo and love skiing.", "u3": ""}
MSGS = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "What should I cook tonight?"}]


@pytest.fixture
def l2(redis_client):
    tier = RedisKVTier(redis_client, CacheKeySigner("chain-secret-0123456789abcdef"),
                       ttl_seconds=60, async_writes=False)
    yield tier
    tier.close()


def make(adapter, l2=None) -> InjectionExecutor:
    return InjectionExecutor(adapter, l1=TenantLRU(max_bytes=256 * 1024**2), l2=l2,
                             metrics=Metrics())


def ask(ex, user, *, tenant="t1", instructions=INSTR, pref=None, n=10, **kw):
    pref = PREFS[user] if pref is None else pref
    return ex.execute(ExecutionRequest(tenant, user, MSGS, pref, instructions=instructions,
                                       max_new_tokens=n, **kw))


def reference(adapter, context, n=10) -> str:
    """Greedy reply with ``context`` as a plain system message (nothing injected)."""
    ids = adapter.tokenizer(adapter.render_chat([{"role": "system", "content": context},
                                                 *MSGS]))["input_ids"]
    out = adapter.model.generate(input_ids=torch.tensor([ids]), max_new_tokens=n,
                                 do_sample=False)[0, len(ids):]
    return adapter.tokenizer.decode(out, skip_special_tokens=True)


def split_of(adapter, context):
    parts = adapter.split_prompt(context, MSGS)
    return parts, adapter.split_segment(parts.segment, context, INSTR)


def test_split_is_token_exact_and_the_tenant_part_is_the_same_for_every_member(adapter):
    ids = {}
    for user, pref in PREFS.items():
        context = "\n\n".join(p for p in (INSTR, pref) if p)
        parts, split = split_of(adapter, context)
        assert split is not None and split.tenant_text + split.member_text == parts.segment
        assert split.tenant_ids + split.member_ids == tuple(
            adapter.renderer.encode(parts.segment, first=True))
        ids[user] = split.tenant_ids
        if pref:
            assert pref in split.member_text and INSTR not in split.member_text
    assert ids["u1"] == ids["u2"] == ids["u3"]
    # instructions that do not open the turn: no split, one segment
    parts = adapter.split_prompt("Other text first\n\n" + INSTR, MSGS)
    assert adapter.split_segment(parts.segment, "Other text first\n\n" + INSTR, INSTR) is None


def test_member_segment_continues_the_tenant_kv_exactly(adapter):
    parts, split = split_of(adapter, INSTR + "\n\n" + PREFS["u1"])
    tenant = adapter.compute_kv_ids(split.tenant_ids)
    member = adapter.compute_kv_ids(split.member_ids, parent=tenant)
    whole = adapter.compute_kv(parts.segment)
    assert member.num_tokens == len(split.member_ids)  # holds only the tokens it adds
    assert torch.allclose(torch.cat([tenant.keys, member.keys], 2), whole.keys, atol=1e-5)
    assert torch.allclose(torch.cat([tenant.values, member.values], 2), whole.values, atol=1e-5)


@pytest.mark.parametrize("user", ["u1", "u2", "u3"])
def test_alpha_one_equals_the_system_message_cold_and_cached(adapter, user):
    ex = make(adapter)
    if user != "u1":
        ask(ex, "u1")  # the tenant segment is then warm
    cold, warm = ask(ex, user), ask(ex, user)
    context = "\n\n".join(p for p in (INSTR, PREFS[user]) if p)
    assert cold.text == warm.text == reference(adapter, context)
    assert cold.injection_mode == "system" and warm.tier is Tier.L1
    assert cold.extra["segments"]["tenant"] == ("compute" if user == "u1" else "l1")


def test_members_share_one_tenant_segment_and_pay_only_their_own(adapter):
    ex = make(adapter)
    first = ask(ex, "u1")
    _, split = split_of(adapter, INSTR + "\n\n" + PREFS["u2"])
    second = ask(ex, "u2")
    nobody = ask(ex, "u3")  # no preference: the tenant segment still comes from cache
    assert first.cached_tokens == 0 and first.extra["segments"] == {
        "tenant": "compute", "member": "compute"}
    assert second.extra["segments"] == {"tenant": "l1", "member": "compute"}
    assert second.cached_tokens == len(split.tenant_ids) == nobody.cached_tokens
    assert second.prompt_tokens == second.kv_tokens + adapter.count_tokens(
        adapter.split_prompt(INSTR + "\n\n" + PREFS["u2"], MSGS).prompt)
    assert nobody.alpha_effective == 0.0 and nobody.extra["preference_applied"] is False
    per = ex.l1.stats()["per_tenant"]["t1"]
    assert per["entries"] == 4  # one tenant segment + three member segments
    tkey = tenant_key("t1", split.tenant_text, adapter.fingerprint)
    tkv = ex.l1.get(tkey)
    mkv = ex.l1.get(CacheKey("t1", "u2", member_hash(tkey, split.member_text),
                             adapter.fingerprint))
    assert tkv.token_ids == split.tenant_ids and mkv.token_ids == split.member_ids
    assert ex.metrics.get("tenant_l1_hits") == 2 and ex.metrics.get("tenant_l1_misses") == 1
    # a warm member reads everything from cache
    again = ask(ex, "u2")
    assert again.cached_tokens == again.kv_tokens == len(split.tenant_ids + split.member_ids)


def test_identical_instructions_are_never_shared_across_tenants(adapter):
    ex = make(adapter)
    a, b = ask(ex, "u1", tenant="ta"), ask(ex, "u1", tenant="tb")
    assert a.extra["segments"]["tenant"] == b.extra["segments"]["tenant"] == "compute"
    assert a.text == b.text
    stats = ex.l1.stats()["per_tenant"]
    assert stats["ta"]["entries"] == stats["tb"]["entries"] == 2


def test_alpha_scales_only_the_member_values(adapter):
    ex = make(adapter)
    parts, split = split_of(adapter, INSTR + "\n\n" + PREFS["u1"])
    full = ex.chain.get("t1", "u1", parts.segment, split, 1.0).kv
    half = ex.chain.get("t1", "u1", parts.segment, split, 0.5).kv
    n = len(split.tenant_ids)
    assert torch.equal(half.keys, full.keys)  # keys never
    assert torch.equal(half.values[:, :, :n], full.values[:, :, :n])  # the tenant's never
    assert torch.equal(half.values[:, :, n:], full.values[:, :, n:] * 0.5)
    res = ask(ex, "u1", alpha=0.5)
    want = strip_control_chars(adapter.generate(parts.prompt, half, 1.0, 10).text)[0]
    assert res.alpha_effective == 0.5 and res.text == want


def test_edits_recompute_only_what_changed(adapter):
    ex = make(adapter)
    for user in ("u1", "u2"):
        ask(ex, user)
    computes = ex.metrics.get("computes")
    ask(ex, "u1", pref="I eat fish.")  # a preference edit: one member segment
    assert ex.metrics.get("computes") == computes + 1
    edited = INSTR + " Mention our shop."
    r1 = ask(ex, "u1", instructions=edited)  # the tenant segment once, then this member
    r2 = ask(ex, "u2", instructions=edited)  # only its own segment
    assert r1.extra["segments"] == {"tenant": "compute", "member": "compute"}
    assert r2.extra["segments"] == {"tenant": "l1", "member": "compute"}
    assert ex.metrics.get("computes") == computes + 4
    assert r2.text == reference(adapter, edited + "\n\n" + PREFS["u2"])


def test_eviction_scopes_redis_round_trip(adapter, l2):
    ex = make(adapter, l2)
    for user in ("u1", "u2"):
        ask(ex, user)
    ask(ex, "u1", tenant="other")
    other = make(adapter, l2)  # another worker: empty L1, the same Redis
    res = ask(other, "u1")
    assert res.extra["segments"] == {"tenant": "l2", "member": "l2"}
    assert res.cached_tokens == res.kv_tokens and res.tier is Tier.L2
    assert res.text == reference(adapter, INSTR + "\n\n" + PREFS["u1"])
    # a member eviction drops only the member's segment; the tenant's stays
    assert ex.invalidate("t1", "u1") == {"l1": 1, "l2": 1}
    assert ask(ex, "u2").tier is Tier.L1
    assert ask(ex, "u1").extra["segments"] == {"tenant": "l1", "member": "compute"}
    assert ex.invalidate("t1", TENANT_USER)["l2"] == 1  # filed under its own slot
    # a tenant eviction drops the tenant segment and every member's; other tenants stay
    ask(ex, "u1")
    out = ex.invalidate("t1")
    assert out == {"l1": 3, "l2": 3} and ex.l1.stats()["per_tenant"]["other"]["entries"] == 2


def test_stats_per_kind(adapter):
    ex = make(adapter)
    for user in ("u1", "u2", "u1"):
        ask(ex, user)
    kinds = ex.stats()["kinds"]
    assert (kinds["tenant"]["entries"], kinds["member"]["entries"]) == (1, 2)
    assert kinds["tenant"]["l1_hits"] == 2 and kinds["tenant"]["l1_misses"] == 1
    assert kinds["member"]["l1_hits"] == 1 and kinds["member"]["l1_misses"] == 2
    assert kinds["tenant"]["bytes"] + kinds["member"]["bytes"] == ex.l1.stats()["bytes"]
    assert kinds["conversation"]["entries"] == 0  # no engine here: no conversation links
