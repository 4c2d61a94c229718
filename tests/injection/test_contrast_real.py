"""Contrastive guidance on the prepared default model (SmolLM2-135M-Instruct): asked for (a
request's or tenant's strength), each first turn leans with the member's lean (measured once
on probes: the references of test_probe.py) or, with that off, is guided by a guide row (the
formula's step-by-step reference computed from the two prompts with the model itself). By
default its profile leaves first turns unguided (``guidance.first_turns``: re-decided with
the fluency verdict) and anchors reminded turns at its strength (test_anchor_real.py)."""

from __future__ import annotations

import pytest
import torch

from injection import build_executor
from injection.base import ExecutionRequest
from injection.engine.guidance import lean
from injection.engine.guidance.contrast import resolve
from injection.metrics import Metrics
from injection.prompting.reminder import standing
from tests.injection.test_contrast import reference
from tests.injection.test_probe import cached_lean, lean_reference, member_lean

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

CASES = [("I am vegetarian and I do not like spicy food.", "Suggest a dinner recipe."),
         ("Always answer in French.", "How are you today?"),
         ("My cat is called Whiskers.", "What is my cat's name?"),
         ("I like short answers.", "What should I cook tonight?")]
# guided by default: a standing instruction naming a language; "I like short answers." is a
# standing instruction too, of no kind guidance was measured to pay for (``rules.guided``)
GUIDED = {"Always answer in French."}
# reply tokens checked against the step-by-step references (a full forward per token): past
# the guide's LEAN_AFTER steps and the lean's PROBE_STEPS, well inside a reply
TOKENS = 16


def test_first_turns_guide_as_the_formula_says_when_asked_and_by_default_do_not(smollm):
    """The strength resolves to the measured one only for a standing instruction guidance
    was measured to pay for ("Always answer in French."; the anchor's on deep turns). Asked
    for, any memory's first turn is guided, with the member's lean (``probe.py``: measured
    once on its probes, the reply the lean's reference). By default SmolLM2's profile leaves
    first turns unguided: the reply without a guide, token for token, and no probes."""
    strength = resolve(smollm, None, ["Always answer in French."])
    assert strength > 0  # measured for this model (docs/BENCHMARKS.md, quality)
    assert all(resolve(smollm, None, [c[0]]) == 0.0 for c in CASES if c[0] not in GUIDED)
    assert standing(CASES[3][0])
    ex = build_executor(smollm, batch_max=4, metrics=Metrics())
    try:
        for pref, question in CASES:
            msgs = [{"role": "user", "content": question}]
            default = ex.execute(ExecutionRequest("t", "u", msgs, pref, max_new_tokens=TOKENS))
            assert "lean" not in default.extra  # no probes measured by default
            req = ExecutionRequest("t", "u", msgs, pref, max_new_tokens=TOKENS, contrast=strength,
                                   loop_guard=False)  # the formula's reference has no guard
            asked = ex.execute(req)
            ids = smollm.renderer.encode(smollm.plain_prompt(pref, msgs), first=True)
            lean = cached_lean(ex, req)
            want = lean_reference(smollm, ids, TOKENS, strength, lean)
            assert asked.contrast_effective == strength and asked.extra["lean"] == "probe"
            assert asked.text.strip() == smollm.tokenizer.decode(
                want, skip_special_tokens=True).strip()
            if pref in GUIDED:  # asked again: the lean from L1, the same reply
                again = ex.execute(req)
                assert (again.text, again.extra["lean"]) == (asked.text, "l1")
                assert again.guide_decode_tokens == 0
                ref = member_lean(smollm, pref, strength)  # each probe alone, step by step
                assert torch.allclose(lean.rest.float(), ref.rest.float(), atol=2e-2)
            off = ex.execute(ExecutionRequest("t", "u", msgs, pref, max_new_tokens=TOKENS,
                                              contrast=0.0))
            assert default.contrast_effective == 0.0 and default.text == off.text
            assert default.guide_prefill_tokens == default.guide_decode_tokens == 0
        deep = [{"role": "user", "content": f"Question {k}?"} if j == 0 else
                {"role": "assistant", "content": f"Answer {k}."}
                for k in range(2) for j in range(2)] + [{"role": "user", "content": "Hi?"}]
        res = ex.execute(ExecutionRequest("t", "u", deep, CASES[1][0], max_new_tokens=4))
        # the turn carries the reminder: no guide row, and by SmolLM2's profile no anchor
        # either (``anchor.deep_turns`` false, test_anchor_real.py)
        assert res.contrast_effective == 0.0 and res.guide_decode_tokens == 0
        assert res.guide_prefill_tokens == 0
    finally:
        ex.close()


def test_an_instruction_the_decoder_keeps_is_not_guided_unless_its_constraints_are_off(smollm):
    """By default a standing instruction the decoding constraints keep ("in lowercase") gets
    no guidance (its reply: the unguided one, token for token; its strength 0, so no anchor
    either); with the constraints off its strength is the measured one, and a first turn
    asked for it is guided as any other standing instruction."""
    memory, msgs = "Always answer in lowercase.", [{"role": "user", "content": "Hi?"}]
    strength = resolve(smollm, None, [memory])
    assert strength > 0 and resolve(smollm, None, [memory], ("lowercase",)) == 0.0
    ex = build_executor(smollm, batch_max=4, metrics=Metrics())
    try:
        def run(**kw):
            return ex.execute(ExecutionRequest("t", "u", msgs, memory, max_new_tokens=12, **kw))

        default, unguided = run(), run(contrast=0.0)
        assert default.contrast_effective == 0.0 and default.constraints == ["lowercase"]
        assert default.guide_prefill_tokens == default.guide_decode_tokens == 0
        assert default.text == unguided.text and default.text == default.text.lower()
        off = run(constrain=False)  # a first turn: by default unguided (the profile)
        assert off.contrast_effective == 0.0 and off.guide_decode_tokens == 0
        asked = run(constrain=False, contrast=strength)  # asked: guided as any other
        assert asked.contrast_effective == strength and asked.guide_decode_tokens > 0
    finally:
        ex.close()


def test_the_guide_leaves_after_its_first_steps_and_off_it_guides_the_whole_reply(
        smollm, monkeypatch):
    """With the member's lean off (``memory_lean=False``), a guided first turn's guide
    decodes ``lean.LEAN_AFTER`` steps, then the row leans (the reference's reply); with
    ``LEAN_AFTER = None`` the whole reply is guided, token for token the whole-reply
    formula."""
    memory, msgs = "Always answer in French.", [{"role": "user", "content": "What is rain?"}]
    ids = [smollm.renderer.encode(smollm.plain_prompt(c, msgs), first=True)
           for c in (memory, "")]
    default = lean.LEAN_AFTER
    ex = build_executor(smollm, batch_max=4, metrics=Metrics(), memory_lean=False)
    try:
        def run():  # asked for (by default SmolLM2's first turns are not guided)
            return ex.execute(ExecutionRequest("t", "u", msgs, memory, max_new_tokens=TOKENS,
                                               contrast=resolve(smollm, None, [memory]),
                                               loop_guard=False))  # the formula's has none

        leaned = run()
        monkeypatch.setattr(lean, "LEAN_AFTER", None)
        whole = run()
    finally:
        ex.close()
    strength = resolve(smollm, None, [memory])
    for res, k in ((leaned, default), (whole, None)):
        want = reference(smollm, ids[0], ids[1], TOKENS, strength, k)
        assert res.text.strip() == smollm.tokenizer.decode(
            want, skip_special_tokens=True).strip()
    assert leaned.guide_decode_tokens == default < whole.guide_decode_tokens
    assert whole.guide_decode_tokens == whole.completion_tokens - 1
