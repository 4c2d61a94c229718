"""The turn planner, from a tokenizer and its chat template alone: no model weights.

``TextOnly`` is the text side of a model (the demo model's real tokenizer and template)
whose forward refuses to run, so every plan here is shown to need none of it.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from injection.base import ExecutionRequest, PreferenceModel
from injection.engine.guidance import probe
from injection.engine.planning.planner import TurnPlanner
from injection.engine.turns import TurnGenerator
from injection.kvcache.conversation import ConversationStore
from injection.kvcache.kvsource import content_hash
from injection.kvcache.lru import TenantLRU
from injection.memory.recall import MemoryPlanner
from injection.metrics import Metrics
from injection.prompting.template import ChatRenderer, compose_context

RULES = "You are the help desk of ACME."
PREF = "I am a vegetarian and I live in Lyon."
ASK = [{"role": "user", "content": "What should I cook tonight?"}]


class TextOnly(PreferenceModel):
    """A model's template and tokenizer; its forward is never to run in planning."""

    fingerprint, device, dtype = "text-only", "cpu", None

    def __init__(self, tokenizer, max_positions: int | None = None) -> None:
        self.tokenizer, self.renderer = tokenizer, ChatRenderer(tokenizer)
        self.max_positions = max_positions

    def compute_kv(self, text):
        raise AssertionError("planning ran the model")

    generate = compute_kv_ids = compute_kv

    def render_chat(self, messages):
        return self.renderer.render(messages)

    def split_prompt(self, context, messages):
        return self.renderer.split(context, messages)

    def plain_prompt(self, context, messages):
        return self.renderer.plain(context, messages)

    def prompt_tokens(self, context, messages):
        return len(self.renderer.encode(self.plain_prompt(context, messages), first=True))

    def count_tokens(self, text):
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def split_segment(self, segment, context, instructions):
        return self.renderer.tenant_split(segment, context, instructions)


@pytest.fixture(scope="module")
def text(demo_model_path) -> TextOnly:
    return TextOnly(AutoTokenizer.from_pretrained(str(demo_model_path)))


def planner(model: TextOnly, *, batching: bool = False, **kw) -> TurnPlanner:
    store = ConversationStore(TenantLRU(max_bytes=1 << 20), None, Metrics(), max_bytes=0)
    return TurnPlanner(model, MemoryPlanner(model), TurnGenerator(model, None, store),
                       alpha_cap=1.0, min_alpha=0.1, batching=batching,
                       one_pass=kw.pop("one_pass", True), **kw)


def test_a_member_turn_injects_the_system_turn_the_plain_prompt_would_render(text):
    plan = planner(text).plan(ExecutionRequest("t", "u", ASK, PREF, RULES, alpha=0.7))
    context = compose_context(RULES, PREF)
    assert plan.injected and plan.personal and plan.mode == "system"
    assert plan.segment + plan.prompt == text.plain_prompt(context, ASK)
    assert plan.split.tenant_text + plan.split.member_text == plan.segment
    assert list(plan.split.tenant_ids + plan.split.member_ids) == text.renderer.encode(
        plan.segment, first=True)  # a token-exact chain: tenant's segment, then member's
    assert (plan.alpha, plan.member_alpha, plan.chash) == (0.7, 0.7, content_hash(plan.segment))
    assert plan.context == context and list(plan.messages) == ASK
    assert plan.link.key is None and not plan.defer  # no engine: no link, no one-pass
    assert plan.guide is None
    with pytest.raises(AttributeError):
        plan.segment = ""  # a value: the run step cannot change what was planned


def test_without_the_member_only_the_tenants_shared_segment_is_injected(text):
    plan = planner(text).plan(ExecutionRequest("t", "u", ASK, PREF, RULES,
                                               injection_enabled=False))
    assert plan.injected and not plan.personal and plan.context == RULES
    assert (plan.alpha, plan.member_alpha) == (0.0, 1.0)  # the tenant's K/V is never scaled
    assert plan.split is not None and plan.segment + plan.prompt == text.plain_prompt(RULES, ASK)


def test_nothing_to_inject_is_a_plain_prompt(text):
    for req in (ExecutionRequest("t", "u", ASK, PREF, injection_enabled=False),
                ExecutionRequest("t", "u", ASK, PREF, alpha=0.05)):  # at or under min_alpha
        plan = planner(text).plan(req)
        assert not plan.injected and plan.mode == "none" and plan.chash == ""
        assert plan.prompt == plan.link.prompt == text.render_chat(ASK)


def test_one_pass_defers_a_missing_member_segment_only_unscaled(text):
    plans = planner(text, batching=True)
    assert plans.plan(ExecutionRequest("t", "u", ASK, PREF, contrast=0.0)).defer
    assert not plans.plan(ExecutionRequest("t", "u", ASK, PREF, alpha=0.5, contrast=0.0)).defer
    assert not planner(text, batching=True, one_pass=False).plan(
        ExecutionRequest("t", "u", ASK, PREF, contrast=0.0)).defer


@pytest.mark.parametrize("memory_lean", [False, True])
@pytest.mark.parametrize("keeps", [False, True])
def test_the_guide_is_the_turn_with_nothing_injected_or_the_instructions_kept(
        text, keeps, memory_lean):
    """Off, the turn's guide row; on (the default), the member's lean instead: its probes,
    each after the member's segment, and their guides built as the turn's would be."""
    plan = planner(text, batching=True, guide_keeps_instructions=keeps,
                   memory_lean=memory_lean).plan(
        ExecutionRequest("t", "u", ASK, PREF, RULES, contrast=1.0))
    encode = text.renderer.encode
    if memory_lean:
        assert plan.guide is None and plan.lean.strength == 1.0 and not plan.defer
        asks = [[{"role": "user", "content": q}] for q in probe.PROBES]
        assert list(plan.lean.ids) == [tuple(encode(text.split_prompt(
            plan.context, a).prompt, first=False)) for a in asks]
        pairs = list(zip(plan.lean.guides, asks, strict=True))
    else:
        assert plan.lean is None
        pairs = [(plan.guide, ASK)]
    for guide, ask in pairs:
        assert guide.strength == 1.0
        want = text.plain_prompt(RULES if keeps else "", ask)
        if keeps:  # after the tenant's shared segment, cached once per tenant
            assert guide.head == "tenant"
            assert guide.segment == text.split_prompt(RULES, ask).segment
            assert [*guide.split.tenant_ids, *guide.split.member_ids, *guide.ids] == encode(
                want, first=True)
        else:  # the template's own system turn (or none), then the same messages
            assert guide.head in ("shared", "none")
            assert [*guide.head_ids, *guide.ids] == encode(want, first=True)


def test_a_lean_is_keyed_by_everything_it_depends_on(text):
    """The lean's digest moves with the memory and the instructions, never with the
    question asked, the strength or the alpha it is applied at (its probes are guided at
    ``probe.PROBE_STRENGTH`` on the segment at ``probe.PROBE_ALPHA``: one lean a member)."""
    def digest(pref=PREF, rules=RULES, ask=ASK, **kw):
        return planner(text, batching=True).plan(
            ExecutionRequest("t", "u", ask, pref, rules, contrast=kw.pop("contrast", 1.0),
                             **kw)).lean.digest

    base = digest()
    assert digest(ask=[{"role": "user", "content": "Something else?"}]) == base
    assert digest(contrast=0.5) == digest(contrast=2.0) == base
    assert digest(alpha=0.8) == digest(alpha=0.5001) == base
    assert len({base, digest(pref=PREF + " Really."), digest(rules=RULES + " Be kind.")}) == 3


def test_the_history_that_fits_is_planned_and_the_last_message_kept(text):
    msgs = []
    for k in range(12):
        msgs += [{"role": "user", "content": f"Tell me fact number {k} about Lyon."},
                 {"role": "assistant", "content": f"Fact {k}: Lyon is in France, on the Rhone."}]
    msgs.append(ASK[0])
    room = text.prompt_tokens(compose_context("", PREF), msgs[-5:]) + 16
    plan = planner(TextOnly(text.tokenizer, max_positions=room)).plan(
        ExecutionRequest("t", "u", msgs, PREF, max_new_tokens=16))
    assert 1 < len(plan.messages) < len(msgs) and plan.messages[-1] == ASK[0]
    assert len(text.renderer.encode(plan.segment + plan.prompt, first=True)) + 16 <= room


def test_a_lean_plan_is_kept_per_system_turn_whatever_is_asked(text):
    """The probes do not depend on the question: a member's next turn reuses its lean plan
    (no probe rendered again); another tenant's turn of the same text gets its own."""
    p = planner(text, batching=True)

    def lean(ask=ASK, tenant="t"):
        return p.plan(ExecutionRequest(tenant, "u", ask, PREF, RULES, contrast=1.0)).lean

    first = lean()
    assert lean([{"role": "user", "content": "Something else?"}]) is first
    other = lean(tenant="t2")
    assert other is not first and other.digest == first.digest  # keyed per tenant by its key
