"""A guide that leaves early (injection/engine/guidance/lean.py): the lean is the mean
log-probability difference of its guided decoding steps, applied over the row's plausible
tokens; in the real batch engine the guide decodes ``LEAN_AFTER`` steps and leaves the
batch, the reply the step-by-step reference's; ``LEAN_AFTER = None`` is the whole-reply
guide, token for token."""

from __future__ import annotations

import pytest
import torch

from injection.engine.batch import BatchEngine
from injection.engine.batchrow import RowJob
from injection.engine.guidance import lean
from injection.engine.guidance.contrast import PLAUSIBLE, Guide, split_rows
from tests.injection.test_batch import _in_threads
from tests.injection.test_batch_faults import _Faulty, _gate_until_queued, _until, _with_model
from tests.injection.test_contrast import MEMORY, _ids, oom_once, reference


def _pair(strength: float = 1.0) -> RowJob:
    row = RowJob(None, 1.0, [1], [1], 8, {}, {})
    row.guide = RowJob(None, 1.0, [1], [1], 8, {}, {}, is_guide=True)
    row.guide_strength = strength
    return row


def test_the_lean_is_the_strength_times_the_mean_difference(monkeypatch):
    monkeypatch.setattr(lean, "LEAN_AFTER", 2)
    row = _pair(strength=2.0)
    mains = [torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([[0.0, 3.0, -1.0]])]
    guides = [torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([[1.0, 1.0, float("-inf")]])]
    for m, g in zip(mains, guides, strict=True):
        assert lean.due(row) and lean.leaving([row]) == []
        lean.observe([row], m, g)
    diffs = [torch.log_softmax(m[0], -1) - torch.log_softmax(g[0], -1)
             for m, g in zip(mains, guides, strict=True)]
    diffs[1][2] = 0.0  # a token the guide rules out counts 0, not +inf
    guide = row.guide
    assert lean.leaving([row]) == [guide] and row.guide is None and row.guide_fed == 2
    assert lean.leaned(row) and not lean.due(row)
    assert torch.allclose(row.lean, (diffs[0] + diffs[1]) * (2.0 / 2))
    main = torch.tensor([[1.0, 0.9, -5.0]])
    got = lean.scores(main, row.lean.unsqueeze(0), float(torch.log(torch.tensor(PLAUSIBLE))))
    lp = torch.log_softmax(main[0], -1)
    assert torch.isinf(got[0, 2]) and torch.allclose(got[0, :2], (lp + row.lean)[:2])


def test_split_rows_leans_rows_whose_guide_left_and_combines_the_others(monkeypatch):
    monkeypatch.setattr(lean, "LEAN_AFTER", 1)
    leaned, guided, plain = _pair(), _pair(), RowJob(None, 1.0, [1], [1], 8, {}, {})
    leaned.lean, leaned.guide, leaned.guide_fed = torch.tensor([0.0, 5.0, 0.0]), None, 1
    logits = torch.tensor([[2.0, 1.9, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 3.0],
                           [3.0, 0.0, 1.0], [0.5, 0.0, 0.0]])
    rows, out = split_rows([leaned, guided, guided.guide, plain], logits[:4])
    assert rows == [leaned, guided, plain]
    assert int(out[0].argmax()) == 1  # the lean turned the pick
    assert torch.equal(out[2], logits[3])  # untouched
    assert guided.lean_steps == 1 and guided.lean is not None  # the guided step counted


def test_the_engine_leans_as_the_reference_and_the_guide_leaves_the_batch(adapter, monkeypatch):
    """The row's reply is the reference's (guide for k steps, then the lean); forwards after
    the guide's k-th step run one row; k = None is the whole-reply guide."""
    with_ids, without_ids = _ids(adapter, MEMORY), _ids(adapter, "")
    widths: list[int] = []
    eng = BatchEngine(_with_model(adapter, _Faulty(
        adapter.model, lambda _, kw: widths.append(kw["input_ids"].shape[0]))), max_batch=4)
    try:
        outs = {}
        for k in (2, None):
            monkeypatch.setattr(lean, "LEAN_AFTER", k)
            widths.clear()
            outs[k] = eng.run(None, 1.0, with_ids, 16, guide=Guide(1.0, None, without_ids))
            outs[k, "widths"] = list(widths)
    finally:
        eng.close()
    for k in (2, None):
        assert outs[k].token_ids == reference(adapter, with_ids, without_ids, 16, 1.0, k)
    assert outs[2].token_ids != outs[None].token_ids  # the lean is not the guide
    n = len(outs[2].token_ids)
    assert n == 16 and outs[2].guide_decode_tokens == 2
    # one prefill of the pair, 2 decoding steps with the guide, then the row alone
    assert outs[2, "widths"] == [2, 2, 2] + [1] * (n - 3)
    assert outs[None, "widths"] == [2] * len(outs[None].token_ids)
    assert outs[None].guide_decode_tokens == len(outs[None].token_ids) - 1


@pytest.mark.parametrize("k", [1, 3])
def test_leaning_rows_beside_guided_and_plain_ones(adapter, monkeypatch, k):
    """Rows whose guides leave at different steps (each admitted apart) decode beside a
    plain row: each reply is its reference's, the plain one its reply alone."""
    monkeypatch.setattr(lean, "LEAN_AFTER", k)
    asks = ["Plan my weekend.", "Name a good book.", "What should I cook tonight?"]
    ids = [_ids(adapter, MEMORY, [{"role": "user", "content": q}]) for q in asks]
    without = [_ids(adapter, "", [{"role": "user", "content": q}]) for q in asks]
    eng = BatchEngine(adapter, max_batch=8)
    try:
        alone = eng.run(None, 1.0, ids[2], 16)
        outs = _in_threads([
            lambda: eng.run(None, 1.0, ids[0], 16, guide=Guide(1.0, None, without[0])),
            lambda: eng.run(None, 1.0, ids[1], 12, guide=Guide(0.5, None, without[1])),
            lambda: eng.run(None, 1.0, ids[2], 16)])
        assert eng.stats()["active"] == 0
    finally:
        eng.close()
    assert outs[0].token_ids == reference(adapter, ids[0], without[0], 16, 1.0)
    assert outs[1].token_ids == reference(adapter, ids[1], without[1], 12, 0.5)
    assert outs[2].token_ids == alone.token_ids


def test_a_leaning_row_put_back_after_an_oom_is_guided_again_from_its_start(adapter):
    """The step after the guide left ([plain row, leaning row]) runs out of memory: the newest
    row (the leaning one, no text streamed) goes back in line and starts over with its guide
    (prefilled again), so its reply is still the reference's; the plain one is unchanged."""
    model = _with_model(adapter, adapter.model).model
    plain_ids, with_ids, without = _ids(adapter, ""), _ids(adapter, MEMORY), _ids(adapter, "")
    raised, hook = oom_once(model, rows=2)  # the first step after the guide left
    ref: dict = {}
    eng = ref["eng"] = BatchEngine(
        _with_model(adapter, _Faulty(model, _gate_until_queued(ref, 1))), max_batch=4)

    def guided():
        _until(lambda: eng._admitting is not None, "the plain row admitted first")
        return eng.run(None, 1.0, with_ids, 16, guide=Guide(1.0, None, without))

    try:
        outs = _in_threads([lambda: eng.run(None, 1.0, plain_ids, 16), guided])
    finally:
        eng.close()
        hook.remove()
    assert raised and eng.counters["oom_shrinks"] == 1 and eng.counters["step_failures"] == 0
    assert outs[1].token_ids == reference(adapter, with_ids, without, 16, 1.0)
    assert outs[1].guide_prefill_tokens == 2 * len(without)  # started over, guided again
    assert outs[1].guide_decode_tokens == lean.LEAN_AFTER
    alone = BatchEngine(adapter, max_batch=1)
    try:
        assert outs[0].token_ids == alone.run(None, 1.0, plain_ids, 16).token_ids
    finally:
        alone.close()
