"""InjectionExecutor: L1 -> L2 -> recompute preference K/V, then injected generation.

The design's ``_get_preference_kv`` / execute path, with its weak spots fixed:
alpha rules decided here (the adapter applies exactly what it is given), keys
include tenant + model fingerprint, a faulty tier degrades to recompute,
concurrent misses compute once, and ``torch.cuda.empty_cache()`` runs only at
the request boundary and in OOM recovery.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import torch

from injection.base import (
    ALPHA_CAP,
    ExecutionRequest,
    ExecutionResult,
    KVStore,
    PreferenceModel,
    Tier,
)
from injection.engine.guidance.plan import guide_figures, plan_guide, reminded_guide
from injection.engine.oom import on_cuda, with_oom_retry
from injection.engine.request_checks import history_len as _history_len
from injection.engine.request_checks import sampling_options
from injection.engine.request_checks import validate as _validate
from injection.engine.steps import kv_format
from injection.engine.turns import TurnGenerator, join
from injection.errors import InvalidRequest
from injection.kvcache.chain import SegmentChain, kind_stats
from injection.kvcache.conversation import ConversationStore
from injection.kvcache.kvsource import PreferenceKVSource, content_hash, user_or_none
from injection.memory.recall import MemoryPlanner, RecallOptions
from injection.metrics import METRICS, Metrics
from injection.prompting.emphasis_spans import emphasis_for
from injection.prompting.history import fit_history
from injection.prompting.opening import next_opening
from injection.prompting.output_filter import clean_reply
from injection.prompting.reminder import Reminder
from injection.prompting.template import compose_context

__all__ = ["InjectionExecutor", "content_hash"]

T = TypeVar("T")


class InjectionExecutor:
    """Runs :class:`ExecutionRequest` s against one model with tiered K/V caching.

    Args:
        adapter: the model (``ModelAdapter`` or any :class:`PreferenceModel`).
        l1: in-process CPU cache (``TenantLRU``) or None.
        l2: shared cache (``RedisKVTier``) or None.
        alpha_cap: effective alpha is ``min(request.alpha, alpha_cap)``.
        min_alpha: effective alpha at or below this means no injection at all.
        metrics: counters sink (default: the process-wide ``METRICS``).
        engine: a ``BatchEngine`` over ``adapter``: generation joins its running batch
            (None: one ``adapter.generate`` per request).
        conversation_max_bytes: with an engine, keep each conversation's sequence K/V up
            to this size in L1 for its next turn (0: no conversation reuse).
        one_pass: with an engine, a missing member segment is prefilled by the request
            itself before its prompt (alpha 1, no emphasis); False computes it apart.
    """

    def __init__(
        self,
        adapter: PreferenceModel,
        *,
        l1: KVStore | None,
        l2: KVStore | None,
        alpha_cap: float = ALPHA_CAP,
        min_alpha: float = 0.1,
        metrics: Metrics | None = None,
        engine: Any = None,
        conversation_max_bytes: int = 0,
        conversation_l1: KVStore | None = None,
        memory: RecallOptions | None = None, one_pass: bool = True,
    ) -> None:
        if not 0.0 <= min_alpha < alpha_cap:
            raise ValueError("need 0 <= min_alpha < alpha_cap")
        self.adapter, self.l1, self.l2 = adapter, l1, l2
        self.alpha_cap, self.min_alpha = float(alpha_cap), float(min_alpha)
        self.metrics = metrics if metrics is not None else METRICS
        self.kv_source = PreferenceKVSource(adapter, l1, l2, self.metrics)
        self.chain = SegmentChain(adapter, self.kv_source)
        self.engine = engine
        self.conv_l1 = conversation_l1 if conversation_l1 is not None else l1
        self.conversations = ConversationStore(
            self.conv_l1, l2, self.metrics,
            max_bytes=conversation_max_bytes if engine is not None else 0)
        self.turns = TurnGenerator(adapter, engine, self.conversations)
        self.memories = MemoryPlanner(adapter, memory, self.metrics)  # budget + recall
        self.one_pass = one_pass and engine is not None
        self._started = threading.local()  # when this thread's request began (``_since``)

    # -- public API -------------------------------------------------------------------
    def execute(self, req: ExecutionRequest) -> ExecutionResult:
        """Generate a reply for ``req``; raises InvalidRequest / ModelOOMError."""
        _validate(req)
        self.metrics.incr("requests")
        try:
            result = self._with_oom_retry(lambda: self._execute_once(req))
        finally:
            if self.engine is None and on_cuda(self.adapter):
                # the request boundary cleans up only without the batch engine: there other
                # rows are mid-generation and only OOM recovery empties the allocator's cache
                torch.cuda.empty_cache()
        self.metrics.incr(f"requests_tier_{result.tier.value}")
        return result

    def effective_alpha(self, alpha: float) -> float:
        return min(float(alpha), self.alpha_cap)

    def warm(self, tenant: str, user: str, preference_text: str, instructions: str = "",
             memories: tuple = ()) -> Tier:
        """Ensure the user's system-turn K/V (or memory segment) is cached; returns its tier."""
        if not tenant or not user_or_none(user):
            raise InvalidRequest("warm needs a tenant and a user")
        hello = [{"role": "user", "content": "Hello"}]  # the segment does not depend on it
        mem = self.memories.plan(ExecutionRequest(tenant, user, hello, preference_text,
                                                  instructions, memories=memories), on=False)
        context = compose_context(instructions, mem.text)
        if not context:
            return Tier.NONE
        parts, context = mem.cut(self.adapter, self.adapter.split_prompt(context, hello), context)
        if not parts.segment:
            return Tier.NONE
        split = self.chain.split(parts.segment, context, instructions)
        if split is None and not mem.text.strip():
            return Tier.NONE  # instructions alone are injected only as a shared segment
        chain = self._with_oom_retry(
            lambda: self.chain.get(tenant, user, parts.segment, split, 1.0))
        return chain.tier

    def invalidate(self, tenant: str, user: str | None = None) -> dict[str, Any]:
        """Evict ``tenant``'s (or one user's) entries from L1 and L2; counts per tier."""
        if not tenant:
            raise InvalidRequest("invalidate needs a tenant")
        out = self.kv_source.evict(tenant, user)
        if self.conv_l1 is not self.l1:  # conversation links in their own L1
            try:
                out["l1"] = (out["l1"] or 0) + self.conv_l1.evict(tenant, user)
            except Exception as exc:  # a tier fault is reported, not raised
                self.kv_source.fault("l1", "evict", exc)
                out["l1_error"] = type(exc).__name__
        self.metrics.incr("invalidations")
        return out

    def clear_l1(self) -> int:
        """Drop every L1 entry (segments and conversation links); returns how many."""
        stores = [self.l1] + ([self.conv_l1] if self.conv_l1 is not self.l1 else [])
        return sum(store.clear() for store in stores if store is not None)

    def stats(self) -> dict[str, Any]:
        """Engine counters plus each tier's own ``stats()``."""
        return {
            "metrics": self.metrics.snapshot(),
            "fingerprint": self.adapter.fingerprint,
            "kv": kv_format(self.adapter),
            "batch": self.engine.stats() if self.engine is not None else None,
            **self.kv_source.tier_stats(),
            "kinds": kind_stats(self.metrics.snapshot()["counters"], self.l1, self.conv_l1),
            "conversations_l1": self.conv_l1.stats() if self.conv_l1 not in (None, self.l1)
            else None,
        }

    def close(self) -> None:
        """Finish pending L2 writes and stop tier threads (worker shutdown)."""
        self.turns.close()  # the openings being prefilled finish first: they need the engine
        self.engine.close() if self.engine is not None else None
        for store in (self.l2, self.l1):
            close = getattr(store, "close", None)
            if callable(close):
                try:
                    close()
                except Exception as exc:  # shutting down: report, never raise
                    self.kv_source.fault("l2" if store is self.l2 else "l1", "close", exc)

    # -- request path -------------------------------------------------------------------
    def _execute_once(self, req: ExecutionRequest) -> ExecutionResult:
        self._started.value, alpha = time.perf_counter(), self.effective_alpha(req.alpha)
        sampling = sampling_options(req)
        # the member's part is alpha-scaled; the tenant's shared segment never is
        mem = self.memories.plan(req, on=req.injection_enabled and alpha > self.min_alpha)
        personal = req.injection_enabled and bool(mem.text.strip())
        personal = personal and alpha > self.min_alpha
        context = compose_context(req.instructions, mem.text if personal else "")
        remind = Reminder.for_request(req, getattr(self.adapter, "renderer", None), personal,
                                      partial(self.memories.relevant, req.tenant))  # + recall
        messages = self._fit(req, context, remind)
        parts = self.adapter.split_prompt(context, messages) if context else None
        parts, head_ctx = mem.cut(self.adapter, parts, context)  # recalled: after the cache
        split = self.chain.split(parts.segment, head_ctx, req.instructions) if (
            parts is not None and parts.segment) else None
        if not personal and split is None:
            return self._plain(self.adapter.plain_prompt(context, messages), req, sampling,
                               mode="none", messages=messages)
        if not parts.segment:  # the template admits no verified split: context stays text
            self.metrics.incr("injection_inline")
            return self._plain(parts.prompt, req, sampling, mode=parts.mode, messages=messages)
        member_alpha = alpha if personal else 1.0
        t0 = time.perf_counter()
        chash = content_hash(parts.segment)
        emph, spans = emphasis_for(self.adapter, req, parts.segment, split,
                                   on=personal and self.engine is not None,
                                   texts=mem.emphasis_texts(), after=lambda n: mem.recalled_spans(
                                       self.adapter, parts.prompt, n))
        plan = self.turns.plan(req, messages, parts.prompt, chash, member_alpha, injected=True,
                               emphasis=emph)
        # one-pass miss: a missing member segment is computed in this turn's own prefill
        defer = self.one_pass and plan.cached is None and member_alpha == 1.0 and not emph
        chain = self.chain.get(req.tenant, req.user, parts.segment, split, member_alpha,
                               defer=defer)
        fetch_ms = (time.perf_counter() - t0) * 1000.0
        assert chain.kv is None or chain.kv.keys.is_cpu, "cached K/V must live on CPU"
        prefix = join(chain.kv, plan.cached)  # a conversation hit continues its link
        done = plan.cached.num_tokens if plan.cached is not None else 0
        guide = plan_guide(self.adapter, self.chain, req, messages, mem, remind,  # contrast
                           on=personal and self.engine is not None,
                           reminded=lambda s: reminded_guide(
                               self.adapter, s, context, mem, [*messages[:-1], dict(
                                   req.messages[-1])], prefix, chain.lead, plan.prompt_ids, done))
        out = self.turns.run(plan, req, prefix, sampling, spans, lead=chain.lead,
                             capture=chain.capture, guide=guide)
        infer_ms = (time.perf_counter() - t0) * 1000.0 - fetch_ms
        text, stripped = clean_reply(out.text, self.metrics.incr)
        head = chain.num_tokens
        self.turns.keep(plan, req, messages, text, out, head, chash, member_alpha, opening=partial(
            next_opening, self.adapter.plain_prompt, context, messages, text, remind))
        self.metrics.observe_ms(f"fetch_{chain.tier.value}", fetch_ms)
        reused = done  # the conversation's cached tokens this turn continued
        prompt_tokens = head + len(out.prompt_token_ids)
        return ExecutionResult(
            text=text, tier=chain.tier, prompt_tokens=prompt_tokens,
            completion_tokens=len(out.token_ids), alpha_effective=alpha if personal else 0.0,
            content_hash=chash, fingerprint=self.adapter.fingerprint, kv_tokens=head,
            kv_layers_count=_layers(chain, self.adapter), kv_bytes_cpu=chain.stored_bytes + len(
                chain.lead) * getattr(self.engine, "bytes_per_token", 0),
            kv_bytes_gpu_peak=out.kv_bytes_gpu, kv_transfer_latency_ms=out.kv_transfer_ms,
            kv_fetch_latency_ms=fetch_ms, inference_latency_ms=infer_ms,
            ttft_ms=self._since(t0) + fetch_ms + out.first_token_ms, stripped_count=stripped,
            injection_mode=parts.mode, history_messages=_history_len(messages),
            finish_reason=out.finish_reason, reused_tokens=reused,
            cached_tokens=min(chain.cached_tokens + reused, prompt_tokens),
            emphasis_effective=emph, **guide_figures(guide, out),
            extra={"segments": chain.tiers, "preference_applied": personal, **mem.extra()},
        )

    def _fit(self, req: ExecutionRequest, context: str,
             remind: Reminder | None = None) -> list[dict[str, str]]:
        """History in whole turns within the context and cap, reminded (cut sized deep)."""
        messages, remind = [dict(m) for m in req.messages], remind or Reminder()
        n_head = next((i for i, m in enumerate(messages) if m["role"] != "system"), 0)
        max_pos = getattr(self.adapter, "max_positions", None)
        count = self.adapter.prompt_tokens
        return remind.apply(fit_history(
            lambda msgs: count(context, remind.apply(msgs)), messages[n_head:-1],
            messages[-1:], limit=max_pos - req.max_new_tokens if max_pos else None,
            history_cap=req.history_token_budget, head=messages[:n_head],
            size_count=lambda msgs: count(context, remind.apply(msgs, deep=True))))

    def _plain(
        self, prompt: str, req: ExecutionRequest, sampling: dict[str, Any], *, mode: str,
        messages: list[dict[str, str]],
    ) -> ExecutionResult:
        """No injection and no preference K/V (tier NONE); the conversation's may be reused."""
        t0 = time.perf_counter()
        plan = self.turns.plan(req, messages, prompt, "", 0.0, injected=False)
        out = self.turns.run(plan, req, plan.cached, sampling)
        reused = plan.cached.num_tokens if plan.cached is not None else 0
        prompt_tokens = len(out.prompt_token_ids)
        infer_ms = (time.perf_counter() - t0) * 1000.0
        text, stripped = clean_reply(out.text, self.metrics.incr)
        self.turns.keep(plan, req, messages, text, out, 0, "", 0.0)
        history = _history_len(messages)
        return ExecutionResult(
            text=text, tier=Tier.NONE, prompt_tokens=prompt_tokens,
            completion_tokens=len(out.token_ids), fingerprint=self.adapter.fingerprint,
            inference_latency_ms=infer_ms, ttft_ms=self._since(t0) + out.first_token_ms,
            stripped_count=stripped,
            injection_mode=mode, history_messages=history, finish_reason=out.finish_reason,
            reused_tokens=reused, cached_tokens=min(reused, prompt_tokens),
        )

    def _since(self, t0: float) -> float:
        """ms of this request's planning (recall, reminders, fitting) before ``t0``."""
        return (t0 - getattr(self._started, "value", t0)) * 1000.0

    def _with_oom_retry(self, fn: Callable[[], T]) -> T:
        return with_oom_retry(fn, self.metrics)


def _layers(chain: Any, adapter: PreferenceModel) -> int:
    return chain.kv.num_layers if chain.kv is not None else int(getattr(adapter, "num_layers", 0))
