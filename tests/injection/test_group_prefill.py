"""Batched prefill (``engine/prefill/grouping.py``): rows waiting together are prefilled in one
forward, each after its own injected K/V (different lengths, alpha, none at all); each
row's reply is token for token the reply it gets alone. Demo model, real engine; the
group's composition is made deterministic by holding the first forward until the rows
are queued (events, not time)."""

from __future__ import annotations

import threading

from injection.engine.batch import BatchEngine
from tests.injection.test_batch import PREFS, _row
from tests.injection.test_batch_faults import _Faulty, _until, _with_model

ROWS = [(PREFS[0], "What should I cook tonight?", 1.0),
        (PREFS[1], "Plan my weekend, please, with something to do outdoors.", 1.0),
        (None, "Tell me a story.", 1.0),
        (PREFS[2], "How are you?", 0.6)]


def _run_grouped(adapter, before_group=None, rows=ROWS, engines=None, **engine_kw):
    """Row 0 starts alone (its forward held until the others queue); the others are then
    prefilled together. Returns the replies and the engine's counters."""
    ref: dict = {}
    forwards: list[tuple[int, int]] = []

    def before(call, kw):
        shape = tuple(kw["input_ids"].shape)
        forwards.append(shape)
        if call == 1:
            _until(lambda: ref["eng"].stats()["waiting"] >= len(rows) - 1, "rows queued")
        if before_group is not None and shape[0] > 1 and shape[1] > 1:
            before_group(kw)

    eng = ref["eng"] = BatchEngine(_with_model(adapter, _Faulty(adapter.model, before)),
                                   max_batch=8, group_prefill=8, **engine_kw)
    if engines is not None:
        engines.append(eng)
    made = [_row(adapter, pref, q) for pref, q, _ in rows]
    out: list = [None] * len(rows)

    def ask(i):
        prompt, kv = made[i]
        out[i] = eng.generate(prompt, kv, rows[i][2], 24)

    threads = [threading.Thread(target=ask, args=(0,))]
    threads[0].start()
    _until(lambda: len(forwards) >= 1, "row 0 prefilling")
    for i in range(1, len(rows)):
        threads.append(threading.Thread(target=ask, args=(i,)))
        threads[-1].start()
    try:
        for t in threads:
            t.join(120)
    finally:
        eng.close()
    alone = [adapter.generate(p, kv, a, 24) for (p, kv), (_, _, a) in zip(made, rows,
                                                                           strict=True)]
    return out, alone, eng.counters, forwards


def test_rows_waiting_together_are_prefilled_in_one_forward_and_answer_as_alone(adapter):
    out, alone, counters, forwards = _run_grouped(adapter)
    assert [o.token_ids for o in out] == [a.token_ids for a in alone]
    assert [o.text for o in out] == [a.text for a in alone]
    assert counters["group_prefills"] == 1 and counters["grouped_rows"] == len(ROWS) - 1
    assert sum(1 for rows, q in forwards if rows > 1 and q > 1) == 1  # one group forward
    assert counters["peak_batch"] == len(ROWS)


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_group_forward_teaches_the_pacer_its_per_token_cost(adapter):
    """Only the group's forward takes (injected) time: 10 ms per token it prefills. The
    pacer's estimate, which sizes the chunks of later long prompts, comes from it."""
    clock, engines, group_tokens = _Clock(), [], []

    def slow(kw):
        group_tokens.append(int(kw["attention_mask"][:, -kw["input_ids"].shape[1]:].sum()))
        clock.t += 0.01 * group_tokens[-1]

    _run_grouped(adapter, before_group=slow, engines=engines, clock=clock)
    assert len(group_tokens) == 1
    per_token = engines[0].pacer.token_seconds()
    # row 0's prefill took no time: without the group's reading there is no estimate
    assert per_token is not None and 0 < per_token <= 0.01, per_token


def test_a_failing_group_forward_sends_its_rows_alone(adapter):
    seen = []

    def boom(kw):
        seen.append(kw["input_ids"].shape[0])
        raise RuntimeError("injected group fault")

    out, alone, counters, _ = _run_grouped(adapter, before_group=boom)
    assert seen == [len(ROWS) - 1]  # tried once, then never grouped again
    assert counters["group_fallbacks"] == 1 and counters["group_prefills"] == 0
    assert [o.token_ids for o in out] == [a.token_ids for a in alone]
    assert counters["row_failures"] == 0


def test_grouped_rows_capture_their_segments(adapter):
    pref_ids = [adapter.renderer.encode(p, first=True) for p in PREFS]
    prompt_ids = [adapter.renderer.encode(adapter.split_prompt(p, [
        {"role": "user", "content": "Hello"}]).prompt, first=False) for p in PREFS]
    ref, got, forwards = {}, {}, []

    def before(call, _kw):
        forwards.append(call)
        if call == 1:
            _until(lambda: ref["eng"].stats()["waiting"] >= 2, "rows queued")

    eng = ref["eng"] = BatchEngine(_with_model(adapter, _Faulty(adapter.model, before)),
                                   max_batch=4, group_prefill=4)

    def ask(i):
        eng.run(None, 1.0, pref_ids[i] + prompt_ids[i], 4, capture_tokens=len(pref_ids[i]),
                capture=lambda kv, i=i: got.__setitem__(i, kv))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    try:
        threads[0].start()
        _until(lambda: forwards, "row 0 prefilling alone")
        for t in threads[1:]:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        eng.close()
    assert eng.counters["grouped_rows"] == 2 and eng.counters["segment_captures"] == 3
    for i, p in enumerate(PREFS):
        want = adapter.compute_kv(p)
        assert got[i].token_ids == want.token_ids
        assert got[i].keys.shape == want.keys.shape
        assert (got[i].keys - want.keys).abs().max() < 1e-4
        assert (got[i].values - want.values).abs().max() < 1e-4
