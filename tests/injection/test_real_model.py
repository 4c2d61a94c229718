"""The prepared default model (SmolLM2-135M-Instruct): real English, and the injected
system turn personalises it exactly as the preference in the prompt does."""

from __future__ import annotations

import pytest

from injection import InjectionExecutor, TenantLRU
from injection.base import ExecutionRequest, Tier
from injection.metrics import Metrics

pytestmark = [pytest.mark.slow, pytest.mark.real_model]
# token parity with the system message holds with the memory mechanisms off (this model's
# defaults turn contrast and deep-conversation reminders on)
PARITY = {"reminder": False, "contrast": 0.0, "constrain": False, "loop_guard": False}  # the plain injection


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


def test_batched_replies_on_smollm2_are_the_replies_alone_and_follow_the_preference(smollm):
    """The worker's path (batch engine + conversation reuse) on the real model: three
    members' rows decoded together, one joining mid-batch, each reply token for token the
    system-message reply; the next turn continues the cached K/V and answers the same."""
    import threading
    import time

    from injection import build_executor

    ex = build_executor(smollm, batch_max=4, metrics=Metrics())
    cases = [("I was born in Nairobi.", "Where was I born?"),
             ("I am vegetarian and I do not like spicy food.", "Suggest a dinner recipe."),
             ("Always answer in French.", "How are you today?")]
    want = [smollm.generate(smollm.plain_prompt(p, [{"role": "user", "content": q}]), None,
                            1.0, 24) for p, q in cases]
    got: list = [None] * len(cases)

    def ask(i):
        if i == 2:  # joins while the others decode
            while ex.engine.counters["steps"] < 3:
                time.sleep(0.001)
        p, q = cases[i]
        got[i] = ex.execute(ExecutionRequest("t", f"u{i}", [{"role": "user", "content": q}], p,
                                             max_new_tokens=24, **PARITY))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        assert [g.text for g in got] == [w.text for w in want]
        assert "Nairobi" in got[0].text
        assert ex.engine.counters["peak_batch"] == 3
        p, q = cases[1]
        history = [{"role": "user", "content": q}, {"role": "assistant", "content": got[1].text}]
        msgs = [*history, {"role": "user", "content": "And a dessert?"}]
        nxt = ex.execute(ExecutionRequest("t", "u1", msgs, p, max_new_tokens=16, **PARITY))
        ref = smollm.generate(smollm.plain_prompt(p, msgs), None, 1.0, 16)
        assert nxt.text == ref.text and nxt.cached_tokens == nxt.kv_tokens  # segment cached
        # a one-shot turn is not stored; from the first turn with history on, the
        # conversation's link is kept and the next turn continues it
        history = [*msgs, {"role": "assistant", "content": nxt.text}]
        msgs = [*history, {"role": "user", "content": "And a drink?"}]
        third = ex.execute(ExecutionRequest("t", "u1", msgs, p, max_new_tokens=16, **PARITY))
        ref = smollm.generate(smollm.plain_prompt(p, msgs), None, 1.0, 16)
        assert third.reused_tokens > got[1].prompt_tokens and third.text == ref.text
    finally:
        ex.close()


def test_chained_tenant_and_member_segments_reproduce_the_system_message(smollm):
    """Tenant instructions shared as one segment, each member's preference continuing it:
    at alpha 1 every reply (cold, tenant warm, all cached, no preference) is the
    system-message reply token for token."""
    ex = InjectionExecutor(smollm, l1=TenantLRU(max_bytes=1024**3), l2=None, alpha_cap=1.0,
                           metrics=Metrics())
    instr = ("You are the assistant of a cooking school. Answer in one or two sentences "
             "and be kind to beginners.")
    msgs = [{"role": "user", "content": "What should I cook for dinner tonight?"}]
    for user, pref in (("1", "I am vegetarian."), ("2", "I was born in Nairobi."), ("3", "")):
        context = instr + ("\n\n" + pref if pref else "")
        want = smollm.generate(smollm.plain_prompt(context, msgs), None, 1.0, 24)
        for _ in range(2):
            res = ex.execute(ExecutionRequest("t", user, msgs, pref, instructions=instr,
                                              max_new_tokens=24))
            assert res.injection_mode == "system" and "tenant" in res.extra["segments"]
            assert res.text == want.text, (user, res.text, want.text)
            assert res.completion_tokens == len(want.token_ids)
    assert ex.metrics.get("tenant_l1_misses") == 1 and ex.metrics.get("tenant_l1_hits") == 5


def test_one_pass_misses_reproduce_the_system_message(smollm):
    """Through the batch engine a missing member segment is computed inside the request's
    own prefill (the one-pass miss): cold, tenant warm and cached replies are still the
    system-message reply token for token, and the stored segment serves the next turn."""
    from injection import build_executor

    ex = build_executor(smollm, batch_max=4, metrics=Metrics())
    instr = "You are the assistant of a travel agency. Answer in one or two sentences."
    msgs = [{"role": "user", "content": "Where should I go on holiday this summer?"}]
    try:
        for user, pref in (("1", "I love mountains and hiking."), ("2", "I hate flying."),
                           ("3", "")):
            context = instr + ("\n\n" + pref if pref else "")
            want = smollm.generate(smollm.plain_prompt(context, msgs), None, 1.0, 24)
            for _ in range(2):
                res = ex.execute(ExecutionRequest("t", user, msgs, pref, instructions=instr,
                                                  max_new_tokens=24, **PARITY))
                assert res.text == want.text, (user, res.text, want.text)
        assert ex.metrics.get("computes_one_pass") == 3  # each member's segment, once
        assert ex.engine.counters["segment_captures"] == 3
        assert ex.metrics.get("member_l1_hits") == 3
    finally:
        ex.close()
