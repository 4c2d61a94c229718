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
from injection.engine.executor import InjectionExecutor, content_hash
from injection.errors import InvalidRequest, ModelOOMError
from injection.kvcache.lru import TenantLRU
from injection.kvcache.redis_tier import RedisKVTier
from injection.kvcache.signing import CacheKeySigner
from injection.metrics import Metrics

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

    def split_prompt(self, context, messages):
        return self.inner.split_prompt(context, messages)

    def plain_prompt(self, context, messages):
        return self.inner.plain_prompt(context, messages)

    def prompt_tokens(self, context, messages):
        return self.inner.prompt_tokens(context, messages)

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


def req(messages, pref, *, tenant="t1", user="u1", **kw) -> ExecutionRequest:
    return ExecutionRequest(tenant, user, messages, pref, max_new_tokens=kw.pop("n", 4), **kw)


def segment(adapter, pref, messages):
    """The injected system turn of ``pref`` and the prompt that follows it."""
    parts = adapter.split_prompt(pref, messages)
    assert parts.mode == "system"
    return parts


# -- alpha rules ------------------------------------------------------------------------
def test_alpha_is_capped_and_applied_exactly(model, adapter, chat_messages, preference):
    ex = make(model, alpha_cap=0.7)
    res = ex.execute(req(chat_messages, preference, alpha=1.0, n=8))
    # the assembled chain arrives with its member values scaled: generate runs at 1.0
    assert res.alpha_effective == 0.7 and model.generates == [(True, 1.0)]
    parts = segment(adapter, preference, chat_messages)
    kv = adapter.compute_kv(parts.segment)
    assert res.text == adapter.generate(parts.prompt, kv, 0.7, 8).text
    assert ex.execute(req(chat_messages, preference, alpha=0.4)).alpha_effective == 0.4
    assert make(model, alpha_cap=0.9).execute(req(chat_messages, preference)).alpha_effective == 0.9
    assert make(model).execute(req(chat_messages, preference)).alpha_effective == 1.0  # default cap


def test_executor_at_alpha_one_equals_the_preference_as_system_message(adapter, preference):
    """The exactness invariant: injecting the system turn changes nothing but the cost."""
    ex = make(adapter, alpha_cap=1.0)
    msgs = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi!"},
            {"role": "user", "content": "What should I cook tonight?"}]
    res = ex.execute(req(msgs, preference, alpha=1.0, n=12))
    assert res.injection_mode == "system" and res.tier is Tier.COMPUTE
    system_msgs = [{"role": "system", "content": preference}, *msgs]
    ids = adapter.tokenizer(adapter.render_chat(system_msgs))["input_ids"]
    ref = adapter.model.generate(input_ids=torch.tensor([ids]), max_new_tokens=12,
                                 do_sample=False)[0, len(ids):]
    assert res.completion_tokens == 12 and res.history_messages == 2
    assert res.text == adapter.tokenizer.decode(ref, skip_special_tokens=True)


def test_tenant_instructions_open_the_injected_turn(model, adapter, chat_messages, preference):
    ex = make(model, alpha_cap=1.0)
    base = ex.execute(req(chat_messages, preference))
    res = ex.execute(req(chat_messages, preference, instructions="Answer briefly."))
    parts = segment(adapter, "Answer briefly.\n\n" + preference, chat_messages)
    assert res.tier is Tier.COMPUTE and model.computes == 2  # the key covers the instructions
    assert res.content_hash == content_hash(parts.segment) != base.content_hash
    assert res.text == adapter.generate(parts.prompt, adapter.compute_kv(parts.segment), 1.0,
                                        4).text
    # a disabled preference keeps the instructions, in the prompt (nothing injected)
    off = ex.execute(req(chat_messages, preference, instructions="Answer briefly.",
                         injection_enabled=False))
    plain = adapter.generate(adapter.plain_prompt("Answer briefly.", chat_messages), None, 1.0, 4)
    assert off.tier is Tier.NONE and off.text == plain.text and model.computes == 2


@pytest.mark.parametrize(
    "kw",
    [{"alpha": 0.1}, {"alpha": 0.0}, {"pref": ""}, {"pref": "  \n\t"},
     {"injection_enabled": False}],
)
def test_no_injection_means_no_kv_work(model, adapter, chat_messages, preference, kw):
    ex = make(model)
    pref = kw.pop("pref", preference)
    res = ex.execute(req(chat_messages, pref, **kw))
    assert res.tier is Tier.NONE and model.computes == 0
    assert model.generates == [(False, 1.0)]
    assert ex.l1.stats()["entries"] == 0 and ex.metrics.get("l1_misses") == 0
    assert (res.kv_tokens, res.kv_bytes_cpu, res.alpha_effective, res.content_hash) == (0, 0, 0.0, "")
    assert res.text == adapter.generate(adapter.render_chat(chat_messages), None, 1.0, 4).text


def test_alpha_just_above_min_injects(model, chat_messages, preference):
    assert make(model).execute(req(chat_messages, preference, alpha=0.11)).tier is Tier.COMPUTE


@pytest.mark.parametrize(
    "bad",
    [{"prompt": ""}, {"prompt": "   "}, {"prompt": None}, {"alpha": -0.5}, {"alpha": float("nan")},
     {"tenant": ""}, {"n": 0}, {"temperature": -1.0}, {"top_p": 0.0}],
)
def test_bad_requests_are_rejected(model, chat_messages, preference, bad):
    msgs = chat_messages
    if "prompt" in bad:
        content = bad.pop("prompt")
        msgs = [{"role": "user", "content": content}] if content is not None else [
            {"role": "assistant", "content": "a reply, not a question"}]
    with pytest.raises(InvalidRequest):
        make(model).execute(req(msgs, preference, **bad))
    assert model.computes == 0 and model.generates == []


# -- tiers ------------------------------------------------------------------------------
def test_tiers_compute_l1_then_l2_promoted_to_l1(model, l2, chat_messages, preference):
    first = make(model, l2=l2)
    a = first.execute(req(chat_messages, preference))
    b = first.execute(req(chat_messages, preference))
    assert (a.tier, b.tier) == (Tier.COMPUTE, Tier.L1) and model.computes == 1
    assert l2.flush(10)
    second = make(model, l2=l2)  # another worker process: empty L1, shared Redis
    c = second.execute(req(chat_messages, preference))
    d = second.execute(req(chat_messages, preference))
    assert (c.tier, d.tier) == (Tier.L2, Tier.L1) and model.computes == 1
    assert a.text == b.text == c.text == d.text  # the decoded entry injects identically
    assert second.metrics.get("l2_hits") == 1 and second.l1.stats()["entries"] == 1
    # one miss and one hit per executor: the single-flight re-check counts nothing
    assert (first.l1.stats()["misses"], first.l1.stats()["hits"]) == (1, 1)
    assert first.metrics.get("l1_misses") == 1 and first.metrics.get("l1_hits") == 1


def test_user_none_or_empty_is_never_cached(model, l2, chat_messages, preference):
    ex = make(model, l2=l2)
    for user in (None, None, "", "  "):
        assert ex.execute(req(chat_messages, preference, user=user)).tier is Tier.COMPUTE
    assert model.computes == 4
    assert l2.flush(10)
    assert ex.l1.stats()["entries"] == 0 and l2.stats()["writes"] == 0


def test_tenant_user_text_and_model_partition_the_cache(model, mqa_model_path, chat_messages, preference):
    from injection.model.loading import load_adapter

    ex = make(model)
    ex.execute(req(chat_messages, preference))
    assert ex.execute(req(chat_messages, preference, tenant="t2")).tier is Tier.COMPUTE
    assert ex.execute(req(chat_messages, preference, user="u2")).tier is Tier.COMPUTE
    assert ex.execute(req(chat_messages, preference + " Also tea.")).tier is Tier.COMPUTE
    other = make(load_adapter(str(mqa_model_path)), l1=ex.l1)  # same L1, other model
    assert other.execute(req(chat_messages, preference)).tier is Tier.COMPUTE
    assert ex.execute(req(chat_messages, preference)).tier is Tier.L1


def test_result_metrics(model, chat_messages, preference):
    ex = make(model)
    res = ex.execute(req(chat_messages, preference, n=5))
    parts = segment(model.inner, preference, chat_messages)
    kv = model.inner.compute_kv(parts.segment)
    assert res.content_hash == content_hash(parts.segment) and res.fingerprint == model.fingerprint
    assert (res.kv_tokens, res.kv_layers_count, res.kv_bytes_cpu) == (kv.num_tokens, 4, kv.nbytes)
    assert res.kv_bytes_gpu_peak == 0  # CPU: no accelerator memory
    assert res.kv_transfer_latency_ms > 0 and res.kv_fetch_latency_ms > 0
    assert res.inference_latency_ms > 0 and res.completion_tokens == 5
    # first token: after the K/V lookup, before the whole generation is done
    assert res.kv_fetch_latency_ms < res.ttft_ms < res.kv_fetch_latency_ms + res.inference_latency_ms
    # every token the model reads before the reply: the injected turn too; none cached yet
    assert res.prompt_tokens == kv.num_tokens + model.count_tokens(parts.prompt)
    assert res.cached_tokens == 0
    again = ex.execute(req(chat_messages, preference, n=5))
    assert (again.prompt_tokens, again.cached_tokens) == (res.prompt_tokens, kv.num_tokens)
    info = res.cache_info()
    assert info["tier"] == "compute" and "text" not in info
    stats = ex.stats()
    assert stats["metrics"]["counters"]["computes"] == 1 and stats["l1"]["entries"] == 1
    assert stats["l2"] is None and stats["fingerprint"] == model.fingerprint


# -- faults -----------------------------------------------------------------------------
def test_broken_l2_degrades_to_compute(model, chat_messages, preference):
    ex = make(model, l2=BrokenStore())
    good = make(Instrumented(model.inner)).execute(req(chat_messages, preference))
    res = ex.execute(req(chat_messages, preference))
    assert res.tier is Tier.COMPUTE and res.text == good.text
    assert ex.metrics.get("l2_errors") == 2  # get + put
    assert ex.execute(req(chat_messages, preference)).tier is Tier.L1
    inv = ex.invalidate("t1")
    assert inv["l1"] == 1 and inv["l2"] is None and inv["l2_error"] == "ConnectionError"
    assert ex.stats()["l2"] == {"error": "ConnectionError"}


def test_broken_l1_degrades_to_l2_and_compute(model, l2, chat_messages, preference):
    ex = make(model, l1=BrokenStore(), l2=l2)
    assert ex.execute(req(chat_messages, preference)).tier is Tier.COMPUTE
    assert l2.flush(10)
    assert ex.execute(req(chat_messages, preference)).tier is Tier.L2
    assert ex.metrics.get("l1_errors") >= 3


def test_redis_down_degrades_to_compute(model, chat_messages, preference):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    client = redis.Redis(  # no retries: redis-py's default backoff spends ~3 s per call
        port=port, socket_connect_timeout=0.2, socket_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    tier = RedisKVTier(client, CacheKeySigner(SECRET))
    try:
        ex = make(model, l2=tier)
        assert ex.execute(req(chat_messages, preference)).tier is Tier.COMPUTE
        assert ex.execute(req(chat_messages, preference)).tier is Tier.L1
        tier.flush(10)
        stats = tier.stats()
        assert stats["errors"] >= 1 and stats["writes"] == 0 and stats["hits"] == 0
    finally:
        tier.close()


def test_oom_is_retried_once_then_reported(model, chat_messages, preference):
    failures = {"left": 1}

    def flaky(out):
        if failures["left"] > 0:
            failures["left"] -= 1
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return out

    model.after_generate = flaky
    ex = make(model)
    assert ex.execute(req(chat_messages, preference)).tier is Tier.L1  # retry finds the K/V cached
    assert ex.metrics.get("oom_retries") == 1
    failures["left"] = 2
    with pytest.raises(ModelOOMError):
        ex.execute(req(chat_messages, preference))
    assert ex.metrics.get("oom_failures") == 1


def test_residual_tool_calls_are_stripped(model, chat_messages, preference):
    model.after_generate = lambda out: out._replace(text=out.text + ' retrieve_fact(trace_id="x")')
    ex = make(model)
    clean = make(Instrumented(model.inner)).execute(req(chat_messages, preference)).text
    for pref in (preference, ""):  # injected and plain paths
        res = ex.execute(req(chat_messages, pref))
        assert res.stripped_count == 1 and "retrieve_fact" not in res.text
    # whitespace is normalised only next to a removed call (the stream cannot take back a
    # reply's leading space it already sent): the call at the end takes the space before it
    assert res.text == make(Instrumented(model.inner)).execute(req(chat_messages, "")).text.rstrip()
    assert ex.metrics.get("stripped_calls") == 2 and clean


# -- concurrency ------------------------------------------------------------------------
def test_concurrent_misses_compute_once(adapter, chat_messages, preference):
    n = 6
    chash = content_hash(segment(adapter, preference, chat_messages).segment)
    key = CacheKey("t1", "u1", chash, adapter.fingerprint)
    holder: dict = {}

    def gate():  # the leader computes only once every other request waits on it
        deadline = time.monotonic() + 10
        while holder["ex"].kv_source.flight.waiters(key) < n - 1 and time.monotonic() < deadline:
            time.sleep(0.002)

    model = Instrumented(adapter, before_compute=gate)
    ex = holder["ex"] = make(model)
    results: list = []
    threads = [
        threading.Thread(target=lambda: results.append(ex.execute(req(chat_messages, preference))))
        for _ in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert model.computes == 1 and len(results) == n
    assert {r.tier for r in results} == {Tier.COMPUTE} and len({r.text for r in results}) == 1
    assert ex.metrics.get("compute_shared") == n - 1 and not ex.kv_source.flight._calls


# -- warm / invalidate / factory --------------------------------------------------------
def test_warm_then_execute_hits(model, chat_messages, preference):
    ex = make(model)
    assert ex.warm("t1", "u1", preference) is Tier.COMPUTE and model.generates == []
    assert ex.warm("t1", "u1", preference) is Tier.L1
    assert ex.execute(req(chat_messages, preference)).tier is Tier.L1 and model.computes == 1
    assert ex.warm("t1", "u1", " ") is Tier.NONE
    with pytest.raises(InvalidRequest):
        ex.warm("t1", "", preference)


def test_invalidate_scopes_to_tenant_and_user(model, l2, chat_messages, preference):
    ex = make(model, l2=l2)
    for tenant, user in (("a", "u1"), ("a", "u2"), ("b", "u1")):
        ex.warm(tenant, user, preference)
    assert l2.flush(10)
    assert ex.invalidate("a", "u1") == {"l1": 1, "l2": 1}
    assert ex.execute(req(chat_messages, preference, tenant="b", user="u1")).tier is Tier.L1
    assert ex.execute(req(chat_messages, preference, tenant="a", user="u2")).tier is Tier.L1
    assert ex.execute(req(chat_messages, preference, tenant="a", user="u1")).tier is Tier.COMPUTE
    assert l2.flush(10)
    assert ex.invalidate("a") == {"l1": 2, "l2": 2}
    assert ex.l1.stats()["entries"] == 1  # tenant b untouched


def test_build_executor_factory(adapter, redis_client, chat_messages, preference):
    ex = build_executor(adapter, redis_client=redis_client, signing_secret=SECRET,
                        l1_max_bytes=32 * 1024**2, l1_tenant_quota_bytes=64 * 1024**2,
                        metrics=Metrics())
    try:
        assert isinstance(ex.l1, TenantLRU) and isinstance(ex.l2, RedisKVTier)
        assert ex.l1.tenant_quota_bytes == 32 * 1024**2 and ex.alpha_cap == 1.0
        assert ex.execute(req(chat_messages, preference)).tier is Tier.COMPUTE
        assert ex.l2.flush(10) and ex.l2.stats()["writes"] == 1
    finally:
        ex.close()
    assert build_executor(adapter, redis_client=redis_client, signing_secret=SECRET,
                          l2_enabled=False).l2 is None
    assert build_executor(adapter).l2 is None
    with pytest.raises(ValueError, match="signing_secret"):
        build_executor(adapter, redis_client=redis_client)


@pytest.mark.parametrize("pref", ["I am vegetarian.", ""])
def test_ttft_counts_the_planning_before_the_fetch(adapter, monkeypatch, pref):
    """Recall, reminders and fitting run before the first token too: ``ttft_ms`` is
    measured from the request's start. The executor's clock jumps 10 s during planning
    (an injected clock, not a slow step): the reported TTFT includes the jump."""
    import injection.engine.executor as executor_module

    jump = {"s": 0.0}

    class Clock:
        @staticmethod
        def perf_counter():
            return time.perf_counter() + jump["s"]

    monkeypatch.setattr(executor_module, "time", Clock)
    ex = build_executor(adapter, batch_max=2, metrics=Metrics())
    real_plan = ex.memories.plan

    def plan(*a, **kw):
        jump["s"] += 10.0
        return real_plan(*a, **kw)

    monkeypatch.setattr(ex.memories, "plan", plan)
    try:
        res = ex.execute(ExecutionRequest("t", "u", [{"role": "user", "content": "Hi"}], pref,
                                          max_new_tokens=2))
    finally:
        ex.close()
    assert 10_000 <= res.ttft_ms < 10_000 + 60_000


@pytest.mark.parametrize("contrast", [0.0, 1.0])
def test_a_vanishing_temperature_is_greedy_not_a_failed_draw(adapter, contrast):
    """Found by the live fuzzer: temperature 2.2e-313 (positive, 0 in float32) made every
    logit +-inf and the draw failed (a 502). Below GREEDY_BELOW the reply is the greedy one."""
    ex = build_executor(adapter, batch_max=4, metrics=Metrics())
    msgs = [{"role": "user", "content": "What should I cook?"}]
    try:
        tiny, greedy = (ex.execute(ExecutionRequest(
            "t", "u", msgs, "I like tests.", max_new_tokens=6, temperature=t, top_p=0.5,
            contrast=contrast, reuse_conversation=False)) for t in (2.2250738585e-313, 0.0))
    finally:
        ex.close()
    assert tiny.text == greedy.text and tiny.completion_tokens == greedy.completion_tokens
