"""Forwards of no row (tenant and member segments, embeddings, the guide's head) run as the
batch engine's work, on its scheduler thread between decoding steps, under its OOM path
(``injection/engine/prefill/forwards.py``), on the demo model. Synchronisation is by
events and the engine's own state, never by timing."""

from __future__ import annotations

import threading

import pytest
import torch

from injection import InjectionExecutor, TenantLRU
from injection.base import ExecutionRequest, MemoryItem, run_here
from injection.engine.batch import BatchEngine
from injection.errors import EngineUnavailable, ModelOOMError
from injection.memory.recall import RecallOptions
from injection.metrics import Metrics
from tests.injection.test_batch import PREFS, _in_threads, _row
from tests.injection.test_batch_faults import _until

INSTR = "You are the assistant of Acme Foods. Answer briefly."
MEMS = tuple(MemoryItem(str(i), t) for i, t in enumerate([
    "I am a vegetarian.", "I live in Oslo and love skiing.", "My dog is called Biscuit.",
    "I am allergic to peanuts.", "I work night shifts as a nurse.",
]))
MSGS = [{"role": "user", "content": "What should I cook tonight?"}]
KINDS = ("tenant", "member", "guide", "embed")


def _executor(adapter, *, here: bool = False) -> InjectionExecutor:
    """With a batch engine; ``here``: its forwards of no row run on the request's thread,
    as before they ran as engine work (the reference)."""
    two = sum(adapter.count_tokens("- " + m.text) + 1 for m in MEMS[:2])
    ex = InjectionExecutor(adapter, l1=TenantLRU(max_bytes=64 * 1024**2), l2=None,
                           metrics=Metrics(), engine=BatchEngine(adapter, max_batch=4),
                           one_pass=False, memory=RecallOptions(two, 2, -1.0))
    if here:
        ex.kv_source.forward = ex.memories.forward = run_here
    return ex


def _replies(adapter, reqs: list[ExecutionRequest]) -> list[str]:
    ex = _executor(adapter, here=True)
    try:
        return [ex.execute(r).text for r in reqs]
    finally:
        ex.close()


def _requests() -> list[ExecutionRequest]:
    """Each needs forwards of its own: a tenant segment, a member's, the recall's
    embeddings (the memories past the segment's budget), the guide's shared head."""
    return [ExecutionRequest("t1", "u1", MSGS, "", instructions=INSTR, memories=MEMS,
                             max_new_tokens=8, reminder=False),
            ExecutionRequest("t2", "u2", MSGS, PREFS[0], max_new_tokens=8, contrast=1.0)]


class _Threads:
    """The thread of every forward through the model's first layer (a hook, removed)."""

    def __init__(self, adapter):
        self.names: list[str] = []
        self.hook = adapter.model.model.layers[0].register_forward_pre_hook(
            lambda _m, _a: self.names.append(threading.current_thread().name))


def test_every_kind_of_forward_runs_on_the_engine_and_replies_are_unchanged(adapter):
    want = _replies(adapter, _requests())
    ex, seen = _executor(adapter), _Threads(adapter)
    try:
        got = [ex.execute(r).text for r in _requests()]
        stats = ex.engine.stats()
    finally:
        seen.hook.remove()
        ex.close()
    assert got == want
    assert all(stats[f"forwards_{k}"] >= 1 for k in KINDS), stats
    assert set(seen.names) == {"batch-engine"}  # no forward on the request's thread
    assert stats["forward_failures"] == stats["forward_ooms"] == 0


def _oom_on_forwards(adapter, n: int):
    """A layer hook: the next ``n`` forwards raise a CUDA OOM (as test_batch_faults.py)."""
    left = {"n": n}

    def hook(_module, _args):
        if left["n"] > 0:
            left["n"] -= 1
            raise torch.cuda.OutOfMemoryError("injected into a forward of no row")

    return left, adapter.model.model.layers[1].register_forward_pre_hook(hook)


def test_an_oom_in_a_forward_is_the_engines_retry_then_fails_that_forward_alone(adapter):
    ex = _executor(adapter)
    try:
        left, hook = _oom_on_forwards(adapter, 1)
        try:
            assert ex.warm("t1", "u1", "", INSTR, memories=MEMS[:1]).value == "compute"
        finally:
            hook.remove()
        assert left["n"] == 0 and ex.engine.counters["forward_ooms"] == 1
        # the engine's path, not the executor's whole-request retry
        assert ex.metrics.get("oom_retries") == 0
        left, hook = _oom_on_forwards(adapter, 2)
        try:
            with pytest.raises(ModelOOMError):
                ex.warm("t9", "u1", "", "Be terse.", memories=MEMS[:1])
        finally:
            hook.remove()
        assert ex.engine.counters["forward_oom_failures"] == 1
        assert ex.metrics.get("oom_failures") == 0
        after = ex.execute(_requests()[0])  # the engine goes on
    finally:
        ex.close()
    assert after.text and ex.engine.counters["step_failures"] == 0


def test_a_forward_runs_between_the_steps_of_a_running_row_and_nests_without_deadlock(adapter):
    """A forward asked while a row decodes runs between its steps (the row still in the
    batch, its output the same as alone); one asked from the scheduler thread itself (a
    stream callback) runs at once instead of waiting for itself."""
    prompt, kv = _row(adapter, PREFS[1], "Plan my weekend.")
    alone = adapter.generate(prompt, kv, 1.0, 16)
    ids = adapter.renderer.encode("Hello there.", first=True)
    eng, seen = BatchEngine(adapter, max_batch=4), {}

    def on_text(_text):
        if "nested" not in seen:  # the scheduler thread asks for a forward of its own
            seen["nested"] = eng.forward("member", lambda: threading.current_thread().name)
            _until(lambda: len(eng._forwards) == 1, "the other thread's forward queued")

    def other():
        _until(lambda: "nested" in seen, "the row streaming")
        return eng.forward("tenant", lambda: (len(eng._rows), adapter.compute_kv_ids(ids)))

    try:
        row, (rows_then, packed) = _in_threads([
            lambda: eng.generate(prompt, kv, 1.0, 16, on_text=on_text), other])
    finally:
        eng.close()
    assert seen["nested"] == "batch-engine" and rows_then == 1
    assert row.token_ids == alone.token_ids
    assert packed.token_ids == tuple(ids) and eng.counters["forwards_tenant"] == 1


def test_concurrent_requests_with_cold_forwards_reply_as_one_at_a_time(adapter):
    reqs = [ExecutionRequest(f"t{i}", f"u{i}", MSGS, "", instructions=f"{INSTR} Tenant {i}.",
                             memories=MEMS[i:], max_new_tokens=6, reminder=False)
            for i in range(3)] + _requests()
    want = _replies(adapter, reqs)
    ex = _executor(adapter)
    try:
        got = _in_threads([lambda r=r: ex.execute(r) for r in reqs])
    finally:
        ex.close()
    assert [g.text for g in got] == want
    assert ex.engine.counters["forwards_tenant"] >= 4


def test_a_stuck_engine_fails_its_waiting_forwards_and_refuses_new_ones(adapter):
    eng, release, running = BatchEngine(adapter, max_batch=2), threading.Event(), threading.Event()

    def stuck():
        running.set()
        release.wait(60)

    try:
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("a", _try(eng, stuck)))
        t.start()
        assert running.wait(60)
        queued = threading.Thread(target=lambda: out.setdefault("b", _try(eng, lambda: 1)))
        queued.start()
        _until(lambda: len(eng._forwards) == 1, "the second forward queued")
        assert eng.abort(EngineUnavailable("aborted")) == 2  # the stuck one and the queued
        queued.join(60)
        release.set()
        t.join(60)
        with pytest.raises(EngineUnavailable):
            eng.forward("embed", lambda: 1)
    finally:
        release.set()
        eng.close()
    assert isinstance(out["a"], EngineUnavailable) and isinstance(out["b"], EngineUnavailable)


def _try(eng, fn):
    try:
        return eng.forward("embed", fn)
    except Exception as exc:  # noqa: BLE001 - collected for the assertion
        return exc


def _held(eng):
    """Hold ``eng``'s scheduler in a forward of its own until the returned event is set."""
    release, running = threading.Event(), threading.Event()

    def stuck():
        running.set()
        release.wait(60)

    t = threading.Thread(target=lambda: eng.forward("embed", stuck))
    t.start()
    assert running.wait(60)
    return release, t


def _pair(adapter, text: str, bad: bool = False):
    """An anchor-like forward's two rows (``RowJob``s of ``text`` and of its first word)."""
    from injection.engine.batchrow import RowJob

    ids = [adapter.renderer.encode(t, first=True) for t in (text, text.split()[0])]
    if bad:
        ids[1] = [*ids[1], adapter.model.config.vocab_size + 7]  # no such token
    return [RowJob(None, 1.0, i, i, 1, {}, {}, solo=True) for i in ids]


def test_row_forwards_queued_together_run_as_one_and_each_gets_its_own_result(
        adapter, monkeypatch):
    """Anchors of concurrent turns (``forward_rows``) queued while the scheduler is busy
    run as one prefill group; each caller gets ``then`` of its own rows' logits, as alone."""
    from injection.engine import steps

    texts = ["Plan my weekend.", "Hello there, how are you?", "What should I cook tonight?"]
    pairs = [_pair(adapter, t) for t in texts]
    alone = [steps.prefill_group(adapter, rows, caches=False)[1] for rows in pairs]
    prefills, real = [], steps.prefill_group
    monkeypatch.setattr(steps, "prefill_group", lambda a, rows, **kw: (
        prefills.append(len(rows)), real(a, rows, **kw))[1])
    eng = BatchEngine(adapter, max_batch=4)
    try:
        release, holder = _held(eng)

        def ask(rows):
            return lambda: eng.forward_rows("anchor", rows, lambda logits: logits.clone())

        box = {}
        threads = [threading.Thread(target=lambda i=i: box.setdefault(i, ask(pairs[i])()))
                   for i in range(len(pairs))]
        for t in threads:
            t.start()
        _until(lambda: len(eng._forwards) == len(pairs), "the anchors queued")
        release.set()
        for t in [holder, *threads]:
            t.join(60)
    finally:
        eng.close()
    assert eng.counters["forward_groups"] == 1 and eng.counters["forwards_anchor"] == 3
    assert prefills == [6]  # one forward of the three pairs, none alone
    for i, want in enumerate(alone):  # the group's logits
        torch.testing.assert_close(box[i], want, rtol=1e-4, atol=1e-4)
        assert box[i].argmax(-1).tolist() == want.argmax(-1).tolist()


def test_a_failing_group_runs_each_alone_and_only_the_bad_one_fails(adapter):
    from injection.engine import steps

    good, bad = _pair(adapter, "Plan my weekend."), _pair(adapter, "Hello there.", bad=True)
    want = steps.prefill_group(adapter, good, caches=False)[1]
    eng = BatchEngine(adapter, max_batch=4)
    box = {}
    try:
        release, holder = _held(eng)

        def ask(name, rows):
            def run():
                try:
                    box[name] = eng.forward_rows("anchor", rows, lambda x: x.clone())
                except Exception as exc:  # noqa: BLE001 - collected for the assertion
                    box[name] = exc
            return threading.Thread(target=run)

        threads = [ask("good", good), ask("bad", bad)]
        for t in threads:
            t.start()
        _until(lambda: len(eng._forwards) == 2, "both queued")
        release.set()
        for t in [holder, *threads]:
            t.join(60)
        assert eng.forward("embed", lambda: 7) == 7  # the engine goes on
    finally:
        eng.close()
    assert isinstance(box["bad"], IndexError), box["bad"]
    torch.testing.assert_close(box["good"], want)
    assert eng.counters["forward_groups"] == 0 and eng.counters["forward_failures"] == 1


def test_only_consecutive_row_forwards_of_one_kind_share_a_group_up_to_its_rows():
    from injection.engine.prefill.forwards import GROUP_ROWS, ForwardJob, _runs

    def job(kind, rows=2):
        return ForwardJob(kind, lambda: None, [object()] * rows if rows else None,
                          (lambda x: x) if rows else None)

    a, b, e, c, d = job("anchor"), job("anchor"), job("embed", 0), job("anchor"), job("tenant")
    assert _runs([a, b, e, c, d]) == [[a, b], [e], [c], [d]]
    many = [job("anchor") for _ in range(GROUP_ROWS // 2 + 1)]
    assert [len(r) for r in _runs(many)] == [GROUP_ROWS // 2, 1]
