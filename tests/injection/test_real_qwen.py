"""Qwen2.5-Coder-0.5B-Instruct (a second family: qwen2, 2 KV heads, ChatML with a default
system prompt): the injected system turn at alpha 1 is the system-message reply token for
token, the template's default system prompt is rendered where nothing is injected, and two
members decoded together answer as each alone.

Short replies (12 tokens) keep it cheap: each token is a forward of a 0.5B model on the CPU."""

from __future__ import annotations

import threading

import pytest

from injection import build_executor
from injection.base import ExecutionRequest, Tier
from injection.engine.steps import kv_format
from injection.metrics import Metrics
from injection.model import profiles

pytestmark = [pytest.mark.slow, pytest.mark.real_model, pytest.mark.qwen]
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
PARITY = {"reminder": False, "contrast": 0.0, "constrain": False, "loop_guard": False}  # the plain injection
TOKENS = 12
ASK = [{"role": "user", "content": "What should I cook for dinner tonight?"}]


def test_the_default_system_prompt_is_qwens_own_until_something_is_injected(qwen):
    """No memory and no instructions: the template's own system turn, as any client of
    this model gets it. A memory or a tenant's instructions: the system turn is theirs
    alone (the template drops its default), exactly what a system message renders."""
    assert (qwen.num_layers, qwen.num_kv_heads) == (24, 2)
    nothing = qwen.split_prompt("", ASK)
    assert nothing.mode == "none" and nothing.segment == ""
    assert nothing.prompt.startswith(f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n")
    for context in ("I am vegetarian.", "You are the assistant of a cooking school."):
        parts = qwen.split_prompt(context, ASK)
        assert parts.mode == "system"
        assert parts.segment == f"<|im_start|>system\n{context}<|im_end|>\n"
        assert QWEN_SYSTEM not in parts.segment + parts.prompt
        assert parts.segment + parts.prompt == qwen.plain_prompt(context, ASK)
    assert qwen.renderer.encode("hi", first=True) == qwen.tokenizer("hi")["input_ids"]  # no BOS
    # a cached token: K and V of 24 layers x 2 KV heads x 64 dims, float32 (SmolLM2: 30 x 3)
    assert kv_format(qwen)["bytes_per_token"] == 2 * 24 * 2 * 64 * 4 == 24_576


def test_injected_kv_at_alpha_one_is_the_system_message_reply_token_for_token(qwen):
    pref = "I am vegetarian and I do not like spicy food."
    parts = qwen.split_prompt(pref, ASK)
    injected = qwen.generate(parts.prompt, qwen.compute_kv(parts.segment), 1.0, TOKENS)
    prompted = qwen.generate(qwen.plain_prompt(pref, ASK), None, 1.0, TOKENS)
    assert injected.token_ids == prompted.token_ids, (injected.text, prompted.text)
    # through the worker's executor (batch engine), every mechanism off: computed, then from L1
    ex = build_executor(qwen, batch_max=2, metrics=Metrics())
    try:
        first = ex.execute(ExecutionRequest("t", "u", ASK, pref, max_new_tokens=TOKENS,
                                            **PARITY))
        again = ex.execute(ExecutionRequest("t", "u", ASK, pref, max_new_tokens=TOKENS,
                                            **PARITY))
        bare = ex.execute(ExecutionRequest("t", "u2", ASK, "", max_new_tokens=TOKENS, **PARITY))
    finally:
        ex.close()
    assert (first.tier, again.tier) == (Tier.COMPUTE, Tier.L1)
    assert first.text == again.text == prompted.text
    plain = qwen.generate(qwen.render_chat(ASK), None, 1.0, TOKENS)
    assert bare.text == plain.text  # no memory: Qwen's own system prompt


def test_tenant_instructions_are_shared_where_a_token_spans_the_boundary(qwen):
    """Qwen's tokenizer makes the instructions' last "." and the separator's "\n\n" one
    token, so the instructions' own ids are no prefix of the turn's: the tenant's segment
    stops one token early, is the same for every member, and each member's reply is still
    the system-message reply token for token (cold, then with the tenant's segment cached)."""
    instr = "You are the assistant of a cooking school. Answer in one or two sentences."
    ex = build_executor(qwen, batch_max=2, metrics=Metrics())
    try:
        for user, pref in (("1", "I am vegetarian."), ("2", "I was born in Nairobi.")):
            context = instr + "\n\n" + pref
            parts = qwen.split_prompt(context, ASK)
            split = qwen.split_segment(parts.segment, context, instr)
            assert split is not None and split.tenant_text.endswith("one or two sentences")
            assert split.tenant_text + split.member_text == parts.segment
            want = qwen.generate(qwen.plain_prompt(context, ASK), None, 1.0, TOKENS)
            res = ex.execute(ExecutionRequest("t", user, ASK, pref, instructions=instr,
                                              max_new_tokens=TOKENS, **PARITY))
            assert "tenant" in res.extra["segments"], res.extra
            assert res.text == want.text, (user, res.text, want.text)
    finally:
        ex.close()
    assert ex.metrics.get("tenant_l1_hits") >= 1  # the second member reused the first's


def test_two_members_batched_answer_as_each_alone_on_the_defaults(qwen):
    """The worker's path on Qwen's profile (guidance 1: deep turns anchored, first turns
    leaning with the member's lean): two members' first turns decoded together give the
    greedy replies each gets alone."""
    assert profiles.guidance_default(qwen) == 1.0 and profiles.for_adapter(qwen).name == (
        "qwen2.5-coder-0.5b")
    ex = build_executor(qwen, batch_max=2, metrics=Metrics())
    reqs = [ExecutionRequest("t", "u1", [{"role": "user", "content": "Where was I born?"}],
                             "I was born in Nairobi.", max_new_tokens=TOKENS),
            ExecutionRequest("t", "u2", ASK, "Always answer in French.",
                             max_new_tokens=TOKENS)]
    try:
        alone = [ex.execute(r).text for r in reqs]  # the French member's lean measured
        ex.engine.counters["peak_batch"] = 0  # (its 8 probe rows ran together)
        got: list = [None, None]
        start = threading.Barrier(2)

        def ask(i):
            start.wait()
            got[i] = ex.execute(reqs[i]).text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert got == alone
        assert ex.engine.counters["peak_batch"] == 2
        assert "Nairobi" in alone[0]
    finally:
        ex.close()
