"""InjectionExecutor: L1 -> L2 -> recompute preference K/V, then injected generation.

A request is planned first (``planning/planner.py``: a ``TurnPlan``, decided without
touching K/V), then run (``_run``): the injected segments fetched or computed, the guide's
K/V head, the generation as a batch engine row, the turn's link kept. The design's ``_get_preference_kv`` / execute path, with its weak spots fixed:
alpha rules decided here (the adapter applies exactly what it is given), keys
include tenant + model fingerprint, a faulty tier degrades to recompute,
concurrent misses compute once, and ``torch.cuda.empty_cache()`` runs only at
the request boundary and in OOM recovery.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from injection.base import (
    ALPHA_CAP,
    ExecutionRequest,
    ExecutionResult,
    KVStore,
    PreferenceModel,
    Tier,
    run_here,
)
from injection.engine.guidance.anchor import build_anchor, scores
from injection.engine.guidance.plan import build_guide
from injection.engine.guidance.probe import MemoryLeans
from injection.engine.oom import on_cuda, with_oom_retry
from injection.engine.planning.plan import TurnPlan
from injection.engine.planning.planner import TurnPlanner, layout
from injection.engine.planning.results import Reply, injected_result, plain_result
from injection.engine.request_checks import validate as _validate
from injection.engine.steps import kv_format
from injection.engine.turns import TurnGenerator, engine_idle, join
from injection.errors import InvalidRequest
from injection.kvcache.chain import SegmentChain, kind_stats
from injection.kvcache.conversation import ConversationStore
from injection.kvcache.kvsource import PreferenceKVSource, content_hash, user_or_none
from injection.memory.recall import MemoryPlanner, RecallOptions
from injection.metrics import METRICS, Metrics
from injection.prompting.constraints import transform
from injection.prompting.output_filter import clean_reply
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
            itself before its prompt (alpha 1); False computes it apart.
        memory_lean: a one-memory first turn leans with the member's lean, measured once on
            probe questions and cached (``engine/guidance/probe.py``); False: a guide row.
            Off with an engine of one row (``max_batch`` 1): a probe's guide row never runs
            there, so its 8 probes could never produce a lean.
        guide_keeps_instructions: the one-memory contrast guide keeps the tenant's
            instructions (``engine/guidance/plan.py``; off: measured, they keep precedence).
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
        guide_keeps_instructions: bool = False, memory_lean: bool = True,
    ) -> None:
        if not 0.0 <= min_alpha < alpha_cap:
            raise ValueError("need 0 <= min_alpha < alpha_cap")
        self.adapter, self.l1, self.l2 = adapter, l1, l2
        self.alpha_cap, self.min_alpha = float(alpha_cap), float(min_alpha)
        self.metrics = metrics if metrics is not None else METRICS
        # forwards of no row run as engine work where an engine exists (prefill/forwards.py)
        forward = engine.forward if engine is not None else run_here
        self.kv_source = PreferenceKVSource(adapter, l1, l2, self.metrics, forward)
        self.chain = SegmentChain(adapter, self.kv_source)
        self.engine = engine
        self.conv_l1 = conversation_l1 if conversation_l1 is not None else l1
        self.conversations = ConversationStore(
            self.conv_l1, l2, self.metrics,
            max_bytes=conversation_max_bytes if engine is not None else 0)
        self.turns = TurnGenerator(adapter, engine, self.conversations)
        self.memories = MemoryPlanner(adapter, memory, self.metrics, forward)  # + recall
        self.leans = MemoryLeans(adapter, engine, self.kv_source, self.chain)
        self.planner = TurnPlanner(adapter, self.memories, self.turns, alpha_cap=alpha_cap,
                                   min_alpha=min_alpha, batching=engine is not None,
                                   one_pass=one_pass,
                                   guide_keeps_instructions=guide_keeps_instructions,
                                   memory_lean=memory_lean and _guides(engine))

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

    def warm(self, tenant: str, user: str, preference_text: str, instructions: str = "",
             memories: tuple = (), contrast: float | None = None) -> Tier:
        """Ensure the user's system-turn K/V (or memory segment) is cached, and the member's
        lean where their first turns lean (``guidance/probe.py``; ``contrast``: the tenant's
        strength, else the model's default); returns the segment's tier."""
        if not tenant or not user_or_none(user):
            raise InvalidRequest("warm needs a tenant and a user")
        hello = [{"role": "user", "content": "Hello"}]  # the segment does not depend on it
        mem = self.memories.plan(ExecutionRequest(tenant, user, hello, preference_text,
                                                  instructions, memories=memories), on=False)
        context = compose_context(instructions, mem.text)
        if not context:
            return Tier.NONE
        parts, split = layout(self.adapter, instructions, context, hello)
        if not parts.segment:
            return Tier.NONE
        if split is None and not mem.text.strip():
            return Tier.NONE  # instructions alone are injected only as a shared segment
        chain = self._with_oom_retry(
            lambda: self.chain.get(tenant, user, parts.segment, split, 1.0))
        plan = self.planner.plan(ExecutionRequest(
            tenant, user, hello, preference_text, instructions, memories=memories,
            contrast=contrast, reuse_conversation=False))
        if plan.lean is not None and plan.segment == parts.segment:
            self.leans.get(plan.lean, tenant, user, chain.kv)
        return chain.tier

    def idle(self) -> bool:
        """Whether the batch engine runs and holds no row (without one: always)."""
        return self.engine is None or engine_idle(self.engine)

    def invalidate(self, tenant: str, user: str | None = None) -> dict[str, Any]:
        """Evict ``tenant``'s (or one user's) entries from L1 and L2; counts per tier."""
        if not tenant:
            raise InvalidRequest("invalidate needs a tenant")
        out = self.kv_source.evict(tenant, user)
        if user is None:  # the tenant's: its memories' embeddings go too (recall, reminders)
            self.memories.evict(tenant)
        if self.conv_l1 is not self.l1:  # conversation links in their own L1
            try:
                out["l1"] = (out["l1"] or 0) + self.conv_l1.evict(tenant, user)
            except Exception as exc:  # a tier fault is reported, not raised
                self.kv_source.fault("l1", "evict", exc)
                out["l1_error"] = type(exc).__name__
        self.metrics.incr("invalidations")
        return out

    def drop_conversation(self, tenant: str, user: str, conversation: str) -> dict[str, Any]:
        """Evict the links of one stored conversation from L1 and L2 (a deleted
        conversation); the member's segments and lean stay; counts per tier."""
        if not (tenant and user and conversation):
            raise InvalidRequest("drop_conversation needs a tenant, a user and a conversation")
        out = self.conversations.drop(tenant, user, conversation)
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
        started = time.perf_counter()
        plan = self.planner.plan(req)
        t0 = time.perf_counter()
        planning_ms = (t0 - started) * 1000.0
        if not plan.injected:
            if plan.mode != "none":  # the template admits no verified split: text it stays
                self.metrics.incr("injection_inline")
            out = self.turns.run(plan, plan.link.cached)
            reply = self._reply(plan, req, out, 0, planning_ms, 0.0, t0)
            return plain_result(plan, reply, self.adapter.fingerprint)
        return self._run(plan, req, planning_ms)

    def _run(self, plan: TurnPlan, req: ExecutionRequest, planning_ms: float) -> ExecutionResult:
        """Fetch (or compute) the planned segments, build the guide, generate, keep."""
        t0 = time.perf_counter()
        chain = self.chain.get(req.tenant, req.user, plan.segment, plan.split,
                               plan.member_alpha, defer=plan.defer)
        fetch_ms = (time.perf_counter() - t0) * 1000.0
        assert chain.kv is None or chain.kv.is_cpu, "cached K/V must live on CPU"
        prefix = join(chain.kv, plan.link.cached)  # a conversation hit continues its link
        guide = build_guide(plan.guide, self.chain, req.tenant, prefix, chain.lead,
                            plan.link.done)
        anchored = build_anchor(plan.anchor, self.chain, req.tenant, chain.kv)
        first, anchor_tokens = scores(self.engine, anchored)
        t1 = time.perf_counter()
        lean, lean_from, (probed, probe_steps) = self.leans.get(plan.lean, req.tenant, req.user,
                                                                chain.kv)
        fetch_ms += (time.perf_counter() - t1) * 1000.0  # a probe: before the first token
        if lean is not None and anchored is not None:  # its first token: the anchor's
            lean = lean.after_first() if first is not None else None
        out = self.turns.run(plan, prefix, lead=chain.lead, capture=chain.capture, guide=guide,
                             first=first, lean=(lean, plan.lean.strength) if lean else None)
        reply = self._reply(plan, req, out, chain.num_tokens, planning_ms, fetch_ms, t0)
        self.metrics.observe_ms(f"fetch_{chain.tier.value}", fetch_ms)
        if anchored is not None and first is not None:
            guided = (anchored.strength, anchor_tokens + probed, probe_steps)
        else:
            guided = (plan.lean.strength, probed, probe_steps) if lean is not None else None
        return injected_result(plan, reply, chain, guide, self.adapter, self.engine,
                               anchored=guided, lean=lean_from)

    def _reply(self, plan: TurnPlan, req: ExecutionRequest, out: Any, head: int,
               planning_ms: float, fetch_ms: float, t0: float) -> Reply:
        """The reply's text cleaned, the turn's link kept (after its ``head`` injected
        tokens), and the timings."""
        infer_ms = (time.perf_counter() - t0) * 1000.0 - fetch_ms
        text, stripped = clean_reply(out.text, self.metrics.incr)
        text = transform(plan.sampling.get("constraints", ()), text)  # as the stream sent it
        self.turns.keep(plan, req, text, out, head)
        return Reply(out, text, stripped, planning_ms, fetch_ms, infer_ms)

    def _with_oom_retry(self, fn: Callable[[], T]) -> T:
        return with_oom_retry(fn, self.metrics)


def _guides(engine: Any) -> bool:
    """Whether ``engine`` runs guide rows (a probe needs one): two rows fit its batch."""
    return engine is not None and engine.max_batch >= 2
