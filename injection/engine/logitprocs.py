"""What ``generate()`` does to the next-token logits, for every row of a step at once.

transformers builds a ``LogitsProcessorList`` from the model's generation config; the
batch engine applies the same processors, in the same order, as tensor ops over the
step's ``[B, V]`` scores (rows differ in temperature and top-p, and in their tokens):

1. repetition penalty (every row, greedy too): a seen token's score is divided by the
   penalty when positive, multiplied when negative;
2. no-repeat n-grams (every row): a token that would repeat an n-gram of the row's
   tokens is banned (``-inf``);
3. sampled rows only: temperature, then top-k (the model's ``top_k``), then top-p.

A row's tokens (prefix + prompt + generated) are a ``[B, W]`` id tensor, left-padded with
-1 (``TokenHistory``), kept only when 1 or 2 is on: it is rebuilt when the rows change
and grows by a column per step otherwise.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

__all__ = ["Knobs", "TokenHistory", "no_repeat_ngrams", "process", "repetition_penalty",
           "top_k", "top_p"]

_NEG_INF = -float("inf")


class Knobs(NamedTuple):
    """The generation config's processors the engine honours (neutral values: off)."""

    penalty: float = 1.0
    ngram: int = 0
    top_k: int = 0

    @classmethod
    def from_config(cls, gc: Any) -> Knobs:
        return cls(float(getattr(gc, "repetition_penalty", None) or 1.0),
                   int(getattr(gc, "no_repeat_ngram_size", None) or 0),
                   int(getattr(gc, "top_k", None) or 0))

    @property
    def needs_history(self) -> bool:
        return self.penalty != 1.0 or self.ngram > 0


class TokenHistory:
    """Each row's tokens so far as one left-padded ``[B, W]`` tensor (see module)."""

    def __init__(self) -> None:
        self._rows: list[Any] = []
        self._lens: list[int] = []
        self.ids: torch.Tensor | None = None

    def of(self, rows: list[Any], device: torch.device) -> torch.Tensor:
        """``rows``' ids (``row.input_ids + row.gen``); one appended column when the same
        rows each grew by one token since the last call, rebuilt otherwise."""
        lens = [len(r.input_ids) + len(r.gen) for r in rows]
        same = (self.ids is not None and len(rows) == len(self._rows)
                and all(a is b for a, b in zip(rows, self._rows, strict=True)))
        if same and all(n == m + 1 for n, m in zip(lens, self._lens, strict=True)):
            last = torch.tensor([[r.gen[-1]] for r in rows], device=self.ids.device)
            self.ids = torch.cat([self.ids, last], dim=1)
        elif not same or lens != self._lens:
            self.ids = build_ids([r.input_ids + r.gen for r in rows], device)
        self._rows, self._lens = list(rows), lens
        return self.ids


def build_ids(seqs: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    return torch.tensor([[-1] * (width - len(s)) + s for s in seqs], device=device)


def _mask_of(ids: torch.Tensor, vocab: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, V]`` bool: True where the row's ``ids`` (where ``keep``) hold the token."""
    ids = ids.masked_fill(ids < 0 if keep is None else ~keep | (ids < 0), vocab)
    mask = torch.zeros(ids.shape[0], vocab + 1, dtype=torch.bool, device=ids.device)
    return mask.scatter_(1, ids, True)[:, :vocab]


def repetition_penalty(scores: torch.Tensor, ids: torch.Tensor, penalty: float) -> torch.Tensor:
    seen = _mask_of(ids, scores.shape[-1])
    return torch.where(seen, torch.where(scores < 0, scores * penalty, scores / penalty), scores)


def no_repeat_ngrams(scores: torch.Tensor, ids: torch.Tensor, n: int) -> torch.Tensor:
    """Ban each row's tokens that would complete an n-gram it already holds."""
    width = ids.shape[1]
    if width < n:
        return scores
    if n == 1:
        return scores.masked_fill(_mask_of(ids, scores.shape[-1]), _NEG_INF)
    tail = ids[:, width - n + 1:]  # the last n-1 tokens: the next n-gram's start
    starts = ids.unfold(1, n - 1, 1)[:, : width - n + 1]  # windows with a token after them
    hit = (starts == tail.unsqueeze(1)).all(-1) & (tail >= 0).all(-1, keepdim=True)
    return scores.masked_fill(_mask_of(ids[:, n - 1:], scores.shape[-1], hit), _NEG_INF)


def top_k(scores: torch.Tensor, k: int, rows: torch.Tensor) -> torch.Tensor:
    """``TopKLogitsWarper`` on the ``rows`` (bool ``[B]``) that sample."""
    k = min(max(k, 1), scores.shape[-1])
    kth = torch.topk(scores, k)[0][..., -1, None]
    return scores.masked_fill((scores < kth) & rows.unsqueeze(1), _NEG_INF)


def top_p(scores: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``TopPLogitsWarper`` with a per-row ``p`` (``[B]``; rows at 1.0 are left alone)."""
    ordered, order = torch.sort(scores, descending=False)
    cum = ordered.softmax(dim=-1).cumsum(dim=-1)
    drop = cum <= (1 - p).unsqueeze(1)
    drop[..., -1:] = False
    drop &= (p < 1.0).unsqueeze(1)
    return scores.masked_fill(drop.scatter(1, order, drop), _NEG_INF)


def process(scores: torch.Tensor, knobs: Knobs, ids: torch.Tensor | None,
            temperatures: list[float], top_ps: list[float]) -> torch.Tensor:
    """All processors on float32 ``scores [B, V]``; ``temperatures``/``top_ps`` per row (a
    greedy row has temperature 0: it is only penalised/banned, as generate() does)."""
    if knobs.penalty != 1.0:
        scores = repetition_penalty(scores, ids, knobs.penalty)
    if knobs.ngram > 0:
        scores = no_repeat_ngrams(scores, ids, knobs.ngram)
    if not any(t > 0 for t in temperatures):
        return scores
    dev = scores.device
    sampled = torch.tensor([t > 0 for t in temperatures], device=dev)
    temps = torch.tensor([t if t > 0 else 1.0 for t in temperatures], device=dev)
    scores = scores / temps.to(scores.dtype).unsqueeze(1)
    if knobs.top_k:
        scores = top_k(scores, knobs.top_k, sampled)
    ps = [p if t > 0 else 1.0 for t, p in zip(temperatures, top_ps, strict=True)]
    if any(p < 1.0 for p in ps):
        scores = top_p(scores, torch.tensor(ps, device=dev, dtype=scores.dtype))
    return scores
