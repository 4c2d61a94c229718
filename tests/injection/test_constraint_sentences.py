"""A reply of at most n sentences (injection/prompting/constraints.py ``max_sentences:<n>``,
kept by injection/engine/decoding/phrases.py): how it is read, each step of the decoder on
the demo model's real tokenizer, and the batch engine keeping it beside a plain row."""

from __future__ import annotations

import pytest

from injection.base import ExecutionRequest
from injection.engine.batch import BatchEngine
from injection.engine.decoding.phrases import EARLY, forced
from injection.prompting.constraints import detect, kept, violates
from injection.prompting.readers import sentence_count
from tests.injection.test_batch import _in_threads
from tests.injection.test_constraint_highlights import _ids, _row
from tests.injection.test_planner import ASK, TextOnly, planner

READ = [
    ("I like very short answers of one or two sentences.", ("max_sentences:2",)),
    ("Answer in one sentence.", ("max_sentences:1",)),
    ("Keep your replies to two short sentences.", ("max_sentences:2",)),
    ("Never write more than three sentences when you reply.", ("max_sentences:3",)),
    ("Reply in fewer than 3 sentences.", ("max_sentences:2",)),
    ("Use at most 4 sentences per answer.", ("max_sentences:4",)),
    ("Always give one-sentence answers.", ("max_sentences:1",)),
    ("Answer in a single sentence, please.", ("max_sentences:1",)),
    ("Explain your answers in at least five sentences.", ()),  # a lower bound
    ("Answer in 3 or more sentences.", ()),
    ("Never answer in one sentence.", ()),
    ("Start each answer with a sentence about the weather.", ()),  # no count
    ("Answer in between 2 and 4 sentences.", ()),
    ("I like short answers.", ()),
    ("My 2 sons write sentences all day.", ()),  # not about replies
]


def test_bullet_points_decide_where_the_reply_ends():
    """A sentence limit beside bullet points is dropped (their lines end the reply); the
    memory is then not all kept (one sentence per point is not), so it may be guided."""
    memory = "Always answer in exactly 3 bullet points of one sentence each."
    assert detect([memory]) == ("bullets:3",) and not kept(memory, ("bullets:3",))
    assert detect(["Answer in two sentences.", "Always highlight a key phrase in *italics*."]) == (
        "highlights:1",)


@pytest.mark.parametrize(("memory", "want"), READ)
def test_a_sentence_limit_is_read_as_a_constraint(memory, want):
    assert detect([memory]) == want
    assert kept(memory, want) == bool(want)  # kept by the decoder: no guide by default


def test_sentences_are_counted_at_a_words_end_then_a_stop():
    assert sentence_count("Rest. Drink water! Why not? ok") == 3
    assert sentence_count("Take 2.5 litres, i.e. enough") == 1  # "i.e." reads as an end
    assert not violates("max_sentences:2", "Rest. Drink water!")
    assert violates("max_sentences:1", "Rest. Drink water!")


def _write(job, tok, eos, text: str) -> list[int]:
    """The row's tokens when the model picks ``text``'s tokens one by one, then the end."""
    for pick in [*_ids(tok, text), eos[0]]:
        token = forced(job, pick, eos, tok)
        job.gen.append(token)
        if token in eos:
            break
    return job.gen


def test_the_reply_ends_where_its_nth_sentence_ends(adapter):
    tok, eos = adapter.tokenizer, sorted(adapter._eos_ids())
    gen = _write(_row(tok, ("max_sentences:2",), eos), tok, eos,
                 "Rest well. Drink some water. Then sleep all night.")
    assert gen[-1] in eos and tok.decode(gen[:-1]) == "Rest well. Drink some water."
    gen = _write(_row(tok, ("max_sentences:1",), eos), tok, eos, "Rest well.\nDrink some water.")
    assert tok.decode(gen[:-1]) == "Rest well."  # a line break starts the next one
    gen = _write(_row(tok, ("max_sentences:1",), eos), tok, eos, "Use 2.5 litres. Then rest.")
    assert tok.decode(gen[:-1]) == "Use 2.5 litres."  # "2." ends no sentence


def test_near_the_cut_the_reply_ends_at_a_sentences_end(adapter):
    """Where ``max_new_tokens`` would cut the next sentence, the reply ends at this one's
    end (within ``EARLY`` tokens of the cut), under its limit."""
    tok, eos = adapter.tokenizer, sorted(adapter._eos_ids())
    first, two = "Rest well and drink some water.", ("max_sentences:2",)
    n = len(_ids(tok, first))
    gen = _write(_row(tok, two, eos, n + EARLY), tok, eos, first + " Then sleep all night.")
    assert tok.decode(gen[:-1]) == first
    gen = _write(_row(tok, two, eos, n + EARLY + 1), tok, eos, first + " Then sleep.")
    assert tok.decode(gen[:-1]) == first + " Then sleep."  # room: the second sentence


def test_a_closing_phrase_comes_after_the_last_sentence(adapter):
    tok, eos = adapter.tokenizer, sorted(adapter._eos_ids())
    gen = _write(_row(tok, ("end:Good luck!", "max_sentences:1"), eos), tok, eos,
                 "Rest well. Drink some water.")
    assert tok.decode(gen[:-1]) == "Rest well. Good luck!"


@pytest.mark.slow
@pytest.mark.real_model
def test_the_engine_keeps_the_limit_beside_a_plain_row(smollm):
    """On the default model (the demo model writes no sentence's end): the limited reply is
    the plain one's words, ended after its first sentence, both in one batch."""
    ids = smollm.renderer.encode(smollm.render_chat(ASK), first=True)
    eng = BatchEngine(smollm, max_batch=4)
    try:
        one, plain = _in_threads([
            lambda: eng.run(None, 1.0, ids, 48, constraints=("max_sentences:1",)),
            lambda: eng.run(None, 1.0, ids, 48)])
    finally:
        eng.close()
    text, plain_text = (smollm.tokenizer.decode(r.token_ids, skip_special_tokens=True)
                        for r in (one, plain))
    assert sentence_count(text) == 1 and not violates("max_sentences:1", text), text
    assert text == plain_text[:len(text)] and violates("max_sentences:1", plain_text)


def test_a_sentence_limited_member_is_kept_so_not_guided_by_default(adapter, monkeypatch):
    from injection.engine.guidance import contrast
    from injection.model import profiles

    text = TextOnly(adapter.tokenizer)
    monkeypatch.setattr(text, "_profile", profiles.Profile(
        "test", "any", 1.0, True, "test", {}), raising=False)  # guidance on by default
    memory = "I like very short answers of one or two sentences."
    found = planner(text, batching=True).plan(
        ExecutionRequest("t", "u", ASK, memory)).sampling["constraints"]
    assert found == ("max_sentences:2",)
    assert contrast.resolve(text, None, [memory], found) == 0.0
    assert contrast.resolve(text, None, [memory], ()) > 0  # before: a guided member
