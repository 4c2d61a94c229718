"""A deep turn's anchor on the prepared default model (SmolLM2-135M-Instruct): a member
whose standing instruction guidance serves, deep in a conversation, gets the first token
the turn's last message alone would get, guided (the formula computed here from the two
prompts with the model itself), then the row's reply leaning with the member's lean (or,
that off, its own greedy reply); off, the reply without it token for token; planned only
where it applies; a failing anchor degrades."""

from __future__ import annotations

import pytest
import torch

from injection import build_executor
from injection.base import ExecutionRequest, MemoryItem
from injection.engine.guidance import anchor, probe
from injection.engine.guidance import plan as guide_plan
from injection.engine.guidance.contrast import PLAUSIBLE, combine, resolve
from injection.metrics import Metrics
from tests.injection.test_probe import cached_lean

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

FRENCH = "Always answer me in French."
HISTORY = [("What is the capital of Italy?", "The capital of Italy is Rome."),
           ("How many legs does a spider have?", "A spider has eight legs."),
           ("What colour is the sky?", "The sky is blue on a clear day.")]
QUESTION = "How do I keep cut flowers fresh?"
N = 12


def _deep(question: str = QUESTION) -> list[dict[str, str]]:
    msgs = [{"role": r, "content": t} for q, a in HISTORY
            for r, t in (("user", q), ("assistant", a))]
    return [*msgs, {"role": "user", "content": question}]


@pytest.fixture
def ex(smollm):
    ex = build_executor(smollm, batch_max=4, metrics=Metrics())
    yield ex
    ex.close()


def _anchor_on(smollm, monkeypatch, key: str):
    """SmolLM2's shipped profile with ``anchor.<key>`` on, attached for the test; returns
    the shipped one."""
    from injection.model import profiles

    base = profiles.for_adapter(smollm)
    mech = {**base.mechanisms, "anchor": {**base.mechanisms["anchor"], key: True}}
    monkeypatch.setattr(smollm, "_profile", base._replace(mechanisms=mech), raising=False)
    return base


@pytest.fixture
def anchoring(smollm, monkeypatch):
    """SmolLM2's profile with deep turns anchored by default (``anchor.deep_turns``, off in
    the shipped profile): the anchor's mechanics at the profile's strength."""
    _anchor_on(smollm, monkeypatch, "deep_turns")


def _ask(ex, memory: str = FRENCH, msgs=None, **kw):
    """A turn at the guidance strength asked explicitly (the profile's default strength;
    the deep lean runs at it, and by default where the profile says so: below)."""
    kw.setdefault("contrast", resolve(ex.adapter, None, [memory]))
    return ex.execute(ExecutionRequest("t", "u", msgs or _deep(), memory, max_new_tokens=N,
                                       **kw))


def _first_token(smollm, memory: str, strength: float) -> int:
    """The guided first token of the last message alone: with the memory as the system
    turn against the template's default one."""
    last = [{"role": "user", "content": QUESTION}]
    with torch.inference_mode():
        logits = [smollm.model(input_ids=torch.tensor([smollm.renderer.encode(
            smollm.plain_prompt(c, last), first=True)])).logits[0, -1] for c in (memory, "")]
    return int(combine(logits[0], logits[1], strength).argmax())


def _continued(ex, smollm, req, token: int, lean=None, strength: float = 0.0) -> list[int]:
    """The deep turn's greedy reply from ``token`` on: its whole prompt (system turn and
    reminded history, as planned) then ``token``, one token at a time; with the member's
    ``lean`` (``probe.py``), each token from ``log p + strength x lean.rest`` over the
    plausible ones."""
    plan = ex.planner.plan(req)
    ids = [*smollm.renderer.encode(plan.segment, first=True),
           *smollm.renderer.encode(plan.prompt, first=False), token]
    out = [token]
    with torch.inference_mode():
        for _ in range(N - 1):
            logits = smollm.model(input_ids=torch.tensor([ids])).logits[0, -1]
            nxt = int(logits.argmax()) if lean is None else _leaned(logits, lean, strength)
            if nxt in smollm._eos_ids():
                break
            out.append(nxt)
            ids.append(nxt)
    return out


def _leaned(logits, lean, strength: float) -> int:
    lp = torch.log_softmax(logits.float(), -1)
    scores = lp + lean.rest.float() * strength
    return int(scores.masked_fill(lp < lp.max() + torch.log(torch.tensor(PLAUSIBLE)),
                                  float("-inf")).argmax())


def test_a_deep_turn_starts_as_its_message_alone_would_and_goes_on_leaning(ex, smollm):
    """The anchor picks the first token; the reply goes on with the member's lean (measured
    by the member's first such turn, ``probe.py``), as its first turns do."""
    strength = resolve(smollm, None, [FRENCH])
    assert strength > 0
    first = _ask(ex)  # the member's segment computed first (no one pass: the anchor needs it)
    res = _ask(ex)  # ... then cached
    assert res.text == first.text and res.tier.value != "compute"
    assert (first.extra["lean"], res.extra["lean"]) == ("probe", "l1")
    req = ExecutionRequest("t", "u", _deep(), FRENCH, max_new_tokens=N, contrast=strength)
    plan = ex.planner.plan(req)
    assert plan.guide is None and plan.anchor is not None  # reminded: no guide row
    assert plan.lean is not None
    want = _continued(ex, smollm, req, _first_token(smollm, FRENCH, strength),
                      cached_lean(ex, req), strength)
    assert res.text.strip() == smollm.tokenizer.decode(want, skip_special_tokens=True).strip()
    assert res.contrast_effective == strength and res.guide_decode_tokens == 0
    assert res.guide_prefill_tokens == len(plan.anchor.ids) + len(plan.anchor.guide.ids)
    unguided = _ask(ex, contrast=0.0)
    assert unguided.text != res.text and unguided.guide_prefill_tokens == 0


def test_without_the_lean_a_deep_turn_goes_on_as_the_row(ex, smollm, monkeypatch):
    """What ``probe.DEEP`` off does at any strength (and a profile's ``anchor.deep_lean``
    false): the anchor picks the first token, the row goes on greedy, and no probes run.
    Asked at its strength, SmolLM2's deep turn leans (``anchor.deep_lean`` true)."""
    strength = resolve(smollm, None, [FRENCH])
    leaning = _ask(ex)
    assert "lean" in leaning.extra
    monkeypatch.setattr(probe, "DEEP", False)
    res = _ask(ex)
    req = ExecutionRequest("t", "u", _deep(), FRENCH, max_new_tokens=N)
    assert ex.planner.plan(req).lean is None and "lean" not in res.extra
    want = _continued(ex, smollm, req, _first_token(smollm, FRENCH, strength))
    assert res.text.strip() == smollm.tokenizer.decode(want, skip_special_tokens=True).strip()
    assert leaning.contrast_effective == res.contrast_effective == strength


def test_smollm2s_profile_leaves_deep_turns_unanchored(ex):
    """``anchor.deep_turns`` false in SmolLM2's profile (2026-12-07: its gain was French this
    model cannot write, docs/BENCHMARKS.md quality): a default deep turn is the unguided
    reply token for token; asked at a strength, it is anchored as before."""
    default = ex.execute(ExecutionRequest("t", "u", _deep(), FRENCH, max_new_tokens=N))
    unguided = _ask(ex, contrast=0.0)
    assert default.text == unguided.text and default.guide_prefill_tokens == 0
    assert "lean" not in default.extra and default.contrast_effective == 0.0
    asked = _ask(ex)
    assert asked.guide_prefill_tokens > 0 and asked.text != default.text


def test_anchoring_off_is_the_reply_without_it_token_for_token(ex, monkeypatch):
    monkeypatch.setattr(guide_plan, "ONE_ANCHORED_DEEP", False)
    off, unguided = _ask(ex), _ask(ex, contrast=0.0)
    assert off.text == unguided.text
    assert off.contrast_effective == 0.0 and off.guide_prefill_tokens == 0


def test_an_anchor_is_planned_only_where_it_applies(ex, anchoring):
    """Not at depth 0 (guided there), not for an instruction the decoder keeps, not for a
    preference, not when the request asks for no guidance; with several memories, on
    turns no longer guided and without tenant instructions, after the turn's segment."""
    def planned(memory=FRENCH, msgs=None, **kw):
        req = ExecutionRequest("t", "u", msgs or _deep(), memory, max_new_tokens=N, **kw)
        return ex.planner.plan(req).anchor

    assert planned() is not None
    assert planned(msgs=[{"role": "user", "content": QUESTION}]) is None
    assert planned("Always answer in lowercase.") is None
    assert planned("I like gardening and my cat is called Whiskers.") is None
    assert planned(contrast=0.0) is None
    many = tuple(MemoryItem(f"m{j}", t) for j, t in enumerate(
        [FRENCH, "I like gardening.", "My cat is called Whiskers."]))

    def plan_many(msgs, **kw):
        return ex.planner.plan(ExecutionRequest("t", "u", msgs, memories=many,
                                                max_new_tokens=N, **kw))

    deep = plan_many(_deep())
    assert deep.guide is None and deep.anchor.guide.head == "segment"
    assert deep.anchor.ids != deep.anchor.guide.ids  # with its reminder, and without
    early = plan_many(_deep()[-3:], contrast=1.0)  # one exchange before: guided, not anchored
    assert early.guide is not None and early.anchor is None
    default = plan_many(_deep()[-3:])  # by default (SmolLM2's profile) neither: unguided
    assert default.guide is None and default.anchor is None and default.lean is None
    assert plan_many(_deep(), instructions="Be brief.").anchor is None


def test_a_failing_anchor_leaves_the_turn_unanchored(ex, monkeypatch):
    unguided = _ask(ex, contrast=0.0)

    def broken(*args, **kw):
        raise RuntimeError("anchor forward failed")

    monkeypatch.setattr(anchor, "combine", broken)  # inside the anchor's forward
    res = _ask(ex)
    assert res.text == unguided.text and res.contrast_effective == 0.0
    assert ex.engine.counters["anchor_failures"] == 1


def test_several_memories_start_as_their_reminded_message_alone_would(ex, smollm, anchoring):
    """Several memories, past their guided turns: the first token the last message alone
    picks with its reminder against without it, both after the member's segment; then the
    row's own greedy reply."""
    many = tuple(MemoryItem(f"m{j}", t) for j, t in enumerate(
        [FRENCH, "I like gardening.", "My cat is called Whiskers."]))

    def req(**kw):
        return ExecutionRequest("t", "u", _deep(), memories=many, max_new_tokens=N, **kw)

    plan = ex.planner.plan(req())
    reminded = plan.messages[-1]
    assert reminded["content"] != QUESTION and reminded["content"].endswith(QUESTION)
    with torch.inference_mode():
        logits = [smollm.model(input_ids=torch.tensor([smollm.renderer.encode(
            smollm.plain_prompt(plan.context, [m]), first=True)])).logits[0, -1]
            for m in (reminded, {"role": "user", "content": QUESTION})]
    strength = resolve(smollm, None, [FRENCH])
    want = _continued(ex, smollm, req(), int(combine(logits[0], logits[1], strength).argmax()))
    res, off = ex.execute(req()), ex.execute(req(contrast=0.0))
    assert res.text.strip() == smollm.tokenizer.decode(want, skip_special_tokens=True).strip()
    assert res.contrast_effective == strength and res.guide_decode_tokens == 0
    assert off.contrast_effective == 0.0 and off.guide_prefill_tokens == 0


def test_the_callers_own_stop_during_the_anchor_is_raised_not_swallowed(ex, monkeypatch):
    """The anchor swallows only a forward's own failures (model errors, a second OOM): any
    other exception, of the kind a time limit reaching the waiting request raises, ends the
    turn as it would without an anchor."""
    class TimeLimit(Exception):
        pass

    def stop(*args, **kw):
        raise TimeLimit

    monkeypatch.setattr(anchor, "combine", stop)
    with pytest.raises(TimeLimit):
        _ask(ex)
    assert ex.engine.counters["anchor_failures"] == 0


def test_deep_turns_at_once_share_one_anchor_forward_and_reply_as_alone(ex, anchoring):
    """Four members' deep turns whose anchors queue together (the engine held meanwhile)
    run them as one forward; every reply is the same as the turn alone."""
    import threading

    from tests.injection.test_batch_faults import _until
    from tests.injection.test_engine_forwards import _held

    questions = [QUESTION, "What should I cook tonight?", "Plan a rainy Sunday for me.",
                 "How do I store fresh basil?"]

    def req(i: int) -> ExecutionRequest:
        return ExecutionRequest("t", f"u{i}", _deep(questions[i]), FRENCH, max_new_tokens=N)

    for i in range(4):  # each member's segment computed first
        ex.execute(req(i))
    alone = [ex.execute(req(i)).text for i in range(4)]
    eng, box = ex.engine, {}
    groups, anchors = eng.counters["forward_groups"], eng.counters["forwards_anchor"]
    release, holder = _held(eng)
    threads = [threading.Thread(target=lambda i=i: box.setdefault(i, ex.execute(req(i))))
               for i in range(4)]
    for t in threads:
        t.start()
    _until(lambda: len(eng._forwards) == 4, "the four anchors queued")
    assert {job.kind for job in eng._forwards} == {"anchor"}
    release.set()
    for t in [holder, *threads]:
        t.join(120)
    assert [box[i].text for i in range(4)] == alone
    assert all(box[i].contrast_effective > 0 for i in range(4))
    assert eng.counters["forward_groups"] == groups + 1
    assert eng.counters["forwards_anchor"] == anchors + 4


def test_a_profile_can_anchor_a_first_turn_and_leave_the_rest_to_the_model(ex, smollm,
                                                                           monkeypatch):
    """``anchor.first_turns`` (off in SmolLM2's profile): a first turn its profile leaves
    unguided starts with the token guidance would pick (the memory as the system turn
    against the template's own, computed here), then goes on greedy with no guide and no
    lean; without it, the unguided reply."""
    first_turn = [{"role": "user", "content": QUESTION}]
    req = ExecutionRequest("t", "u", first_turn, FRENCH, max_new_tokens=N)
    plain = ex.execute(req)
    base = _anchor_on(smollm, monkeypatch, "first_turns")
    assert not base.mechanisms["anchor"].get("first_turns")  # the shipped default: off
    plan = ex.planner.plan(req)
    assert plan.anchor is not None and plan.guide is None and plan.lean is None
    res = ex.execute(req)
    want = _continued(ex, smollm, req, _first_token(smollm, FRENCH, base.guidance))
    assert res.text.strip() == smollm.tokenizer.decode(want, skip_special_tokens=True).strip()
    assert res.guide_prefill_tokens == len(plan.anchor.ids) + len(plan.anchor.guide.ids)
    assert res.guide_decode_tokens == 0 and plain.guide_prefill_tokens == 0
    assert res.text != plain.text  # the anchor chose another first token here
