"""A group prefill on a model the lean step serves (``engine/prefill/in_place.py``): the
rows' K/V are written once into the buffers the forward extends, each row's cache is a
view of its real columns, and every row gets what it gets prefilled alone: its first
token, its logits (up to rounding: a padded batch sums in another order) and its K/V.
Demo model and the real SmolLM2 with a tenant-length prefix; the engine's replies equal
those of rows run alone."""

from __future__ import annotations

import threading

import pytest
import torch

from injection.engine import steps
from injection.engine.batch import BatchEngine
from injection.engine.batchrow import RowJob
from injection.engine.prefill import in_place
from injection.model.loading import load_adapter
from tests.injection.test_batch import PREFS, _row
from tests.injection.test_batch_faults import _held_start, _until
from tests.injection.test_group_prefill import ROWS


@pytest.fixture(scope="module")
def lean_adapter(demo_model_path):
    """The demo model loaded for this module: the session's adapter may carry another
    test's hook (under xdist), which sets the lean step aside."""
    adapter = load_adapter(str(demo_model_path), device="cpu", dtype="fp32")
    assert steps.serving(adapter) is not None
    return adapter


def _jobs(adapter, rows) -> list[RowJob]:
    jobs = []
    for pref, question, alpha in rows:
        prompt, kv = _row(adapter, pref, question)
        new = adapter.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        jobs.append(RowJob(kv, alpha, new, new, 4, {}, {}))
    return jobs


def _counted(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = in_place.prefill
    monkeypatch.setattr(in_place, "prefill", lambda a, lean, jobs, caches: (
        calls.append(len(jobs)), real(a, lean, jobs, caches))[1])
    return calls


def _agrees_with_alone(adapter, jobs, monkeypatch, tol: float) -> None:
    calls = _counted(monkeypatch)
    caches, logits = steps.prefill_group(adapter, jobs)
    assert calls == [len(jobs)]
    for job, cache, got in zip(jobs, caches, logits, strict=True):
        alone_cache, want = steps.prefill(adapter, job)
        assert got.argmax() == want.argmax()
        assert torch.allclose(got, want, atol=tol, rtol=0)
        assert cache.get_seq_length() == alone_cache.get_seq_length()
        for a, b in zip(cache.layers, alone_cache.layers, strict=True):
            n = b.keys.shape[2]
            assert a.keys.shape == (1, b.keys.shape[1], n, b.keys.shape[3])
            assert torch.allclose(a.keys, b.keys[:, :, :n], atol=tol, rtol=0)
            assert torch.allclose(a.values, b.values[:, :, :n], atol=tol, rtol=0)


def test_each_grouped_row_gets_what_it_gets_alone(lean_adapter, monkeypatch):
    """Prefixes of different lengths, alpha 0.6, no prefix at all, questions of
    different lengths (so rows are padded after their new tokens)."""
    _agrees_with_alone(lean_adapter, _jobs(lean_adapter, ROWS), monkeypatch, 1e-4)


def test_without_a_prefix_in_the_group_the_general_path_runs(lean_adapter, monkeypatch):
    calls = _counted(monkeypatch)
    jobs = _jobs(lean_adapter, [(None, "Tell me a story.", 1.0), (None, "How are you?", 1.0)])
    _, logits = steps.prefill_group(lean_adapter, jobs)
    assert calls == [] and logits.shape[0] == 2


@pytest.mark.real_model
def test_smollm2s_members_of_one_tenant_each_as_alone(real_model_path, monkeypatch):
    """Three members of one tenant with 1,100-character instructions (SmolLM2 loaded here:
    the session's copy may carry another test's hook)."""
    smollm = load_adapter(real_model_path, device="cpu")
    assert steps.serving(smollm) is not None
    tenant = ("You answer for a cooking school. " * 30).strip()
    rows = [(f"{tenant} {p}", q, 1.0) for p, q in zip(
        PREFS, ["What should I cook tonight?", "Plan my weekend.",
                "Which knife should I buy first, and how do I keep it sharp?"], strict=True)]
    _agrees_with_alone(smollm, _jobs(smollm, rows), monkeypatch, 2e-4)


def test_the_engines_grouped_rows_answer_as_alone(lean_adapter, monkeypatch):
    """Row 0 prefills alone (held until the others queue), the others in one in-place
    group: every reply is token for token the one it gets alone."""
    calls = _counted(monkeypatch)
    ref: dict = {}
    entered, real = threading.Event(), steps.prefill

    def held(*a, **k):
        if not entered.is_set():
            entered.set()
            _until(lambda: ref["eng"].stats()["waiting"] >= len(ROWS) - 1, "rows queued")
        return real(*a, **k)
    monkeypatch.setattr(steps, "prefill", held)
    eng = ref["eng"] = BatchEngine(lean_adapter, max_batch=8, group_prefill=8)
    made = [_row(lean_adapter, pref, q) for pref, q, _ in ROWS]
    out: list = [None] * len(ROWS)

    def ask(i):
        out[i] = eng.generate(made[i][0], made[i][1], ROWS[i][2], 24)
    _held_start([threading.Thread(target=ask, args=(i,)) for i in range(len(ROWS))],
                entered.is_set, eng)
    assert calls == [len(ROWS) - 1] and eng.counters["grouped_rows"] == len(ROWS) - 1
    alone = [lean_adapter.generate(p, kv, a, 24) for (p, kv), (_, _, a) in zip(made, ROWS,
                                                                           strict=True)]
    assert [o.token_ids for o in out] == [a.token_ids for a in alone]
