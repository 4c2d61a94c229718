"""A reply with at least n placeholders in square brackets, ``[like this]``
(``prompting/constraints.py``, ``placeholders:<n>``: "Include at least two placeholders in
square brackets, like [name], in each answer."), kept by the decoder.

The model writes as it would, and opens a placeholder itself where it likes (``[`` or
`` [``; no other token with a bracket outside one). Until n are closed, the word the model
starts after a determiner or possessive (``SLOTS``: "ask your *[doctor]*", "at the
*[bakery]*") becomes one: a forced `` [`` in its place, then the model's words glued to it
(a first token with no space before it, no bracket, not an earlier placeholder's first
token: greedy, SmolLM2 wrote "[melanometer] of the [melanometer]"), then a ``]`` where its
first clause ends (the model's punctuation or line break comes after it), where it has
``WORDS`` words and the last is no function word (``highlights.BINDING``), or ``TOKENS``
tokens on at a word's start; the model's own ``]`` closes it first. Not in the reply's
first ``OPENING`` tokens (its answer first: a placeholder there drew SmolLM2 into reciting
the memory, as a highlight did). Where only the placeholders still to come fit (``ROOM``
tokens each), one opens at the next word instead; the end of turn waits until the n-th is
closed (``phrases.holds``). IFEval counts ``\\[.*?\\]`` spans (``verdicts.violates``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from injection.engine.decoding.highlights import close_marks, closes, paired, pending
from injection.engine.decoding.text import masks, only, token_texts

__all__ = ["OPENING", "ROOM", "SLOTS", "TOKENS", "WORDS", "Placeholders", "close_open", "due",
           "mask", "open_slots", "placeholders", "step"]

WORDS = 2  # a placeholder closes before its next word once it has this many
TOKENS = 6  # ... or before the next word this many tokens on, clause or not
ROOM = TOKENS + 3  # reply tokens kept free for each placeholder still to come
OPENING = 8  # reply tokens before the first placeholder the decoder opens
SLOTS = frozenset("a an the your my our their his her its this some any".split())


class Placeholders(NamedTuple):
    """n placeholders, the ``[``, `` [`` and ``]`` tokens, and which tokens may start one (a
    word with no space before it), go on inside one (no ``[``; a ``]`` only first: "].")
    and stand outside one (no bracket but an opening one), ``[V]`` bool each."""

    count: int
    bracket: int
    spaced: int
    close: int
    glued: torch.Tensor
    within: torch.Tensor
    outside: torch.Tensor


def placeholders(tokenizer: Any, constraints: Any) -> Placeholders | None:
    """The ``placeholders:<n>`` constraint's tokens, or None."""
    counts = [int(c[13:]) for c in constraints if c.startswith("placeholders:")]
    if not counts:
        return None
    marks = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("[", " [", "]")]
    if any(len(m) != 1 for m in marks):
        return None  # a tokenizer without them as single tokens: not kept
    opening = [marks[0][0], marks[1][0]]
    return Placeholders(max(counts), *(m[0] for m in marks),
                        *masks(tokenizer, "placeholders", lambda texts: _masks(texts, opening)))


def _masks(texts: list[str], opening: list[int]) -> tuple[torch.Tensor, ...]:
    """``Placeholders``' glued, within and outside masks over the tokens' ``texts``."""
    plain = torch.tensor(["[" not in t and "]" not in t for t in texts])
    within = plain | torch.tensor([t[:1] == "]" and "]" not in t[1:] and "[" not in t
                                   for t in texts])
    outside = plain.clone()
    outside[opening] = True
    return torch.tensor([t[:1].isalnum() for t in texts]) & plain, within, outside


def open_slots(job: Any) -> tuple[int, bool]:
    """(placeholders closed, whether one is open) in the row's reply so far."""
    return paired(job.sampler.placeholders)


def close_open(job: Any) -> int | None:
    """The ``]`` that closes the row's open placeholder now (``highlights.close_marks``)."""
    said = job.sampler.forced.placeholders
    return None if said is None else close_marks(job.sampler.placeholders, len(job.gen),
                                                 said.close)


def due(job: Any) -> bool:
    """Whether the row may not end yet: a placeholder is open or fewer than n are closed."""
    return pending(job.sampler.placeholders, job.sampler.forced.placeholders.count)


def mask(job: Any, scores: torch.Tensor) -> torch.Tensor:
    """A row's ``[V]`` scores: right after an opening bracket only ``glued`` tokens; inside
    a placeholder no ``[``; outside one no bracket but an opening one."""
    said, marks = job.sampler.forced.placeholders, job.sampler.placeholders
    if len(marks) % 2 == 0:
        return only(scores, said.outside)
    if marks[-1] < len(job.gen) - 1:
        return only(scores, said.within)
    keep = said.glued.clone()  # not an earlier one's first token: "[leaf] of the [leaf]"
    keep[[job.gen[m + 1] for m in marks[:-1:2] if m + 1 < len(job.gen)]] = False
    return only(scores, keep)


def step(job: Any, token: int, eos: Any, tokenizer: Any, opened: int, reserve: int) -> int:
    """The row's next token with its placeholders kept (see module): ``opened`` is where
    the reply's own text starts, ``reserve`` the tokens its closing phrase and postscript
    need."""
    said, marks, n = job.sampler.forced.placeholders, job.sampler.placeholders, len(job.gen)
    if said is None or n < opened:
        return token
    texts = token_texts(tokenizer)
    done, inside = open_slots(job)
    piece = texts[token] if token < len(texts) else ""
    if inside:
        if piece.startswith("]") and marks[-1] < n - 1:  # the model closes it
            marks.append(n)
            return token
        if marks[-1] < n - 1 and closes(job.gen[marks[-1] + 1:], piece, token in eos, texts,
                                        WORDS, TOKENS):
            marks.append(n)
            return said.close
        return token
    if token in (said.bracket, said.spaced):  # the model opens one
        marks.append(n)
        return token
    if done >= said.count or token in eos or piece[:1] != " " or not piece[1:2].isalnum():
        return token
    left = job.max_new_tokens - reserve - n
    squeezed = left <= (said.count - done) * ROOM
    slot = n >= opened + OPENING and texts[job.gen[-1]].strip().lower() in SLOTS
    if squeezed or slot:
        marks.append(n)
        return said.spaced
    return token
