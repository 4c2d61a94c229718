"""A reply that is exactly n bullet points (``prompting/constraints.py``, ``bullets:<n>``),
kept by the decoder.

Each line of the reply opens with a forced ``*`` token (after the opening phrase and the
title, on a line of their own), and the model writes the point: its first token is a word
after a space (``spaced``: "* Rest", not "*Rest*", which markdown shows in italics, nor
"**", bold) and not the word an earlier point opened with (greedy, SmolLM2 wrote the same
point three times), and the end of turn waits (``phrases.holds``). A line break, the
model's or the end of turn it picked before the n-th point, opens the next point; after
the n-th, the reply ends there (or its closing phrase or postscript comes:
``phrases.forced`` sees an end of turn), or at a sentence's end ``EARLY`` tokens before
``max_new_tokens``. A point that has used its share of the reply's tokens breaks at its
next sentence end, or at a word's start ``SLACK`` tokens later, and wherever else only
the points still to come fit (``POINT`` tokens each), so every point is written before
``max_new_tokens``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from injection.engine.decoding.text import masks, only, tail_ended, token_texts

__all__ = ["EARLY", "SLACK", "Bullets", "bullets", "first", "step"]

SLACK = 8  # tokens a point may run past its share waiting for a sentence's end
POINT = 6  # tokens kept free for each point still to come ("*", a few words, a line break)
EARLY = 12  # the last point ends at a sentence's end this close to ``max_new_tokens``


class Bullets(NamedTuple):
    """n points, the ``*`` and line-break tokens, and which tokens may open a point (a
    space, then a word: ``[V]`` bool)."""

    count: int
    star: int
    newline: int
    spaced: torch.Tensor


def bullets(tokenizer: Any, constraints: Any) -> Bullets | None:
    """The ``bullets:<n>`` constraint's tokens, or None."""
    counts = [int(c[8:]) for c in constraints if c.startswith("bullets:")]
    if not counts:
        return None
    star, newline = (tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("*", "\n"))
    if len(star) != 1 or len(newline) != 1:
        return None  # a tokenizer without them as single tokens: not kept
    spaced = masks(tokenizer, "bullets", lambda texts: torch.tensor(
        [len(t) > 1 and t[0] == " " and t[1].isalnum() for t in texts]))
    return Bullets(min(counts), star[0], newline[0], spaced)


def first(job: Any, scores: torch.Tensor) -> torch.Tensor:
    """A row's ``[V]`` scores where its last token is a forced ``*``: only ``spaced``
    tokens, none that opened an earlier point; the same scores otherwise."""
    marks, said = job.sampler.bullets, job.sampler.forced.bullets
    if not marks or marks[-1] != len(job.gen) - 1:
        return scores
    allowed = said.spaced.clone()
    allowed[[job.gen[m + 1] for m in marks[:-1]]] = False
    return only(scores, allowed)


def step(job: Any, token: int, eos: Any, tokenizer: Any, opened: int, reserve: int) -> int:
    """The row's next token with its points kept (see module): ``opened`` is where the
    reply's own text starts (after its opening phrase and title), ``reserve`` the tokens
    its closing phrase and postscript need."""
    said, marks, n = job.sampler.forced.bullets, job.sampler.bullets, len(job.gen)
    if said is None or n < opened:
        return token
    texts = token_texts(tokenizer)
    at_line = (n == opened and not marks) or (n > 0 and "\n" in texts[job.gen[-1]])
    if at_line and len(marks) < said.count:
        if n > 0 and not marks and "\n" not in texts[job.gen[-1]]:
            return said.newline  # after an opening phrase: the points on lines of their own
        marks.append(n)
        return said.star
    if not marks:
        return said.newline
    breaks = token in eos or "\n" in texts[token]
    last = len(marks) >= said.count
    if breaks:
        return next(iter(eos)) if last else said.newline
    if last:  # the reply ends at a sentence's end near its last token
        left = job.max_new_tokens - reserve - n
        done = left <= EARLY and tail_ended(job.gen, texts)
        return next(iter(eos)) if done else token
    room = job.max_new_tokens - reserve - n - 1  # after a line break now
    if room <= (said.count - len(marks)) * POINT or _due(job, token, texts, marks,
                                                          said.count, reserve):
        return said.newline
    return token


def _due(job: Any, token: int, texts: list[str], marks: list[int], count: int,
         reserve: int) -> bool:
    """Whether the current point breaks now: it has used its share of what is left of the
    reply and a sentence has just ended, or ``SLACK`` tokens later ``token`` starts a word."""
    n, start = len(job.gen), marks[-1]
    share = (job.max_new_tokens - reserve - start) // (count - len(marks) + 1)
    used = n - start
    if used < share:
        return False
    return tail_ended(job.gen, texts) or (
        used >= share + SLACK and texts[token][:1].isspace())
