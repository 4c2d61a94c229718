"""The worker side of the admin playground: one reply for a member, personalised or plain.

Nothing is stored and nothing of the text is logged. ``personalised`` with the saved
preference goes through the member's cache like a chat; an unsaved edit
(``preference_text`` given) is computed with ``user=None``: never cached under the
member's key, so their next real chat still uses their saved preference. With a
``stream_id`` the pieces go to that Redis stream as they are generated (gpu_worker.channels.streams),
and a reader that went away stops the generation.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from django.conf import settings

from gpu_worker.channels import streams
from gpu_worker.serving.chat_service import (
    build_request,
    instruction_rules,
    load_member,
    load_memories,
    memories_used,
)
from gpu_worker.serving.host import get_executor
from injection.base import DEFAULT_ALPHA, ExecutionRequest, MemoryItem
from tenants.errors import InvalidInput
from tenants.models import Member

VARIANTS = ("personalised", "plain")


def _memories(member: Member, variant: str, preference_text: str | None
              ) -> tuple[MemoryItem, ...]:
    """The member's memories; an unsaved preference edit stands in for the first one."""
    if variant == "plain":
        return ()
    memories = load_memories(member)
    if preference_text is None or not memories:
        return memories
    return ((MemoryItem("unsaved", preference_text),) if preference_text else ()) + memories[1:]


def _request(member: Member, message: str, variant: str, preference_text: str | None,
             alpha: float | None, max_new_tokens: int,
             memories: tuple[MemoryItem, ...] = (),
             contrast: float | None = None) -> ExecutionRequest:
    messages = [{"role": "user", "content": message}]
    params = {"max_new_tokens": max_new_tokens, "alpha": alpha, "contrast": contrast}
    if variant == "plain":  # no tenant instructions, no preference: the bare model
        return ExecutionRequest(tenant=str(member.tenant_id), user=None, messages=messages,
                                injection_enabled=False, max_new_tokens=max_new_tokens)
    pref = member.own_preference()
    if preference_text is None:
        return build_request(member, pref, messages, params, memories=memories)
    return ExecutionRequest(
        tenant=str(member.tenant_id), user=None, messages=messages,
        preference_text=preference_text, instructions=member.tenant.instructions,
        instruction_rules=instruction_rules(member.tenant),
        injection_enabled=True, memories=memories,
        alpha=float(alpha if alpha is not None else pref.alpha if pref else DEFAULT_ALPHA),
        contrast=contrast if contrast is not None else member.tenant.memory_contrast,
        reminder=member.tenant.memory_reminder,
        constrain=member.tenant.decoding_constraints,
        loop_guard=member.tenant.loop_guard,
        max_new_tokens=max_new_tokens)


def reply(member_id: int, message: str, variant: str, preference_text: str | None = None,
          alpha: float | None = None, max_new_tokens: int | None = None,
          stream_id: str | None = None, contrast: float | None = None) -> dict[str, Any]:
    if variant not in VARIANTS:
        raise InvalidInput(f"variant must be one of {', '.join(VARIANTS)}")
    started = time.monotonic()
    member = load_member(member_id)
    tokens = int(max_new_tokens or settings.CHAT_DEFAULT_MAX_NEW_TOKENS)
    # a one-off reply: its sequence K/V is never kept as a conversation entry
    memories = _memories(member, variant, preference_text)
    req = dataclasses.replace(_request(member, message, variant, preference_text, alpha, tokens,
                                       memories, contrast), reuse_conversation=False)
    pub = streams.publisher(stream_id) if stream_id else None
    if pub is not None:
        req = dataclasses.replace(req, on_text=pub.piece, cancelled=pub.cancelled)
    try:
        result = get_executor().execute(req)
    except BaseException:
        if pub is not None:
            pub.end("error")
        raise
    if pub is not None:
        pub.end("cancelled" if result.finish_reason == "cancelled" else "done")
    return {
        "variant": variant, "reply": result.text, "tier": result.tier.value,
        "prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
        "kv_tokens": result.kv_tokens,  # the injected system turn (counted in prompt_tokens)
        "cached_tokens": result.cached_tokens,
        "latency_ms": round((time.monotonic() - started) * 1000, 1),
        "kv_fetch_ms": round(result.kv_fetch_latency_ms, 1),
        "inference_ms": round(result.inference_latency_ms, 1),
        "ttft_ms": round(result.ttft_ms, 1), "finish_reason": result.finish_reason,
        "alpha_effective": result.alpha_effective, "injection_mode": result.injection_mode,
        "contrast_effective": result.contrast_effective,
        "unsaved_preference": preference_text is not None and variant == "personalised",
        "memories_used": memories_used(result, memories),
    }
