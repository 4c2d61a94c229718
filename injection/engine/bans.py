"""A row's decoding constraints (``prompting/constraints.py``) applied to its logits.

Each constraint tuple becomes one map over the vocabulary, built once per tokenizer:
``to[i]`` is ``i`` (the token keeps the constraints), another token ``j`` (a case
constraint: the token's text lower- or upper-cased, where that is a token of its own that
keeps every constraint) or -1 (banned). A step moves each constrained row's probability
along the map: a banned token's share is dropped, a folded token's share is added to its
counterpart's. So under "lowercase" the model's "To" becomes its "to" with both their
shares (banning "To" alone left greedy replies starting "1. 1. 1."). The tokenizer's
special tokens (end of turn, ...) are always kept.

Applied to a row's raw logits, before a guide's contrast and the processors, so a guided
row's plausibility floor and top-p see only what the row may say. The row's scores are
then log-probabilities (the same argmax and draws as logits with those probabilities).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from injection.prompting.constraints import FOLDS, TRANSFORMS, violates

__all__ = ["apply", "fold", "token_map"]

_LOCK = threading.Lock()


def _texts(tokenizer: Any) -> list[str]:
    texts = getattr(tokenizer, "_kvinject_token_texts", None)
    if texts is None:
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        tokenizer._kvinject_token_texts = texts
    return texts


def token_map(tokenizer: Any, constraints: Sequence[str]) -> torch.Tensor | None:
    """``[len(tokenizer)]`` long: where each token goes under ``constraints`` (see module;
    None: none kept token by token). Built once per tokenizer and constraint tuple."""
    key = tuple(sorted(c for c in constraints if c not in TRANSFORMS))  # kept on the text
    if not key:
        return None
    with _LOCK:
        maps: dict[tuple, torch.Tensor] = tokenizer.__dict__.setdefault("_kvinject_maps", {})
        if key not in maps:
            maps[key] = _build(tokenizer, key)
        return maps[key]


def _build(tokenizer: Any, constraints: tuple[str, ...]) -> torch.Tensor:
    texts, special = _texts(tokenizer), set(tokenizer.all_special_ids)
    index = {t: i for i, t in enumerate(texts) if i not in special}
    case = next((c for c in constraints if c in FOLDS), None)
    to = []
    for i, text in enumerate(texts):
        if i in special:
            to.append(i)
            continue
        target = i
        if case is not None and violates(case, text):
            target = index.get(FOLDS[case](text), -1)
        if target >= 0 and any(violates(c, texts[target]) for c in constraints):
            target = -1
        to.append(target)
    return torch.tensor(to, dtype=torch.long)


def fold(scores: torch.Tensor, to: torch.Tensor) -> torch.Tensor:
    """One row's ``[V]`` scores moved along ``to`` (``token_map``): log-probabilities with
    the banned tokens at -inf; columns past the tokenizer's (padding) are dropped."""
    n = to.shape[0]
    probs = torch.softmax(scores.float(), dim=-1)[:n]
    to = to.to(probs.device, non_blocking=True)
    out = torch.zeros(scores.shape[-1], dtype=probs.dtype, device=probs.device)
    ok = to >= 0
    out.index_add_(0, to[ok], probs[ok])
    return torch.log(out)


def apply(rows: Sequence[Any], logits: torch.Tensor) -> torch.Tensor:
    """``logits`` (``[rows, V]``) with each constrained row (its ``sampler.ban``, a
    ``token_map``) folded; the same tensor when no row is constrained."""
    folded = [(i, r.sampler.ban) for i, r in enumerate(rows)
              if r.sampler is not None and r.sampler.ban is not None]
    if not folded:
        return logits
    logits = logits.float().clone()
    for i, to in folded:
        logits[i] = fold(logits[i], to)
    return logits
