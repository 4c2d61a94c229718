"""Paced chunked prefill: while rows decode, a long prompt's chunks are sized from the
engine's own measurements to cost about ``pace`` decoding steps (``engine/prefill/pacing.py``).
The engine's clock is injected and advanced by the model's forward passes: chunk sizes
follow from the figures the test sets, never from how fast this machine is."""

from __future__ import annotations

import threading

import pytest

from injection.engine.batch import BatchEngine
from injection.engine.prefill.pacing import Pacer
from tests.injection.test_batch import PREFS, _row
from tests.injection.test_batch_faults import _Faulty, _until, _with_model
from tests.injection.test_chunked_prefill import _long_prompt


def test_a_chunk_costs_about_the_budget_in_decoding_steps():
    p = Pacer(512, 1.5, floor=16)
    assert p.chunk(2000, decoding=True) == 512  # nothing measured yet: the cap
    p.stepped(0.1)
    p.prefilled(100, 0.5)  # 5 ms a token
    assert p.chunk(2000, decoding=True) == 30  # 1.5 x 100 ms / 5 ms
    assert p.chunk(20, decoding=True) == 20  # never more than what is left
    assert p.chunk(2000, decoding=False) == 512  # nobody waits: the cap (memory bound)
    p.stepped(0.001)
    p.stepped(0.001)
    assert p.chunk(2000, decoding=True) == 16  # the floor
    assert Pacer(0, 1.5).chunk(2000, decoding=True) == 2000  # chunking off
    off = Pacer(256, 0.0)
    off.stepped(0.1)
    off.prefilled(100, 0.5)
    assert off.chunk(2000, decoding=True) == 256  # pacing off: the cap
    with pytest.raises(ValueError):
        Pacer(512, -1.0)


def test_a_short_prefill_makes_the_estimate_cautious():
    p = Pacer(512, 2.0, floor=1, smoothing=1.0)
    p.stepped(0.1)
    p.prefilled(10, 0.1)  # a 10-token prompt, mostly fixed cost: 10 ms a token
    assert p.chunk(2000, decoding=True) == 20  # smaller than the 2.5 ms/token truth allows


class _Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_while_a_row_decodes_the_long_prompt_arrives_in_paced_chunks(adapter):
    """Forwards advance the injected clock: 4 ms a prefilled token, 80 ms a decoding step;
    at pace 1.5 a chunk is 1.5 x 80 / 4 = 30 tokens while the short row decodes."""
    prompt, kv = _row(adapter, PREFS[0], "What should I cook tonight?")
    long_ids = _long_prompt(adapter, 300)
    clock, calls, ref = _Clock(), [], {}

    def before(_n, kw):
        rows, q = kw["input_ids"].shape
        calls.append((rows, q))
        clock.t += 0.004 * q if q > 1 else 0.08
        if (rows, q) == (1, 1) and calls.count((1, 1)) == 1:  # the short row decodes
            _until(lambda: ref["eng"].stats()["waiting"] >= 1, "the long prompt queued")

    eng = ref["eng"] = BatchEngine(_with_model(adapter, _Faulty(adapter.model, before)),
                                   max_batch=4, prefill_chunk=256, pace=1.5, clock=clock)
    out: dict = {}
    try:
        short = threading.Thread(target=lambda: out.setdefault(
            "short", eng.generate(prompt, kv, 1.0, 40)))
        short.start()
        _until(lambda: calls.count((1, 1)) >= 1, "the short row decoding")
        out["long"] = eng.run(None, 1.0, long_ids, 4)
        short.join(60)
    finally:
        eng.close()
    chunks = [q for rows, q in calls[1:] if rows == 1 and q > 1]  # the long prompt's
    assert sum(chunks) == 300 and len(chunks) == 10 and set(chunks) == {30}
    assert out["short"].token_ids == adapter.generate(prompt, kv, 1.0, 40).token_ids
    whole = BatchEngine(adapter, max_batch=1, prefill_chunk=0)
    try:
        assert out["long"].token_ids == whole.run(None, 1.0, long_ids, 4).token_ids
    finally:
        whole.close()


def test_alone_a_long_prompt_is_prefilled_in_chunks_of_the_cap(adapter):
    long_ids = _long_prompt(adapter, 600)
    calls = []
    eng = BatchEngine(_with_model(adapter, _Faulty(adapter.model, lambda _n, kw: calls.append(
        kw["input_ids"].shape[1]))), max_batch=2, prefill_chunk=256, pace=1.5)
    try:
        eng.run(None, 1.0, long_ids, 2)
    finally:
        eng.close()
    assert calls[:3] == [256, 256, 88]  # nobody decoding: nothing to pace against


def test_a_burst_larger_than_the_running_batch_is_prefilled_together_unpaced(adapter):
    """Three long prompts queue while one short row decodes: more wait than run, so they
    are prefilled as when idle, in one forward of the three (paced, each would come alone
    in 30-token chunks: the test above); every reply is the one it gets alone."""
    prompt, kv = _row(adapter, PREFS[0], "What should I cook tonight?")
    longs = [_long_prompt(adapter, 120 + k)[k:] for k in range(3)]  # 120 tokens, different
    clock, calls, ref = _Clock(), [], {}

    def before(_n, kw):
        rows, q = kw["input_ids"].shape
        calls.append((rows, q))
        clock.t += 0.004 * q * rows if q > 1 else 0.08
        if (rows, q) == (1, 1) and calls.count((1, 1)) == 1:  # the short row decodes
            _until(lambda: ref["eng"].stats()["waiting"] >= 3, "the burst queued")

    eng = ref["eng"] = BatchEngine(_with_model(adapter, _Faulty(adapter.model, before)),
                                   max_batch=4, prefill_chunk=256, pace=1.5, clock=clock,
                                   group_prefill=4)
    out: dict = {}
    try:
        threads = [threading.Thread(target=lambda: out.setdefault(
            "short", eng.generate(prompt, kv, 1.0, 40)))]
        threads[0].start()
        _until(lambda: calls.count((1, 1)) >= 1, "the short row decoding")
        for k, ids in enumerate(longs):
            threads.append(threading.Thread(target=lambda k=k, ids=ids: out.setdefault(
                k, eng.run(None, 1.0, ids, 4))))
            threads[-1].start()
        for t in threads:
            t.join(60)
    finally:
        eng.close()
    assert (3, 120) in calls  # the three in one forward, whole
    assert not [q for rows, q in calls[1:] if rows == 1 and q > 1]  # no chunk of one alone
    assert eng.stats()["group_prefills"] == 1 and eng.stats()["prefill_chunks"] == 0
    alone = BatchEngine(adapter, max_batch=1, prefill_chunk=0)
    try:
        for k, ids in enumerate(longs):
            assert out[k].token_ids == alone.run(None, 1.0, ids, 4).token_ids
        assert out["short"].token_ids == adapter.generate(prompt, kv, 1.0, 40).token_ids
    finally:
        alone.close()
