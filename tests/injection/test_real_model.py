"""The prepared default model (SmolLM2-135M-Instruct): real English, and the injected
system turn personalises it exactly as the preference in the prompt does."""

from __future__ import annotations

import pytest

from injection import InjectionExecutor, TenantLRU, load_adapter
from injection.base import ExecutionRequest, Tier
from injection.metrics import Metrics

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


@pytest.fixture(scope="module")
def smollm(real_model_path):
    return load_adapter(real_model_path, device="cpu")


def test_real_model_knows_the_capital_of_france(smollm):
    adapter = smollm
    assert (adapter.num_layers, adapter.num_kv_heads) == (30, 3)
    prompt = adapter.render_chat([{"role": "user", "content": "What is the capital of France?"}])
    assert prompt.endswith("<|im_start|>assistant\n")
    out = adapter.generate(prompt, None, 1.0, 20)  # greedy
    assert "Paris" in out.text, out.text
    assert 0 < len(out.token_ids) <= 20


def test_injected_system_turn_equals_the_system_message_and_changes_the_answer(smollm):
    """SmolLM2's template adds its own default system turn when there is none: the injected
    turn replaces it, and at alpha 1 the reply is the system-message reply, token for token."""
    ex = InjectionExecutor(smollm, l1=TenantLRU(max_bytes=1024**3), l2=None, alpha_cap=1.0,
                           metrics=Metrics())
    pref = "Always answer in French."
    msgs = [{"role": "user", "content": "How are you today?"}]
    parts = smollm.split_prompt(pref, msgs)
    assert parts.mode == "system" and parts.segment == (
        "<|im_start|>system\nAlways answer in French.<|im_end|>\n")
    injected = ex.execute(ExecutionRequest("t", "u", msgs, pref, max_new_tokens=24))
    cached = ex.execute(ExecutionRequest("t", "u", msgs, pref, max_new_tokens=24))
    prompted = smollm.generate(smollm.plain_prompt(pref, msgs), None, 1.0, 24)
    plain = smollm.generate(smollm.render_chat(msgs), None, 1.0, 24)
    assert (injected.tier, cached.tier) == (Tier.COMPUTE, Tier.L1)
    assert injected.text == cached.text == prompted.text, (injected.text, prompted.text)
    assert injected.text != plain.text  # the preference changed what the model says


@pytest.mark.parametrize("pref, question", [
    ("I was born in Nairobi.", "Where was I born?"),
    ("My favourite sport is tennis.", "What is my favourite sport?"),
    ("I am vegetarian.", "What should I cook for dinner tonight?"),
])
def test_alpha_one_reproduces_the_system_message_token_for_token(smollm, pref, question):
    msgs = [{"role": "user", "content": question}]
    parts = smollm.split_prompt(pref, msgs)
    injected = smollm.generate(parts.prompt, smollm.compute_kv(parts.segment), 1.0, 32)
    prompted = smollm.generate(smollm.plain_prompt(pref, msgs), None, 1.0, 32)
    assert injected.token_ids == prompted.token_ids, (injected.text, prompted.text)
