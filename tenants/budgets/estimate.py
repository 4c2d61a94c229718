"""What a chat will cost before it runs: its prompt, estimated on the web.

Counted with the model's own tokenizer (``tenants.api.context_limits.model_limits``,
the light ``tokenizers`` library: the web never loads the model): the message, the
history the worker will put before it (``/v1``: the request's messages; ``/api/chat``:
the stored conversation up to ``CHAT_HISTORY_TOKEN_BUDGET``), tool definitions, the
tenant instructions and the member's preference, plus the chat template's markup per
message. Without a
local model directory, four characters count as one token.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings

from tenants.api.context_limits import model_limits
from tenants.models import Member, Message, Preference

TEMPLATE_TOKENS_PER_MESSAGE = 8  # role markers and separators of a chat template


def model_path() -> str:
    """The workers' model dir as configured (as ``tenants.api.views.chat_model_path``)."""
    if settings.MODEL_PATH:
        return str(settings.MODEL_PATH)
    demo = settings.DEFAULT_MODEL == "demo"
    return str(settings.DEMO_MODEL_PATH if demo else settings.DEFAULT_MODEL_PATH)


def served_model() -> str:
    """The model's id as /v1 serves it (OPENAI_MODEL_ID, else the model dir's name)."""
    return settings.OPENAI_MODEL_ID or Path(model_path()).name


def count_tokens(texts: list[str]) -> int:
    limits = model_limits(model_path())
    if limits is None:
        return sum(len(t) // 4 + 1 for t in texts if t)
    tokenizer = limits[0]
    return sum(len(tokenizer.encode(t, add_special_tokens=False).ids) for t in texts if t)


def _stored_history(member: Member, conversation_id: int | None) -> list[str]:
    if conversation_id is None:
        return []
    budget, used, texts = settings.CHAT_HISTORY_TOKEN_BUDGET, 0, []
    rows = (Message.objects.filter(tenant=member.tenant_id, conversation_id=conversation_id,
                                   conversation__member=member)
            .order_by("-created_at", "-id").values_list("content", "token_count")[:400])
    for content, tokens in rows:
        used += tokens
        if texts and budget is not None and used > budget:
            break
        texts.append(content)
    return texts


def prompt_estimate(member: Member, conversation_id: int | None, message: str,
                    params: dict) -> int:
    """Tokens the worker's prompt for this chat is expected to hold."""
    history = params.get("history")
    texts = ([str(m.get("content") or "") for m in history] if history is not None
             else _stored_history(member, conversation_id))
    texts.append(message)
    if params.get("tools"):  # rendered into the prompt where the template supports them
        texts.append(json.dumps(params["tools"], separators=(",", ":")))
    pref = Preference.objects.filter(tenant=member.tenant_id, member=member).first()
    context = [member.tenant.instructions, pref.text if pref is not None and pref.enabled
               else ""]
    markup = TEMPLATE_TOKENS_PER_MESSAGE * (len(texts) + 1)
    return count_tokens(texts + context) + markup


def room_after(prompt_tokens: int) -> int:
    """Completion tokens that fit the model's context after a prompt (at least 1)."""
    limits = model_limits(model_path())
    if limits is None:
        return max(1, settings.CHAT_DEFAULT_MAX_NEW_TOKENS)
    return max(1, limits[1] - prompt_tokens)
