"""What the decoding constraints read of a tokenizer and a reply's text: every token's
text (built once per tokenizer) and where a sentence ends."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["ended", "masks", "only", "tail_ended", "token_texts"]


def token_texts(tokenizer: Any) -> list[str]:
    """Each token id's text, decoded once per tokenizer."""
    texts = getattr(tokenizer, "_kvinject_token_texts", None)
    if texts is None:
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        tokenizer._kvinject_token_texts = texts
    return texts


def masks(tokenizer: Any, name: str, build: Callable[[list[str]], Any]) -> Any:
    """``build(token_texts(tokenizer))``, built once per tokenizer and ``name`` (a
    constraint's ``[V]`` masks: tens of milliseconds of Python each, on the request's
    thread); never changed by its callers."""
    built = getattr(tokenizer, "_kvinject_masks", None)
    if built is None:
        built = tokenizer._kvinject_masks = {}
    if name not in built:
        built[name] = build(token_texts(tokenizer))
    return built[name]


_END = re.compile(r"[^\W\d_][.!?]+[\"')\]]*\s*$")  # a word's end, then .!? ("1." is a list's)


def ended(text: str) -> bool:
    """Whether ``text`` ends a sentence (a word, then ".", "!" or "?")."""
    return _END.search(text) is not None


def tail_ended(gen: Sequence[int], texts: list[str]) -> bool:
    """Whether the reply ``gen`` (token ids; ``texts``: ``token_texts``) has just ended a
    sentence (its last three tokens read by ``ended``)."""
    return ended("".join(texts[t] for t in gen[-3:]))


def only(scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """A row's ``[V]`` scores with every token outside ``keep`` (``[V']`` bool, the
    tokenizer's vocabulary; padding columns past it dropped) at -inf; the same scores
    where that would leave no token."""
    n = min(keep.shape[0], scores.shape[0])
    out = torch.full_like(scores, float("-inf"))
    out[:n] = torch.where(keep[:n].to(scores.device, non_blocking=True), scores[:n], out[:n])
    return out if torch.isfinite(out).any() else scores
