"""A reply that holds a word at least n times (injection/prompting/constraints.py
``word:<word>:<n>``, kept by injection/engine/decoding/keywords.py): how it is read (and
not read: a ban, a capped count, a word another replaces, an opening or closing phrase),
how it is counted, each step of the decoder on SmolLM2's tokenizer, and the batch engine
keeping it on the default model."""

from __future__ import annotations

import pytest
import torch

from injection.engine.decoding import bans
from injection.engine.decoding.keywords import NGRAM, OWN
from injection.engine.decoding.phrases import forced
from injection.prompting.constraints import detect, kept, violates
from tests.injection.decoding_rows import engine_replies, eos_ids
from tests.injection.decoding_rows import ids as _ids
from tests.injection.decoding_rows import row as _row

READ = [
    ("Work the word 'harvest' into every reply.", ("word:harvest:1",)),
    ("Say 'splendid' at least three times in each answer.", ("word:splendid:3",)),
    ("Mention 'kayak' more than once whenever you answer me.", ("word:kayak:2",)),
    ("Your replies should always contain the phrase 'all aboard'.", ("word:all aboard:1",)),
    ("Repeat the word 'onward' at least twice in each reply.", ("word:onward:2",)),
    ("Never use the word 'basically' in your answers.", ("ban:basically",)),
    ("Never reply without using the word 'tide'.", ("word:tide:1",)),  # asked, twice negated
    ("Use 'colour' instead of 'color' in every answer.", ("word:colour:1",)),
    ("Use 'honestly' at most twice in a reply.", ()),  # a cap, not a request
    ("Use the word 'maybe' no more than twice per reply.", ()),  # nor a ban
    ("Start every reply with the word 'Howdy'.", ("start:Howdy",)),  # an opening phrase
    ("End each answer with the word 'Onwards'.", ("end:Onwards",)),
    ("My cat is called 'Pixel'.", ()),  # a fact, no standing instruction
]


@pytest.mark.parametrize(("memory", "want"), READ)
def test_required_words_are_read_as_a_constraint(memory, want):
    assert detect([memory]) == want
    assert kept(memory, want) == bool(want)  # kept by the decoder: no guide by default


def test_a_word_both_required_and_banned_is_neither_and_lowercase_stays_beside_it():
    assert detect(["Always use the word 'awesome'.", "Never say the word 'awesome'."]) == ()
    assert detect(["Reply in lowercase and include the word 'Tulip' each time."]) == (
        "lowercase", "word:tulip:1")


def test_a_required_word_is_counted_whole_in_any_case():
    assert not violates("word:garden:2", "The garden. Garden-fresh, too.")
    assert violates("word:garden:2", "The garden and the gardens.")  # "gardens" is not it
    assert not violates("word:all aboard:1", "All  aboard, friends.")
    assert violates("word:tide:1", "Low tides.")


def _stepper(tok, job, eos):
    def step(piece: str | None) -> str:  # the model picks ``piece`` (None: the end of turn)
        t = eos[0] if piece is None else _ids(tok, piece)[0]
        job.gen.append(forced(job, t, eos, tok))
        return "<end>" if job.gen[-1] in eos else tok.decode(job.gen[-1:])
    return step


@pytest.mark.slow
@pytest.mark.real_model
def test_the_word_opens_a_sentence_where_the_reply_would_end_and_the_end_waits(smol_tok):
    tok = smol_tok
    eos = eos_ids(tok)
    job = _row(tok, ("word:kayak:2",), eos)
    step = _stepper(tok, job, eos)
    assert [step(p) for p in ("Row", " daily", ".")] == ["Row", " daily", "."]
    assert len(_ids(tok, " Kayak")) == 2
    assert step(None) + step(" the") == " Kayak"  # the end of turn: the word instead, whole
    held = bans.apply([job], torch.zeros(1, len(tok)))[0]
    assert torch.isinf(held[eos]).all()  # the model writes OWN tokens of its own first
    assert [step(p) for p in (" trips", " need", " sun", ".")] == [" trips", " need", " sun",
                                                                  "."]
    assert OWN == 4 and torch.isfinite(bans.apply([job], torch.zeros(1, len(tok)))[0][eos]).all()
    assert step(None) + step(" it") == " Kayak"  # the second time it is due
    text = tok.decode(job.gen)
    assert text == "Row daily. Kayak trips need sun. Kayak", text
    for p in (" on", " water", ".", None):
        step(p)
    assert job.gen[-1] in eos and not violates("word:kayak:2", tok.decode(job.gen[:-1]))


@pytest.mark.slow
@pytest.mark.real_model
def test_a_word_the_model_writes_itself_is_not_forced_and_lowercase_folds_it(smol_tok):
    tok = smol_tok
    eos = eos_ids(tok)
    job = _row(tok, ("word:garden:1",), eos)
    step = _stepper(tok, job, eos)
    assert [step(p) for p in ("My", " garden", ".", None)] == ["My", " garden", ".", "<end>"]
    job = _row(tok, ("lowercase", "word:garden:1"), eos)
    step = _stepper(tok, job, eos)
    assert [step(p) for p in ("yes", ".", None)] == ["yes", ".", " garden"]


@pytest.mark.slow
@pytest.mark.real_model
def test_the_word_comes_in_the_second_half_or_mid_sentence_at_the_cut(smol_tok):
    tok = smol_tok
    eos = eos_ids(tok)
    job = _row(tok, ("word:garden:1",), eos, max_new=40)
    step = _stepper(tok, job, eos)
    step("Yes"), step(".")  # a sentence's end in the first half: not yet
    assert step(" It") == " It"
    while len(job.gen) < 20:
        step(" and")
    assert step(".") == "." and step(" Then") == " Garden"  # the second half: the next sentence
    job = _row(tok, ("word:garden:2",), eos, max_new=40)
    step = _stepper(tok, job, eos)
    while len(job.gen) < job.max_new_tokens:  # one sentence to the cut, never an end
        step(" and")
    text = tok.decode(job.gen)
    assert not violates("word:garden:2", text) and "garden garden" not in text, text


@pytest.mark.slow
@pytest.mark.real_model
def test_under_a_word_limit_the_word_opens_the_reply(smol_tok):
    tok = smol_tok
    eos = eos_ids(tok)
    job = _row(tok, ("max_words:12", "word:garden:1"), eos)
    step = _stepper(tok, job, eos)
    assert step("Water") + step(" is") == "Garden"


@pytest.mark.slow
@pytest.mark.real_model
def test_the_engine_keeps_the_word_on_the_default_model(smollm):
    out, plain = engine_replies(smollm, ("word:lantern:2",), 48)
    text = smollm.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert not violates("word:lantern:2", text), text
    assert violates("word:lantern:1", smollm.tokenizer.decode(plain.token_ids))


@pytest.mark.slow
@pytest.mark.real_model
def test_after_a_forced_word_the_reply_repeats_no_run_of_its_own_tokens(smol_tok):
    tok = smol_tok
    job = _row(tok, ("word:kayak:2",), eos_ids(tok))
    job.gen = _ids(tok, "Row on the lake. Kayak on the lake")
    again = _ids(tok, ".")[0]  # " on the lake." would come twice: NGRAM tokens
    assert NGRAM == 4 and job.gen[1:5] == [*job.gen[-3:], again]
    plain = bans.apply([job], torch.zeros(1, len(tok)))[0]
    assert torch.isfinite(plain[again])  # no word forced yet: the model's own choice
    job.sampler.keywords.append((5, tuple(_ids(tok, " Kayak"))))
    out = bans.apply([job], torch.zeros(1, len(tok)))[0]
    banned = set(torch.isinf(out).nonzero().flatten().tolist())
    assert banned == {again, *eos_ids(tok)}  # and the end waits for the model's own tokens


@pytest.mark.slow
@pytest.mark.real_model
def test_two_required_words_are_each_forced_in_turn(smol_tok):
    tok = smol_tok
    eos = eos_ids(tok)
    assert detect(["Always use the words 'pear' and 'apple' in your answers."]) == (
        "word:apple:1", "word:pear:1")
    job = _row(tok, ("word:apple:1", "word:pear:1"), eos)
    step = _stepper(tok, job, eos)
    for p in ("Eat", " fruit", ".", None, " is", " sweet", " and", " good", ".", None):
        step(p)
    while job.gen[-1] not in eos:
        step(None) if len(job.gen) > 30 else step(" too")
    text = tok.decode(job.gen[:-1])
    assert text.startswith("Eat fruit. Apple is sweet and good. Pear"), text
    assert not violates("word:apple:1", text) and not violates("word:pear:1", text)
