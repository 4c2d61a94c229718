"""A member's lean measured once on a probe (injection/engine/guidance/probe.py), in the real
batch engine on the demo model: a probe row hands back its first token's log-probability
difference and the mean of its steps', as a step-by-step reference computes them; a row
given a lean chooses with it from its first token on (the reference's reply), with no guide
row in any forward; the lean packs into the tiers' K/V shape and back."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from injection import InjectionExecutor, TenantLRU
from injection.base import ExecutionRequest
from injection.engine.batch import BatchEngine
from injection.engine.guidance import lean, probe
from injection.engine.guidance.contrast import PLAUSIBLE, Guide, combine
from injection.engine.guidance.probe import MemoryLean, pack, unpack
from injection.kvcache.packed import PackedKV
from injection.kvcache.redis_tier import RedisKVTier
from injection.kvcache.signing import CacheKeySigner
from injection.metrics import Metrics
from tests.injection.test_batch import _in_threads
from tests.injection.test_batch_faults import _Faulty, _with_model
from tests.injection.test_contrast import (
    MEMORY,
    QUESTION,
    _history,
    _ids,
    client_text,
    reference,
)

_LOG_PLAUSIBLE = float(torch.log(torch.tensor(PLAUSIBLE)))


def _forward(adapter, ids, cache):
    return adapter.model(input_ids=torch.tensor([ids], device=adapter.device),
                         past_key_values=cache, use_cache=True).logits[0, -1]


def _diff(main, guide):
    d = torch.log_softmax(main.float(), -1) - torch.log_softmax(guide.float(), -1)
    return d.nan_to_num(0.0, 0.0, 0.0)


def probe_reference(adapter, with_ids, without_ids, steps: int, strength: float):
    """The probe, one token at a time: both rows fed the guided token; the first token's
    difference and the mean of the next ``steps`` tokens'."""
    with torch.inference_mode():
        caches = [DynamicCache(config=adapter._cache_config) for _ in range(2)]
        logits = [_forward(adapter, ids, c) for ids, c in zip(
            (with_ids, without_ids), caches, strict=True)]
        first, total = _diff(*logits), 0.0
        for i in range(steps + 1):
            if i:
                total = total + _diff(*logits)
            token = int(combine(logits[0], logits[1], strength).argmax())
            logits = [_forward(adapter, [token], c) for c in caches]
    return first, total / steps


def lean_reference(adapter, ids, n: int, strength: float, lean: MemoryLean) -> list[int]:
    """A reply leaning from its first token: ``s x first``, then ``s x rest``, over the
    row's plausible tokens (float16 leans, as the tiers keep them)."""
    out, eos = [], adapter._eos_ids()
    with torch.inference_mode():
        cache = DynamicCache(config=adapter._cache_config)
        logits = _forward(adapter, ids, cache)
        for i in range(n):
            lp = torch.log_softmax(logits.float(), -1)
            add = (lean.first if i == 0 else lean.rest).to(lp.device, torch.float32) * strength
            scores = (lp + add).masked_fill(lp < lp.max() + _LOG_PLAUSIBLE, float("-inf"))
            token = int(scores.argmax())
            out.append(token)
            if token in eos:
                break
            logits = _forward(adapter, [token], cache)
    return out


def test_a_probe_row_measures_the_first_difference_and_the_mean_of_its_steps(adapter):
    with_ids, without_ids = _ids(adapter, MEMORY), _ids(adapter, "")
    eng = BatchEngine(adapter, max_batch=4)
    try:
        out = eng.run(None, 1.0, with_ids, probe.PROBE_STEPS + 1,
                      guide=Guide(1.0, None, without_ids), probe=True)
        plain = eng.run(None, 1.0, with_ids, 4, guide=Guide(1.0, None, without_ids))
    finally:
        eng.close()
    first, mean = probe_reference(adapter, with_ids, without_ids, probe.PROBE_STEPS, 1.0)
    assert len(out.token_ids) == probe.PROBE_STEPS + 1
    assert torch.allclose(out.leans[0].cpu(), first, atol=1e-4)
    assert torch.allclose(out.leans[1].cpu(), mean, atol=1e-4)
    assert plain.leans is None  # only a probe row measures


def test_a_row_with_a_lean_chooses_with_it_from_its_first_token_and_runs_no_guide(adapter):
    """The lean turns the reply (it is not the plain one) into the reference's; every
    forward is one row wide, and a plain row beside it is its reply alone."""
    with_ids, without_ids = _ids(adapter, MEMORY), _ids(adapter, "")
    first, mean = probe_reference(adapter, with_ids, without_ids, probe.PROBE_STEPS, 1.0)
    lean = MemoryLean(first.half() * 4, mean.half() * 4)  # strong enough to turn picks
    widths: list[int] = []
    eng = BatchEngine(_with_model(adapter, _Faulty(
        adapter.model, lambda _, kw: widths.append(kw["input_ids"].shape[0]))), max_batch=4)
    try:
        leaned = eng.run(None, 1.0, with_ids, 16, lean=(lean, 1.0))
        one_row = list(widths)
        plain = eng.run(None, 1.0, with_ids, 16)
        both = _in_threads([lambda: eng.run(None, 1.0, with_ids, 16, lean=(lean, 1.0)),
                            lambda: eng.run(None, 1.0, with_ids, 16)])
    finally:
        eng.close()
    assert leaned.token_ids == lean_reference(adapter, with_ids, 16, 1.0, lean)
    assert leaned.token_ids != plain.token_ids
    assert set(one_row) == {1} and leaned.guide_prefill_tokens == leaned.guide_decode_tokens == 0
    assert both[0].token_ids == leaned.token_ids and both[1].token_ids == plain.token_ids
    assert eng.counters["guided_rows"] == 0


def test_a_lean_packs_as_one_token_of_kv_and_back(adapter):
    vocab = adapter.model.get_output_embeddings().weight.shape[0]
    lean = MemoryLean(torch.randn(vocab).half(), torch.randn(vocab).half())
    kv = pack(lean)
    assert isinstance(kv, PackedKV) and kv.num_tokens == 1 and kv.is_cpu
    back = unpack(kv, vocab)
    assert torch.equal(back.first, lean.first) and torch.equal(back.rest, lean.rest)
    assert unpack(kv, vocab + 1) is None  # another model's vocabulary: measured again
    assert unpack(PackedKV(kv.keys.float(), kv.values.float(), (0,)), vocab) is None


@pytest.mark.parametrize("steps", [1, 3])
def test_probes_of_other_lengths_measure_their_own_steps(adapter, steps):
    with_ids, without_ids = _ids(adapter, MEMORY), _ids(adapter, "")
    eng = BatchEngine(adapter, max_batch=4)
    try:
        out = eng.run(None, 1.0, with_ids, steps + 1, guide=Guide(0.5, None, without_ids),
                      probe=True)
    finally:
        eng.close()
    _, mean = probe_reference(adapter, with_ids, without_ids, steps, 0.5)
    assert torch.allclose(out.leans[1].cpu(), mean, atol=1e-4)


# -- the executor: measured once per member, cached with the member's segments -------------

def member_lean(adapter, memory: str, strength: float = 1.0) -> MemoryLean:
    """The lean the executor measures for ``memory``: each probe's reference, averaged."""
    parts = [probe_reference(adapter, _ids(adapter, memory, q), _ids(adapter, "", q),
                             probe.PROBE_STEPS, strength)
             for q in ([{"role": "user", "content": p}] for p in probe.PROBES)]
    return MemoryLean(*(torch.stack([p[k] for p in parts]).mean(0).half() for k in (0, 1)))


def cached_lean(ex, req: ExecutionRequest) -> MemoryLean:
    """The lean ``ex`` keeps in L1 for ``req``'s member (what its turns lean with)."""
    plan = ex.planner.plan(req)
    key = probe.lean_key(req.tenant, req.user, ex.adapter.fingerprint, plan.lean)
    return unpack(ex.l1.peek(key), ex.leans.vocab)


def _executor(adapter, l2=None, **kw) -> InjectionExecutor:
    return InjectionExecutor(adapter, l1=TenantLRU(max_bytes=64 * 1024**2), l2=l2,
                             metrics=Metrics(), engine=BatchEngine(adapter, max_batch=8), **kw)


def _ask(ex, question=QUESTION, memory=MEMORY, tenant="t1", user="u1", contrast=1.0):
    return ex.execute(ExecutionRequest(tenant, user, question, memory, max_new_tokens=12,
                                       contrast=contrast))


def test_the_executor_measures_a_members_lean_once_and_every_first_turn_leans_with_it(adapter):
    other = [{"role": "user", "content": "Plan my weekend."}]
    ex = _executor(adapter)
    try:
        first, again, asked = _ask(ex), _ask(ex), _ask(ex, other)
        steps = ex.metrics.get("lean_probes")
        req = ExecutionRequest("t1", "u1", QUESTION, MEMORY, contrast=1.0)
        plan, lean = ex.planner.plan(req), cached_lean(ex, req)
    finally:
        ex.close()
    # the probes, each as the step-by-step reference measures it alone (float16: to within
    # its rounding; the batch's kernels are not the reference's), averaged
    want_lean = member_lean(adapter, MEMORY)
    assert torch.allclose(lean.first.float(), want_lean.first.float(), atol=2e-2)
    assert torch.allclose(lean.rest.float(), want_lean.rest.float(), atol=2e-2)
    for res, q in ((first, QUESTION), (asked, other)):
        want = lean_reference(adapter, _ids(adapter, MEMORY, q), 12, 1.0, lean)
        assert res.text.strip() == client_text(adapter, want)
        assert res.contrast_effective == 1.0
    assert again.text == first.text and steps == len(probe.PROBES)
    assert [r.extra["lean"] for r in (first, again, asked)] == ["probe", "l1", "l1"]
    # the probes' forwards are billed to the turn that ran them, none to the others: each
    # probe's row and guide prefilled after their cached heads, and decoded PROBE_STEPS steps
    assert first.guide_prefill_tokens == sum(len(i) for i in plan.lean.ids) + sum(
        len(g.ids) for g in plan.lean.guides)
    assert first.guide_decode_tokens == 2 * probe.PROBE_STEPS * len(probe.PROBES)
    assert (again.guide_prefill_tokens, again.guide_decode_tokens) == (0, 0)


def test_one_lean_a_member_serves_every_strength_it_is_applied_at(adapter):
    """The probes are guided at ``PROBE_STRENGTH`` whatever the turn's: a turn at another
    strength (a client's ``contrast``, a tenant's new ``memory_contrast``) measures nothing
    again and leans with the same lean at its own strength."""
    ex = _executor(adapter)
    try:
        strong = _ask(ex, contrast=2.0)
        steps = ex.metrics.get("lean_probes")
        usual = _ask(ex, contrast=1.0)
        lean = cached_lean(ex, ExecutionRequest("t1", "u1", QUESTION, MEMORY, contrast=2.0))
    finally:
        ex.close()
    assert [strong.extra["lean"], usual.extra["lean"]] == ["probe", "l1"]
    assert steps == ex.metrics.get("lean_probes") == len(probe.PROBES)
    want_lean = member_lean(adapter, MEMORY, probe.PROBE_STRENGTH)
    assert torch.allclose(lean.rest.float(), want_lean.rest.float(), atol=2e-2)
    for res, s in ((strong, 2.0), (usual, 1.0)):
        want = lean_reference(adapter, _ids(adapter, MEMORY, QUESTION), 12, s, lean)
        assert res.text.strip() == client_text(adapter, want) and res.contrast_effective == s


def test_a_lean_is_the_members_own_tenant_and_memory_and_goes_with_them(adapter):
    """Keyed per tenant, member and content: another tenant or member measures its own, an
    edited memory another; invalidating the member (or the tenant) drops it."""
    ex = _executor(adapter)
    try:
        assert _ask(ex).extra["lean"] == "probe"
        assert _ask(ex, tenant="t2").extra["lean"] == "probe"  # never another tenant's
        assert _ask(ex, user="u2").extra["lean"] == "probe"
        edited = _ask(ex, memory=MEMORY + " I like rice.")
        assert edited.extra["lean"] == "probe"
        assert _ask(ex).extra["lean"] == "l1"
        ex.invalidate("t1", "u1")
        assert _ask(ex).extra["lean"] == "probe"
        assert _ask(ex, tenant="t2").extra["lean"] == "l1"  # another tenant's untouched
        ex.invalidate("t2")
        assert _ask(ex, tenant="t2").extra["lean"] == "probe"
        # u1 (measured again; its edited memory's went with it), u2, and t2's u1
        assert ex.stats()["kinds"]["lean"]["entries"] == 3
    finally:
        ex.close()


def test_a_lean_in_the_shared_cache_serves_another_worker_and_a_bad_one_is_measured_again(
        adapter, redis_client):
    tier = RedisKVTier(redis_client, CacheKeySigner("lean-secret-0123456789abcdef0123"),
                       ttl_seconds=60, async_writes=False)
    a, b = _executor(adapter, tier), _executor(adapter, tier)
    try:
        mine = _ask(a)
        theirs = _ask(b)
        plan = b.planner.plan(ExecutionRequest("t1", "u1", QUESTION, MEMORY, contrast=1.0))
        key = probe.lean_key("t1", "u1", adapter.fingerprint, plan.lean)
        vocab = adapter.model.get_output_embeddings().weight.shape[0]
        wrong = MemoryLean(torch.zeros(vocab - 1).half(), torch.zeros(vocab - 1).half())
        b.clear_l1()
        tier.put(key, pack(wrong))  # another shape under the key: not a lean of this model
        again = _ask(b)
    finally:
        a.close()
        b.close()
        tier.evict("t1")
        tier.close()
    assert (mine.extra["lean"], theirs.extra["lean"]) == ("probe", "l2")
    assert theirs.text == mine.text and theirs.guide_decode_tokens == 0
    assert again.extra["lean"] == "probe" and again.text == mine.text


def test_off_a_first_turn_is_guided_by_a_guide_row_as_before(adapter):
    ex = _executor(adapter, memory_lean=False)
    try:
        res = _ask(ex)
    finally:
        ex.close()
    want = reference(adapter, _ids(adapter, MEMORY), _ids(adapter, ""), 12, 1.0)
    assert res.text.strip() == client_text(adapter, want)
    assert "lean" not in res.extra and ex.metrics.get("lean_probes") == 0
    assert res.guide_decode_tokens == min(res.completion_tokens - 1, lean.LEAN_AFTER)


def test_a_failed_probe_leaves_the_turn_without_a_lean(adapter):
    """The probe's forward fails (its rows raise): the turn is answered unguided, once, and
    the next turn measures again."""
    ex = _executor(adapter)
    calls = {"n": 0}
    real = ex.engine.start

    def failing(*args, **kw):
        if kw.get("probe") and calls["n"] == 0:
            calls["n"] += 1
            raise RuntimeError("probe forward failed")
        return real(*args, **kw)

    ex.engine.start = failing
    try:
        res = _ask(ex)
        plain = _ask(ex, contrast=0.0)
        later = _ask(ex)
    finally:
        ex.close()
    assert res.text == plain.text and res.contrast_effective == 0.0
    assert (res.guide_prefill_tokens, res.guide_decode_tokens) == (0, 0)
    assert "lean" not in res.extra and ex.metrics.get("lean_failures") == 1
    assert later.extra["lean"] == "probe"


def test_a_reminded_turn_is_anchored_then_leans_with_its_first_turns_lean(adapter, monkeypatch):
    """A deep (reminded) turn's first token is its anchor's (anchor.py), the rest lean with
    the lean the member's first turn measured (the same key: no probe again), no guide row;
    without the deep lean (``probe.DEEP``) it starts with the same token and goes on as the
    row. Without its reminder a deep turn leans as a first turn does."""
    deep_req = ExecutionRequest("t1", "u1", _history(3), MEMORY, max_new_tokens=12,
                                contrast=1.0)
    ex = _executor(adapter)
    try:
        first = _ask(ex)
        deep = ex.execute(deep_req)
        plans = [ex.planner.plan(r) for r in (deep_req, ExecutionRequest(
            "t1", "u1", QUESTION, MEMORY, contrast=1.0))]
        monkeypatch.setattr(probe, "DEEP", False)
        plain = ex.execute(deep_req)
        unreminded = ex.execute(ExecutionRequest("t1", "u1", _history(3), MEMORY,
                                                 max_new_tokens=4, contrast=1.0,
                                                 reminder=False))
    finally:
        ex.close()
    assert first.extra["lean"] == "probe" and deep.extra["lean"] == "l1"
    assert plans[0].anchor is not None and plans[0].lean.digest == plans[1].lean.digest
    assert deep.contrast_effective == 1.0 and deep.guide_decode_tokens == 0
    assert deep.guide_prefill_tokens == len(plans[0].anchor.ids) + len(plans[0].anchor.guide.ids)
    assert "lean" not in plain.extra and plain.guide_prefill_tokens == deep.guide_prefill_tokens
    assert unreminded.extra["lean"] == "l1" and unreminded.contrast_effective == 1.0


def test_warming_a_member_measures_their_lean_too(adapter):
    """``warm`` (``kvcache warm``, after an edit) leaves the member's first chat nothing to
    measure; a member whose turns do not lean (strength 0) gets no lean."""
    ex = _executor(adapter)
    try:
        assert ex.warm("t1", "u1", MEMORY, contrast=1.0).value == "compute"
        probes = ex.metrics.get("lean_probes")
        res = _ask(ex)
        ex.warm("t1", "u2", MEMORY)  # the demo model's default strength: 0
    finally:
        ex.close()
    assert probes == len(probe.PROBES) and res.extra["lean"] == "l1"
    assert res.guide_prefill_tokens == res.guide_decode_tokens == 0
    assert ex.metrics.get("lean_probes") == probes


def test_one_lean_a_member_serves_every_alpha_it_is_applied_at(adapter, redis_client):
    """The probes run on the member's segment at ``PROBE_ALPHA`` whatever the turn's alpha: a
    client varying ``alpha`` per request (0.9, 0.91, 0.92) measures the probes once and keeps
    one lean in L1 and in L2 (the turns after the first write nothing to L2), the lean a
    turn at alpha 1 measures; each turn still injects its own segment at its own alpha."""
    tier = RedisKVTier(redis_client, CacheKeySigner("lean-secret-0123456789abcdef0123"),
                       ttl_seconds=60, async_writes=False)
    ex = _executor(adapter, tier)
    reqs = [ExecutionRequest("t1", "u1", QUESTION, MEMORY, max_new_tokens=12, contrast=1.0,
                             alpha=a) for a in (0.9, 0.91, 0.92)]

    def names():
        return sorted(redis_client.scan_iter(match=tier.signer.entry_match("t1")))

    try:
        results = [ex.execute(reqs[0])]
        after_first = names()
        results += [ex.execute(r) for r in reqs[1:]]
        after_all = names()
        plans = [ex.planner.plan(r) for r in reqs]
        lean = cached_lean(ex, reqs[0])
        l1_leans = ex.stats()["kinds"]["lean"]["entries"]
        lean_name = tier.signer.redis_key(probe.lean_key("t1", "u1", adapter.fingerprint,
                                                         plans[0].lean)).encode()
    finally:
        ex.close()
        tier.evict("t1")
        tier.close()
    assert [r.extra["lean"] for r in results] == ["probe", "l1", "l1"]
    assert ex.metrics.get("lean_probes") == len(probe.PROBES)
    assert len({p.lean.digest for p in plans}) == 1 and l1_leans == 1
    assert lean_name in after_first and after_all == after_first
    assert [r.alpha_effective for r in results] == [0.9, 0.91, 0.92]
    want_lean = member_lean(adapter, MEMORY)  # the probes' references, nothing scaled
    assert torch.allclose(lean.first.float(), want_lean.first.float(), atol=2e-2)
    assert torch.allclose(lean.rest.float(), want_lean.rest.float(), atol=2e-2)


def test_an_engine_of_one_row_runs_no_probe(adapter):
    """``WORKER_BATCH_MAX=1``: a probe's guide row never runs beside it, so no probe could
    produce a lean; a guided first turn (and a warm) runs none and answers unguided, as it
    did when its 8 probes ran for nothing."""
    ex = InjectionExecutor(adapter, l1=TenantLRU(max_bytes=64 * 1024**2), l2=None,
                           metrics=Metrics(), engine=BatchEngine(adapter, max_batch=1))
    probes = {"n": 0}
    real = ex.engine.start

    def counting(*args, **kw):
        probes["n"] += bool(kw.get("probe"))
        return real(*args, **kw)

    ex.engine.start = counting
    try:
        res = _ask(ex)
        ex.warm("t1", "u2", MEMORY, contrast=1.0)
        plain = _ask(ex, contrast=0.0, user="u3")
    finally:
        ex.close()
    assert probes["n"] == 0 and ex.metrics.get("lean_probes") == 0
    assert "lean" not in res.extra and res.text == plain.text
    assert (res.guide_prefill_tokens, res.guide_decode_tokens) == (0, 0)
    assert ex.stats()["kinds"]["lean"]["entries"] == 0
