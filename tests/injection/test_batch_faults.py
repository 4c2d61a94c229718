"""Failure containment in the batch engine, each failure injected into the real engine on
the demo model: a failing row fails alone and at once, a step that fails half-way leaves
the batch cache consistent, bookkeeping never fails a finished reply, a row resumed after
an OOM never streams its text twice. Synchronisation is by events, never by timing."""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch
from transformers import DynamicCache

from injection.engine.batch import BatchEngine
from injection.engine.batchcache import BatchCache
from tests.injection.test_batch import PREFS, _in_threads, _row

QUESTION = "What should I cook tonight?"


class _Faulty:
    """The model, with ``before(call_no, kwargs)`` run before each forward (may raise or
    wait): faults injected where the engine calls the model."""

    def __init__(self, model, before):
        self.model, self.before, self.calls = model, before, 0
        self.config, self.generation_config = model.config, model.generation_config

    def __call__(self, **kw):
        self.calls += 1
        self.before(self.calls, kw)
        return self.model(**kw)


def _with_model(adapter, model):
    wrapped = copy.copy(adapter)
    wrapped.model = model
    return wrapped


def _until(cond, what: str) -> None:
    """Wait for a state the test set in motion (bounded only against a hang)."""
    deadline = time.monotonic() + 60
    while not cond():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.002)


def _held_start(threads, started, eng) -> None:
    """Start ``threads[0]``, wait for ``started()`` (its forward held by the test), start the
    others, join them all, close ``eng``: the rest queue while the first row's forward waits."""
    threads[0].start()
    _until(started, "row 0 prefilling")
    for t in threads[1:]:
        t.start()
    try:
        for t in threads:
            t.join(120)
    finally:
        eng.close()


def _gate_until_queued(eng_ref: dict, n: int):
    """A ``before`` hook: the first forward waits until ``n`` more rows are queued, so they
    all join the next decoding step together (the batch's composition is deterministic)."""

    def before(call, _kw):
        if call == 1:
            _until(lambda: eng_ref["eng"].stats()["waiting"] >= n, "rows queued")

    return before


def test_a_row_whose_prefill_raises_fails_alone_and_at_once(adapter):
    """Before: the request was left in no list (its caller waited for the time limit) and
    the rows beside it failed with its error."""
    prompt, kv = _row(adapter, PREFS[0], QUESTION)
    alone = adapter.generate(prompt, kv, 1.0, 24)
    bad_prompt, bad_kv = _row(adapter, PREFS[1], "Plan my weekend.")
    bad_ids = adapter.renderer.encode(bad_prompt, first=False)
    queued, failed, seen = threading.Event(), threading.Event(), {}

    def before(call, kw):
        ids = kw["input_ids"]
        if ids.shape[1] > 1 and ids[0].tolist() == bad_ids:
            seen["prefill_call"] = call
            raise RuntimeError("injected prefill fault")
        if call == 4:  # the running row's 3rd step: hold it until the bad row is queued
            assert queued.wait(60)
        if "prefill_call" in seen and "caller_had_error" not in seen:
            # the next step after the failed prefill: its caller already has the error
            seen["caller_had_error"] = failed.wait(60)

    eng = BatchEngine(_with_model(adapter, _Faulty(adapter.model, before)), max_batch=4)
    box: dict = {}

    def bad():
        try:
            eng.generate(bad_prompt, bad_kv, 1.0, 24)
        except RuntimeError as exc:
            box["error"] = exc
            failed.set()

    try:
        good = threading.Thread(target=lambda: box.update(good=eng.generate(prompt, kv, 1.0, 24)))
        good.start()
        _until(lambda: eng.counters["steps"] >= 2, "the first row decoding")
        bad_thread = threading.Thread(target=bad)
        bad_thread.start()
        # queued (held by the running row's step), or already admitted and failed
        _until(lambda: eng.stats()["waiting"] == 1 or failed.is_set(), "the bad row queued")
        queued.set()
        bad_thread.join(60)
        good.join(60)
    finally:
        eng.close()
    assert str(box.get("error")) == "injected prefill fault"
    assert seen["caller_had_error"] is True  # failed at once, while its neighbour decoded
    assert box["good"].token_ids == alone.token_ids
    assert eng.counters["row_failures"] == 1 and eng.stats()["active"] == 0


def test_an_oom_half_way_through_a_step_is_undone_and_survivors_match_their_solo_replies(
    adapter,
):
    """The OOM is raised inside the model after its first layers appended the step's
    column to the cache: the step is rolled back, the newest row requeued, and every reply
    still equals the same request run alone."""
    rows = [_row(adapter, p, QUESTION) for p in PREFS]
    alone = [adapter.generate(p, kv, 1.0, 16) for p, kv in rows]
    model = copy.deepcopy(adapter.model)
    raised = []

    def oom_in_layer(_module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        if hidden.shape[0] == 3 and hidden.shape[1] == 1 and not raised:
            raised.append(True)
            raise torch.cuda.OutOfMemoryError("injected, after layers 0-1 updated the cache")

    layers = model.model.layers
    layers[len(layers) // 2].register_forward_pre_hook(oom_in_layer, with_kwargs=True)
    ref: dict = {}
    eng = ref["eng"] = BatchEngine(
        _with_model(adapter, _Faulty(model, _gate_until_queued(ref, 2))), max_batch=4
    )
    try:
        outs = _in_threads([lambda r=r: eng.generate(r[0], r[1], 1.0, 16) for r in rows])
    finally:
        eng.close()
    assert raised and eng.counters["oom_shrinks"] == 1
    assert [o.token_ids for o in outs] == [a.token_ids for a in alone]
    assert eng.counters["step_failures"] == 0 and eng.counters["row_failures"] == 0


def test_restore_undoes_a_step_that_reached_only_some_layers(adapter):
    batch = BatchCache()
    for n in (5, 3):
        row = DynamicCache(config=adapter._cache_config)
        for i in range(adapter.num_layers):
            row.update(torch.randn(1, adapter.num_kv_heads, n, 8),
                       torch.randn(1, adapter.num_kv_heads, n, 8), i)
        batch.add(row)
    snap = batch.snapshot()
    new = torch.zeros(2, adapter.num_kv_heads, 1, 8)
    batch.cache.update(new, new, 0)  # the step got through layer 0 only
    assert not batch.consistent()
    batch.restore(snap)
    assert batch.consistent() and batch.width == 5 and batch.pads == [0, 2]


def test_a_failing_conversation_kv_copy_never_fails_the_finished_reply(adapter, monkeypatch):
    prompt, kv = _row(adapter, PREFS[0], QUESTION)
    ids = adapter.renderer.encode(prompt, first=False)
    eng = BatchEngine(adapter, max_batch=2)
    try:
        kept = eng.run(kv, 1.0, ids, 12, keep_kv=True)

        def broken(*_a, **_k):
            raise torch.cuda.OutOfMemoryError("injected: no room for the host copy")

        monkeypatch.setattr(BatchCache, "row_kv", broken)
        out = eng.run(kv, 1.0, ids, 12, keep_kv=True)
    finally:
        eng.close()
    assert kept.sequence_kv is not None  # without the fault the K/V is handed back
    assert out.token_ids == kept.token_ids and out.text == kept.text
    assert out.sequence_kv is None and eng.counters["keep_kv_failures"] == 1


def test_a_streaming_row_put_back_after_an_oom_resumes_without_repeating_text(adapter):
    """Before: a row that had streamed text was failed by the OOM. Now it goes back in line
    and resumes where it stopped: what its caller's stream received is its reply, once."""
    rows = [_row(adapter, p, QUESTION) for p in PREFS]
    alone = [adapter.generate(p, kv, 1.0, 20) for p, kv in rows]
    pieces: list[list[str]] = [[], [], []]
    state = {"steps3": 0}

    def before(call, kw):
        gate(call, kw)
        if kw["input_ids"].shape == (3, 1):
            state["steps3"] += 1
            if state["steps3"] == 6:  # every row has streamed text by now
                state["sent"] = [len("".join(p)) for p in pieces]
                raise torch.cuda.OutOfMemoryError("injected")

    ref: dict = {}
    gate = _gate_until_queued(ref, 2)
    eng = ref["eng"] = BatchEngine(_with_model(adapter, _Faulty(adapter.model, before)),
                                   max_batch=4)
    try:
        outs = _in_threads([
            lambda i=i, r=r: eng.generate(r[0], r[1], 1.0, 20, on_text=pieces[i].append)
            for i, r in enumerate(rows)
        ])
    finally:
        eng.close()
    assert all(not isinstance(o, BaseException) for o in outs), outs
    assert eng.counters["oom_shrinks"] == 1 and eng.counters["resumed"] == 1
    assert all(state["sent"])  # the OOM came after every row had streamed text
    for got, streamed, want in zip(outs, pieces, alone, strict=True):
        assert "".join(streamed) == got.text  # every piece once, in order
        assert len(got.token_ids) == len(want.token_ids)
    # the rows that were not put back are exactly their solo replies
    same = [g.token_ids == a.token_ids for g, a in zip(outs, alone, strict=True)]
    assert sum(same) >= 2


@pytest.mark.parametrize("where", ["prefill", "decode"])
def test_an_error_outside_any_row_leaves_an_engine_that_serves_the_next_request(adapter, where):
    prompt, kv = _row(adapter, PREFS[0], QUESTION)
    alone = adapter.generate(prompt, kv, 1.0, 8)
    state = {"armed": True}

    def before(_call, kw):
        step = kw["input_ids"].shape[1] == 1
        if state["armed"] and step == (where == "decode"):
            state["armed"] = False
            raise RuntimeError("injected")

    eng = BatchEngine(_with_model(adapter, _Faulty(adapter.model, before)), max_batch=2)
    try:
        with pytest.raises(RuntimeError, match="injected"):
            eng.generate(prompt, kv, 1.0, 8)
        again = eng.generate(prompt, kv, 1.0, 8)
    finally:
        eng.close()
    assert again.token_ids == alone.token_ids
    assert eng.stats()["active"] == 0 and eng.stats()["waiting"] == 0


def test_a_failing_conversation_store_never_fails_the_finished_reply(adapter, monkeypatch):
    """The executor's post-reply bookkeeping (the turn's link into L1/Redis) raising: the
    replies are the ones a healthy executor gives; only the reuse is lost (counted)."""
    from injection import build_executor
    from injection.base import ExecutionRequest
    from injection.kvcache.conversation import ConversationStore
    from injection.metrics import Metrics

    def two_turns(ex):
        first = [{"role": "user", "content": QUESTION}]
        r1 = ex.execute(ExecutionRequest("t", "u1", first, PREFS[0], max_new_tokens=8))
        nxt = [*first, {"role": "assistant", "content": r1.text},
               {"role": "user", "content": "And for dessert?"}]
        r2 = ex.execute(ExecutionRequest("t", "u1", nxt, PREFS[0], max_new_tokens=8))
        ex.close()
        return [r1.text, r2.text], ex.metrics.snapshot()["counters"]

    want, healthy = two_turns(build_executor(adapter, batch_max=2, metrics=Metrics()))

    def broken(*_a, **_k):
        raise MemoryError("injected: no room to keep the link")

    monkeypatch.setattr(ConversationStore, "keep", broken)
    got, counters = two_turns(build_executor(adapter, batch_max=2, metrics=Metrics()))
    assert healthy.get("conv_stored", 0) >= 1  # the healthy run keeps a link
    assert got == want and counters.get("conv_keep_errors", 0) >= 1
