"""InjectionExecutor with the real demo model, a real TenantLRU and a real Redis L2."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import redis
import torch
from redis.backoff import NoBackoff
from redis.retry import Retry

from injection import build_executor
from injection.base import CacheKey, ExecutionRequest, KVStore, PreferenceModel, Tier
from injection.errors import InvalidRequest, ModelOOMError
from injection.executor import InjectionExecutor, content_hash
from injection.lru import TenantLRU
from injection.metrics import Metrics
from injection.redis_tier import RedisKVTier
from injection.signing import CacheKeySigner

SECRET = "test-secret-0123456789abcdef"


class Instrumented(PreferenceModel):
    """The real adapter, counting calls; optional hooks gate compute or alter generate."""

    def __init__(self, inner, *, before_compute=None, after_generate=None):
        self.inner, self.fingerprint = inner, inner.fingerprint
        self.device, self.dtype = inner.device, inner.dtype
        self.before_compute, self.after_generate = before_compute, after_generate
        self.computes, self.generates = 0, []

    def compute_kv(self, text):
        self.computes += 1
        if self.before_compute:
            self.before_compute()
        return self.inner.compute_kv(text)

    def generate(self, prompt, injected, alpha, max_new_tokens, **sampling):
        self.generates.append((injected is not None, alpha))
        out = self.inner.generate(prompt, injected, alpha, max_new_tokens, **sampling)
        return self.after_generate(out) if self.after_generate else out

    def render_chat(self, messages):
        return self.inner.render_chat(messages)

    def count_tokens(self, text):
        return self.inner.count_tokens(text)


class BrokenStore(KVStore):
    """A tier whose every operation fails (a faulty deployment, a bug)."""

    def get(self, *args, **kwargs):
        raise ConnectionError("tier down")

    put = evict = stats = get


@pytest.fixture
def model(adapter):
    return Instrumented(adapter)


@pytest.fixture
def l2(redis_client):
    tier = RedisKVTier(redis_client, CacheKeySigner(SECRET), ttl_seconds=60)
    yield tier
    tier.close()


def make(model, *, l1="lru", l2=None, **kw) -> InjectionExecutor:
    l1 = TenantLRU(max_bytes=64 * 1024**2) if l1 == "lru" else l1
    return InjectionExecutor(model, l1=l1, l2=l2, metrics=Metrics(), **kw)


def req(prompt, pref, *, tenant="t1", user="u1", **kw) -> ExecutionRequest:
    return ExecutionRequest(tenant, user, prompt, pref, max_new_tokens=kw.pop("n", 4), **kw)


# -- alpha rules ------------------------------------------------------------------------
def test_alpha_is_capped_and_applied_exactly(model, adapter, chat_prompt, preference):
    ex = make(model)
    res = ex.execute(req(chat_prompt, preference, alpha=1.0, n=8))
    assert res.alpha_effective == 0.7 and model.generates == [(True, 0.7)]
    kv = adapter.compute_kv(preference)
    assert res.text == adapter.generate(chat_prompt, kv, 0.7, 8).text
    assert ex.execute(req(chat_prompt, preference, alpha=0.4)).alpha_effective == 0.4
    assert make(model, alpha_cap=0.9).execute(req(chat_prompt, preference)).alpha_effective == 0.9


def test_executor_at_alpha_one_matches_plain_generation_on_prefix(adapter, chat_prompt, preference):
    ex = make(adapter, alpha_cap=1.0)
    res = ex.execute(req(chat_prompt, preference, alpha=1.0, n=10))
    pref_ids = adapter.tokenizer(preference)["input_ids"]
    ids = torch.tensor([pref_ids + adapter.tokenizer(chat_prompt, add_special_tokens=False)["input_ids"]])
    ref = adapter.model.generate(input_ids=ids, max_new_tokens=10, do_sample=False)[0, ids.shape[1] :]
    assert res.text == adapter.tokenizer.decode(ref, skip_special_tokens=True)


@pytest.mark.parametrize(
    "kw",
    [{"alpha": 0.1}, {"alpha": 0.0}, {"pref": ""}, {"pref": "  \n\t"},
     {"injection_enabled": False}],
)
def test_no_injection_means_no_kv_work(model, adapter, chat_prompt, preference, kw):
    ex = make(model)
    pref = kw.pop("pref", preference)
    res = ex.execute(req(chat_prompt, pref, **kw))
    assert res.tier is Tier.NONE and model.computes == 0
    assert model.generates == [(False, 1.0)]
    assert ex.l1.stats()["entries"] == 0 and ex.metrics.get("l1_misses") == 0
    assert (res.kv_tokens, res.kv_bytes_cpu, res.alpha_effective, res.content_hash) == (0, 0, 0.0, "")
    assert res.text == adapter.generate(chat_prompt, None, 1.0, 4).text


def test_alpha_just_above_min_injects(model, chat_prompt, preference):
    assert make(model).execute(req(chat_prompt, preference, alpha=0.11)).tier is Tier.COMPUTE


@pytest.mark.parametrize(
    "bad",
    [{"prompt": ""}, {"prompt": "   "}, {"alpha": -0.5}, {"alpha": float("nan")},
     {"tenant": ""}, {"n": 0}, {"temperature": -1.0}, {"top_p": 0.0}],
)
def test_bad_requests_are_rejected(model, chat_prompt, preference, bad):
    prompt = bad.pop("prompt", chat_prompt)
    with pytest.raises(InvalidRequest):
        make(model).execute(req(prompt, preference, **bad))
    assert model.computes == 0 and model.generates == []


# -- tiers ------------------------------------------------------------------------------
def test_tiers_compute_l1_then_l2_promoted_to_l1(model, l2, chat_prompt, preference):
    first = make(model, l2=l2)
    a = first.execute(req(chat_prompt, preference))
    b = first.execute(req(chat_prompt, preference))
    assert (a.tier, b.tier) == (Tier.COMPUTE, Tier.L1) and model.computes == 1
    assert l2.flush(10)
    second = make(model, l2=l2)  # another worker process: empty L1, shared Redis
    c = second.execute(req(chat_prompt, preference))
    d = second.execute(req(chat_prompt, preference))
    assert (c.tier, d.tier) == (Tier.L2, Tier.L1) and model.computes == 1
    assert a.text == b.text == c.text == d.text  # the decoded entry injects identically
    assert second.metrics.get("l2_hits") == 1 and second.l1.stats()["entries"] == 1
    # one miss and one hit per executor: the single-flight re-check counts nothing
    assert (first.l1.stats()["misses"], first.l1.stats()["hits"]) == (1, 1)
    assert first.metrics.get("l1_misses") == 1 and first.metrics.get("l1_hits") == 1


def test_user_none_or_empty_is_never_cached(model, l2, chat_prompt, preference):
    ex = make(model, l2=l2)
    for user in (None, None, "", "  "):
        assert ex.execute(req(chat_prompt, preference, user=user)).tier is Tier.COMPUTE
    assert model.computes == 4
    assert l2.flush(10)
    assert ex.l1.stats()["entries"] == 0 and l2.stats()["writes"] == 0


def test_tenant_user_text_and_model_partition_the_cache(model, mqa_model_path, chat_prompt, preference):
    from injection.adapter import load_adapter

    ex = make(model)
    ex.execute(req(chat_prompt, preference))
    assert ex.execute(req(chat_prompt, preference, tenant="t2")).tier is Tier.COMPUTE
    assert ex.execute(req(chat_prompt, preference, user="u2")).tier is Tier.COMPUTE
    assert ex.execute(req(chat_prompt, preference + " Also tea.")).tier is Tier.COMPUTE
    other = make(load_adapter(str(mqa_model_path)), l1=ex.l1)  # same L1, other model
    assert other.execute(req(chat_prompt, preference)).tier is Tier.COMPUTE
    assert ex.execute(req(chat_prompt, preference)).tier is Tier.L1


def test_result_metrics(model, chat_prompt, preference):
    ex = make(model)
    res = ex.execute(req(chat_prompt, preference, n=5))
    kv = model.inner.compute_kv(preference)
    assert res.content_hash == content_hash(preference) and res.fingerprint == model.fingerprint
    assert (res.kv_tokens, res.kv_layers_count, res.kv_bytes_cpu) == (kv.num_tokens, 4, kv.nbytes)
    assert res.kv_bytes_gpu_peak == 0  # CPU: no accelerator memory
    assert res.kv_transfer_latency_ms > 0 and res.kv_fetch_latency_ms > 0
    assert res.inference_latency_ms > 0 and res.completion_tokens == 5
    assert res.prompt_tokens == model.count_tokens(chat_prompt)
    info = res.cache_info()
    assert info["tier"] == "compute" and "text" not in info
    stats = ex.stats()
    assert stats["metrics"]["counters"]["computes"] == 1 and stats["l1"]["entries"] == 1
    assert stats["l2"] is None and stats["fingerprint"] == model.fingerprint


# -- faults -----------------------------------------------------------------------------
def test_broken_l2_degrades_to_compute(model, chat_prompt, preference):
    ex = make(model, l2=BrokenStore())
    good = make(Instrumented(model.inner)).execute(req(chat_prompt, preference))
    res = ex.execute(req(chat_prompt, preference))
    assert res.tier is Tier.COMPUTE and res.text == good.text
    assert ex.metrics.get("l2_errors") == 2  # get + put
    assert ex.execute(req(chat_prompt, preference)).tier is Tier.L1
    inv = ex.invalidate("t1")
    assert inv["l1"] == 1 and inv["l2"] is None and inv["l2_error"] == "ConnectionError"
    assert ex.stats()["l2"] == {"error": "ConnectionError"}


def test_broken_l1_degrades_to_l2_and_compute(model, l2, chat_prompt, preference):
    ex = make(model, l1=BrokenStore(), l2=l2)
    assert ex.execute(req(chat_prompt, preference)).tier is Tier.COMPUTE
    assert l2.flush(10)
    assert ex.execute(req(chat_prompt, preference)).tier is Tier.L2
    assert ex.metrics.get("l1_errors") >= 3


def test_redis_down_degrades_to_compute(model, chat_prompt, preference):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    client = redis.Redis(  # no retries: redis-py's default backoff spends ~3 s per call
        port=port, socket_connect_timeout=0.2, socket_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    tier = RedisKVTier(client, CacheKeySigner(SECRET))
    try:
        ex = make(model, l2=tier)
        assert ex.execute(req(chat_prompt, preference)).tier is Tier.COMPUTE
        assert ex.execute(req(chat_prompt, preference)).tier is Tier.L1
        tier.flush(10)
        stats = tier.stats()
        assert stats["errors"] >= 1 and stats["writes"] == 0 and stats["hits"] == 0
    finally:
        tier.close()


def test_oom_is_retried_once_then_reported(model, chat_prompt, preference):
    failures = {"left": 1}

    def flaky(out):
        if failures["left"] > 0:
            failures["left"] -= 1
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return out

    model.after_generate = flaky
    ex = make(model)
    assert ex.execute(req(chat_prompt, preference)).tier is Tier.L1  # retry finds the K/V cached
    assert ex.metrics.get("oom_retries") == 1
    failures["left"] = 2
    with pytest.raises(ModelOOMError):
        ex.execute(req(chat_prompt, preference))
    assert ex.metrics.get("oom_failures") == 1


def test_residual_tool_calls_are_stripped(model, chat_prompt, preference):
    model.after_generate = lambda out: out._replace(text=out.text + ' retrieve_fact(trace_id="x")')
    ex = make(model)
    clean = make(Instrumented(model.inner)).execute(req(chat_prompt, preference)).text
    for pref in (preference, ""):  # injected and plain paths
        res = ex.execute(req(chat_prompt, pref))
        assert res.stripped_count == 1 and "retrieve_fact" not in res.text
    assert res.text == make(Instrumented(model.inner)).execute(req(chat_prompt, "")).text.strip()
    assert ex.metrics.get("stripped_calls") == 2 and clean


# -- concurrency ------------------------------------------------------------------------
def test_concurrent_misses_compute_once(adapter, chat_prompt, preference):
    n = 6
    key = CacheKey("t1", "u1", content_hash(preference), adapter.fingerprint)
    holder: dict = {}

    def gate():  # the leader computes only once every other request waits on it
        deadline = time.monotonic() + 10
        while holder["ex"].kv_source.flight.waiters(key) < n - 1 and time.monotonic() < deadline:
            time.sleep(0.002)

    model = Instrumented(adapter, before_compute=gate)
    ex = holder["ex"] = make(model)
    results: list = []
    threads = [
        threading.Thread(target=lambda: results.append(ex.execute(req(chat_prompt, preference))))
        for _ in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert model.computes == 1 and len(results) == n
    assert {r.tier for r in results} == {Tier.COMPUTE} and len({r.text for r in results}) == 1
    assert ex.metrics.get("compute_shared") == n - 1 and ex.kv_source.flight.in_flight() == 0


# -- warm / invalidate / factory --------------------------------------------------------
def test_warm_then_execute_hits(model, chat_prompt, preference):
    ex = make(model)
    assert ex.warm("t1", "u1", preference) is Tier.COMPUTE and model.generates == []
    assert ex.warm("t1", "u1", preference) is Tier.L1
    assert ex.execute(req(chat_prompt, preference)).tier is Tier.L1 and model.computes == 1
    assert ex.warm("t1", "u1", " ") is Tier.NONE
    with pytest.raises(InvalidRequest):
        ex.warm("t1", "", preference)


def test_invalidate_scopes_to_tenant_and_user(model, l2, chat_prompt, preference):
    ex = make(model, l2=l2)
    for tenant, user in (("a", "u1"), ("a", "u2"), ("b", "u1")):
        ex.warm(tenant, user, preference)
    assert l2.flush(10)
    assert ex.invalidate("a", "u1") == {"l1": 1, "l2": 1}
    assert ex.execute(req(chat_prompt, preference, tenant="b", user="u1")).tier is Tier.L1
    assert ex.execute(req(chat_prompt, preference, tenant="a", user="u2")).tier is Tier.L1
    assert ex.execute(req(chat_prompt, preference, tenant="a", user="u1")).tier is Tier.COMPUTE
    assert l2.flush(10)
    assert ex.invalidate("a") == {"l1": 2, "l2": 2}
    assert ex.l1.stats()["entries"] == 1  # tenant b untouched


def test_build_executor_factory(adapter, redis_client, chat_prompt, preference):
    ex = build_executor(adapter, redis_client=redis_client, signing_secret=SECRET,
                        l1_max_bytes=32 * 1024**2, l1_tenant_quota_bytes=64 * 1024**2,
                        metrics=Metrics())
    try:
        assert isinstance(ex.l1, TenantLRU) and isinstance(ex.l2, RedisKVTier)
        assert ex.l1.tenant_quota_bytes == 32 * 1024**2 and ex.alpha_cap == 0.7
        assert ex.execute(req(chat_prompt, preference)).tier is Tier.COMPUTE
        assert ex.l2.flush(10) and ex.l2.stats()["writes"] == 1
    finally:
        ex.close()
    assert build_executor(adapter, redis_client=redis_client, signing_secret=SECRET,
                          l2_enabled=False).l2 is None
    assert build_executor(adapter).l2 is None
    with pytest.raises(ValueError, match="signing_secret"):
        build_executor(adapter, redis_client=redis_client)
