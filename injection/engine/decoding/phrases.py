"""The phrases a reply opens and closes with, kept by the decoder (``prompting/constraints.py``:
``start:``, ``end:``, ``repeat`` (the user's message as the opening), ``ps:``, ``title``,
``choice:``, ``max_words:``, ``max_sentences:``), as token ids built once per request (``phrases``).
A word the reply is to hold (``word:``) is forced where it would end (``keywords.py``).

``forced`` replaces the row's chosen token with the phrase's token due at that point of the
reply; ``choices`` and ``holds`` are what ``bans.apply`` does to a step's logits: only the
tokens that go on with one of the options, and no end of turn right after a forced
opening or postscript marker. Bullet points, highlighted spans and placeholders are kept in
their own modules (``bullets.py``, ``highlights.py``, ``placeholders.py``), called from
``forced`` once a title is closed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from injection.engine.decoding.bullets import Bullets, bullets
from injection.engine.decoding.bullets import step as bullet_step
from injection.engine.decoding.highlights import Highlights, highlights
from injection.engine.decoding.highlights import close_open as close_span
from injection.engine.decoding.highlights import due as spans_due
from injection.engine.decoding.highlights import step as highlight_step
from injection.engine.decoding.keywords import (
    OWN,
    ROOM,
    Keyword,
    due,
    keywords,
    missing,
    pending,
    start,
)
from injection.engine.decoding.placeholders import Placeholders, placeholders
from injection.engine.decoding.placeholders import close_open as close_slot
from injection.engine.decoding.placeholders import due as slots_due
from injection.engine.decoding.placeholders import step as placeholder_step
from injection.engine.decoding.text import ended, tail_ended, token_texts
from injection.prompting.readers import sentence_count, word_count
from injection.prompting.verdicts import phrase, violates

__all__ = ["OWN", "PS_NOTE", "TITLE_TOKENS", "Phrases", "choices", "forced", "holds",
           "phrases"]


def holds(job: Any) -> bool:
    """Whether the row may not end yet: an opening phrase ("repeat my question"), a title
    or a postscript's marker was forced and the model has not yet written ``OWN`` tokens
    after it (else the reply is the member's own question, a bare title or "P.S.")."""
    said, n, at = job.sampler.forced, len(job.gen), job.sampler.postscript
    if not said.eos or said.choices:
        return False
    titled, marks, words = job.sampler.titled, job.sampler.bullets, job.sampler.keywords
    return ((bool(said.start) and n < len(said.start) + OWN)
            or (bool(words) and n < words[-1][0] + len(words[-1][1]) + OWN)
            or (bool(marks) and n < marks[-1] + 1 + OWN)
            or (said.highlights is not None and spans_due(job))
            or (said.placeholders is not None and slots_due(job))
            or (titled is not None and n < titled + OWN)
            or (at is not None and at >= 0 and n < at + len(said.ps) + OWN))


def choices(options: Sequence[tuple[int, ...]], gen: Sequence[int],
            scores: torch.Tensor) -> torch.Tensor:
    """``[V]`` scores with only the tokens that go on with an option the reply ``gen``
    still begins (the same scores when none goes on: ``forced`` ends it)."""
    n, gen = len(gen), tuple(gen)
    nxt = sorted({o[n] for o in options if len(o) > n and o[:n] == gen})
    if not nxt:
        return scores
    out = torch.full_like(scores, float("-inf"))
    at = torch.tensor(nxt, device=scores.device)
    out[at] = scores[at]
    return out


class Phrases(NamedTuple):
    """The phrases a reply opens and closes with, as token ids, and the closing text; a
    postscript's marker (on a line of its own) and its text."""

    start: tuple[int, ...]
    end: tuple[int, ...]
    end_text: str
    ps: tuple[int, ...] = ()
    ps_text: str = ""
    title: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # "<<", ">>" + line break
    choices: tuple[tuple[int, ...], ...] = ()  # the whole reply is one of them
    eos: tuple[int, ...] = ()  # not chosen right after a forced opening or marker (``OWN``)
    words: int = 0  # the reply has fewer words than this (0: no limit)
    sentences: int = 0  # ... at most this many sentences (0: no limit)
    bullets: Bullets | None = None  # the reply is exactly n bullet points
    highlights: Highlights | None = None  # ... has at least n *highlighted* spans
    placeholders: Placeholders | None = None  # ... at least n [placeholders]
    required: tuple[Keyword, ...] = ()  # ... holds each of these words at least n times


def phrases(tokenizer: Any, constraints: Sequence[str]) -> Phrases | None:
    """The ``start:``/``end:``/``ps:`` constraints' phrases encoded (the end after a space,
    the postscript after a blank line), or None."""
    said = dict(p for p in map(phrase, constraints) if p is not None)
    options = [c[7:].split("|") for c in constraints if c.startswith("choice:")]
    limits = [int(c[10:]) for c in constraints if c.startswith("max_words:")]
    most = [int(c[14:]) for c in constraints if c.startswith("max_sentences:")]
    points, spans = bullets(tokenizer, constraints), highlights(tokenizer, constraints)
    required, slots = keywords(tokenizer, constraints), placeholders(tokenizer, constraints)
    if (not said and "title" not in constraints and not options and not limits and not most
            and not points and not spans and not required and not slots):
        return None

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else ()

    if options:  # the reply is one of them: no other phrase applies
        return Phrases((), (), "", choices=tuple(i for i in map(ids, options[0]) if i))

    end, ps = said.get("end", ""), said.get("ps", "")
    title = (ids("<<"), ids(">>\n")) if "title" in constraints else None
    return Phrases(ids(said.get("start", "")), ids(" " + end if end else ""), end,
                   ids("\n\n" + ps if ps else ""), ps, title, words=min(limits or [0]),
                   sentences=min(most or [0]), bullets=points, highlights=None if points else spans,
                   required=required, placeholders=None if points or spans else slots)


def forced(job: Any, token: int, eos: Any, tokenizer: Any) -> int:
    """The row's next token with its phrases kept: the opening phrase's tokens first; the
    closing phrase's where the reply would end (an end-of-turn token, unless the reply
    already ends with the phrase), where only its tokens still fit ``max_new_tokens`` or
    at a sentence's end just before (``_due``), or where a word or sentence limit is
    reached (``_word_limit``, ``_sentence_limit``), then the end of turn."""
    said, n = job.sampler.forced, len(job.gen)
    if said is None:
        return token
    if said.choices:  # chosen among them by ``apply``; complete: the end of turn
        return next(iter(eos)) if tuple(job.gen) in said.choices else token
    if n < len(said.start):
        return said.start[n]
    if (title := _title(job, token, eos, tokenizer)) is not None:
        return title
    if said.required and (word := pending(job)) is not None:
        return word
    chosen, token = token, _points(job, token, eos, tokenizer)
    moved = token != chosen and token not in eos  # a point's or highlight's mark
    if (word := _keyword(job, token, eos, tokenizer, moved)) is not None:
        return word
    if (ps := _postscript(job, token, eos, tokenizer)) is not None:
        return ps
    if job.sampler.ending is None and (_word_limit(job, token, tokenizer)
                                       or _sentence_limit(job, token, tokenizer)):
        if (close := close_span(job)) is not None or (close := close_slot(job)) is not None:
            return close  # an open span or placeholder closes first (the limit holds)
        if not said.end:
            return next(iter(eos))
        job.sampler.ending = n
    if not said.end:
        return token
    if job.sampler.ending is None:
        if token in eos and tokenizer.decode(job.gen).strip().lower().endswith(
                said.end_text.lower()):
            return token  # said already
        if _due(job, token, eos, tokenizer, len(said.end)):
            job.sampler.ending = n
    if job.sampler.ending is None:
        return token
    k = n - job.sampler.ending
    return said.end[k] if k < len(said.end) else next(iter(eos))


EARLY = 16  # a closing phrase or postscript comes at a sentence's end this close to the cut


def _due(job: Any, token: int, eos: Any, tokenizer: Any, need: int) -> bool:
    """Whether a closing phrase (a postscript) of ``need`` tokens starts now: the reply
    would end, only it still fits ``max_new_tokens``, or a sentence has just ended within
    ``EARLY`` tokens of that (so the reply is not cut mid-sentence for it)."""
    left = job.max_new_tokens - need - len(job.gen)
    if token in eos or left <= 0:
        return True
    return left <= EARLY and ended(tokenizer.decode(job.gen[-3:]))


EARLY_WORDS = 6  # a word-limited reply ends at a sentence's end this close to its limit


def _word_limit(job: Any, token: int, tokenizer: Any) -> bool:
    """Whether a word-limited reply closes now: ``token`` would start its last allowed word
    (the closing phrase's words counted in), or a sentence has just ended within
    ``EARLY_WORDS`` of that. A word is never cut: a token that goes on with one passes."""
    said = job.sampler.forced
    if not said.words or not job.gen:
        return False
    text = tokenizer.decode(job.gen)
    written = word_count(text)
    used = written + word_count(said.end_text)
    grows = word_count(text + tokenizer.decode([token])) > written
    if grows and used + 1 >= said.words:
        return True
    return used + 1 + EARLY_WORDS >= said.words and ended(text)


def _sentence_limit(job: Any, token: int, tokenizer: Any) -> bool:
    """Whether a sentence-limited reply closes now: it has just ended its n-th sentence and
    ``token`` would start another (a space or a line break first), or it has just ended one
    within ``EARLY`` tokens of ``max_new_tokens`` (its closing phrase counted), which would
    cut the next in half."""
    said, texts = job.sampler.forced, token_texts(tokenizer)
    if not said.sentences or not job.gen or not tail_ended(job.gen, texts):
        return False
    if job.max_new_tokens - len(said.end) - len(job.gen) <= EARLY:
        return True
    piece = texts[token] if token < len(texts) else ""
    return piece[:1].isspace() and sentence_count(tokenizer.decode(job.gen)) >= said.sentences


def _points(job: Any, token: int, eos: Any, tokenizer: Any) -> int:
    """The token with the reply's bullet points, highlights or placeholders kept
    (``bullets.step``, ``highlights.step``, ``placeholders.step``), once its title is closed
    and until its closing phrase or postscript starts."""
    said, sampler = job.sampler.forced, job.sampler
    keep = next((f for f, on in ((bullet_step, said.bullets), (highlight_step, said.highlights),
                                 (placeholder_step, said.placeholders)) if on is not None), None)
    if (keep is None or sampler.ending is not None
            or (sampler.postscript is not None and sampler.postscript >= 0)
            or (said.title is not None and sampler.titled is None)):
        return token
    words = (sum(w.count for w in said.required) - len(sampler.keywords)) * ROOM
    opened = len(said.start) if sampler.titled is None else sampler.titled
    return keep(job, token, eos, tokenizer, opened, _reserve(job) + max(0, words))


def _reserve(job: Any) -> int:
    """The reply tokens its closing phrase and postscript (its marker and note) need."""
    said = job.sampler.forced
    return len(said.end) + (len(said.ps) + min(PS_NOTE, job.max_new_tokens // 4)
                            if said.ps else 0)


def _keyword(job: Any, token: int, eos: Any, tokenizer: Any, moved: bool) -> int | None:
    """A required word's first token if it is due now (``keywords.py``), or None: not where
    a bullet point or highlight was just forced, a closing phrase or postscript has begun."""
    said, sampler, n = job.sampler.forced, job.sampler, len(job.gen)
    if (not said.required or moved or sampler.ending is not None
            or (sampler.postscript is not None and sampler.postscript >= 0)):
        return None
    if said.words or said.sentences:  # the limit decides where it ends: the word opens it
        now = n == (len(said.start) if said.title is None else sampler.titled)
        short = missing(job, tokenizer) if now else []
        return start(job, tokenizer, short[0][0]) if short else None
    return due(job, token, eos, tokenizer, _reserve(job))


PS_NOTE = 12  # reply tokens kept free for a postscript's note (at most a quarter of the reply)


def _postscript(job: Any, token: int, eos: Any, tokenizer: Any) -> int | None:
    """The postscript's marker token due now, or None: where the reply would end or where
    only the marker, a note and the closing phrase still fit, unless the reply holds it."""
    said, sampler, n = job.sampler.forced, job.sampler, len(job.gen)
    if not said.ps or sampler.postscript == -1:
        return None
    if sampler.postscript is None:
        note = min(PS_NOTE, job.max_new_tokens // 4)
        if not _due(job, token, eos, tokenizer, len(said.end) + len(said.ps) + note):
            return None
        held = not violates(f"ps:{said.ps_text}", tokenizer.decode(job.gen))
        sampler.postscript = -1 if held else n
        if held:
            return None
    k = n - sampler.postscript
    return said.ps[k] if k < len(said.ps) else None


TITLE_TOKENS = 12  # a title's tokens before ``>>`` closes it


def _title(job: Any, token: int, eos: Any, tokenizer: Any) -> int | None:
    """The title's bracket token due now, or None: ``<<`` after the opening phrase; ``>>``
    and a line break where the title would break a line, end the reply or run past
    ``TITLE_TOKENS``, unless the model wrote ``>>`` itself."""
    said, sampler, n = job.sampler.forced, job.sampler, len(job.gen)
    if said.title is None or sampler.titled is not None:
        return None
    (opens, closes), at = said.title, len(said.start) + len(said.title[0])
    if n < at:
        return opens[n - len(said.start)]
    if sampler.title is None:
        piece = tokenizer.decode(job.gen[at:] + [token])
        if ">>" in piece:
            sampler.titled = n + 1
            return None
        if not (n > at and ("\n" in piece or token in eos) or n - at >= TITLE_TOKENS):
            return None
        sampler.title = n
    k = n - sampler.title
    if k < len(closes):
        return closes[k]
    sampler.titled = n
    return None
