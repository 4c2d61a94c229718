"""A deep turn's anchor (``engine/guidance/anchor.py``): its first token chosen as the turn's
last message alone, guided, would choose it. Engine: first-token scores given to a row
replace its own (alone, in a grouped prefill, and again for a row put back before its
first token); the demo model, the real engine, token-level references."""

from __future__ import annotations

import threading

import torch

from injection.engine.batch import BatchEngine
from injection.engine.guidance import anchor
from tests.injection.test_batch import PREFS, _row
from tests.injection.test_batch_faults import _Faulty, _held_start, _until, _with_model


def _forced(adapter, token: int) -> torch.Tensor:
    """Scores that allow ``token`` alone."""
    scores = torch.full((adapter.model.config.vocab_size,), float("-inf"))
    scores[token] = 0.0
    return scores


def _continued(adapter, prompt: str, kv, token: int, n: int) -> list[int]:
    """Greedy reply ids after ``prompt`` that start with ``token`` (the row's reference)."""
    ids = adapter.renderer.encode(prompt, first=kv is None)
    eng = BatchEngine(adapter, max_batch=2)
    try:
        rest = eng.run(kv, 1.0, [*ids, token], n - 1)
    finally:
        eng.close()
    return [token, *rest.token_ids]


def test_first_scores_choose_the_first_token_and_the_row_goes_on_from_it(adapter):
    prompt, kv = _row(adapter, PREFS[0], "What should I cook tonight?")
    eng = BatchEngine(adapter, max_batch=2)
    try:
        ids = adapter.renderer.encode(prompt, first=False)
        plain = eng.run(kv, 1.0, ids, 12)
        token = next(t for t in range(5, 500) if t != plain.token_ids[0])
        out = eng.run(kv, 1.0, ids, 12, first_scores=_forced(adapter, token))
        again = eng.run(kv, 1.0, ids, 12)  # nothing of the anchor stays behind
    finally:
        eng.close()
    assert out.token_ids[0] == token != plain.token_ids[0]
    assert out.token_ids == _continued(adapter, prompt, kv, token, 12)
    assert again.token_ids == plain.token_ids


def test_anchored_rows_prefilled_together_each_get_their_own_first_token(adapter):
    """Three rows queued while the first forward is held are prefilled in one forward;
    the two anchored ones start with their own token, the other is its plain reply."""
    rows = [(PREFS[0], "What should I cook tonight?", 11), (PREFS[1], "Plan my weekend.", 23),
            (None, "Tell me a story.", None), (PREFS[2], "How are you?", 37)]
    made = [_row(adapter, pref, q) for pref, q, _ in rows]
    ref: dict = {}
    shapes: list[tuple] = []

    def before(call, kw):
        shapes.append(tuple(kw["input_ids"].shape))
        if call == 1:
            _until(lambda: ref["eng"].stats()["waiting"] >= len(rows) - 1, "rows queued")

    eng = ref["eng"] = BatchEngine(_with_model(adapter, _Faulty(adapter.model, before)),
                                   max_batch=8, group_prefill=8)
    out: list = [None] * len(rows)

    def ask(i):
        prompt, kv = made[i]
        token = rows[i][2]
        out[i] = eng.run(kv, 1.0, adapter.renderer.encode(prompt, first=kv is None), 10,
                         first_scores=None if token is None else _forced(adapter, token))

    _held_start([threading.Thread(target=ask, args=(i,)) for i in range(len(rows))],
                lambda: len(shapes) >= 1, eng)
    assert any(s[0] == len(rows) - 1 for s in shapes), shapes  # the three in one forward
    for (prompt, kv), (_, _, token), got in zip(made, rows, out, strict=True):
        if token is None:
            assert got.token_ids == adapter.generate(prompt, kv, 1.0, 10).token_ids
        else:
            assert got.token_ids == _continued(adapter, prompt, kv, token, 10)


def test_a_row_that_has_chosen_keeps_its_own_logits():
    """``first`` applies before the row's first token only (a row put back after its
    first token is resumed, never anchored again)."""
    class Row:
        first_scores = torch.tensor([0.0, -1.0])
        gen: list[int] = []

    own = torch.tensor([-1.0, 0.0])
    row = Row()
    assert torch.equal(anchor.first(row, own), Row.first_scores)
    row.gen = [1]
    assert torch.equal(anchor.first(row, own), own)
    assert torch.equal(anchor.firsts([row], own[None]), own[None])
