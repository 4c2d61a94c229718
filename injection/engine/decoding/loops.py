"""The loop guard: a reply never says the same run of ``n`` of its own tokens twice.

Small models fall into loops under greedy decoding: a sentence, a phrase or a word said
again until the reply's token limit ("la peina de la peina de la peina ..."), most often
when writing in a language they know little of. Where the guard is on (the model's profile,
``loop_guard``, or the request), a token that would complete a run of ``n`` tokens the
reply already holds is banned for that step, as transformers' ``no_repeat_ngram_size``
bans it, but over the reply's own tokens only: the prompt's are not counted (a reply may
quote the question or a memory). The model then writes its next most likely token.

It stands aside where a reply's form repeats by nature (``verbatim``): inside a fenced code
block, in a reply that opens as JSON, on a table row or an indented line. There a name is
called again, a key comes back, a row has the same cells: banning those repeats mangled
identifiers ("celsius_todem_fahrenheit") and padded tables with spaces on SmolLM2
(``bench/probe_loop_guard.py``). It never bans the end of the turn (a reply may always
stop), and a row whose every candidate it would ban (where a decoding constraint left only
those) keeps its scores. Forced tokens (a constraint's phrase or word: ``bans.forced``) are
placed after the choice and are not affected. Applied to the choosing rows' final scores
(after a guide's contrast), so a guided row's combination never sees a banned token. A
guided or leaning row keeps only the tokens its model finds plausible (``contrast.PLAUSIBLE``),
often one; where the guard bans all of them, the row writes its model's own next most likely
token (``own``: its scores without the guide), as an unguided row would, instead of the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch

__all__ = ["DEFAULT_ON", "NGRAM", "guard", "verbatim"]

DEFAULT_ON = False  # without a profile entry: a model's replies as the model writes them
NGRAM = 4  # tokens in a run that may not come twice, where a profile names none


def verbatim(text: str) -> bool:
    """Whether a reply ending in ``text`` is where its form repeats by nature (see module):
    an open code fence, a reply opening with ``{`` or ``[``, a line starting with ``|``
    or indented by a tab or four spaces."""
    if text.count("```") % 2 or text.lstrip()[:1] in ("{", "["):
        return True
    line = text.rsplit("\n", 1)[-1]
    return line.lstrip(" ")[:1] == "|" or line.startswith(("    ", "\t"))


def _banned(row: Any, n: int) -> set[int]:
    """The tokens that would complete a run of ``n`` the row's reply holds: the reply's runs
    are indexed on its sampler (the first n-1 tokens of each -> the tokens after them) as it
    grows, so a step looks up one key."""
    s, gen = row.sampler, row.gen
    for k in range(max(s.indexed, n - 1), len(gen)):
        s.grams.setdefault(tuple(gen[k - n + 1:k]), set()).add(gen[k])
    s.indexed = len(gen)
    return s.grams.get(tuple(gen[len(gen) - n + 1:]), set())


def guard(rows: Sequence[Any], scores: torch.Tensor, eos: Collection[int],
          own: Callable[[Any], torch.Tensor] | None = None) -> torch.Tensor:
    """``scores`` (``[rows, V]``, the choosing rows') with each guarded row's repeats banned
    (see module; a row's text so far: its ``watch.text``, decoded as each token came); the
    same tensor when no row bans a token (none guarded, long enough to repeat, about to
    repeat and outside a ``verbatim`` form). ``own(row)``: a guided row's scores without its
    guide (``contrast.own_scores``), tried where the ban leaves its guided scores nothing."""
    out = scores
    for i, r in enumerate(rows):
        n = getattr(r.sampler, "no_repeat", 0) if r.sampler is not None else 0
        if n <= 0 or len(r.gen) < n:
            continue
        ban = [t for t in _banned(r, n) if t not in eos and 0 <= t < scores.shape[-1]]
        if not ban or verbatim(r.watch.text):
            continue
        row = _without(scores[i], ban)
        if row is None and own is not None and _guided(r):
            row = _without(own(r).float(), ban)
        if row is not None:  # else it keeps its scores
            out = scores.clone() if out is scores else out
            out[i] = row
    return out


def _without(scores: torch.Tensor, ban: list[int]) -> torch.Tensor | None:
    """A copy of one row's ``scores`` with ``ban`` at ``-inf``; None if nothing is left."""
    row = scores.clone()
    row[ban] = -float("inf")
    return row if bool(torch.isfinite(row).any()) else None


def _guided(row: Any) -> bool:
    return getattr(row, "guide", None) is not None or getattr(row, "lean", None) is not None
