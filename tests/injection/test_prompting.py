"""The injected segment is the context as the chat template's system turn: split, exactness
on several templates, fallbacks for templates without a system role, and BOS handling."""

from __future__ import annotations

import copy

import pytest
import torch

from injection.base import ExecutionRequest, Tier
from injection.engine.executor import InjectionExecutor
from injection.kvcache.lru import TenantLRU
from injection.metrics import Metrics
from injection.model.adapter import ModelAdapter
from injection.prompting.template import compose_context

PREF = "I am a vegetarian and I do not like spicy food."
CONVERSATION = [
    {"role": "user", "content": "Hello there"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "What should I cook tonight?"},
]

# ChatML with a default system turn when the conversation has none (SmolLM2, Qwen style)
CHATML_DEFAULT_SYSTEM = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|system|>\\nYou are a helpful assistant.<|end|>\\n' }}{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
# Llama 3 style: BOS rendered into the text by the template itself
BOS_IN_TEXT = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n\\n' + message['content'] | trim + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n\\n' }}{% endif %}"
)
# Gemma style: no system role (raises), strict alternation
NO_SYSTEM_ROLE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/...') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
# drops system messages silently and transforms content: no split can be verified
UPPERCASING = (
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] | upper + '<|end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def with_template(adapter: ModelAdapter, template: str | None) -> ModelAdapter:
    tok = copy.deepcopy(adapter.tokenizer)
    tok.chat_template = template
    return ModelAdapter(adapter.model, tok, device=adapter.device, dtype=adapter.dtype)


def executor(adapter) -> InjectionExecutor:
    return InjectionExecutor(adapter, l1=TenantLRU(max_bytes=64 * 1024**2), l2=None,
                             alpha_cap=1.0, metrics=Metrics())


def reference(adapter, prompt: str, n: int) -> str:
    """Plain greedy generation of a whole prompt, straight through transformers."""
    ids = adapter.renderer.encode(prompt, first=True)
    out = adapter.model.generate(input_ids=torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return adapter.tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)


# SmolLM2's tokenizer names its turn marker <|im_start|> as BOS: every turn starts with it
BOS_OPENS_EVERY_TURN = (
    "{% for message in messages %}"
    "{{ bos_token + message['role'] + '\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ bos_token + 'assistant\n' }}{% endif %}"
)

TEMPLATES = {"demo": "keep", "chatml-default-system": CHATML_DEFAULT_SYSTEM,
             "bos-in-text": BOS_IN_TEXT, "bos-opens-every-turn": BOS_OPENS_EVERY_TURN,
             "no-template": None}


@pytest.mark.parametrize("name", TEMPLATES)
def test_split_reproduces_the_full_rendering_token_for_token(adapter, name):
    a = adapter if TEMPLATES[name] == "keep" else with_template(adapter, TEMPLATES[name])
    parts = a.split_prompt(PREF, CONVERSATION)
    full = a.plain_prompt(PREF, CONVERSATION)
    assert parts.mode == "system" and PREF in parts.segment and parts.segment + parts.prompt == full
    r = a.renderer
    assert r.encode(parts.segment, first=True) + r.encode(parts.prompt, first=False) == r.encode(
        full, first=True)
    assert "What should I cook" not in parts.segment  # the turn ends before the conversation


@pytest.mark.parametrize("name", TEMPLATES)
def test_alpha_one_injection_equals_the_preference_as_system_message(adapter, name):
    a = adapter if TEMPLATES[name] == "keep" else with_template(adapter, TEMPLATES[name])
    ex = executor(a)
    first = ex.execute(ExecutionRequest("t", "u", CONVERSATION, PREF, max_new_tokens=12))
    again = ex.execute(ExecutionRequest("t", "u", CONVERSATION, PREF, max_new_tokens=12))
    assert (first.tier, again.tier) == (Tier.COMPUTE, Tier.L1)
    expected = reference(a, a.plain_prompt(PREF, CONVERSATION), 12)
    assert first.text == again.text == expected
    parts = a.split_prompt(PREF, CONVERSATION)
    prompt_ids = a.renderer.encode(parts.prompt, first=False)
    out = a.generate(parts.prompt, a.compute_kv(parts.segment), 1.0, 2)
    assert out.prompt_token_ids == prompt_ids  # not a token of the continuation is dropped
    assert first.kv_tokens == len(a.renderer.encode(a.split_prompt(PREF, CONVERSATION).segment,
                                                    first=True))


def test_template_rendering_bos_gets_exactly_one(adapter):
    a = with_template(adapter, BOS_IN_TEXT)
    bos = a.tokenizer.bos_token_id
    plain = a.generate(a.render_chat(CONVERSATION), None, 1.0, 2)
    assert plain.prompt_token_ids[0] == bos and plain.prompt_token_ids.count(bos) == 1
    parts = a.split_prompt(PREF, CONVERSATION)
    kv = a.compute_kv(parts.segment)
    assert kv.token_ids[0] == bos and list(kv.token_ids).count(bos) == 1
    assert bos not in a.generate(parts.prompt, kv, 1.0, 2).prompt_token_ids
    # the demo template leaves BOS to the tokenizer: still exactly one
    demo_plain = adapter.generate(adapter.render_chat(CONVERSATION), None, 1.0, 2)
    assert demo_plain.prompt_token_ids.count(bos) == 1


def test_template_without_system_role_falls_back_to_a_user_prefix(adapter):
    a = with_template(adapter, NO_SYSTEM_ROLE)
    parts = a.split_prompt(PREF, CONVERSATION)
    assert parts.mode == "user_prefix" and parts.segment.endswith(PREF + "\n\n")
    assert parts.prompt.startswith("Hello there")  # the first user message continues it
    res = executor(a).execute(ExecutionRequest("t", "u", CONVERSATION, PREF, max_new_tokens=10))
    assert res.injection_mode == "user_prefix" and res.tier is Tier.COMPUTE
    assert res.text == reference(a, a.plain_prompt(PREF, CONVERSATION), 10)


def test_no_verifiable_split_keeps_the_context_in_the_prompt(adapter):
    a = with_template(adapter, UPPERCASING)
    parts = a.split_prompt(PREF, CONVERSATION)
    assert parts.mode == "inline" and parts.segment == "" and PREF.upper() in parts.prompt
    ex = executor(a)
    res = ex.execute(ExecutionRequest("t", "u", CONVERSATION, PREF, max_new_tokens=6))
    assert res.tier is Tier.NONE and res.injection_mode == "inline"
    assert res.text == reference(a, parts.prompt, 6) and ex.l1.stats()["entries"] == 0


def test_a_client_system_message_follows_the_injected_turn(adapter):
    msgs = [{"role": "system", "content": "Reply in French."}, *CONVERSATION]
    parts = adapter.split_prompt(PREF, msgs)
    assert parts.mode == "system" and "French" not in parts.segment and "French" in parts.prompt
    assert parts.segment == adapter.split_prompt(PREF, CONVERSATION).segment  # same cache entry
    assert parts.segment.index(PREF) < (parts.segment + parts.prompt).index("Reply in French")


def test_compose_context_orders_instructions_then_preference():
    assert compose_context("Be brief.", "I like tea.") == "Be brief.\n\nI like tea."
    assert compose_context("", " I like tea. ") == "I like tea."
    assert compose_context("  ", "") == ""


def test_counts_and_encodings_are_kept_and_equal_the_tokenizers(adapter):
    """A turn renders and encodes its conversation several times while it is planned; each
    text is tokenised once (the last results are kept), the kept result is the tokenizer's,
    and a caller gets a list of its own."""
    fresh = with_template(adapter, adapter.tokenizer.chat_template)  # a renderer of its own
    real, calls = fresh.renderer._encode, []

    def counted(text: str, first: bool) -> list[int]:
        calls.append(text)
        return real(text, first)

    fresh.renderer._encode = counted
    want = len(real(fresh.plain_prompt(PREF, CONVERSATION), True))
    assert fresh.prompt_tokens(PREF, CONVERSATION) == want
    assert fresh.prompt_tokens(PREF, [dict(m) for m in CONVERSATION]) == want  # by value
    parts = fresh.split_prompt(PREF, CONVERSATION)  # its whole rendering: encoded already
    ids = fresh.renderer.encode(parts.prompt, first=False)  # verified by the split: kept
    assert ids == real(parts.prompt, False)
    assert len(calls) == 3  # the whole conversation, its segment and its prompt, once each
    ids.append(-1)
    assert fresh.renderer.encode(parts.prompt, first=False) == ids[:-1]
    other = [*CONVERSATION[:-1], {"role": "user", "content": "And for dessert, then?"}]
    assert fresh.prompt_tokens(PREF, other) == len(real(fresh.plain_prompt(PREF, other), True))
    assert len(calls) == 4
