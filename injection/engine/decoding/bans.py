"""A row's decoding constraints (``prompting/constraints.py``) applied to its logits (the
phrases it opens and closes with, its options: ``phrases.py``).

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

import re
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from injection.engine.decoding.bullets import first
from injection.engine.decoding.highlights import mask
from injection.engine.decoding.keywords import fresh
from injection.engine.decoding.phrases import Phrases, choices, forced, holds, phrases
from injection.engine.decoding.placeholders import mask as placeholder_mask
from injection.engine.decoding.text import token_texts
from injection.prompting.constraints import FOLDS, tokenwise, violates

__all__ = ["Phrases", "TokenMap", "apply", "fold", "forced", "prepare", "row", "token_map"]

_LOCK = threading.Lock()


def _words(tokenizer: Any) -> dict[str, list[int]]:
    """Each word (letters, lower-cased) -> the tokens whose text holds it (``ban:``)."""
    words = getattr(tokenizer, "_kvinject_token_words", None)
    if words is None:
        special, words = set(tokenizer.all_special_ids), {}
        for i, text in enumerate(token_texts(tokenizer)):
            if i in special:
                continue
            for w in {w.lower() for w in re.findall(r"[A-Za-z]+", text)}:
                words.setdefault(w, []).append(i)
        tokenizer._kvinject_token_words = words
    return words


class TokenMap(NamedTuple):
    """Where each token goes (``to``: itself, a twin, or -1), and the same as what a step
    needs: ``keep`` (a token that stays) and the moved tokens' ``src`` -> ``dst``."""

    to: torch.Tensor
    keep: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor

    @classmethod
    def of(cls, to: torch.Tensor) -> TokenMap:
        own = to == torch.arange(to.shape[0])
        moved = ((to >= 0) & ~own).nonzero().flatten()
        return cls(to, own, moved, to[moved])


def token_map(tokenizer: Any, constraints: Sequence[str]) -> TokenMap | None:
    """Where each token goes under ``constraints`` (see module; None: none kept token by
    token). The map of the fixed constraints (lowercase, no commas: a handful of sets) is
    built once per tokenizer; banned words, a member's own text, are applied to it per
    request and never cached (a cache keyed by them would tell one tenant, by its timing,
    which words another's members ban)."""
    fixed = tuple(sorted(c for c in constraints if tokenwise(c) and not c.startswith("ban:")))
    banned = sorted({i for c in constraints if c.startswith("ban:")
                     for i in _words(tokenizer).get(c[4:], ())})
    if not fixed and not banned:
        return None
    with _LOCK:
        maps: dict[tuple, TokenMap] = tokenizer.__dict__.setdefault("_kvinject_maps", {})
        if fixed not in maps:
            maps[fixed] = TokenMap.of(_build(tokenizer, fixed))
        base = maps[fixed]
    if not banned:
        return base
    ids = torch.tensor(banned, dtype=torch.long)
    to = base.to.clone()
    to[ids] = -1
    to[torch.isin(to, ids)] = -1  # folded onto a banned word ("Very" -> "very") too
    return TokenMap.of(to)


def prepare(tokenizer: Any, constraints: Sequence[str], eos: Sequence[int] = ()
            ) -> tuple[TokenMap | None, Phrases | None]:
    """A row's token map and phrases (``eos``: the model's end-of-turn ids), built where
    the request is submitted (its caller's thread, not the engine's loop: a tokenizer's
    first map takes a fraction of a second)."""
    said = phrases(tokenizer, constraints)
    return token_map(tokenizer, constraints), said and said._replace(eos=tuple(eos))


def _build(tokenizer: Any, constraints: tuple[str, ...]) -> torch.Tensor:
    texts, special = token_texts(tokenizer), set(tokenizer.all_special_ids)
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


def fold(scores: torch.Tensor, tmap: TokenMap) -> torch.Tensor:
    """Rows of scores (``[.., V]``) moved along ``tmap`` (``token_map``): log-probabilities
    with the banned tokens at -inf; columns past the tokenizer's (padding) are dropped."""
    n, dev = tmap.to.shape[0], scores.device
    probs = torch.softmax(scores.float(), dim=-1)
    out = torch.zeros_like(probs)
    keep = tmap.keep.to(dev, non_blocking=True)
    out[..., :n] = probs[..., :n] * keep
    if tmap.src.numel():
        out.index_add_(-1, tmap.dst.to(dev, non_blocking=True),
                       probs.index_select(-1, tmap.src.to(dev, non_blocking=True)))
    return torch.log(out)


def row(job: Any, logits: torch.Tensor) -> torch.Tensor:
    """One row's ``[V]`` logits folded by its map (a guided row's, before its contrast)."""
    return apply([job], logits[None])[0]


def apply(rows: Sequence[Any], logits: torch.Tensor) -> torch.Tensor:
    """``logits`` (``[rows, V]``) with each constrained row (its ``sampler.token_map``)
    folded, the rows of one map at once; the same tensor when no row is constrained."""
    groups: dict[int, list[int]] = {}
    maps: dict[int, TokenMap] = {}
    for i, r in enumerate(rows):
        if r.sampler is not None and r.sampler.token_map is not None:
            groups.setdefault(id(r.sampler.token_map), []).append(i)
            maps[id(r.sampler.token_map)] = r.sampler.token_map
    said = [i for i, r in enumerate(rows) if r.sampler is not None
            and r.sampler.forced is not None]
    choosing = [i for i in said if rows[i].sampler.forced.choices]
    holding = [i for i in said if holds(rows[i])]
    starting = [i for i in said if rows[i].sampler.forced.bullets is not None
                and rows[i].sampler.bullets]  # a point's first token (``bullets.first``)
    marking = [i for i in said if rows[i].sampler.forced.highlights is not None]
    slotting = [i for i in said if rows[i].sampler.forced.placeholders is not None]
    worded = [i for i in said if rows[i].sampler.keywords]  # a word was forced (``fresh``)
    if not (groups or choosing or holding or starting or marking or worded or slotting):
        return logits
    logits = logits.float().clone()
    for key, idx in groups.items():
        at = torch.tensor(idx, device=logits.device)
        logits[at] = fold(logits[at], maps[key])
    for i in choosing:
        logits[i] = choices(rows[i].sampler.forced.choices, rows[i].gen, logits[i])
    for i in holding:
        logits[i, list(rows[i].sampler.forced.eos)] = float("-inf")
    for i in starting:
        logits[i] = first(rows[i], logits[i])
    for i in marking:
        logits[i] = mask(rows[i], logits[i])
    for i in worded:
        logits[i] = fresh(rows[i], logits[i])
    for i in slotting:
        logits[i] = placeholder_mask(rows[i], logits[i])
    return logits
