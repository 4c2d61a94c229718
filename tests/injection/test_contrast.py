"""Contrastive guidance (injection/engine/contrast.py) in the real batch engine on the demo
model: a guided row's greedy reply equals a step-by-step reference of the formula (two
caches, the same tokens fed to both), beside other rows and after an OOM put-back; off
(strength 0, or no room for a second row) is today's output; the guide leaves with its
row; the executor guides only personal turns without a reminder, against the same
conversation without the memory."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache

from injection import InjectionExecutor, TenantLRU
from injection.base import ExecutionRequest
from injection.engine.batch import BatchEngine
from injection.engine.guidance import lean
from injection.engine.guidance.contrast import (
    PLAUSIBLE,
    Guide,
    combine,
    resolve,
)
from injection.errors import InvalidRequest
from injection.metrics import Metrics
from injection.model import profiles
from injection.prompting.output_filter import clean_reply
from tests.injection.test_batch import _in_threads
from tests.injection.test_batch_faults import _Faulty, _gate_until_queued, _with_model

SMOL = profiles.read(profiles.PROFILES_DIR / "smollm2-135m-instruct.json")

MEMORY = "I am vegetarian and I never eat fish."
QUESTION = [{"role": "user", "content": "What should I cook tonight?"}]


def _ids(adapter, context: str, messages=QUESTION) -> list[int]:
    return adapter.renderer.encode(adapter.plain_prompt(context, messages), first=True)


def client_text(adapter, ids: list[int]) -> str:
    """``ids`` decoded as a client gets a reply (the executor's output filter applied: a
    random model's reply may hold control characters)."""
    text, _ = clean_reply(adapter.tokenizer.decode(ids, skip_special_tokens=True),
                          lambda *_: None)
    return text.strip()


_DEFAULT = object()


def reference(adapter, with_ids, without_ids, n: int, strength: float,
              lean_after: int | None | object = _DEFAULT, row=lambda x: x) -> list[int]:
    """The formula, one token at a time: both sequences fed the chosen token (``row``: what
    the engine does to the row's logits first, e.g. a constraint's fold). With ``lean_after``
    k (default: the engine's ``lean.LEAN_AFTER``; None: never), the guide stops after k
    decoding steps and the row goes on with ``s`` times the mean of those steps'
    log-probability differences (``lean.py``)."""
    k = lean.LEAN_AFTER if lean_after is _DEFAULT else lean_after
    model, eos, out, dev = adapter.model, adapter._eos_ids(), [], adapter.device
    total, steps = 0.0, 0
    with torch.inference_mode():
        caches = [DynamicCache(config=adapter._cache_config) for _ in range(2)]
        logits = [model(input_ids=torch.tensor([ids], device=dev), past_key_values=c,
                        use_cache=True).logits[0, -1] for ids, c in zip(
                            (with_ids, without_ids), caches, strict=True)]
        for i in range(n):
            mine = row(logits[0])
            if len(logits) == 2:
                token = int(combine(mine, logits[1], strength).argmax())
                if i > 0:  # a decoding step (the first token is the prefill's)
                    diff = (torch.log_softmax(mine.float(), -1)
                            - torch.log_softmax(logits[1].float(), -1))
                    total, steps = total + diff.nan_to_num(0.0, 0.0, 0.0), steps + 1
            else:
                lp = torch.log_softmax(mine.float(), -1)
                scores = lp + total * (strength / steps)
                scores[lp < lp.max() + torch.log(torch.tensor(PLAUSIBLE))] = float("-inf")
                token = int(scores.argmax())
            out.append(token)
            if token in eos:
                break
            if k is not None and steps >= k:
                caches, logits = caches[:1], logits[:1]  # the guide leaves
            logits = [model(input_ids=torch.tensor([[token]], device=dev),
                            past_key_values=c,
                            use_cache=True).logits[0, -1] for c in caches]
    return out


def test_combine_is_the_formula_over_plausible_tokens():
    main = torch.tensor([2.0, 1.2, -1.0, -4.0])
    guide = torch.tensor([2.0, 0.0, 1.0, -12.0])
    got = combine(main, guide, 1.0)
    lp_m, lp_g = torch.log_softmax(main, -1), torch.log_softmax(guide, -1)
    want = 2 * lp_m - lp_g
    plausible = lp_m >= lp_m.max() + torch.log(torch.tensor(PLAUSIBLE))
    assert plausible.tolist() == [True, True, False, False]
    assert torch.allclose(got[plausible], want[plausible])
    assert torch.isinf(got[~plausible]).all()
    # token 1 overtakes token 0: what the memory adds wins, among plausible tokens only
    assert int(got.argmax()) == 1 and int(want.argmax()) == 3


@pytest.mark.parametrize("strength, chunk", [(0.5, 512), (2.0, 512), (1.0, 8)])
def test_a_guided_row_equals_the_step_by_step_reference(adapter, strength, chunk):
    """A short prompt is prefilled with its guide in one forward; one in chunks (8 tokens)
    gets its guide prefilled after its last chunk."""
    with_ids, without_ids = _ids(adapter, MEMORY), _ids(adapter, "")
    eng = BatchEngine(adapter, max_batch=4, prefill_chunk=chunk)
    try:
        out = eng.run(None, 1.0, with_ids, 16, guide=Guide(strength, None, without_ids))
        plain = eng.run(None, 1.0, with_ids, 16)
        assert eng.stats()["active"] == 0  # the guide left with its row
    finally:
        eng.close()
    want = reference(adapter, with_ids, without_ids, 16, strength)
    assert out.token_ids == want
    assert out.token_ids != plain.token_ids  # the guide changed the reply
    assert eng.counters["guided_rows"] == 1
    assert eng.counters["guide_pairs"] == (chunk > len(with_ids))
    assert (eng.counters["prefill_chunks"] > 0) == (chunk < len(with_ids))


def test_off_is_todays_output(adapter):
    with_ids, without_ids = _ids(adapter, MEMORY), _ids(adapter, "")
    eng, solo = BatchEngine(adapter, max_batch=4), BatchEngine(adapter, max_batch=1)
    try:
        plain = eng.run(None, 1.0, with_ids, 16)
        zero = eng.run(None, 1.0, with_ids, 16, guide=Guide(0.0, None, without_ids))
        no_room = solo.run(None, 1.0, with_ids, 16, guide=Guide(1.0, None, without_ids))
    finally:
        eng.close()
        solo.close()
    assert zero.token_ids == plain.token_ids == no_room.token_ids
    assert eng.counters["guided_rows"] == solo.counters["guided_rows"] == 0
    for out in (plain, zero, no_room):  # no guide row ran: none is reported
        assert (out.guide_prefill_tokens, out.guide_decode_tokens) == (0, 0)


@pytest.mark.parametrize("chunk", [512, 8])
def test_the_guide_rows_tokens_come_back_with_the_reply(adapter, chunk):
    """The guide's prefill is the ids it ran after its cached prefix (in the row's forward,
    or after the row's last chunk); its decode, the row's tokens it was fed (all but the
    last, no step follows it, and none once it has left: ``lean.LEAN_AFTER``). The reply's
    own counts are unchanged."""
    with_ids, without_ids = _ids(adapter, MEMORY), _ids(adapter, "")
    head = adapter.compute_kv_ids(without_ids[:6])  # a cached prefix: not prefilled
    eng = BatchEngine(adapter, max_batch=4, prefill_chunk=chunk)
    try:
        whole = eng.run(None, 1.0, with_ids, 12, guide=Guide(1.0, None, without_ids))
        after = eng.run(None, 1.0, with_ids, 12, guide=Guide(1.0, head, without_ids[6:]))
    finally:
        eng.close()
    assert whole.token_ids == after.token_ids  # the same guide, its head from a cache
    for out, prefilled in ((whole, len(without_ids)), (after, len(without_ids) - 6)):
        assert len(out.token_ids) > 1 and out.prompt_token_ids == with_ids
        assert (out.guide_prefill_tokens, out.guide_decode_tokens) == (
            prefilled, min(len(out.token_ids) - 1, lean.LEAN_AFTER))
        assert len(out.token_ids) - 1 > lean.LEAN_AFTER  # it left before the reply ended


def test_a_guided_row_beside_other_rows(adapter):
    """Three rows decode together (one with its guide: four in the batch); each reply is
    the one it gets alone, the guided one the reference's."""
    asks = ["What should I cook tonight?", "Plan my weekend.", "Name a good book."]
    ids = [_ids(adapter, MEMORY, [{"role": "user", "content": q}]) for q in asks]
    without = _ids(adapter, "", [{"role": "user", "content": asks[1]}])
    eng = BatchEngine(adapter, max_batch=8)
    try:
        alone = [eng.run(None, 1.0, i, 16) for i in ids]
        calls = [lambda i=i: eng.run(None, 1.0, i, 16) for i in ids]
        calls[1] = lambda: eng.run(None, 1.0, ids[1], 16, guide=Guide(1.0, None, without))
        outs = _in_threads(calls)
        assert eng.stats()["active"] == 0
    finally:
        eng.close()
    assert outs[0].token_ids == alone[0].token_ids and outs[2].token_ids == alone[2].token_ids
    assert outs[1].token_ids == reference(adapter, ids[1], without, 16, 1.0)
    assert eng.counters["peak_batch"] >= 3


def test_a_guide_takes_no_request_slot(adapter):
    """``max_batch`` counts requests: two guided requests decode together at max_batch 2
    (four rows, each with its guide), the third waits for a request slot; each reply is the
    formula's reference. Before, a guide took a slot: one guided request at a time."""
    asks = ["Plan my weekend.", "Name a good book.", "What should I cook tonight?"]
    ids = [_ids(adapter, MEMORY, [{"role": "user", "content": q}]) for q in asks]
    without = [_ids(adapter, "", [{"role": "user", "content": q}]) for q in asks]
    ref: dict = {}
    eng = ref["eng"] = BatchEngine(_with_model(adapter, _Faulty(
        adapter.model, _gate_until_queued(ref, 2))), max_batch=2)
    try:
        outs = _in_threads([
            lambda k=k: eng.run(None, 1.0, ids[k], 12, guide=Guide(1.0, None, without[k]))
            for k in range(3)])
        stats = eng.stats()
    finally:
        eng.close()
    assert eng.counters["peak_batch"] == 4 and eng.counters["guided_rows"] == 3
    assert stats["free_slots"] == 2 and stats["max_batch"] == 2
    for k in range(3):
        assert outs[k].token_ids == reference(adapter, ids[k], without[k], 12, 1.0)


def test_guided_rows_waiting_together_are_prefilled_in_one_forward_with_their_guides(adapter):
    """A burst of guided first turns (and a plain one) queued behind a running row: one
    group forward prefills every row and its guide; each guided reply is the formula's
    reference, the plain one its reply alone; the guides' prefill is counted."""
    asks = ["Plan my weekend.", "Name a good book.", "What should I cook tonight?"]
    ids = [_ids(adapter, MEMORY, [{"role": "user", "content": q}]) for q in asks]
    without = [_ids(adapter, "", [{"role": "user", "content": q}]) for q in asks]
    plain = _ids(adapter, "", [{"role": "user", "content": "Tell me a story."}])
    ref, started = {}, threading.Event()
    gate = _gate_until_queued(ref, 3)

    def before(call, kw):
        started.set()
        gate(call, kw)  # the plain row's forward waits for the three guided ones to queue

    eng = ref["eng"] = BatchEngine(_with_model(adapter, _Faulty(adapter.model, before)),
                                   max_batch=8, group_prefill=8)
    outs: list = [None] * 4
    try:
        first = threading.Thread(target=lambda: outs.__setitem__(0, eng.run(
            None, 1.0, plain, 12)))
        first.start()
        assert started.wait(60)
        outs[1:] = _in_threads([
            lambda k=k: eng.run(None, 1.0, ids[k], 12, guide=Guide(1.0, None, without[k]))
            for k in range(3)])
        first.join(60)
    finally:
        eng.close()
    assert eng.counters["group_prefills"] == 1 and eng.counters["grouped_rows"] >= 2
    assert eng.counters["guide_pairs"] == eng.counters["guided_rows"] == 3
    for k in range(3):
        assert outs[k + 1].token_ids == reference(adapter, ids[k], without[k], 12, 1.0)
        assert outs[k + 1].guide_prefill_tokens == len(without[k])
    alone = BatchEngine(adapter, max_batch=1)
    try:
        assert outs[0].token_ids == alone.run(None, 1.0, plain, 12).token_ids
    finally:
        alone.close()


def oom_once(model, rows: int):
    """A hook on ``model``'s second layer: the first decoding step of ``rows`` rows runs out
    of memory. Returns the list it marks when it raised, and the hook (to remove)."""
    raised: list[bool] = []

    def oom_in_layer(_module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        if hidden.shape[0] == rows and hidden.shape[1] == 1 and not raised:
            raised.append(True)
            raise torch.cuda.OutOfMemoryError("injected")

    return raised, model.model.layers[1].register_forward_pre_hook(oom_in_layer,
                                                                    with_kwargs=True)


def test_an_oom_puts_the_guided_row_back_with_its_guide(adapter):
    """The step with [plain row, guided row, its guide] runs out of memory: the newest row
    that is not a guide goes back in line with its guide; both replies are unchanged."""
    model = _with_model(adapter, adapter.model).model
    plain_ids, with_ids, without = _ids(adapter, ""), _ids(adapter, MEMORY), _ids(adapter, "")
    raised, hook = oom_once(model, rows=3)
    ref: dict = {}
    eng = ref["eng"] = BatchEngine(
        _with_model(adapter, _Faulty(model, _gate_until_queued(ref, 1))), max_batch=4)
    try:
        outs = _in_threads([lambda: eng.run(None, 1.0, plain_ids, 16),
                            lambda: eng.run(None, 1.0, with_ids, 16,
                                            guide=Guide(1.0, None, without))])
    finally:
        eng.close()
        hook.remove()
    assert raised and eng.counters["oom_shrinks"] == 1 and eng.counters["step_failures"] == 0
    assert outs[1].token_ids == reference(adapter, with_ids, without, 16, 1.0)
    with torch.inference_mode():
        alone = BatchEngine(adapter, max_batch=1)
        try:
            assert outs[0].token_ids == alone.run(None, 1.0, plain_ids, 16).token_ids
        finally:
            alone.close()


def _executor(adapter, **kw) -> InjectionExecutor:
    """One-memory first turns guided by a guide row, not the member's lean (``probe.py``,
    the default: tests/injection/test_probe.py)."""
    return InjectionExecutor(adapter, l1=TenantLRU(max_bytes=64 * 1024**2), l2=None,
                             metrics=Metrics(), engine=BatchEngine(adapter, max_batch=4),
                             memory_lean=False, **kw)


def _history(n: int) -> list[dict[str, str]]:
    msgs: list[dict[str, str]] = []
    for k in range(n):
        msgs += [{"role": "user", "content": f"Tell me fact {k}."},
                 {"role": "assistant", "content": f"Fact {k} is short."}]
    return msgs + QUESTION


def test_the_executor_guides_against_the_conversation_without_the_memory(adapter):
    ex = _executor(adapter)
    try:
        req = ExecutionRequest("t1", "u1", QUESTION, MEMORY, max_new_tokens=12, contrast=1.0)
        res = ex.execute(req)
        ex.clear_l1()
        cold = ex.execute(req)  # the member segment recomputed: same reply
        hits = ex.metrics.get("tenant_l1_hits")
        again = ex.execute(req)
        # the guide's head (the template's default system turn) is a cached tenant segment
        assert ex.metrics.get("tenant_l1_hits") == hits + 1 and again.text == res.text
        none = ex.execute(ExecutionRequest("t1", "u2", QUESTION, "", max_new_tokens=12,
                                           contrast=1.0))
        with pytest.raises(InvalidRequest, match="contrast"):
            ex.execute(ExecutionRequest("t1", "u1", QUESTION, MEMORY, contrast=5.0))
    finally:
        ex.close()
    assert res.contrast_effective == 1.0 and cold.text == res.text
    want = reference(adapter, _ids(adapter, MEMORY), _ids(adapter, ""), 12, 1.0)
    assert client_text(adapter, want) == res.text.strip()
    assert none.contrast_effective == 0.0  # nothing personal: no guide
    # the guide row's work, beside the reply's: its prefill (at most its whole input, less
    # a cached head) and one decoding step per reply token but the last, until it leaves
    assert 0 < res.guide_prefill_tokens <= len(_ids(adapter, ""))
    assert res.guide_decode_tokens == min(res.completion_tokens - 1, lean.LEAN_AFTER)
    assert (again.guide_prefill_tokens, again.guide_decode_tokens) == (
        res.guide_prefill_tokens, res.guide_decode_tokens)
    assert (none.guide_prefill_tokens, none.guide_decode_tokens) == (0, 0)


@pytest.mark.parametrize("keeps", [False, True])
def test_the_guide_has_nothing_injected_unless_it_keeps_the_instructions(adapter, keeps):
    """The default guide has neither the tenant's instructions nor the memory, so the
    instructions are amplified with the memory (they keep precedence); keeping them in the
    guide (``guide_keeps_instructions``) contrasts the memory alone."""
    from injection.prompting.template import compose_context

    rules = "You are the help desk of ACME. Answer in one sentence."
    ex = _executor(adapter, guide_keeps_instructions=keeps)
    try:
        res = ex.execute(ExecutionRequest("t1", "u1", QUESTION, MEMORY, rules,
                                          max_new_tokens=12, contrast=1.0))
    finally:
        ex.close()
    want = reference(adapter, _ids(adapter, compose_context(rules, MEMORY)),
                     _ids(adapter, compose_context(rules if keeps else "", "")), 12, 1.0)
    assert res.contrast_effective == 1.0
    assert client_text(adapter, want) == res.text.strip()


def test_reminded_turns_are_not_guided(adapter):
    ex = _executor(adapter)
    try:
        early = ex.execute(ExecutionRequest("t1", "u1", _history(1), MEMORY,
                                            max_new_tokens=4, contrast=1.0))
        deep = ex.execute(ExecutionRequest("t1", "u1", _history(3), MEMORY,
                                           max_new_tokens=4, contrast=1.0))
        unreminded = ex.execute(ExecutionRequest("t1", "u1", _history(3), MEMORY,
                                                 max_new_tokens=4, contrast=1.0,
                                                 reminder=False))
    finally:
        ex.close()
    assert early.contrast_effective == 1.0 and early.guide_decode_tokens > 0
    # its turn carries the reminder: no guide row, its first token anchored (anchor.py)
    assert deep.contrast_effective == 1.0 and deep.guide_decode_tokens == 0
    assert deep.guide_prefill_tokens > 0
    assert unreminded.contrast_effective == 1.0 and unreminded.guide_decode_tokens > 0


def test_pairs_combined_at_once_equal_each_combined_alone():
    """``split_rows`` combines a step's guided rows in one call: each row's scores are the
    same bit for bit as combining it alone, whatever the strengths beside it."""
    torch.manual_seed(3)
    main, guide = torch.randn(5, 4000) * 4, torch.randn(5, 4000) * 4
    strengths = [1.0, 0.5, 2.0, 0.3, 1.7]
    together = combine(main, guide, strengths)
    for r, s in enumerate(strengths):
        alone = combine(main[r], guide[r], s)
        assert torch.equal(together[r], alone)
        lp_m, lp_g = torch.log_softmax(main[r], -1), torch.log_softmax(guide[r], -1)
        want = ((1.0 + s) * lp_m - s * lp_g).masked_fill(
            lp_m < lp_m.max() + torch.log(torch.tensor(PLAUSIBLE)), float("-inf"))
        assert torch.equal(alone, want)  # the formula, as combine computed it before
    assert torch.equal(combine(main, guide, [1.0] * 5), combine(main, guide, 1.0))


def test_split_rows_drops_guides_and_combines_each_pair():
    """A step's rows: guided rows (their guides anywhere in the step), an unguided row, and
    a guided row whose guide is not in this step: guides choose nothing, each guided row's
    logits are combined with its own guide's, the others pass unchanged."""
    from injection.engine.batchrow import RowJob
    from injection.engine.guidance.contrast import guide_job, split_rows

    def row(strength: float = 0.0) -> RowJob:
        job = RowJob(None, 1.0, [1], [1], 4, {}, {})
        if strength:
            job.guide, job.guide_strength = guide_job(job, Guide(strength, None, [2])), strength
        return job

    a, b, c, d = row(1.0), row(), row(2.0), row(0.5)
    torch.manual_seed(5)
    rows = [a, c.guide, b, c, a.guide, d]  # d's guide is not in the step
    logits = torch.randn(len(rows), 300) * 3
    kept, out = split_rows(rows, logits)
    assert kept == [a, b, c, d]
    assert torch.equal(out[0], combine(logits[0], logits[4], 1.0))
    assert torch.equal(out[1], logits[2]) and torch.equal(out[3], logits[5])
    assert torch.equal(out[2], combine(logits[3], logits[1], 2.0))
    kept, out = split_rows([a, c, c.guide, a.guide], logits[:4])  # every row guided
    assert kept == [a, c]
    assert torch.equal(out[0], combine(logits[0], logits[3], 1.0))
    assert torch.equal(out[1], combine(logits[1], logits[2], 2.0))


def test_by_default_only_memories_of_a_measured_kind_are_guided():
    """``resolve``: a standing instruction naming a language, or asking for what a decoding
    constraint would keep but the turn's do not; not one of no measured kind, nor a fact."""
    smol = SimpleNamespace(_model_key=SMOL.model_key)  # SmolLM2's profile
    on = SMOL.guidance
    assert on > 0
    assert resolve(smol, None, ["Always answer in French."]) == on
    assert resolve(smol, None, ["Always answer in lowercase."]) == on  # constraints off
    assert resolve(smol, None, ["Always answer in lowercase."], ("lowercase",)) == 0.0
    for memory in ("I like short answers.", "Be polite in every answer.", "I live in Paris."):
        assert resolve(smol, None, [memory]) == 0.0
    assert resolve(smol, None, ["I like short answers.", "Reply in German."]) == on
    assert resolve(smol, None, ["always reply in german please"]) == on  # as people type
    assert resolve(smol, None, ["Give polish to every answer."]) == 0.0  # no language
    assert resolve(smol, 1.5, ["I like short answers."]) == 1.5  # asked for: any memory
    assert resolve(SimpleNamespace(_model_key="other"), None, ["Reply in German."]) == 0.0
