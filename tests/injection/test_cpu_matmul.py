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

ALL = tuple(range(max(cpu_matmul.ROWS) + 1))  # every count unpadded


@pytest.mark.parametrize(("rows", "pad_to"), [(1, 0), (1, 4), (2, 0), (3, 4), (5, 0),
                                              (14, 16), (16, 16)])
@pytest.mark.parametrize("bias", [True, False])
def test_small_linear_is_linear(rows, pad_to, bias):
    torch.manual_seed(rows)
    layer = nn.Linear(48, 40, bias=bias)
    x = torch.randn(rows, 1, 48)  # [batch, one token, features], as a decoding step
    got = cpu_matmul.small_linear(x, layer.weight, layer.bias, rows, pad_to)
    assert got.shape == (rows, 1, 40) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias))


def _counting(monkeypatch) -> list[int]:
    """Row counts that reach ``small_linear`` from here on."""
    seen: list[int] = []
    real = cpu_matmul.small_linear

    def spy(x, weight, bias, rows, pad_to=0):
        seen.append(rows if pad_to <= rows else (rows, pad_to))
        return real(x, weight, bias, rows, pad_to)

    monkeypatch.setattr(cpu_matmul, "small_linear", spy)  # looked up on each call
    return seen


def test_install_routes_only_the_chosen_row_counts(monkeypatch):
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    x = torch.randn(6, 16)
    reference = model(x).detach()
    use = tuple({2: 2, 5: 8}.get(n, 0) for n in range(max(cpu_matmul.ROWS) + 1))
    assert cpu_matmul.install(model, cpu_matmul.MatmulChoice(use, {})) == 2
    seen = _counting(monkeypatch)
    torch.testing.assert_close(model(x[:2]), reference[:2])  # routed: 2 rows
    torch.testing.assert_close(model(x[:3]), reference[:3])  # not: 3 rows
    torch.testing.assert_close(model(x[:5]), reference[:5])  # routed, padded to 8
    torch.testing.assert_close(model(x), reference)  # not: 6 rows
    assert seen == [2, 2, (5, 8), (5, 8)]
    # nothing chosen: nothing routed, and a deep copy routes its own layers
    assert cpu_matmul.install(nn.Linear(4, 4), cpu_matmul.MatmulChoice((0,) * len(use), {})) == 0
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin[0].weight.zero_(), twin[0].bias.zero_()
    assert torch.equal(twin(x[:2]), twin[2].bias.expand(2, 4))
    torch.testing.assert_close(model(x[:2]), reference[:2])


def test_calibrate_picks_what_it_measured():
    model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 32))
    before = torch.get_rng_state()
    packed = cpu_matmul.pack(cpu_matmul._linears(model))
    for kernels in (None, packed):
        choice = cpu_matmul.calibrate(model, reps=1, packed=kernels)
        assert torch.equal(torch.get_rng_state(), before)  # seeded sampling after a load unchanged
        assert set(choice.timings) == {*cpu_matmul.ROWS, cpu_matmul.PREFILL_ROWS}
        for n, (linear, wxt, pk) in choice.timings.items():
            assert linear is not None and (wxt is None) == (n == cpu_matmul.PREFILL_ROWS)
            assert (pk is None) == (kernels is None)
        assert choice.use == cpu_matmul.choose(choice.timings) and choice.use[0] == 0
        lin, _, pk = choice.timings[cpu_matmul.PREFILL_ROWS]
        assert choice.prefill_packed == (pk is not None and pk < cpu_matmul.MARGIN * lin)
        summary = choice.summary()
        assert summary["wxt_rows"] == [n for n, u in enumerate(choice.use) if u > 0]
        assert summary["packed_rows"] == [n for n, u in enumerate(choice.use)
                                          if u == cpu_matmul.PACKED]


def test_choose_takes_the_fastest_kernel_per_count():
    """Times as measured on a 2-core CPU (SmolLM2, ms a pass, {rows: (F.linear, W @ x.T,
    packed)}): ``W @ x.T`` for 1-2 rows, packed above; without packed, 14 rows padded to 16."""
    p = cpu_matmul.PACKED
    timings = {1: (47, 20, 26), 2: (77, 20, 29), 4: (63, 27, 23), 8: (57, 51, 28),
               16: (69, 60, 35), 64: (140, None, 94)}
    assert cpu_matmul.choose(timings) == (0, 1, 2) + (p,) * 14
    unpacked = {n: (lin, wxt, None) for n, (lin, wxt, _) in timings.items()}
    assert cpu_matmul.choose(unpacked) == (0, 1, 2, 4, 4) + (8,) * 4 + (16,) * 8
    slow16 = {**unpacked, 16: (69, 80, None)}  # nothing under 0.95 x F.linear at 9-16
    assert cpu_matmul.choose(slow16)[9:] == (0,) * 8


@pytest.mark.parametrize("rows", [1, 5, 16, 64])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_is_linear(rows, bias):
    torch.manual_seed(rows)
    layer = nn.Linear(48, 40, bias=bias)
    packed = cpu_matmul.pack([layer])
    assert packed is not None  # this torch (x86_64, CPU) has oneDNN
    x = torch.randn(rows, 1, 48)
    got = cpu_matmul.packed_linear(x, packed[layer], layer.bias)
    assert got.shape == (rows, 1, 40)
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias))


def test_packed_rows_do_not_depend_on_the_batch():
    """A row's product is the same bit for bit alone and among up to 64 rows (module doc):
    so is a greedy reply, alone or in a burst."""
    torch.manual_seed(0)
    layer = nn.Linear(576, 1536)  # SmolLM2's MLP shape
    packed = cpu_matmul.pack([layer])[layer]
    x = torch.randn(64, 576)
    with torch.inference_mode():
        full = cpu_matmul.packed_linear(x, packed, layer.bias)
        for m in (1, 2, 3, 8, 14, 16, 33):
            assert torch.equal(cpu_matmul.packed_linear(x[:m], packed, layer.bias), full[:m])


def test_install_packed_routes_its_counts_and_a_copy_falls_back(monkeypatch):
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    x = torch.randn(40, 16)
    reference = model(x).detach()
    packed = cpu_matmul.pack(cpu_matmul._linears(model))
    use = (0, 1, 2) + (cpu_matmul.PACKED,) * (max(cpu_matmul.ROWS) - 2)
    choice = cpu_matmul.MatmulChoice(use, {}, prefill_packed=True)
    with pytest.raises(ValueError, match="packed weights"):
        cpu_matmul.install(model, choice)
    assert cpu_matmul.install(model, choice, packed) == 2
    calls: list[int] = []
    real = cpu_matmul.packed_linear
    monkeypatch.setattr(cpu_matmul, "packed_linear",
                        lambda x, w, b: calls.append(x.shape[0]) or real(x, w, b))
    seen = _counting(monkeypatch)
    for n in (1, 3, 40):  # W @ x.T; packed; a prefill-sized product, packed
        torch.testing.assert_close(model(x[:n]), reference[:n])
    assert calls == [3, 3, 40, 40] and seen == [1, 1]
    twin = copy.deepcopy(model)  # its own weights: not the original's packed copy
    with torch.no_grad():
        twin[0].weight.zero_(), twin[0].bias.zero_()
    calls.clear()
    assert torch.equal(twin(x[:3]), twin[2].bias.expand(3, 4)) and calls == []
    model2 = nn.Sequential(nn.Linear(16, 8))
    cpu_matmul.install(model2, choice._replace(prefill_packed=False), cpu_matmul.pack([model2[0]]))
    model2(x[:16]), model2(x[:17])
    assert calls == [16]  # 17 rows: F.linear


def test_setup_modes(monkeypatch):
    model = nn.Linear(8, 8)
    assert cpu_matmul.setup(model, torch.device("cpu"), "linear") is None
    assert "forward" not in vars(model)
    assert cpu_matmul.setup(model, torch.device("cuda"), "auto") is None  # CPU only
    with pytest.raises(ValueError, match="cpu matmul mode"):
        cpu_matmul.setup(model, torch.device("cpu"), "fast")
    forced = cpu_matmul.setup(model, torch.device("cpu"), "wxt")
    assert forced.use == ALL and vars(model)["forward"].__func__ is cpu_matmul._routed_forward
    packed = nn.Linear(8, 8)
    choice = cpu_matmul.setup(packed, torch.device("cpu"), "packed")
    assert choice.prefill_packed and set(choice.use[1:]) == {cpu_matmul.PACKED}
    assert packed in cpu_matmul._PACKED
    half = nn.Linear(8, 8).to(torch.float16)
    assert cpu_matmul.setup(half, torch.device("cpu"), "wxt") is None  # float32, bfloat16
    monkeypatch.setattr(cpu_matmul, "_dtypes", lambda: (torch.float32,))  # a CPU without
    bf16 = nn.Linear(8, 8).to(torch.bfloat16)  # oneDNN's bfloat16: left to F.linear
    assert cpu_matmul.setup(bf16, torch.device("cpu"), "wxt") is None
    monkeypatch.undo()
    small = nn.Linear(8, 8)  # far below AUTO_MIN_BYTES: its weights sit in the caches
    assert cpu_matmul.setup(small, torch.device("cpu"), "auto") is None
    assert "forward" not in vars(small)


def test_auto_calibrates_a_model_past_the_caches(monkeypatch):
    model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 32))
    monkeypatch.setattr(cpu_matmul, "AUTO_MIN_BYTES", 1)  # as if it were large
    choice = cpu_matmul.setup(model, torch.device("cpu"), "auto")
    assert set(cpu_matmul.ROWS) <= set(choice.timings)
    assert ("forward" in vars(model[0])) == (any(choice.use) or choice.prefill_packed)
    assert choice.use == cpu_matmul.choose(choice.timings)
    assert (model[0] in cpu_matmul._PACKED) == choice.packs  # kept only where used


def test_engine_replies_with_either_kernel(demo_model_path, monkeypatch):
    """Greedy replies of a batch (one row, then four together) on the demo model are the
    same whichever kernel the decoding steps use; load_adapter records its choice."""
    replies, seen = {}, _counting(monkeypatch)
    for mode in ("linear", "wxt", "packed"):
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
        seen.clear()
    assert replies["wxt"] == replies["linear"] == replies["packed"]


@pytest.mark.slow
@pytest.mark.real_model
def test_real_model_guided_replies_with_either_kernel(real_model_path):
    """SmolLM2: a guided request alone (a 2-row step) and two together (4 rows) give the same
    greedy reply whichever kernel decodes them (bench_quality: 152/152 the same)."""
    from injection.engine.guidance.contrast import Guide

    replies = {}
    for mode in ("linear", "wxt", "packed"):
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
    assert replies["wxt"] == replies["linear"] == replies["packed"]


@pytest.mark.skipif(torch.bfloat16 not in cpu_matmul._dtypes(),
                    reason="oneDNN computes no bfloat16 on this CPU")
@pytest.mark.parametrize("mode", ["packed", "auto"])
def test_bfloat16_layers_take_the_measured_kernels_with_the_same_products(mode, monkeypatch):
    """``MODEL_DTYPE=bf16`` on a CPU with AVX-512 BF16 or AMX: its linears are packed and
    timed like float32's, and multiply as ``F.linear`` does (bfloat16 rounding apart)."""
    monkeypatch.setattr(cpu_matmul, "AUTO_MIN_BYTES", 1)  # as if it were large
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(576, 1536), nn.Linear(1536, 576)).to(torch.bfloat16)
    reference = copy.deepcopy(model)  # its own layers: F.linear (a copy is never routed)
    choice = cpu_matmul.setup(model, torch.device("cpu"), mode)
    assert choice is not None and "forward" in vars(model[0])
    if mode == "auto":
        assert set(cpu_matmul.ROWS) <= set(choice.timings)
    with torch.inference_mode():
        for rows in (1, 2, 8, 16, 40):
            x = torch.randn(rows, 1, 576).to(torch.bfloat16)
            torch.testing.assert_close(model(x), reference(x), rtol=3e-2, atol=3e-2)
