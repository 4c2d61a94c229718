"""Decoding constraints (injection/prompting/constraints.py, injection/engine/decoding/bans.py):
which standing instructions are read as constraints, the token map they make on the
demo model's real tokenizer, and the batch engine applying it exactly (a step-by-step
reference, alone, beside other rows and under a guide); the planner puts them in the
turn's sampling only for an injected member on the batch engine, unless asked not to."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import DynamicCache

from injection import build_executor
from injection.base import ExecutionRequest
from injection.engine.batch import BatchEngine
from injection.engine.decoding.bans import TokenMap, fold, token_map
from injection.engine.guidance.contrast import Guide
from injection.metrics import Metrics
from injection.prompting.constraints import detect, kept, transform, violates
from tests.injection.test_batch import _in_threads
from tests.injection.test_contrast import reference as guided_reference
from tests.injection.test_planner import ASK, TextOnly, planner

READ = [
    ("Always write your replies in lowercase, never capitals.", ("lowercase",)),
    ("Don't use capital letters when you answer me.", ("lowercase",)),
    ("Answer with nothing but capital letters.", ("uppercase",)),
    ("Capital letters only in your replies, no lowercase.", ("uppercase",)),
    ("Please reply in ALL CAPS.", ("uppercase",)),
    ("Never write your answers in all caps.", ()),  # no shouting: not "no capitals"
    ("Capitalize the first word of each reply.", ()),
    ("Never use commas in your answers.", ("no_comma",)),
    ("Commas confuse my screen reader: reply with none.", ("no_comma",)),
    ("Use commas sparingly when you reply.", ()),
    ("Keep every reply comma-free.", ("no_comma",)),
    ("Don't forget to use commas between the items of a list.", ()),  # asks for them
    ("Don't use the words 'very' or 'really' when you reply.", ("ban:really", "ban:very")),
    ("Keep the word \u201cliterally\u201d out of your answers.", ("ban:literally",)),
    ("Never say 'thank you so much' in replies.", ()),  # a phrase, not a word: not banned
    # a double negation asks for the word: never banned, a word the reply is to hold
    ("Never answer without using the word 'thunder'.", ("word:thunder:1",)),
    ("Don't forget to use the word 'indeed' in your answers.", ("word:indeed:1",)),
    ("Use the word 'garden' in each reply and never forget it.", ("word:garden:1",)),
    ("Never use the word 'basically', no exceptions.", ("ban:basically",)),
    ("Don't forget: never say the word 'moist' to me.", ("ban:moist",)),
    ("Always reply in French.", ()),
    ("Start every reply with 'Ahoy!' please.", ("start:Ahoy!",)),
    ("Close each answer with the exact phrase 'That's all.'", ("end:That's all.",)),
    ("Your last words in every reply must be \"Over and out.\"", ("end:Over and out.",)),
    ("Never start your answers with 'Sure'.", ()),
    ("Wrap your whole reply in double quotation marks.", ('end:"', 'start:"')),
    ("I am vegetarian and never eat fish.", ()),  # not an instruction on the reply
    ("My favourite colour is blue, not red.", ()),
]


@pytest.mark.parametrize(("memory", "want"), READ)
def test_standing_instructions_read_as_constraints(memory, want):
    assert detect([memory]) == want


def test_contradictions_and_the_tenants_literals_drop_a_constraint():
    assert detect(["Reply in lowercase.", "Answer in capital letters."]) == ()
    both = ["Reply in lowercase only.", "Never use commas in answers."]
    assert detect(both) == ("lowercase", "no_comma")
    # "Acme:" breaks lowercase; the tenant's instructions win (and are kept), the rest too
    assert detect(both, "Start every reply with 'Acme:' please.") == ("no_comma", "start:Acme:")
    assert detect(both, "Be brief.") == ("lowercase", "no_comma")
    # how replies open or close: the tenant's own rule wins over the member's
    ends = ["Start each reply with 'hi!'", "End every answer with 'bye'."]
    assert detect(ends) == ("end:bye", "start:hi!")
    assert detect(ends, "Begin every reply with 'Acme:'.") == ("end:bye", "start:Acme:")
    assert detect(ends, "Sign off with the words 'The Acme team'.") == (
        "end:The Acme team", "start:hi!")
    # the tenant's own standing instructions are kept too, and theirs win
    assert detect(["Reply in capital letters."], "Always answer in lowercase.") == (
        "lowercase",)
    assert detect([], "You are the help desk of ACME. Answer briefly.") == ()


def test_a_memory_is_kept_when_each_standing_sentence_asks_only_for_kept_constraints():
    """``kept``: what guidance skips by default (``contrast.resolve``)."""
    both = "Always answer in lowercase, never with commas."
    assert kept(both, detect([both])) and not kept(both, ("lowercase",))
    assert kept("I am deaf. Reply in lowercase.", ("lowercase",))  # a fact is no instruction
    assert not kept("Answer in lowercase. Always reply in French.", ("lowercase",))
    asked = "End each answer with 'Is that all?' please."  # a "?" inside quotes cuts nothing
    assert kept(asked, detect([asked]))
    asked = "Always answer in lowercase, e.g. in every reply and every list."  # nor "e.g."
    assert kept(asked, detect([asked]))
    # nothing read, not an instruction, or the tenant's rule won: not kept
    for memory in ("Always answer in French.", "I am vegetarian.", "Never use the letter e."):
        assert not kept(memory, detect([memory]))
    member = "Reply in capital letters."
    assert not kept(member, detect([member], "Always answer in lowercase."))


def test_violates():
    assert violates("lowercase", "The") and not violates("lowercase", " the 2 cats.")
    assert violates("uppercase", "Hi") and not violates("uppercase", " HI, 42!")
    assert violates("no_comma", "a, b") and not violates("no_comma", "a; b")
    assert violates("ban:very", " Very") and not violates("ban:very", " every")
    assert violates("start:Hi", "Oh. Hi") and not violates("start:Hi", " hi there")
    assert violates("end:Bye.", "Bye. Oh") and not violates("end:Bye.", "So bye. ")
    with pytest.raises(ValueError):
        violates("bold", "x")


def test_the_token_map_folds_case_and_bans_the_rest(adapter):
    tok = adapter.tokenizer
    texts = tok.batch_decode([[i] for i in range(len(tok))])
    tmap = token_map(tok, ("lowercase", "no_comma"))
    assert tmap is token_map(tok, ("no_comma", "lowercase"))  # built once per tuple
    to = tmap.to
    for i in tok.all_special_ids:
        assert int(to[i]) == i  # the end of turn is always there
    special = set(tok.all_special_ids)
    kept = [i for i in range(len(tok)) if int(to[i]) >= 0 and i not in special]
    assert kept and all(not violates("lowercase", texts[int(to[i])])
                        and not violates("no_comma", texts[int(to[i])]) for i in kept)
    folded = [i for i in kept if int(to[i]) != i]
    assert folded and all(texts[int(to[i])] == texts[i].lower() for i in folded)
    assert all(int(to[i]) == -1 for i, t in enumerate(texts) if "," in t and i not in special)


def test_banned_words_are_applied_per_request_never_cached(adapter):
    """The maps a tokenizer keeps are those of the fixed constraints only: a banned word
    (a member's own text) is applied to them per request, the same map as built whole."""
    from injection.engine.decoding import bans

    tok = adapter.tokenizer
    for cons in (("ban:alpha", "ban:the"), ("ban:the", "lowercase", "no_comma")):
        got = token_map(tok, cons)
        assert torch.equal(got.to, bans._build(tok, tuple(sorted(cons))))
        assert got is not token_map(tok, cons)  # made again, not kept
    assert all(not c.startswith("ban:") for key in tok._kvinject_maps for c in key)


def test_capitals_are_kept_on_the_text_not_token_by_token(adapter):
    tok = adapter.tokenizer
    assert token_map(tok, ("uppercase",)) is None
    assert token_map(tok, ("no_comma", "uppercase")) is token_map(tok, ("no_comma",))
    assert transform(("no_comma", "uppercase"), "Hi there.") == "HI THERE."
    assert transform(("lowercase",), "Hi") == "Hi"  # folded by the engine, not here


def test_fold_moves_each_tokens_share_to_where_it_maps():
    scores = torch.tensor([1.0, 2.0, 0.5, -1.0, 3.0])
    tmap = TokenMap.of(torch.tensor([0, 0, 2, -1]))  # 1 onto 0, 3 banned, 4 past the map
    p = torch.softmax(scores, -1)
    want = torch.tensor([p[0] + p[1], 0.0, p[2], 0.0, 0.0])
    assert torch.allclose(fold(scores, tmap).exp(), want)
    both = fold(torch.stack([scores, scores.flip(0)]), tmap).exp()  # rows at once
    assert torch.allclose(both[0], want) and torch.allclose(both[1], fold(
        scores.flip(0), tmap).exp())


def reference(adapter, ids: list[int], to, n: int, guide_ids: list[int] | None = None,
              strength: float = 1.0) -> list[int]:
    """Greedy, one token at a time: the row's logits folded (then contrasted with the
    guide's, which is fed the same tokens: ``test_contrast.reference``)."""
    def row(x):
        return fold(x, to) if to is not None else x

    if guide_ids:
        return guided_reference(adapter, ids, guide_ids, n, strength, row=row)
    model, eos, out, dev = adapter.model, adapter._eos_ids(), [], adapter.device
    with torch.inference_mode():
        cache = DynamicCache(config=adapter._cache_config)
        logits = model(input_ids=torch.tensor([ids], device=dev), past_key_values=cache,
                       use_cache=True).logits[0, -1]
        for _ in range(n):
            token = int(row(logits).argmax())
            out.append(token)
            if token in eos:
                break
            logits = model(input_ids=torch.tensor([[token]], device=dev), past_key_values=cache,
                           use_cache=True).logits[0, -1]
    return out


def test_the_engine_applies_the_constraints_alone_beside_others_and_guided(adapter):
    render = adapter.renderer
    ids = render.encode(adapter.render_chat([{"role": "user", "content": "Tell me a story."}]),
                        first=True)
    other = render.encode(adapter.render_chat(ASK), first=True)
    cons = ("lowercase", "no_comma")
    to = token_map(adapter.tokenizer, cons)
    want, plain = reference(adapter, ids, to, 24), reference(adapter, ids, None, 24)
    eng = BatchEngine(adapter, max_batch=4)
    try:
        alone = eng.run(None, 1.0, ids, 24, constraints=cons)
        together = _in_threads([lambda: eng.run(None, 1.0, ids, 24, constraints=cons),
                                lambda: eng.run(None, 1.0, other, 24),
                                lambda: eng.run(None, 1.0, other, 24, constraints=cons)])
        guided = eng.run(None, 1.0, ids, 24, constraints=cons,
                         guide=Guide(1.0, None, other))
        unconstrained = eng.run(None, 1.0, ids, 24)
    finally:
        eng.close()
    assert alone.token_ids == together[0].token_ids == want
    assert together[1].token_ids == reference(adapter, other, None, 24)  # untouched
    assert together[2].token_ids == reference(adapter, other, to, 24)  # one map, two rows
    assert guided.token_ids == reference(adapter, ids, to, 24, other)
    assert unconstrained.token_ids == plain


def test_the_engine_opens_and_closes_a_reply_with_its_phrases(adapter):
    """The opening phrase first; the closing one where the reply would end, or where only
    it still fits, then the end of turn; a reply already ending with it is left alone."""
    ids = adapter.renderer.encode(adapter.render_chat(ASK), first=True)
    said = ("end:Good luck!", "start:Ahoy there,")
    start = adapter.tokenizer("Ahoy there,", add_special_tokens=False)["input_ids"]
    end = adapter.tokenizer(" Good luck!", add_special_tokens=False)["input_ids"]
    eng = BatchEngine(adapter, max_batch=4)
    try:
        short, long = (eng.run(None, 1.0, ids, n, constraints=said) for n in (20, 400))
        plain = eng.run(None, 1.0, ids, 400)
    finally:
        eng.close()
    assert short.token_ids[:len(start)] == start and short.token_ids[-len(end):] == end
    assert len(short.token_ids) == 20 and short.finish_reason == "length"
    body = long.token_ids[:-1] if long.finish_reason == "stop" else long.token_ids
    assert long.token_ids[:len(start)] == start and body[-len(end):] == end
    assert plain.token_ids != long.token_ids


def test_a_phrase_the_reply_already_ends_with_is_not_said_twice(adapter):
    from injection.engine.decoding.bans import Phrases, forced
    from injection.engine.sampling import RowSampler

    tok, eos = adapter.tokenizer, adapter._eos_ids()
    gen = tok("Well. Good luck!", add_special_tokens=False)["input_ids"]
    end = tuple(tok(" Good luck!", add_special_tokens=False)["input_ids"])

    class Job:
        sampler = RowSampler(forced=Phrases((), end, "Good luck!"))
        max_new_tokens = 64

    Job.gen = list(gen)
    stop = next(iter(eos))
    assert forced(Job, stop, eos, tok) == stop  # said already: the reply ends
    Job.gen = gen[:-len(end)]
    assert forced(Job, stop, eos, tok) == end[0]  # not yet: the phrase, then the end
    Job.gen.append(end[0])
    assert forced(Job, 5, eos, tok) == end[1]  # the phrase goes on, whatever is chosen
    Job.gen = gen
    assert forced(Job, 5, eos, tok) == stop  # said: the end of turn


def test_the_planner_constrains_the_tenant_and_an_injected_member_on_the_engine(adapter):
    text = TextOnly(adapter.tokenizer)  # planned from the tokenizer alone
    lower = "Always answer me in lowercase."
    on = planner(text, batching=True)
    assert on.plan(ExecutionRequest("t", "u", ASK, lower)).sampling["constraints"] == (
        "lowercase",)
    rules = "You are Acme's help desk. Start every reply with the word 'Acme:'."
    assert on.plan(ExecutionRequest("t", "u", ASK, lower, rules)).sampling["constraints"] == (
        "start:Acme:",)  # the tenant's literal breaks the member's lowercase: theirs win
    assert on.plan(ExecutionRequest("t", "u", ASK, lower, rules, injection_enabled=False)
                   ).sampling["constraints"] == ("start:Acme:",)  # the tenant's: every reply
    for plans, req in ((on, ExecutionRequest("t", "u", ASK, lower, constrain=False)),
                       (on, ExecutionRequest("t", "u", ASK, "I like jazz.")),
                       (on, ExecutionRequest("t", "u", ASK, lower, injection_enabled=False)),
                       (planner(text), ExecutionRequest("t", "u", ASK, lower))):
        assert "constraints" not in plans.plan(req).sampling


def test_a_constrained_member_gets_a_reply_that_keeps_the_instruction(adapter):
    """Through the executor on the demo model; off (``constrain=False``): the reply the
    turn gives without it."""
    ex = build_executor(adapter, batch_max=4, metrics=Metrics())
    lower = "Never use capital letters or commas when you reply."
    try:
        reqs = [ExecutionRequest("t", "u", ASK, lower, max_new_tokens=24, constrain=c,
                                 contrast=0.0) for c in (None, False)]
        on, off = (ex.execute(r) for r in reqs)
    finally:
        ex.close()
    assert on.text and not violates("lowercase", on.text) and not violates("no_comma", on.text)
    assert on.text != off.text  # the random model's reply breaks them when left alone
    assert on.constraints == ["lowercase", "no_comma"] and off.constraints == []


def test_capitals_are_the_reply_upper_cased_streamed_as_sent(adapter):
    ex = build_executor(adapter, batch_max=4, metrics=Metrics())
    caps = "Answer me in capital letters only."
    pieces: list[str] = []
    try:
        on = ex.execute(ExecutionRequest("t", "u", ASK, caps, max_new_tokens=24,
                                         contrast=0.0, on_text=pieces.append))
        off = ex.execute(ExecutionRequest("t", "u", ASK, caps, max_new_tokens=24,
                                          contrast=0.0, constrain=False))
    finally:
        ex.close()
    assert on.constraints == ["uppercase"] and off.constraints == []
    assert on.text == off.text.upper() != off.text and "".join(pieces) == on.text


def test_guided_constrained_rows_prefilled_as_a_group_answer_as_alone(adapter):
    """The group prefill's first tokens fold each row before its guide's contrast, as a
    row prefilled alone does (a burst once gave other replies than the same alone)."""
    from tests.injection.test_batch_faults import _Faulty, _held_start, _until, _with_model

    render, cons = adapter.renderer, ("lowercase", "no_comma")
    to = token_map(adapter.tokenizer, cons)
    asks = [render.encode(adapter.render_chat([{"role": "user", "content": q}]), first=True)
            for q in ("Tell me a story.", "Plan my weekend, please.", "How are you?")]
    plain = render.encode(adapter.render_chat([{"role": "user", "content": "Hi."}]),
                          first=True)
    ref: dict = {}
    forwards: list[tuple[int, ...]] = []

    def before(call, kw):
        forwards.append(tuple(kw["input_ids"].shape))
        if call == 1:  # hold the first row until the guided ones are queued
            _until(lambda: ref["eng"].stats()["waiting"] >= 2, "rows queued")

    eng = ref["eng"] = BatchEngine(_with_model(adapter, _Faulty(adapter.model, before)),
                                   max_batch=8, group_prefill=8)
    out: list = [None] * 3

    def ask(i):
        out[i] = eng.run(None, 1.0, plain, 24) if i == 0 else eng.run(
            None, 1.0, asks[i - 1], 24, constraints=cons, guide=Guide(1.0, None, plain))

    # alone first: its forward held until the guided rows queue
    _held_start([threading.Thread(target=ask, args=(i,)) for i in range(3)],
                lambda: len(forwards) >= 1, eng)
    assert eng.counters["group_prefills"] == 1, forwards
    for ids, got in zip(asks[:2], out[1:], strict=True):
        assert got.token_ids == reference(adapter, ids, to, 24, plain)
