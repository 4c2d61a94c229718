"""A reply of exactly n bullet points (injection/prompting/constraints.py ``bullets:<n>``,
kept by injection/engine/decoding/bullets.py): how it is read, each step of the decoder on
the demo model's real tokenizer, and the batch engine keeping it beside a plain row."""

from __future__ import annotations

import pytest
import torch

from injection.base import ExecutionRequest
from injection.engine.batch import BatchEngine
from injection.engine.decoding import bans
from injection.engine.decoding.bullets import POINT
from injection.engine.decoding.phrases import OWN, forced
from injection.engine.sampling import RowSampler
from injection.prompting.constraints import detect, kept, violates
from tests.injection.test_batch import _in_threads
from tests.injection.test_planner import ASK, TextOnly, planner

READ = [
    ("Always answer in exactly 3 bullet points.", ("bullets:3",)),
    ("Give me two markdown bullets per reply, nothing else.", ("bullets:2",)),
    ("Reply with five bulleted items each time.", ("bullets:5",)),
    ("Please format each answer as 2 short bullet-points.", ("bullets:2",)),
    ("Use at most 3 bullet points when you answer.", ()),  # a bound, not a count
    ("Answer in 3 or more bullet points.", ()),
    ("Never reply in 4 bullet points.", ()),
    ("Use bullet points in your answers.", ()),  # no count
    ("My 3 kids love bullet points in answers.", ()),
    ("Answer in between 2 and 4 bullet points.", ()),
]


@pytest.mark.parametrize(("memory", "want"), READ)
def test_a_bullet_count_is_read_as_a_constraint(memory, want):
    assert detect([memory]) == want
    assert kept(memory, want) == bool(want)  # kept by the decoder: no guide by default


def test_points_are_counted_as_ifeval_counts_them():
    assert not violates("bullets:2", "* Rest.\n* Drink water.")
    assert not violates("bullets:2", "Tips:\n\n- Rest.\n  * Drink water.")  # "-" counts too
    assert violates("bullets:2", "* Rest.\n**Bold** is no point.")
    assert violates("bullets:2", "* Rest.\n* Drink.\n* Sleep.")


def _job(tok, said, max_new: int = 64):
    class Job:
        sampler = RowSampler(forced=said)
        max_new_tokens = max_new
        gen: list[int] = []

    return Job


def _said(tok, constraints, eos):
    return bans.prepare(tok, constraints, eos)[1]


def _word(tok, text: str) -> int:
    (i,) = tok(text, add_special_tokens=False)["input_ids"]
    return i


def test_each_point_opens_with_a_star_and_the_reply_ends_after_the_last(adapter):
    tok, eos = adapter.tokenizer, sorted(adapter._eos_ids())
    said = _said(tok, ("bullets:2",), eos)
    star, nl, stop, word = said.bullets.star, said.bullets.newline, eos[0], _word(tok, " cook")
    job = _job(tok, said)
    job.sampler.token_map = None

    def step(pick: int) -> int:
        token = forced(job, pick, eos, tok)
        job.gen.append(token)
        return token

    assert step(word) == star  # the reply opens with the first point
    assert step(word) == word
    assert step(stop) == nl  # the end of turn before the second point: a line break
    assert step(word) == star and step(word) == word
    assert step(nl) == stop  # a line break after the last point ends the reply
    assert tok.decode(job.gen).startswith("* cook\n* cook")
    assert not violates("bullets:2", tok.decode(job.gen[:-1]))


def test_a_points_first_token_is_a_new_word_after_a_space(adapter):
    """Right after a ``*``: no "**", no line break, no end of turn (``OWN`` tokens), no
    word glued to the star, and not the word an earlier point opened with."""
    tok, eos = adapter.tokenizer, sorted(adapter._eos_ids())
    said = _said(tok, ("bullets:3",), eos)
    job = _job(tok, said)
    job.sampler.token_map = None
    rest, star = _word(tok, " cook"), said.bullets.star
    job.gen, job.sampler.bullets = [star], [0]
    out = bans.apply([job], torch.zeros(1, len(tok)))[0]
    for text in ("*", "\n", "The"):  # "**" is two stars in this tokenizer
        assert torch.isinf(out[_word(tok, text)]), text
    assert torch.isinf(out[eos]).all() and torch.isfinite(out[rest])
    job.gen, job.sampler.bullets = [star, rest, said.bullets.newline, star], [0, 3]
    out = bans.apply([job], torch.zeros(1, len(tok)))[0]
    assert torch.isinf(out[rest]) and torch.isfinite(out[_word(tok, " drink")])
    job.gen = job.gen + [rest] * OWN
    assert torch.equal(bans.apply([job], torch.zeros(1, len(tok)))[0], torch.zeros(len(tok)))


def test_a_point_breaks_where_only_the_points_to_come_still_fit(adapter):
    tok, eos = adapter.tokenizer, sorted(adapter._eos_ids())
    said = _said(tok, ("bullets:3",), eos)
    word = _word(tok, " cook")
    job = _job(tok, said, max_new=40)
    job.sampler.token_map = None
    while len(job.gen) < job.max_new_tokens:  # a model that never breaks a line
        job.gen.append(forced(job, word, eos, tok))
    text = tok.decode(job.gen)
    assert not violates("bullets:3", text), text
    last = len(job.gen) - 1 - job.gen[::-1].index(said.bullets.star)
    assert len(job.gen) - last >= POINT - 1  # the last point has room of its own


def test_an_opening_phrase_stands_on_its_own_line_before_the_points(adapter):
    tok, eos = adapter.tokenizer, sorted(adapter._eos_ids())
    said = _said(tok, ("bullets:2", "start:Hi!"), eos)
    job = _job(tok, said)
    word = _word(tok, " cook")
    for _ in range(len(said.start) + 3):
        job.gen.append(forced(job, word, eos, tok))
    assert tok.decode(job.gen).startswith("Hi!\n* cook")


def test_the_engine_writes_exactly_n_points_on_the_demo_model(adapter):
    ids = adapter.renderer.encode(adapter.render_chat(ASK), first=True)
    eng = BatchEngine(adapter, max_batch=4)
    try:
        three, plain = _in_threads([
            lambda: eng.run(None, 1.0, ids, 60, constraints=("bullets:3",)),
            lambda: eng.run(None, 1.0, ids, 60)])
    finally:
        eng.close()
    text = adapter.tokenizer.decode(three.token_ids, skip_special_tokens=True)
    assert not violates("bullets:3", text), text
    assert all(line.startswith("* ") for line in text.strip().split("\n")), text
    assert violates("bullets:3", adapter.tokenizer.decode(plain.token_ids))


def test_a_bulleted_member_is_kept_so_not_guided_by_default(adapter, monkeypatch):
    from injection.engine.guidance import contrast
    from injection.model import profiles

    text = TextOnly(adapter.tokenizer)
    monkeypatch.setattr(text, "_profile", profiles.Profile(
        "test", "any", 1.0, True, "test", {}), raising=False)  # guidance on by default
    memory = "Always answer in exactly 3 bullet points."
    found = planner(text, batching=True).plan(
        ExecutionRequest("t", "u", ASK, memory)).sampling["constraints"]
    assert found == ("bullets:3",)
    assert contrast.resolve(text, None, [memory], found) == 0.0
    assert contrast.resolve(text, None, [memory], ()) == 1.0  # constraints off: guided
