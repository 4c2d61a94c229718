"""What a chat will cost before it runs: its prompt, estimated on the web.

Counted with the model's own tokenizer (``tenants.api.context_limits.model_limits``,
the light ``tokenizers`` library: the web never loads the model): the message, the
history the engine will keep before it (``/v1``: the request's messages; ``/api/chat``:
the stored conversation; both cut by the engine's one rule, ``tenants.history``, within
``CHAT_HISTORY_TOKEN_BUDGET``), tool definitions, the tenant instructions and the
member's preference, plus the chat template's markup per message. Without a local model
directory, four characters count as one token.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings

from tenants.api.context_limits import model_limits
from tenants.history import TEMPLATE_TOKENS_PER_MESSAGE, fit_counted, stored_history
from tenants.models import Member


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


def history_texts(member: Member, conversation_id: int | None,
                  history: list[dict] | None) -> tuple[list[str], int]:
    """The history the engine will keep before the message, and its tokens: of the
    request's own messages (``/v1``, each counted here), or of the stored conversation as
    the worker sends it (``/api/chat``, counted with the model's tokenizer once kept)."""
    if history is not None:
        counted = [{"role": m.get("role"), "text": str(m.get("content") or ""),
                    "tokens": count_tokens([str(m.get("content") or "")])} for m in history]
        kept = fit_counted(counted, settings.CHAT_HISTORY_TOKEN_BUDGET)
        return [m["text"] for m in kept], sum(m["tokens"] for m in kept)
    if conversation_id is None:
        return [], 0
    texts = [m["content"] for m in stored_history(
        member.tenant_id, member.pk, conversation_id, settings.CHAT_HISTORY_TOKEN_BUDGET,
        as_kept=True)]
    return texts, count_tokens(texts)


def prompt_estimate(member: Member, conversation_id: int | None, message: str,
                    params: dict) -> int:
    """Tokens the worker's prompt for this chat is expected to hold."""
    history, tokens = history_texts(member, conversation_id, params.get("history"))
    texts = [message]
    if params.get("tools"):  # rendered into the prompt where the template supports them
        texts.append(json.dumps(params["tools"], separators=(",", ":")))
    pref = member.own_preference()
    context = [member.tenant.instructions, pref.text if pref is not None and pref.enabled
               else ""]
    markup = TEMPLATE_TOKENS_PER_MESSAGE * (len(history) + len(texts) + 1)
    return tokens + count_tokens(texts + context) + markup


def room_after(prompt_tokens: int) -> int:
    """Completion tokens that fit the model's context after a prompt (at least 1)."""
    limits = model_limits(model_path())
    if limits is None:
        return max(1, settings.CHAT_DEFAULT_MAX_NEW_TOKENS)
    return max(1, limits[1] - prompt_tokens)
