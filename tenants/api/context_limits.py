"""Refuse a chat that cannot fit the model's context before any worker sees it.

The web process never loads the model stack (torch/transformers): it reads the model
directory's ``config.json`` and ``tokenizer.json`` with the light ``tokenizers``
library. The check is a lower bound (the chat template's markup is not counted), so
it only refuses what certainly cannot fit; the worker's exact check is the backstop
and answers with the same error. Without a local model directory the check is skipped.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from django.conf import settings

from tenants.errors import ContextLengthExceeded

__all__ = ["check_fits", "completion_room", "model_limits"]

# Template markup per message (role tags, separators) the lower bound leaves out: reserved
# when the reply may run "until the context is full", so the worker's exact count fits.
MARKUP_TOKENS = 8


@functools.lru_cache(maxsize=4)
def model_limits(path: str) -> tuple[Any, int] | None:
    """``(tokenizer, max_positions)`` of a local HF model dir, or None if unknown."""
    root = Path(path)
    tok_file, cfg_file = root / "tokenizer.json", root / "config.json"
    if not (tok_file.is_file() and cfg_file.is_file()):
        return None
    config = json.loads(cfg_file.read_text())
    max_pos = config.get("text_config", config).get("max_position_embeddings")
    if not isinstance(max_pos, int) or max_pos <= 0:
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tok_file)), max_pos


def check_fits(model_path: str | Path, texts: list[str], max_new_tokens: int) -> None:
    """Raise ContextLengthExceeded if ``texts`` + ``max_new_tokens`` exceed the model."""
    limits = model_limits(str(model_path))
    if limits is None:
        return
    tokenizer, max_pos = limits
    needed = max_new_tokens + sum(
        len(tokenizer.encode(t, add_special_tokens=False).ids) for t in texts if t
    )
    if needed > max_pos:
        raise ContextLengthExceeded(
            f"The message, your preference and max_new_tokens need at least {needed} tokens; "
            f"the model's context holds {max_pos}. Shorten the message or lower max_new_tokens.",
            needed_tokens=needed, context_tokens=max_pos,
        )


def _count(tokenizer: Any, texts: list[str]) -> int:
    return sum(len(tokenizer.encode(t, add_special_tokens=False).ids) for t in texts if t)


def completion_room(model_path: str | Path, texts: list[str], *, requested: int | None,
                    cap: int, param: str = "max_tokens", history: list[str] = (),
                    history_cap: int | None = None) -> int:
    """``max_new_tokens`` for an OpenAI-style request, as OpenAI decides it.

    ``texts`` must fit (the new message, the member's context); ``history`` (the earlier
    turns) is what the worker keeps in whole turns, newest first, as far as the context and
    ``history_cap`` allow, so it never makes a request fail. A ``requested`` length (a
    ``max_tokens``) that cannot fit beside ``texts`` is OpenAI's context-length error naming
    ``param``; one that fits is served up to the server's ``cap``. Without one the reply
    may run until the context is full (at most ``cap``), history counted as it will be kept.
    """
    limits = model_limits(str(model_path))
    if limits is None:
        return max(1, min(requested or cap, cap))
    tokenizer, max_pos = limits
    prompt = _count(tokenizer, texts)
    if requested is not None and prompt + requested > max_pos:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {max_pos} tokens. However, you requested "
            f"at least {prompt + requested} tokens ({prompt} in the messages and your "
            f"preference, {requested} in the completion). Please reduce the length of the "
            f"messages or the completion.", param=param, needed_tokens=prompt + requested,
            context_tokens=max_pos)
    if requested is not None:  # refused above only if it certainly cannot fit
        return min(requested, cap)
    room = max_pos - prompt - MARKUP_TOKENS * (len(texts) + 1)
    if room < 1:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {max_pos} tokens. However, your "
            f"message and your preference need at least {prompt} tokens, which leaves no "
            f"room for a reply. Please reduce the length of the messages.", param="messages",
            needed_tokens=prompt, context_tokens=max_pos)
    kept = _count(tokenizer, list(history)) + MARKUP_TOKENS * len(history)
    kept = kept if history_cap is None else min(kept, history_cap)
    if room - kept >= 1:  # else the worker drops history to make room
        room -= kept
    return min(room, cap)


def completion_cap(tenant) -> int:
    """The most tokens one reply may have for ``tenant``'s members: its own cap when set,
    never above the server's ``CHAT_MAX_NEW_TOKENS``."""
    own = getattr(tenant, "max_completion_tokens", None)
    return min(settings.CHAT_MAX_NEW_TOKENS, own) if own else settings.CHAT_MAX_NEW_TOKENS
