"""The worker side of one chat turn: member -> prompt -> injected generation -> stored reply."""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings

from gpu_worker.host import get_executor
from injection.base import ExecutionRequest
from tenants.actions import do_record_chat, get_conversation
from tenants.errors import InactiveAccount, NotFound
from tenants.models import Conversation, Member, Message, Preference


def load_member(member_id: int) -> Member:
    member = Member.objects.select_related("tenant", "user").filter(pk=member_id).first()
    if member is None:
        raise NotFound("Unknown member.")
    if not (member.active and member.tenant.active and member.user.is_active):
        raise InactiveAccount()
    return member


def load_conversation(member: Member, conversation_id: int | None) -> Conversation | None:
    return None if conversation_id is None else get_conversation(member, conversation_id)


def trimmed_history(conv: Conversation | None, count_tokens, budget: int) -> list[dict]:
    """Newest-first messages that fit in ``budget`` tokens, returned oldest-first."""
    if conv is None or budget <= 0:
        return []
    picked: list[dict] = []
    used = 0
    newest_first = Message.objects.filter(tenant=conv.tenant_id, conversation=conv).order_by(
        "-created_at", "-id"
    )
    for msg in newest_first.iterator():
        cost = msg.token_count or count_tokens(msg.content)
        if used + cost > budget:
            break
        used += cost
        picked.append({"role": msg.role, "content": msg.content})
    return picked[::-1]


def build_request(member: Member, pref: Preference | None, prompt: str, params: dict):
    alpha = params.get("alpha")
    if alpha is None:
        alpha = pref.alpha if pref else 1.0
    return ExecutionRequest(
        tenant=str(member.tenant_id),
        user=str(member.pk),
        prompt=prompt,
        preference_text=pref.text if pref else "",
        injection_enabled=bool(pref and pref.enabled),
        alpha=float(alpha),
        max_new_tokens=int(params.get("max_new_tokens") or settings.CHAT_DEFAULT_MAX_NEW_TOKENS),
        temperature=float(params.get("temperature") or 0.0),
        top_p=float(params.get("top_p") or 1.0),
    )


def answer(
    member_id: int, conversation_id: int | None, message: str, params: dict, request_id: str
) -> dict[str, Any]:
    started = time.monotonic()
    member = load_member(member_id)
    conv = load_conversation(member, conversation_id)
    pref = Preference.objects.filter(tenant=member.tenant, member=member).first()
    executor = get_executor()
    adapter = executor.adapter
    history = trimmed_history(conv, adapter.count_tokens, settings.CHAT_HISTORY_TOKEN_BUDGET)
    prompt = adapter.render_chat(history + [{"role": "user", "content": message}])
    result = executor.execute(build_request(member, pref, prompt, params))
    reply = result.text.replace("\x00", "")  # PostgreSQL text cannot hold NUL; models emit it
    usage = {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "message_tokens": adapter.count_tokens(message),
    }
    cache = result.cache_info()
    cache["preference_version"] = pref.version if pref else None
    latency_ms = (time.monotonic() - started) * 1000
    conv = do_record_chat(
        member, conv, message=message, reply=reply, usage=usage, cache=cache,
        latency_ms=latency_ms, request_id=request_id,
    )
    usage.pop("message_tokens")
    return {
        "reply": reply,
        "conversation": conv.pk,
        "usage": usage,
        "cache": cache,
        "request_id": request_id,
    }
