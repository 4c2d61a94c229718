"""The loop guard: a reply never says the same run of ``n`` of its own tokens twice.

Small models fall into loops under greedy decoding: a sentence, a phrase or a word said
again until the reply's token limit ("la peina de la peina de la peina ..."), most often
when writing in a language they know little of. Where the guard is on (the model's profile,
``loop_guard``, or the request), a token that would complete a run of ``n`` tokens the
reply already holds is banned for that step, as transformers' ``no_repeat_ngram_size``
bans it, but over the reply's own tokens only: the prompt's are not counted (a reply may
quote the question or a memory). The model then writes its next most likely token.

It never bans the end of the turn (a reply may always stop), and a row whose every
candidate it would ban (where a decoding constraint left only those) keeps its scores.
Forced tokens (a constraint's phrase or word: ``bans.forced``) are placed after the choice
and are not affected. Applied to the choosing rows' final scores (after a guide's contrast),
so a guided row's combination never sees a banned token.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch

from injection.engine.logitprocs import build_ids, no_repeat_ngrams

__all__ = ["DEFAULT_ON", "NGRAM", "guard"]

DEFAULT_ON = False  # without a profile entry: a model's replies as the model writes them
NGRAM = 4  # tokens in a run that may not come twice, where a profile names none


def guard(rows: Sequence[Any], scores: torch.Tensor, eos: Collection[int]) -> torch.Tensor:
    """``scores`` (``[rows, V]``, the choosing rows') with each guarded row's repeats banned
    (see module); the same tensor when no row is guarded or long enough to repeat."""
    by_n: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        n = getattr(r.sampler, "no_repeat", 0) if r.sampler is not None else 0
        if n > 0 and len(r.gen) >= n:
            by_n.setdefault(n, []).append(i)
    if not by_n:
        return scores
    scores = scores.clone()
    keep = sorted(e for e in eos if 0 <= e < scores.shape[-1])
    for n, idx in by_n.items():
        ids = build_ids([rows[i].gen for i in idx], scores.device)
        at = torch.tensor(idx, device=scores.device)
        before = scores[at]
        banned = no_repeat_ngrams(before, ids, n)
        if keep:
            banned[:, keep] = before[:, keep]
        stuck = ~torch.isfinite(banned).any(-1, keepdim=True)
        scores[at] = torch.where(stuck, before, banned)
    return scores
