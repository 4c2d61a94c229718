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

from tenants.errors import ContextLengthExceeded

__all__ = ["check_fits", "model_limits"]


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
