"""Contrastive guidance on the prepared default model (SmolLM2-135M-Instruct): on by
default at its measured strength, each guided reply the formula's step-by-step reference
computed from the two prompts with the model itself, off where a turn is reminded."""

from __future__ import annotations

import pytest

from injection import build_executor, load_adapter
from injection.base import ExecutionRequest
from injection.engine.guidance.contrast import resolve
from injection.metrics import Metrics
from tests.injection.test_contrast import reference

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

CASES = [("I am vegetarian and I do not like spicy food.", "Suggest a dinner recipe."),
         ("Always answer in French.", "How are you today?"),
         ("My cat is called Whiskers.", "What is my cat's name?")]


@pytest.fixture(scope="module")
def smollm(real_model_path):
    return load_adapter(real_model_path, device="cpu")


def test_the_default_guides_first_turns_as_the_formula_says(smollm):
    strength = resolve(smollm, None)
    assert strength > 0  # measured for this model (docs/BENCHMARKS.md, memory depth)
    ex = build_executor(smollm, batch_max=4, metrics=Metrics())
    try:
        for pref, question in CASES:
            msgs = [{"role": "user", "content": question}]
            got = ex.execute(ExecutionRequest("t", "u", msgs, pref, max_new_tokens=24))
            ids = [smollm.renderer.encode(smollm.plain_prompt(c, msgs), first=True)
                   for c in (pref, "")]
            want = reference(smollm, ids[0], ids[1], 24, strength)
            assert got.contrast_effective == strength
            assert got.text.strip() == smollm.tokenizer.decode(want, skip_special_tokens=True).strip()
        deep = [{"role": "user", "content": f"Question {k}?"} if j == 0 else
                {"role": "assistant", "content": f"Answer {k}."}
                for k in range(2) for j in range(2)] + [{"role": "user", "content": "Hi?"}]
        res = ex.execute(ExecutionRequest("t", "u", deep, CASES[0][0], max_new_tokens=4))
        assert res.contrast_effective == 0.0  # the turn carries the reminder
    finally:
        ex.close()
