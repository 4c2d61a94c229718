"""The CPU's decode-shaped linear kernel (``injection/model/cpu_matmul.py``): the same
products as ``F.linear`` (float rounding apart), routed only where chosen, chosen from
what was measured, and the engine's replies unchanged with it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from injection.engine.batch import BatchEngine
from injection.model import cpu_matmul
from injection.model.loading import load_adapter
from tests.injection.test_batch import _in_threads

ALL = (False,) + (True,) * max(cpu_matmul.ROWS)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 16])
@pytest.mark.parametrize("bias", [True, False])
def test_small_linear_is_linear(rows, bias):
    torch.manual_seed(rows)
    layer = nn.Linear(48, 40, bias=bias)
    x = torch.randn(rows, 1, 48)  # [batch, one token, features], as a decoding step
    got = cpu_matmul.small_linear(x, layer.weight, layer.bias, rows)
    assert got.shape == (rows, 1, 40) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias))


def _counting(monkeypatch) -> list[int]:
    """Row counts that reach ``small_linear`` from here on."""
    seen: list[int] = []
    real = cpu_matmul.small_linear

    def spy(x, weight, bias, rows):
        seen.append(rows)
        return real(x, weight, bias, rows)

    monkeypatch.setattr(cpu_matmul, "small_linear", spy)  # looked up on each call
    return seen


def test_install_routes_only_the_chosen_row_counts(monkeypatch):
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    x = torch.randn(6, 16)
    reference = model(x).detach()
    use = tuple(n in (2,) for n in range(max(cpu_matmul.ROWS) + 1))
    assert cpu_matmul.install(model, use) == 2
    seen = _counting(monkeypatch)
    torch.testing.assert_close(model(x[:2]), reference[:2])  # routed: 2 rows
    torch.testing.assert_close(model(x[:3]), reference[:3])  # not: 3 rows
    torch.testing.assert_close(model(x), reference)  # not: 6 rows
    assert seen == [2, 2]
    # nothing chosen: nothing routed, and a deep copy routes its own layers
    assert cpu_matmul.install(nn.Linear(4, 4), (False,) * len(use)) == 0
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin[0].weight.zero_(), twin[0].bias.zero_()
    assert torch.equal(twin(x[:2]), twin[2].bias.expand(2, 4))
    torch.testing.assert_close(model(x[:2]), reference[:2])


def test_calibrate_picks_what_it_measured():
    model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 32))
    before = torch.get_rng_state()
    choice = cpu_matmul.calibrate(model, reps=1)
    assert torch.equal(torch.get_rng_state(), before)  # seeded sampling after a load unchanged
    assert set(choice.timings) == set(cpu_matmul.ROWS)
    low = 0
    for rows in cpu_matmul.ROWS:
        linear_ms, wxt_ms = choice.timings[rows]
        faster = wxt_ms < cpu_matmul.MARGIN * linear_ms
        assert choice.use[low + 1: rows + 1] == (faster,) * (rows - low)
        low = rows
    assert choice.use[0] is False
    assert choice.summary()["wxt_rows"] == [n for n, u in enumerate(choice.use) if u]


def test_setup_modes():
    model = nn.Linear(8, 8)
    assert cpu_matmul.setup(model, torch.device("cpu"), "linear") is None
    assert "forward" not in vars(model)
    assert cpu_matmul.setup(model, torch.device("cuda"), "auto") is None  # CPU only
    with pytest.raises(ValueError, match="cpu matmul mode"):
        cpu_matmul.setup(model, torch.device("cpu"), "fast")
    forced = cpu_matmul.setup(model, torch.device("cpu"), "wxt")
    assert forced.use == ALL and vars(model)["forward"].__func__ is cpu_matmul._routed_forward
    half = nn.Linear(8, 8).to(torch.bfloat16)
    assert cpu_matmul.setup(half, torch.device("cpu"), "wxt") is None  # float32 only
    small = nn.Linear(8, 8)  # far below AUTO_MIN_BYTES: its weights sit in the caches
    assert cpu_matmul.setup(small, torch.device("cpu"), "auto") is None
    assert "forward" not in vars(small)


def test_auto_calibrates_a_model_past_the_caches(monkeypatch):
    model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 32))
    monkeypatch.setattr(cpu_matmul, "AUTO_MIN_BYTES", 1)  # as if it were large
    choice = cpu_matmul.setup(model, torch.device("cpu"), "auto")
    assert set(choice.timings) == set(cpu_matmul.ROWS)
    assert ("forward" in vars(model[0])) == any(choice.use)


def test_engine_replies_with_either_kernel(demo_model_path, monkeypatch):
    """Greedy replies of a batch (one row, then four together) on the demo model are the
    same whichever kernel the decoding steps use; load_adapter records its choice."""
    replies, seen = {}, _counting(monkeypatch)
    for mode in ("linear", "wxt"):
        adapter = load_adapter(str(demo_model_path), device="cpu", dtype="fp32",
                               cpu_matmul=mode)
        assert (adapter.matmul is None) == (mode == "linear")
        engine = BatchEngine(adapter, max_batch=4)
        try:
            prompts = [f"Tell me about {w}." for w in ("cats", "rain", "maps", "tea")]
            alone = engine.generate(prompts[0], None, 1.0, 12, stop=())
            outs = _in_threads([lambda p=p, e=engine: e.generate(p, None, 1.0, 12, stop=())
                                for p in prompts])
        finally:
            engine.close()
        replies[mode] = [alone.token_ids, *[o.token_ids for o in outs]]
        assert (1 in seen and 4 in seen) == (mode == "wxt")  # decoding steps of 1 and 4 rows
    assert replies["wxt"] == replies["linear"]


@pytest.mark.slow
@pytest.mark.real_model
def test_real_model_guided_replies_with_either_kernel(real_model_path):
    """SmolLM2: a guided request alone (a 2-row step) and two together (4 rows) give the same
    greedy reply whichever kernel decodes them (bench_quality: 152/152 the same)."""
    from injection.engine.guidance.contrast import Guide

    replies = {}
    for mode in ("linear", "wxt"):
        adapter = load_adapter(real_model_path, device="cpu", cpu_matmul=mode)
        engine = BatchEngine(adapter, max_batch=4)
        jobs = []
        for q in ("How do bees make honey?", "Plan a short walk in the rain."):
            msgs = [{"role": "user", "content": q}]
            row = adapter.renderer.encode(adapter.plain_prompt(
                "Always answer in lowercase letters only.", msgs), first=True)
            guide = adapter.renderer.encode(adapter.plain_prompt("", msgs), first=True)
            jobs.append((row, Guide(1.0, None, guide)))
        calls = [lambda job=job, e=engine: e.run(None, 1.0, job[0], 24, guide=job[1], stop=())
                 for job in jobs]
        try:
            alone = calls[0]().token_ids
            outs = _in_threads(calls)  # both together
        finally:
            engine.close()
        assert outs[0].token_ids == alone  # alone and beside another guided request
        replies[mode] = [o.token_ids for o in outs]
    assert replies["wxt"] == replies["linear"]
