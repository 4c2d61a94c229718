"""The batch engine on the demo model: a row's output in a batch is the row's output alone."""

from __future__ import annotations

import copy
import ctypes
import threading
import time

import pytest
import torch

from injection.engine.batch import BatchEngine
from injection.errors import ModelOOMError

PREFS = [
    "I am vegetarian.",
    "I live in Oslo, I ski every winter weekend, I have two dogs and I never eat fish or meat.",
    "Answer like a pirate, always, in every single reply you give me.",
]


@pytest.fixture
def engine(adapter):
    eng = BatchEngine(adapter, max_batch=8)
    yield eng
    eng.close()


def _row(adapter, pref: str | None, question: str):
    msgs = [{"role": "user", "content": question}]
    if pref is None:
        return adapter.render_chat(msgs), None
    parts = adapter.split_prompt(pref, msgs)
    return parts.prompt, adapter.compute_kv(parts.segment)


def _in_threads(calls):
    """Run each ``fn`` on its own thread; returns results (or exceptions) in order."""
    out: list = [None] * len(calls)

    def run(i, fn):
        try:
            out[i] = fn()
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def _wait_steps(engine, n: int) -> None:
    deadline = time.monotonic() + 30
    while engine.counters["steps"] < n and time.monotonic() < deadline:
        time.sleep(0.002)


def test_greedy_rows_in_a_batch_equal_each_row_alone(adapter, engine):
    """Different preference lengths, different alpha, a row without injection, and a row
    that joins while the others are decoding: each output is the one it gets alone."""
    rows = [(*_row(adapter, p, q), a) for p, q, a in [
        (PREFS[0], "What should I cook tonight?", 1.0),
        (PREFS[1], "Plan my weekend.", 0.6),
        (None, "Tell me a story.", 1.0),
    ]]
    alone = [adapter.generate(prompt, kv, a, 24) for prompt, kv, a in rows]
    late_prompt, late_kv = _row(adapter, PREFS[2], "Where is the treasure?")
    late_alone = adapter.generate(late_prompt, late_kv, 0.8, 16)

    def late():
        _wait_steps(engine, 3)  # the first rows are mid-generation
        return engine.generate(late_prompt, late_kv, 0.8, 16)

    calls = [lambda r=r: engine.generate(r[0], r[1], r[2], 24) for r in rows] + [late]
    outs = _in_threads(calls)
    for got, want in zip(outs, [*alone, late_alone], strict=True):
        assert not isinstance(got, BaseException), got
        assert got.token_ids == want.token_ids
        assert got.text == want.text and got.finish_reason == want.finish_reason
        assert got.prompt_token_ids == want.prompt_token_ids
    assert engine.counters["peak_batch"] >= 3 and engine.counters["batched_steps"] > 0
    assert engine.stats()["active"] == 0


def test_a_row_never_sees_another_rows_kv(adapter, engine):
    """Tenant isolation: another tenant's row whose injected K/V is NaN cannot change a row
    (attention over a foreign or padded column would turn it into NaN)."""
    prompt, kv = _row(adapter, PREFS[0], "What should I cook tonight?")
    alone = adapter.generate(prompt, kv, 1.0, 20)
    other_prompt, other_kv = _row(adapter, PREFS[1], "Plan my weekend.")
    poisoned = type(other_kv)(torch.full_like(other_kv.keys, float("nan")),
                              torch.full_like(other_kv.values, float("nan")), other_kv.token_ids)
    outs = _in_threads([
        lambda: engine.generate(other_prompt, poisoned, 1.0, 20),
        lambda: engine.generate(prompt, kv, 1.0, 20),
    ])
    assert outs[1].token_ids == alone.token_ids
    assert engine.counters["batched_steps"] > 0


def test_rows_keep_their_own_stop_cancel_stream_and_sampling(adapter, engine):
    prompt, kv = _row(adapter, PREFS[0], "What should I cook tonight?")
    full = adapter.generate(prompt, kv, 1.0, 20)
    stop_at = full.text[len(full.text) // 2:][:3]
    pieces: list[str] = []
    calls = {"n": 0}

    def cancel_after_three():
        calls["n"] += 1
        return calls["n"] > 3

    seeded = {"temperature": 0.9, "top_p": 0.9, "seed": 7}
    outs = _in_threads([
        lambda: engine.generate(prompt, kv, 1.0, 20, stop=(stop_at,)),
        lambda: engine.generate(prompt, kv, 1.0, 20, cancelled=cancel_after_three),
        lambda: engine.generate(prompt, kv, 1.0, 20, on_text=pieces.append),
        lambda: engine.generate(prompt, kv, 1.0, 5),
        lambda: engine.generate(prompt, kv, 1.0, 20, **seeded),
    ])
    stopped, cancelled, streamed, short, sampled = outs
    assert stopped.finish_reason == "stop" and stop_at not in stopped.text
    assert full.text.startswith(stopped.text)
    assert cancelled.finish_reason == "cancelled" and len(cancelled.token_ids) == 4
    assert "".join(pieces) == streamed.text == full.text
    assert short.token_ids == full.token_ids[:5] and short.finish_reason == "length"
    # a seeded row samples from its own generator: the same reply alone in the engine
    assert engine.generate(prompt, kv, 1.0, 20, **seeded).token_ids == sampled.token_ids


class _OOMWhenWide:
    """The model, raising the accelerator's OOM for a decoding step wider than ``limit``."""

    def __init__(self, model, limit: int):
        self.model, self.limit, self.raised = model, limit, 0
        self.config, self.generation_config = model.config, model.generation_config

    def __call__(self, **kw):
        if kw["input_ids"].shape[0] > self.limit:
            self.raised += 1
            raise torch.cuda.OutOfMemoryError("simulated")
        return self.model(**kw)


def test_an_oom_shrinks_the_batch_instead_of_failing_every_row(adapter):
    wrapped = copy.copy(adapter)
    wrapped.model = _OOMWhenWide(adapter.model, limit=2)
    eng = BatchEngine(wrapped, max_batch=4)
    rows = [_row(adapter, p, "What should I cook tonight?") for p in PREFS]
    alone = [adapter.generate(p, kv, 1.0, 12) for p, kv in rows]
    try:
        outs = _in_threads([lambda r=r: eng.generate(r[0], r[1], 1.0, 12) for r in rows])
    finally:
        eng.close()
    assert [o.token_ids for o in outs] == [a.token_ids for a in alone]
    assert wrapped.model.raised >= 1 and eng.counters["oom_shrinks"] >= 1
    assert eng.counters["peak_batch"] <= 3


def test_an_oom_alone_fails_only_that_row(adapter):
    wrapped = copy.copy(adapter)
    wrapped.model = _OOMWhenWide(adapter.model, limit=0)
    eng = BatchEngine(wrapped, max_batch=4)
    prompt, kv = _row(adapter, PREFS[0], "Hi")
    try:
        with pytest.raises(ModelOOMError):
            eng.generate(prompt, kv, 1.0, 4)
    finally:
        eng.close()


def test_the_kv_budget_bounds_the_batch(adapter):
    prompt, kv = _row(adapter, PREFS[1], "Plan my weekend.")
    one_row = kv.num_tokens + len(adapter.renderer.encode(prompt, first=False)) + 10
    probe = BatchEngine(adapter)
    eng = BatchEngine(adapter, max_batch=8, kv_budget_bytes=2 * one_row * probe.bytes_per_token)
    alone = adapter.generate(prompt, kv, 1.0, 10)
    try:
        outs = _in_threads([lambda: eng.generate(prompt, kv, 1.0, 10) for _ in range(4)])
    finally:
        eng.close()
    assert all(o.token_ids == alone.token_ids for o in outs)
    assert eng.counters["peak_batch"] == 2


def test_a_caller_interrupted_while_waiting_abandons_its_row(adapter, engine):
    """The worker's soft time limit arrives in the task thread as an exception: the row is
    dropped at the next step and the rows beside it finish normally."""
    prompt, kv = _row(adapter, PREFS[0], "What should I cook tonight?")
    alone = adapter.generate(prompt, kv, 1.0, 30)
    got: dict = {}

    def victim():
        got["tid"] = threading.get_ident()
        try:
            engine.generate(prompt, kv, 1.0, 200)
        except TimeoutError as exc:
            got["exc"] = exc

    t = threading.Thread(target=victim)
    t.start()
    _wait_steps(engine, 2)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(got["tid"]),
                                               ctypes.py_object(TimeoutError))
    other = engine.generate(prompt, kv, 1.0, 30)
    t.join(30)
    assert isinstance(got.get("exc"), TimeoutError)
    assert other.token_ids == alone.token_ids
    deadline = time.monotonic() + 10
    while engine.stats()["active"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.stats()["active"] == 0  # the abandoned row left the batch


def test_a_row_whose_stream_callback_raises_fails_alone(adapter, engine):
    prompt, kv = _row(adapter, PREFS[0], "What should I cook tonight?")
    alone = adapter.generate(prompt, kv, 1.0, 16)

    def broken(_text):
        raise ConnectionError("the stream's Redis went away")

    outs = _in_threads([lambda: engine.generate(prompt, kv, 1.0, 16, on_text=broken),
                        lambda: engine.generate(prompt, kv, 1.0, 16)])
    assert isinstance(outs[0], ConnectionError)
    assert outs[1].token_ids == alone.token_ids


def test_the_models_repetition_penalty_is_applied_as_generate_applies_it(adapter):
    """A generation_config with a repetition penalty (greedy too): rows in a batch equal
    generate() alone, and differ from the unpenalised reply."""
    prompt, kv = _row(adapter, PREFS[0], "What should I cook tonight?")
    plain = adapter.generate(prompt, kv, 1.0, 24)
    gc = adapter.model.generation_config
    saved = gc.repetition_penalty
    gc.repetition_penalty = 1.5
    try:
        want = adapter.generate(prompt, kv, 1.0, 24)
        eng = BatchEngine(adapter, max_batch=4)
        try:
            outs = _in_threads([lambda: eng.generate(prompt, kv, 1.0, 24) for _ in range(2)])
        finally:
            eng.close()
    finally:
        gc.repetition_penalty = saved
    assert want.token_ids != plain.token_ids
    assert [o.token_ids for o in outs] == [want.token_ids, want.token_ids]
