"""A reply that holds a word (or a few words) at least n times ("Work the word 'garden' into
every answer.", "Say 'indeed' at least twice.": ``prompting/constraints.py``,
``word:<word>:<n>``), kept by the decoder.

The model writes as it would. Where the reply holds the word fewer than n times
(``verdicts.mentions``: the model may well have written it) and would end (its end-of-turn
token), where only the words still due fit (``ROOM`` tokens each, besides a closing phrase
and postscript), or at a sentence's end in the second half of what is left of the reply
before that (``due``; a word forced at the very end was cut off mid-sentence or forced twice
in a row, "simply simply"), the word is forced as the next sentence's first (capitalised,
after a space; without one at a line's start; as asked, after a space, mid-sentence;
lower-case under ``lowercase``) and the model goes on from it: the end of turn waits ``OWN``
tokens (``phrases.holds``). Where a word or sentence limit decides where the reply ends,
the word opens the reply instead, so the limit counts it. Several words asked: each in turn
(in the order of ``keywords``). Once started, the word is written whole (``pending``). After
it, the reply repeats no ``NGRAM`` tokens of its own (``fresh``: greedy, SmolLM2 went on from
a forced word by saying its answer again, "Indeed, volcanoes erupt through magma." twice
over).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from injection.engine.decoding.text import ended, tail_ended, token_texts
from injection.engine.logitprocs import no_repeat_ngrams
from injection.prompting.verdicts import mentions, required

__all__ = ["NGRAM", "ROOM", "Keyword", "due", "fresh", "keywords", "missing", "pending", "start"]

ROOM = 8  # reply tokens kept free for each time the word is still due (the word, a few more)
NGRAM = 4  # after a forced word no run of this many reply tokens comes twice
OWN = 4  # tokens of its own a reply writes after a forced opening, postscript marker or word


class Keyword(NamedTuple):
    """The word, how often, and its tokens: at a line's (the reply's) start, opening a
    sentence after a space, and mid-sentence."""

    word: str
    count: int
    line: tuple[int, ...]
    spaced: tuple[int, ...]
    inline: tuple[int, ...]


def keywords(tokenizer: Any, constraints: Sequence[str]) -> tuple[Keyword, ...]:
    """The ``word:`` constraints' words with their tokens, in the order asked (sorted)."""
    out = []
    for word, count in sorted(w for w in map(required, constraints) if w):
        opener = word.lower() if "lowercase" in constraints else word[:1].upper() + word[1:]
        out.append(Keyword(word, count, *(tuple(tokenizer(t, add_special_tokens=False)[
            "input_ids"]) for t in (opener, " " + opener, " " + word))))
    return tuple(out)


def pending(job: Any) -> int | None:
    """The forced word's token due now (a word once started is written whole), or None."""
    marks, n = job.sampler.keywords, len(job.gen)
    if marks and n - marks[-1][0] < len(marks[-1][1]):
        return marks[-1][1][n - marks[-1][0]]
    return None


def missing(job: Any, tokenizer: Any) -> list[tuple[Keyword, int]]:
    """Each word the reply is to hold more often, with how many more times."""
    text = tokenizer.decode(job.gen)
    short = ((w, w.count - mentions(text, w.word)) for w in job.sampler.forced.required)
    return [(w, k) for w, k in short if k > 0]


def start(job: Any, tokenizer: Any, said: Keyword) -> int:
    """The word forced now (see module): its first token; ``pending`` gives the rest."""
    gen = job.gen
    tail = "".join(token_texts(tokenizer)[t] for t in gen[-3:])
    ids = (said.line if not tail or tail[-1].isspace()
           else said.spaced if ended(tail) else said.inline)
    job.sampler.keywords.append((len(gen), ids))
    return ids[0]


def due(job: Any, token: int, eos: Any, tokenizer: Any, reserve: int) -> int | None:
    """The first token of the first word still due, if one is due now (see module;
    ``reserve``: the tokens a closing phrase and postscript need), or None; never within
    ``OWN`` tokens of the last forced word's end, unless the reply would end."""
    marks, n = job.sampler.keywords, len(job.gen)
    if marks and n < marks[-1][0] + len(marks[-1][1]) + OWN and token not in eos:
        return None
    stop, tail = token in eos, tail_ended(job.gen, token_texts(tokenizer))
    most = sum(w.count for w in job.sampler.forced.required)  # no decoding of the reply
    if not (stop or tail or job.max_new_tokens - reserve - most * ROOM - n <= 0):
        return None  # (``missing``) on a step where no word can be due
    if not (short := missing(job, tokenizer)):
        return None
    left = job.max_new_tokens - reserve - sum(k for _, k in short) * ROOM - n
    if stop or left <= 0 or (left <= (left + n) // 2 and tail):
        return start(job, tokenizer, short[0][0])
    return None


def fresh(job: Any, scores: torch.Tensor) -> torch.Tensor:
    """A row's ``[V]`` scores without the tokens that would repeat ``NGRAM`` tokens of its
    reply, once a word was forced in it (the same scores before)."""
    if not job.sampler.keywords or len(job.gen) < NGRAM:
        return scores
    ids = torch.tensor([job.gen], device=scores.device)
    return no_repeat_ngrams(scores[None], ids, NGRAM)[0]
