"""A reply with at least n ``[placeholders]`` (injection/prompting/constraints.py
``placeholders:<n>``, kept by injection/engine/decoding/placeholders.py): how it is read, how
IFEval counts them, each step of the decoder on SmolLM2's tokenizer (``[``, `` [`` and ``]``
are tokens of its own), and the batch engine keeping it on the
default model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from injection.engine.decoding import bans
from injection.engine.decoding.phrases import forced
from injection.engine.decoding.placeholders import OPENING, ROOM, WORDS
from injection.engine.guidance.contrast import resolve
from injection.model import profiles
from injection.prompting.constraints import detect, kept, violates
from tests.injection.decoding_rows import engine_replies, eos_ids
from tests.injection.decoding_rows import ids as _ids
from tests.injection.decoding_rows import row as _row

READ = [
    ("Include at least two placeholders in square brackets, like [name], in each answer.",
     ("placeholders:2",)),
    ("Always leave a blank in square brackets such as [date] for me to fill in.",
     ("placeholders:1",)),
    ("Use square-bracket placeholders, like [item], at least twice per reply.",
     ("placeholders:2",)),
    ("Always include three placeholders like [x] in replies.", ("placeholders:3",)),
    ("Use four or more [square-bracket] placeholders per reply.", ("placeholders:4",)),
    ("Add two blanks in square brackets, e.g. [name], to every answer.",  # "e.g." ends no
     ("placeholders:2",)),  # sentence: the rest is no second, unread instruction
    ("Never use placeholders in square brackets.", ()),  # negated
    ("Leave blanks for names.", ()),  # no square brackets
    ("Fill in the form fields for me.", ()),
]


@pytest.mark.parametrize(("memory", "want"), READ)
def test_placeholders_are_read_as_a_constraint(memory, want):
    assert detect([memory]) == want
    assert kept(memory, want) == bool(want)  # kept by the decoder: no guide by default


def test_kept_placeholders_run_no_guide_and_beside_bullet_points_they_are_guided():
    smol = SimpleNamespace(_model_key=profiles.read(
        profiles.PROFILES_DIR / "smollm2-135m-instruct.json").model_key)  # SmolLM2's
    alone = ["Add a placeholder like [name] to each reply."]
    assert resolve(smol, None, alone, detect(alone)) == 0.0  # the decoder keeps it
    asked = ["Answer in exactly 2 bullet points.", *alone]
    found = detect(asked)
    assert found == ("bullets:2",) and not kept(alone[0], found)
    assert resolve(smol, None, asked, found) == profiles.guidance_default(smol) > 0


def test_placeholders_count_as_ifeval_counts_them():
    assert not violates("placeholders:2", "Ask your [doctor] at the [store].")
    assert violates("placeholders:2", "Ask your [doctor] at the clinic.")
    assert violates("placeholders:1", "Ask your [\ndoctor].")  # one does not cross a line
    assert not violates("placeholders:1", "Say [] then.")  # IFEval's ``\[.*?\]``


@pytest.mark.slow
@pytest.mark.real_model
def test_the_word_after_a_determiner_becomes_a_placeholder_that_closes_at_a_clause(smol_tok):
    tok = smol_tok
    eos = eos_ids(tok)
    job = _row(tok, ("placeholders:2",), eos)

    def step(piece: str) -> str:  # the model picks ``piece`` (one token): what is written
        (t,) = _ids(tok, piece)
        job.gen.append(forced(job, t, eos, tok))
        return tok.decode(job.gen[-1:])

    said = ["Then", " ask", " your", " doctor", " and", " your", " nurse", " for", " the"]
    assert [step(p) for p in said] == said  # "your" within the first OPENING tokens: left
    assert len(said) == OPENING + 1
    assert step(" store") == " ["  # after "the", past the opening: the word becomes one
    out = bans.apply([job], torch.zeros(1, len(tok)))[0]
    assert torch.isinf(out[_ids(tok, " store")[0]]) and torch.isfinite(out[_ids(tok, "store")[0]])
    assert torch.isinf(out[_ids(tok, "]")[0]])  # not empty
    assert [step(p) for p in ("store", ",")] == ["store", "]"]  # closed where a clause ends
    assert [step(p) for p in (",", " then", " call", " a")] == [",", " then", " call", " a"]
    assert step(" friend") == " ["
    out = bans.apply([job], torch.zeros(1, len(tok)))[0]
    assert torch.isinf(out[_ids(tok, "store")[0]])  # not the first one's word again
    assert torch.isinf(out[eos]).all()  # the second is not closed yet
    assert [step(p) for p in ("best", " old", " pal")] == ["best", " old", "]"]  # WORDS words
    text = tok.decode(job.gen)
    assert text == ("Then ask your doctor and your nurse for the [store], then call a"
                    " [best old]"), text
    assert not violates("placeholders:2", text) and WORDS == 2
    out = bans.apply([job], torch.zeros(1, len(tok)))[0]
    assert torch.isfinite(out[eos]).all() and torch.isfinite(out[_ids(tok, " [")[0]])
    assert torch.isinf(out[_ids(tok, "][")[0]])  # no other bracket outside one


@pytest.mark.slow
@pytest.mark.real_model
def test_the_models_own_brackets_count_and_close(smol_tok):
    tok = smol_tok
    eos = eos_ids(tok)
    job = _row(tok, ("placeholders:1",), eos)
    for piece in ("Dear", " [", "Name", "].", " Thanks"):
        (t,) = _ids(tok, piece)
        assert forced(job, t, eos, tok) == t  # its own: written as chosen
        job.gen.append(t)
    assert job.sampler.placeholders == [1, 3]
    out = bans.apply([job], torch.zeros(1, len(tok)))[0]
    assert torch.isfinite(out[eos]).all()  # one closed: the reply may end


@pytest.mark.slow
@pytest.mark.real_model
def test_placeholders_still_come_when_no_determiner_does(smol_tok):
    tok = smol_tok
    eos = eos_ids(tok)
    job = _row(tok, ("placeholders:3",), eos, max_new=48)
    word = _ids(tok, " and")[0]
    while len(job.gen) < job.max_new_tokens:  # never a determiner, never a clause's end
        job.gen.append(forced(job, word, eos, tok))
    text = tok.decode(job.gen)
    assert not violates("placeholders:3", text) and 3 * ROOM < 48, text


@pytest.mark.slow
@pytest.mark.real_model
def test_the_engine_keeps_placeholders_on_the_default_model(smollm):
    out, plain = engine_replies(smollm, ("placeholders:2",), 48)
    text = smollm.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert not violates("placeholders:2", text), text
    assert violates("placeholders:2", smollm.tokenizer.decode(plain.token_ids))


@pytest.mark.slow
@pytest.mark.real_model
def test_a_word_limit_closes_an_open_placeholder_before_the_reply_ends(smol_tok):
    tok = smol_tok
    eos = eos_ids(tok)
    job = _row(tok, ("max_words:11", "placeholders:1"), eos)
    said = ["Then", " ask", " your", " doctor", " and", " your", " nurse", " for", " the"]
    for piece in [*said, " store", "store"]:  # " store" after "the": opens one, then its word
        (t,) = _ids(tok, piece)
        job.gen.append(forced(job, t, eos, tok))
    assert tok.decode(job.gen).endswith("the [store")
    (now,) = _ids(tok, " now")  # would start the 11th word: the limit
    job.gen.append(forced(job, now, eos, tok))
    assert tok.decode(job.gen[-1:]) == "]"  # closed first ...
    job.gen.append(forced(job, now, eos, tok))
    assert job.gen[-1] in eos  # ... then the reply ends
    text = tok.decode(job.gen[:-1])
    assert not violates("placeholders:1", text) and not violates("max_words:11", text), text
