"""A reply with at least n highlighted sections, markdown ``*like this*``
(``prompting/constraints.py``, ``highlights:<n>``), kept by the decoder.

The reply's sentences after its first (so it states its answer first: a span opening the
reply drew SmolLM2 into reciting the memory, "*Highlight at least* two key phrases ...")
open with a highlighted span until n are closed: a forced ``*`` (`` *`` after a space),
then the model's words, glued to the star (a first token with no space before it: "*The",
not "* The", which markdown does not emphasise; not the first token of an earlier span:
greedy, SmolLM2 repeated "*Pack a lighter*" line after line), then a ``*`` where the
span's first clause ends (the model's punctuation or line break comes after it), where it
has ``WORDS`` words and the last is no function word ("*Pack for a* trip": ``BINDING``),
or ``TOKENS`` tokens on at a word's start. The model's own ``*`` closes an open span;
outside one it may not write one (an unpaired star would pair with the next span). Where sentences run long and only the spans still to come fit
(``ROOM`` tokens each), a span opens at the next word instead; the end of turn waits
until the n-th is closed (``phrases.holds``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from injection.engine.decoding.text import masks, only, tail_ended, token_texts

__all__ = ["BINDING", "ROOM", "TOKENS", "WORDS", "Highlights", "close_marks", "close_open",
           "closes", "due", "highlights", "mask", "open_spans", "paired", "pending", "step"]

WORDS = 3  # a span closes before its next word once it has this many
TOKENS = 8  # ... or before the next word this many tokens on, clause or not
ROOM = TOKENS + 3  # reply tokens kept free for each span still to come
BINDING = frozenset(  # a span does not close after these words (it would split a phrase)
    "a an the for to of in on at by with from and or but my your our their his her its "
    "this that these those is are was were be as into than some any each every".split())


class Highlights(NamedTuple):
    """n spans, the ``*`` and ``" *"`` tokens, which tokens may start a span (a word with no
    space before it) and which hold no star (``[V]`` bool each)."""

    count: int
    star: int
    spaced_star: int
    glued: torch.Tensor
    starless: torch.Tensor


def highlights(tokenizer: Any, constraints: Any) -> Highlights | None:
    """The ``highlights:<n>`` constraint's tokens, or None."""
    counts = [int(c[11:]) for c in constraints if c.startswith("highlights:")]
    if not counts:
        return None
    star, spaced = (tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("*", " *"))
    if len(star) != 1 or len(spaced) != 1:
        return None  # a tokenizer without them as single tokens: not kept
    glued, starless = masks(tokenizer, "highlights", lambda texts: (
        torch.tensor([t[:1].isalnum() for t in texts]),
        torch.tensor(["*" not in t for t in texts])))
    return Highlights(max(counts), star[0], spaced[0], glued, starless)


def open_spans(job: Any) -> tuple[int, bool]:
    """(spans closed, whether one is open) in the row's reply so far."""
    return paired(job.sampler.highlights)


def close_open(job: Any) -> int | None:
    """The ``*`` that closes the row's open span now (``close_marks``), or None."""
    said = job.sampler.forced.highlights
    return None if said is None else close_marks(job.sampler.highlights, len(job.gen), said.star)


def close_marks(marks: list[int], n: int, close: int) -> int | None:
    """``close``, the token that closes the span open in ``marks`` at reply position ``n``
    (its mark set), or None: none open, or one opened by the token now replaced at ``n``
    (its mark dropped: it is not written)."""
    if not paired(marks)[1]:
        return None
    if marks[-1] == n:
        marks.pop()
        return None
    marks.append(n)
    return close


def paired(marks: list[int]) -> tuple[int, bool]:
    """(spans closed, whether one is open) by where their marks stand (open, close, ..)."""
    return len(marks) // 2, len(marks) % 2 == 1


def due(job: Any) -> bool:
    """Whether the row may not end yet: a span is open or fewer than n are closed."""
    return pending(job.sampler.highlights, job.sampler.forced.highlights.count)


def pending(marks: list[int], count: int) -> bool:
    """Whether a span is open or fewer than ``count`` are closed, by their ``marks``."""
    closed, inside = paired(marks)
    return inside or closed < count


def mask(job: Any, scores: torch.Tensor) -> torch.Tensor:
    """A row's ``[V]`` scores: right after an opening star only ``glued`` tokens; outside a
    span no token with a star."""
    said, marks = job.sampler.forced.highlights, job.sampler.highlights
    if marks and len(marks) % 2 == 1 and marks[-1] == len(job.gen) - 1:
        keep = said.glued.clone()
        keep[[job.gen[m + 1] for m in marks[:-1:2]]] = False
    elif not marks or len(marks) % 2 == 0:
        keep = said.starless
    else:
        return scores
    return only(scores, keep)


def step(job: Any, token: int, eos: Any, tokenizer: Any, opened: int, reserve: int) -> int:
    """The row's next token with its spans kept (see module): ``opened`` is where the
    reply's own text starts, ``reserve`` the tokens its closing phrase and postscript need."""
    said, marks, n = job.sampler.forced.highlights, job.sampler.highlights, len(job.gen)
    if said is None or n < opened:
        return token
    texts = token_texts(tokenizer)
    done, inside = open_spans(job)
    piece = texts[token] if token < len(texts) else ""
    if inside:
        if "*" in piece and marks[-1] < n - 1:  # the model closes it
            marks.append(n)
            return token if piece.startswith("*") else said.star
        if marks[-1] < n - 1 and closes(job.gen[marks[-1] + 1:], piece, token in eos, texts,
                                        WORDS, TOKENS):
            marks.append(n)
            return said.star
        return token
    if done >= said.count or token in eos:
        return token
    left = job.max_new_tokens - reserve - n
    at_start = n > opened and "\n" in texts[job.gen[-1]]  # a line's start, not the reply's
    sentence = n > opened and tail_ended(job.gen, texts)
    squeezed = left <= (said.count - done) * ROOM and piece[:1].isspace()
    if at_start or ((sentence or squeezed) and piece[:1] == " "):
        marks.append(n)
        return said.star if at_start else said.spaced_star
    return token


def closes(inside: list[int], piece: str, stop: bool, texts: list[str], words: int,
           tokens: int) -> bool:
    """Whether a span holding the tokens ``inside`` closes before ``piece``: the reply would
    end or break a line, a clause ends (punctuation), or a word starts past ``words`` words
    (the last no ``BINDING`` word) or ``tokens`` tokens."""
    if stop or "\n" in piece or piece[:1] in ",.;:!?)":
        return True
    if not piece[:1].isspace():
        return False
    said = "".join(texts[t] for t in inside).split()
    return (len(said) >= words and said[-1].lower() not in BINDING) or len(inside) >= tokens
