"""Chunked prefill: a long prompt arriving is prefilled in chunks, one between decoding
steps, so rows already decoding go on while it arrives (counted in steps, not time)."""

from __future__ import annotations

import threading

from injection.engine.batch import BatchEngine
from tests.injection.test_batch import PREFS, _row
from tests.injection.test_batch_faults import _Faulty, _until, _with_model

CHUNK = 256


def _long_prompt(adapter, tokens: int) -> list[int]:
    text = " ".join(f"item {i} is a vegetable soup with beans;" for i in range(tokens // 4))
    ids = adapter.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) >= tokens
    return ids[:tokens]


def test_a_2k_token_prompt_is_prefilled_between_the_running_rows_steps(adapter):
    prompt, kv = _row(adapter, PREFS[0], "What should I cook tonight?")
    long_ids = _long_prompt(adapter, 2000)
    calls: list[tuple[int, int]] = []  # (rows, tokens) of every forward, in order
    ref: dict = {}

    def before(_n, kw):
        rows, q = kw["input_ids"].shape
        calls.append((rows, q))
        if (rows, q) == (1, 1) and calls.count((1, 1)) == 1:  # the short row decodes
            _until(lambda: ref["eng"].stats()["waiting"] >= 1, "the long prompt queued")

    eng = ref["eng"] = BatchEngine(_with_model(adapter, _Faulty(adapter.model, before)),
                                   max_batch=4, prefill_chunk=CHUNK)
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
    chunks = [i for i, (rows, q) in enumerate(calls) if rows == 1 and q > 1][1:]  # not A's
    assert len(chunks) == -(-2000 // CHUNK) and eng.counters["prefill_chunks"] == len(chunks) - 1
    between = [c for c in calls[chunks[0]:chunks[-1]] if c[1] == 1]
    assert len(between) >= len(chunks) - 1  # a decoding step between every two chunks
    assert all(q <= CHUNK for _, q in calls)  # no forward longer than a chunk
    alone = adapter.generate(prompt, kv, 1.0, 40)
    assert out["short"].token_ids == alone.token_ids
    whole = BatchEngine(adapter, max_batch=1, prefill_chunk=0)
    try:
        assert out["long"].token_ids == whole.run(None, 1.0, long_ids, 4).token_ids
    finally:
        whole.close()
