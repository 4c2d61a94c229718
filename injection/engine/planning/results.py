"""A planned turn's ``ExecutionResult``: the reply, what was injected and reused, timings."""

from __future__ import annotations

from typing import Any, NamedTuple

from injection.base import ExecutionResult, Tier
from injection.engine.guidance.plan import guide_figures
from injection.engine.planning.plan import TurnPlan
from injection.engine.request_checks import history_len

__all__ = ["Reply", "injected_result", "plain_result"]


class Reply(NamedTuple):
    """What the run step produced: the generation, its cleaned text, and its timings."""

    out: Any  # ``GenerationOutput``
    text: str
    stripped: int  # tool-call markup and control characters removed from the text
    planning_ms: float  # the plan (recall, reminders, fitting, the link's lookup)
    fetch_ms: float  # the injected segments (L1, L2 or computed; 0 when none)
    infer_ms: float


def plain_result(plan: TurnPlan, reply: Reply, fingerprint: str) -> ExecutionResult:
    """Nothing injected (tier NONE); the conversation's link may have been continued."""
    out, reused = reply.out, plan.link.done
    prompt_tokens = len(out.prompt_token_ids)
    return ExecutionResult(
        text=reply.text, tier=Tier.NONE, prompt_tokens=prompt_tokens,
        completion_tokens=len(out.token_ids), fingerprint=fingerprint,
        inference_latency_ms=reply.infer_ms,
        ttft_ms=reply.planning_ms + out.first_token_ms, stripped_count=reply.stripped,
        injection_mode=plan.mode, history_messages=history_len(list(plan.messages)),
        finish_reason=out.finish_reason, reused_tokens=reused,
        cached_tokens=min(reused, prompt_tokens),
    )


def injected_result(plan: TurnPlan, reply: Reply, chain: Any, guide: Any, model: Any,
                    engine: Any, anchored: tuple[float, int] | None = None,
                    lean: str = "") -> ExecutionResult:
    """The injected ``chain`` (``ChainKV``) before the prompt, with ``guide`` or none;
    ``anchored``: the anchor's (or the member's lean's) strength and prefilled tokens
    (``guidance/anchor.py``, ``guidance/probe.py``); ``lean``: where the lean came from."""
    out, head, reused = reply.out, chain.num_tokens, plan.link.done
    prompt_tokens = head + len(out.prompt_token_ids)
    layers = chain.kv.num_layers if chain.kv is not None else int(
        getattr(model, "num_layers", 0))
    return ExecutionResult(
        text=reply.text, tier=chain.tier, prompt_tokens=prompt_tokens,
        completion_tokens=len(out.token_ids), alpha_effective=plan.alpha,
        content_hash=plan.chash, fingerprint=model.fingerprint, kv_tokens=head,
        kv_layers_count=layers, kv_bytes_cpu=chain.stored_bytes + len(
            chain.lead) * getattr(engine, "bytes_per_token", 0),
        kv_bytes_gpu_peak=out.kv_bytes_gpu, kv_transfer_latency_ms=out.kv_transfer_ms,
        kv_fetch_latency_ms=reply.fetch_ms, inference_latency_ms=reply.infer_ms,
        ttft_ms=reply.planning_ms + reply.fetch_ms + out.first_token_ms,
        stripped_count=reply.stripped, injection_mode=plan.mode,
        history_messages=history_len(list(plan.messages)), finish_reason=out.finish_reason,
        reused_tokens=reused, cached_tokens=min(chain.cached_tokens + reused, prompt_tokens),
        **guide_figures(guide, out, anchored),
        constraints=list(plan.own_constraints),
        extra={"segments": chain.tiers, "preference_applied": plan.personal,
               **({"lean": lean} if lean else {}), **plan.memory.extra()},
    )
