"""Decoding constraints that open or close a reply with the user's own words or a
postscript (injection/prompting/constraints.py ``repeat`` and ``ps:``, kept by
injection/engine/decoding/bans.py): how they are read, the planner's opening from the turn's user
message, and the batch engine keeping them on the demo model's real tokenizer."""

from __future__ import annotations

import pytest

from injection.base import ExecutionRequest
from injection.engine.batch import BatchEngine
from injection.engine.decoding.phrases import Phrases, forced, phrases
from injection.engine.sampling import RowSampler
from injection.prompting.constraints import detect, kept, opening, violates
from tests.injection.test_batch import _in_threads
from tests.injection.test_planner import ASK, TextOnly, planner

READ = [
    ("Begin every answer by repeating my question word for word.", ("repeat",)),
    ("Please restate my question before you reply.", ("repeat",)),
    ("Open each response with the user's exact message, then answer.", ("repeat",)),
    ("Don't repeat my question back to me when you answer.", ()),
    ("Start each answer with a summary of my question.", ()),
    ("Answer my questions directly.", ()),
    ("Always add a P.S. at the end of your replies.", ("ps:P.S.",)),
    ("Sign off every answer with a P.P.S. line.", ("ps:P.P.S.",)),
    ("End each reply with a short postscript.", ("ps:P.S.",)),
    ("Add a postscript, marked P.P.S., to what you write.", ("ps:P.P.S.",)),
    ("Never add a postscript to your answers.", ()),
    ("Always send my parcels with U.P.S. when you answer about shipping.", ()),
    ("Always copy the message of the day into your replies.", ()),
    ("Only ever reply with 'Yes.', 'No.' or 'Maybe.'", ("choice:Yes.|No.|Maybe.",)),
    ("Reply with 'Yes' or 'No' only, no other words.", ("choice:Yes|No",)),
    ("Never answer with just 'yes' or 'no'.", ()),
    ("Reply with just one of these: Sure / No way", ("choice:Sure|No way",)),
    ("Reply with one of: yes, no.", ()),  # a comma list: not read
    ("Only recommend 'Acme Pro' or 'Acme Lite' to customers.", ()),  # not the reply's text
    ("Keep every answer under 20 words.", ("max_words:20",)),
    ("Never write more than 29 words when you reply.", ("max_words:30",)),
    ("Answer in at most 15 words, please.", ("max_words:16",)),
    ("Don't keep your answers under 50 words.", ()),
    ("Only start replies with 'Hi' or 'Hey'.", ("start:Hi",)),
]


@pytest.mark.parametrize(("memory", "want"), READ)
def test_openings_and_postscripts_read_as_constraints(memory, want):
    assert detect([memory]) == want
    assert kept(memory, want) == bool(want)  # kept by the decoder: no guide by default


def test_the_tenants_opening_wins_and_repeat_becomes_the_users_message():
    member = ["Always restate my question first.", "Reply in lowercase."]
    assert detect(member) == ("lowercase", "repeat")
    assert detect(member, "Start every reply with 'acme:'.") == ("lowercase", "start:acme:")
    assert opening(("no_comma", "repeat"), " What is\n 2+2? ") == (
        "no_comma", "repeat", "start:What is 2+2?")
    assert opening(("repeat",), "  ") == ()  # nothing to repeat
    assert opening(("lowercase", "repeat"), "Why Not?") == (
        "lowercase", "repeat", "start:why not?")
    assert not violates("ps:P.S.", "Done. p.s. bring a coat") and violates("ps:P.S.", "Done.")


def test_the_planner_opens_with_the_turns_user_message(adapter):
    text = TextOnly(adapter.tokenizer)
    on = planner(text, batching=True)
    echo = "Begin every answer by repeating my question word for word."
    history = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"},
               *ASK]
    plan = on.plan(ExecutionRequest("t", "u", history, echo))
    assert plan.sampling["constraints"] == ("repeat", f"start:{ASK[0]['content']}")
    assert "constraints" not in on.plan(ExecutionRequest("t", "u", ASK, echo,
                                                         constrain=False)).sampling


def _job(tok, gen_text: str, said: Phrases, max_new: int = 64):
    class Job:
        sampler = RowSampler(forced=said)
        max_new_tokens = max_new
        gen = tok(gen_text, add_special_tokens=False)["input_ids"] if gen_text else []

    return Job


def test_a_postscript_where_the_reply_would_end_unless_it_holds_one(adapter):
    tok, eos = adapter.tokenizer, adapter._eos_ids()
    said = phrases(tok, ("ps:P.S.",))
    assert tok.decode(said.ps) == "\n\nP.S." and said.start == said.end == ()
    stop = next(iter(eos))
    job = _job(tok, "Pack light.", said)
    assert forced(job, 7, eos, tok) == 7  # room left, not ending: the model's own
    out = [forced(job, stop, eos, tok)]  # it would end: the marker, token by token
    while len(out) < len(said.ps):
        job.gen.append(out[-1])
        out.append(forced(job, stop, eos, tok))
    assert tuple(out) == said.ps
    job.gen.append(out[-1])
    assert forced(job, 9, eos, tok) == 9 and forced(job, stop, eos, tok) == stop  # the note
    done = _job(tok, "Pack light.\n\nP.S. Have fun.", said)
    assert forced(done, stop, eos, tok) == stop  # said already: the reply ends


def test_the_engine_keeps_a_postscript_and_an_opening_on_the_demo_model(adapter):
    ids = adapter.renderer.encode(adapter.render_chat(ASK), first=True)
    said = ("ps:P.P.S.", "start:What should I cook tonight?")
    start = adapter.tokenizer(said[1][6:], add_special_tokens=False)["input_ids"]
    eng = BatchEngine(adapter, max_batch=4)
    try:
        short, long = (eng.run(None, 1.0, ids, n, constraints=said) for n in (40, 300))
        plain = eng.run(None, 1.0, ids, 300)
    finally:
        eng.close()
    for out in (short, long):
        text = adapter.tokenizer.decode(out.token_ids)
        assert out.token_ids[:len(start)] == start and "\n\nP.P.S." in text
    assert len(short.token_ids) == 40  # where only the marker and a note still fit
    assert "P.P.S." not in adapter.tokenizer.decode(plain.token_ids)


def test_a_title_opens_the_reply_and_is_closed_at_its_line_break(adapter):
    tok, eos = adapter.tokenizer, adapter._eos_ids()
    assert detect(["Give each answer a title wrapped in double angular brackets."]) == (
        "title",)
    assert detect(["Never put a title in <<brackets>> on your replies."]) == ()
    said = phrases(tok, ("title",))
    (opens, closes), nl = said.title, tok("\n", add_special_tokens=False)["input_ids"][0]
    job = _job(tok, "", said)
    for want in opens:  # "<<" whatever the model picks
        assert forced(job, nl, eos, tok) == want
        job.gen.append(want)
    job.gen += tok("Packing", add_special_tokens=False)["input_ids"]
    out = [forced(job, nl, eos, tok)]  # the title's line break: ">>" then the break
    while len(out) < len(closes):
        job.gen.append(out[-1])
        out.append(forced(job, nl, eos, tok))
    job.gen.append(out[-1])
    assert tuple(out) == closes and forced(job, nl, eos, tok) == nl
    assert tok.decode(job.gen) == "<<Packing>>\n" and not violates("title", tok.decode(job.gen))
    own = _job(tok, "<<Packing>", said)  # the model closes it itself
    close = tok(">", add_special_tokens=False)["input_ids"][0]
    assert forced(own, close, eos, tok) == close and forced(own, nl, eos, tok) == nl
    from injection.engine.decoding.phrases import OWN, holds

    said = said._replace(eos=tuple(eos))  # as ``bans.prepare`` builds it
    own.sampler.forced = said
    own.gen.append(close)
    assert holds(own)  # a bare title is no reply: OWN tokens of its own first
    own.gen += [nl] * OWN
    assert not holds(own)


def test_the_engine_titles_a_reply_on_the_demo_model(adapter):
    ids = adapter.renderer.encode(adapter.render_chat(ASK), first=True)
    eng = BatchEngine(adapter, max_batch=4)
    try:
        out = eng.run(None, 1.0, ids, 60, constraints=("title",))
    finally:
        eng.close()
    text = adapter.tokenizer.decode(out.token_ids)
    assert text.startswith("<<") and not violates("title", text), text


def test_a_reply_that_is_one_of_its_options_on_the_demo_model(adapter):
    """The model chooses among the options (the mask lets through only their next tokens)
    and the reply ends where one is complete; other rows in the step are left alone."""
    tok = adapter.tokenizer
    opts = ["My answer is yes.", "My answer is no.", "My answer is maybe."]
    ids = adapter.renderer.encode(adapter.render_chat(ASK), first=True)
    eng = BatchEngine(adapter, max_batch=4)
    try:
        out, plain = _in_threads([
            lambda: eng.run(None, 1.0, ids, 40, constraints=("choice:" + "|".join(opts),)),
            lambda: eng.run(None, 1.0, ids, 40)])
    finally:
        eng.close()
    assert tok.decode(out.token_ids[:-1]) in opts and out.finish_reason == "stop"
    assert tok.decode(plain.token_ids) not in opts and len(plain.token_ids) > 8
    said = phrases(tok, ("choice:Yes|No", "end:Bye"))
    assert said.end == () and len(said.choices) == 2  # no other phrase applies to it


def test_no_end_of_turn_right_after_a_forced_opening_or_marker(adapter):
    """A reply that repeats the question goes on to answer it: its end of turn is masked
    until it has written ``OWN`` tokens of its own; so after a postscript's marker."""
    import torch

    from injection.engine.decoding import bans
    from injection.engine.decoding.phrases import OWN

    tok, eos = adapter.tokenizer, sorted(adapter._eos_ids())
    _, said = bans.prepare(tok, ("start:Why?", "ps:P.S."), eos)
    job = _job(tok, "", said)
    job.sampler.token_map = None
    scores = torch.zeros(1, len(tok))
    for n in range(len(said.start) + OWN + 1):
        job.gen = [5] * n
        out = bans.apply([job], scores)
        assert bool(torch.isinf(out[0, eos]).all()) == (n < len(said.start) + OWN), n
        assert torch.isfinite(out[0, :eos[0]]).all()
    job.sampler.postscript = n  # the marker starts here
    job.gen = [5] * (n + len(said.ps))
    assert torch.isinf(bans.apply([job], scores)[0, eos]).all()
    job.gen += [5] * OWN
    assert torch.isfinite(bans.apply([job], scores)[0, eos]).all()


def test_a_closing_phrase_comes_at_a_sentence_end_just_before_the_cut(adapter):
    """Within ``EARLY`` tokens of where only the phrase still fits, a sentence that has
    just ended brings it in (not cut mid-sentence); further from the cut it does not."""
    from injection.engine.decoding.phrases import EARLY
    from injection.engine.decoding.text import ended as _ended

    assert _ended("Take a coat.") and _ended('He said "go!" ') and not _ended("steps:\n\n1.")

    tok, eos = adapter.tokenizer, adapter._eos_ids()
    said = phrases(tok, ("end:Bye.",))
    body = tok("Pack light. Take a coat.", add_special_tokens=False)["input_ids"]
    far = _job(tok, "Pack light. Take a coat.", said, max_new=len(body) + len(said.end) + EARLY + 1)
    assert forced(far, 7, eos, tok) == 7
    near = _job(tok, "Pack light. Take a coat.", said, max_new=len(body) + len(said.end) + EARLY)
    assert forced(near, 7, eos, tok) == said.end[0]
    mid = _job(tok, "Pack light. Take a", said, max_new=len(body) + len(said.end) + 2)
    assert forced(mid, 7, eos, tok) == 7  # mid-sentence: until only the phrase fits


def test_a_word_limit_ends_the_reply_at_a_word_or_sentence_end(adapter):
    tok, eos = adapter.tokenizer, adapter._eos_ids()
    stop, said = next(iter(eos)), phrases(tok, ("max_words:20",))
    word, piece = (tok(t, add_special_tokens=False)["input_ids"][0] for t in (" word", "ish"))
    job = _job(tok, " ".join(["one"] * 12), said)
    assert forced(job, word, eos, tok) == word  # 13 words, mid-sentence: free
    job = _job(tok, " ".join(["one"] * 13) + ".", said)
    assert forced(job, word, eos, tok) == stop  # a sentence ended within EARLY_WORDS
    job = _job(tok, " ".join(["one"] * 19), said)
    assert forced(job, word, eos, tok) == stop  # the 20th word: never
    assert forced(job, piece, eos, tok) == piece  # "oneish": goes on with the 19th
    ends = phrases(tok, ("end:Bye now.", "max_words:20"))
    job = _job(tok, " ".join(["one"] * 17), ends)
    assert forced(job, word, eos, tok) == ends.end[0]  # its closing phrase's words count


def test_the_engine_keeps_a_word_limit_on_the_demo_model(adapter):
    ids = adapter.renderer.encode(adapter.render_chat(ASK), first=True)
    eng = BatchEngine(adapter, max_batch=4)
    try:
        out, plain = (eng.run(None, 1.0, ids, 80, **kw)
                      for kw in ({"constraints": ("max_words:10",)}, {}))
    finally:
        eng.close()
    text = adapter.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert not violates("max_words:10", text) and out.finish_reason == "stop", text
    assert violates("max_words:10", adapter.tokenizer.decode(plain.token_ids))


def test_a_repeated_question_is_kept_so_not_guided_by_default(adapter, monkeypatch):
    """The turn's constraints hold ``repeat`` beside its opening phrase, so the default
    guide (for a standing instruction the decoder does not keep) leaves it alone."""
    from injection.engine.guidance import contrast
    from injection.model import profiles

    text = TextOnly(adapter.tokenizer)
    monkeypatch.setattr(text, "_profile", profiles.Profile(
        "test", "any", 1.0, True, "test", {}), raising=False)  # guidance on by default
    echo = "Begin every answer by repeating my question word for word."
    found = planner(text, batching=True).plan(
        ExecutionRequest("t", "u", ASK, echo)).sampling["constraints"]
    assert contrast.resolve(text, None, [echo], found) == 0.0
    assert contrast.resolve(text, None, [echo], ()) == 1.0  # constraints off: guided
    assert contrast.resolve(text, None, ["Always answer in French."], found) == 1.0
