"""A reply with at least n ``*highlighted*`` spans after its first sentence (injection/prompting/constraints.py
``highlights:<n>``, kept by injection/engine/decoding/highlights.py): how it is read, how
IFEval counts the spans, each step of the decoder on SmolLM2's tokenizer (``" *"`` is one
of its tokens; the demo tokenizer has none, so the decoder leaves it alone there), and the
batch engine keeping it on the default model."""

from __future__ import annotations

import pytest
import torch

from injection.engine.decoding import bans
from injection.engine.decoding.highlights import WORDS
from injection.engine.decoding.phrases import forced
from injection.prompting.constraints import detect, kept, violates
from tests.injection.decoding_rows import engine_replies, eos_ids
from tests.injection.decoding_rows import ids as _ids
from tests.injection.decoding_rows import row as _row

READ = [
    ("Highlight at least two parts of every answer with markdown, like *this*.",
     ("highlights:2",)),
    ("Always emphasise a key phrase in *asterisks*.", ("highlights:1",)),
    ("Mark three key terms in each reply in bold.", ("highlights:3",)),
    ("Use *italics* to highlight something at least twice per answer.", ("highlights:2",)),
    ("Never highlight anything with asterisks.", ()),
    ("Mark your answers with a score out of 10.", ()),  # no markdown
    ("Use bold for headings.", ()),  # no highlighting asked
]


@pytest.mark.parametrize(("memory", "want"), READ)
def test_highlights_are_read_as_a_constraint(memory, want):
    assert detect([memory]) == want
    assert kept(memory, want) == bool(want)  # kept by the decoder: no guide by default


def test_bullet_points_win_over_highlights_and_spans_count_as_ifeval_counts_them():
    assert detect(["Answer in exactly 2 bullet points.", "Highlight a phrase with *this*."]
                  ) == ("bullets:2",)
    assert not violates("highlights:2", "*Pack light* and **take a coat**.")
    assert violates("highlights:2", "*Pack light* and ** ** or * *.")
    assert violates("highlights:1", "Pack *\nlight*.")  # a span does not cross a line




@pytest.mark.slow
@pytest.mark.real_model
def test_a_span_opens_the_reply_and_the_next_sentence_and_closes_at_a_clause(smol_tok):
    tok = smol_tok
    eos = eos_ids(tok)
    job = _row(tok, ("highlights:2",), eos)

    def step(piece: str) -> str:  # the model picks ``piece`` (one token): what is written
        (t,) = _ids(tok, piece)
        job.gen.append(forced(job, t, eos, tok))
        return tok.decode(job.gen[-1:])

    assert [step(p) for p in ("Sleep", " well", ".")] == ["Sleep", " well", "."]  # its own
    assert step(" Pack") == " *"  # the next sentence opens a span (the model's word lost)
    out = bans.apply([job], torch.zeros(1, len(tok)))[0]
    assert torch.isinf(out[_ids(tok, " Pack")[0]]) and torch.isfinite(out[_ids(tok, "Pack")[0]])
    assert [step(p) for p in ("Pack", " light", ",")] == ["Pack", " light", "*"]  # a clause
    assert [step(p) for p in (",", " then", " go", ".", " Take")] == [
        ",", " then", " go", ".", " *"]  # and the next
    out = bans.apply([job], torch.zeros(1, len(tok)))[0]
    assert torch.isinf(out[_ids(tok, " Take")[0]]) and torch.isinf(out[_ids(tok, "Pack")[0]])
    assert torch.isfinite(out[_ids(tok, "Take")[0]])  # glued, and not the first span's word
    assert torch.isinf(out[eos]).all()  # the second span is not closed yet
    assert [step(p) for p in ("Take", " a", " coat", " with", " with")] == [
        "Take", " a", " coat", "*", " with"]  # closed after WORDS words, not after "a"
    text = tok.decode(job.gen)
    assert text == "Sleep well. *Pack light*, then go. *Take a coat* with", text
    assert not violates("highlights:2", text) and WORDS == 3
    out = bans.apply([job], torch.zeros(1, len(tok)))[0]
    assert torch.isfinite(out[eos]).all() and torch.isinf(out[_ids(tok, "*")[0]])


@pytest.mark.slow
@pytest.mark.real_model
def test_spans_still_come_when_a_sentence_runs_to_the_cut(smol_tok):
    tok = smol_tok
    eos = eos_ids(tok)
    job = _row(tok, ("highlights:3",), eos, max_new=48)
    word = _ids(tok, " and")[0]
    while len(job.gen) < job.max_new_tokens:  # one long sentence, never a clause's end
        job.gen.append(forced(job, word, eos, tok))
    text = tok.decode(job.gen)
    assert not violates("highlights:3", text), text


@pytest.mark.slow
@pytest.mark.real_model
def test_the_engine_highlights_replies_on_the_default_model(smollm):
    out, plain = engine_replies(smollm, ("highlights:2",), 48)
    text = smollm.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert not violates("highlights:2", text), text
    assert violates("highlights:2", smollm.tokenizer.decode(plain.token_ids))


@pytest.mark.slow
@pytest.mark.real_model
def test_a_word_limit_closes_an_open_span_before_the_reply_ends(smol_tok):
    tok = smol_tok
    eos = eos_ids(tok)
    job = _row(tok, ("highlights:1", "max_words:5"), eos)
    for piece in ("Sleep", " well", "\n", "Pack", "Pack", " light"):  # a line's start: a span
        (t,) = _ids(tok, piece)
        job.gen.append(forced(job, t, eos, tok))
    assert tok.decode(job.gen) == "Sleep well\n*Pack light"
    (now,) = _ids(tok, " now")  # would start the 5th word: the limit
    assert [tok.decode([forced(job, now, eos, tok)])] == ["*"]  # closed first ...
    job.gen.append(_ids(tok, "*")[0])
    assert forced(job, now, eos, tok) in eos  # ... then the reply ends
    text = tok.decode(job.gen)
    assert not violates("highlights:1", text) and not violates("max_words:5", text), text
