"""PackedKV: shapes, round trips, 2-copy device moves, fresh scaled values."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from injection.kvcache.packed import PackedKV

L, H, T, D = 4, 2, 5, 8


def make_entries(dtype=torch.float32, batch_dim=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (1, H, T, D) if batch_dim else (H, T, D)
    return [
        (torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype))
        for _ in range(L)
    ]


def make_packed(dtype=torch.float32, seed=0) -> PackedKV:
    return PackedKV.from_entries(make_entries(dtype, seed=seed), range(100, 100 + T))


class CopyCounter(TorchDispatchMode):
    """Counts aten ops that materialise a tensor copy."""

    COPY_OPS = {"copy_", "_to_copy", "clone", "stack", "cat", "contiguous"}

    def __init__(self):
        super().__init__()
        self.copies: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in self.COPY_OPS:
            self.copies.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("batch_dim", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_from_entries_shapes_and_round_trip(dtype, batch_dim):
    entries = make_entries(dtype, batch_dim)
    p = PackedKV.from_entries(entries, [1, 2, 3, 4, 5])
    assert p.keys.shape == p.values.shape == (L, H, T, D)
    assert (p.num_layers, p.num_heads, p.num_tokens, p.head_dim) == (L, H, T, D)
    assert p.dtype == dtype and p.device == torch.device("cpu")
    assert p.keys.is_contiguous() and p.values.is_contiguous()
    assert p.token_ids == (1, 2, 3, 4, 5)
    assert p.nbytes == 2 * L * H * T * D * torch.tensor([], dtype=dtype).element_size()
    out = p.to_entries()
    assert len(out) == L
    for (k, v), (k0, v0) in zip(out, entries, strict=True):
        assert k.shape == v.shape == (1, H, T, D)
        assert torch.equal(k.reshape(H, T, D), k0.reshape(H, T, D))
        assert torch.equal(v.reshape(H, T, D), v0.reshape(H, T, D))


def test_to_entries_are_views_not_copies():
    p = make_packed()
    for i, (k, v) in enumerate(p.to_entries()):
        assert k.untyped_storage().data_ptr() == p.keys.untyped_storage().data_ptr()
        assert k.data_ptr() == p.keys[i].data_ptr()
        assert v.data_ptr() == p.values[i].data_ptr()


def test_from_entries_is_one_stack_each():
    entries = make_entries()
    with CopyCounter() as cc:
        PackedKV.from_entries(entries, range(T))
    assert cc.copies == ["stack", "stack"]


def test_to_same_device_returns_self_without_copies():
    p = make_packed()
    with CopyCounter() as cc:
        assert p.to("cpu") is p
        assert p.to(torch.device("cpu"), non_blocking=True) is p
    assert cc.copies == []


def test_to_other_device_makes_exactly_two_copies():
    # "meta" is a real second device on every machine: no GPU needed to count copies.
    p = make_packed(torch.bfloat16)
    with CopyCounter() as cc:
        m = p.to("meta")
    assert len(cc.copies) == 2, cc.copies
    assert m.device.type == "meta" and m.dtype == torch.bfloat16
    assert m.shape == p.shape and m.token_ids == p.token_ids


@pytest.mark.gpu
def test_cuda_round_trip_two_copies_and_pinning():
    p = make_packed(torch.bfloat16).pin_memory()
    assert p.is_pinned()
    with CopyCounter() as cc:
        g = p.to("cuda", non_blocking=True)
    assert len(cc.copies) == 2
    torch.cuda.synchronize()
    assert g.device.type == "cuda" and g.to("cuda") is g
    assert g.to("cpu").equal(p)


def test_pin_memory_is_noop_without_cuda():
    p = make_packed()
    if torch.cuda.is_available():
        pytest.skip("pinning is exercised by the gpu test")
    assert p.pin_memory() is p


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("alpha", [1.0, 0.5, 0.0])
def test_scaled_values_is_fresh_and_never_mutates(dtype, alpha):
    p = make_packed(dtype)
    before_v, before_k = p.values.clone(), p.keys.clone()
    s = p.scaled_values(alpha)
    assert s.dtype == dtype and s.shape == p.values.shape
    assert s.data_ptr() != p.values.data_ptr()
    assert torch.equal(s, p.values * alpha)
    s.add_(1)  # the caller owns it: mutating must not reach the cached entry
    assert torch.equal(p.values, before_v) and torch.equal(p.keys, before_k)


def test_scaled_values_is_vectorised():
    p = make_packed()
    with CopyCounter() as cc:
        p.scaled_values(0.7)
    assert len(cc.copies) == 0  # one mul, no per-layer copies


@pytest.mark.parametrize(
    "keys,values,ids,msg",
    [
        (torch.zeros(2, 2, 3, 4), torch.zeros(2, 2, 3, 5), range(3), "shape mismatch"),
        (torch.zeros(2, 2, 3, 4), torch.zeros(2, 2, 3, 4, dtype=torch.float16), range(3), "dtype"),
        (torch.zeros(2, 2, 3, 4), torch.zeros(2, 2, 3, 4, device="meta"), range(3), "device"),
        (torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), range(3), r"\[L, H, T, D\]"),
        (torch.zeros(2, 2, 3, 4), torch.zeros(2, 2, 3, 4), range(4), "token_ids"),
        (torch.zeros(2, 2, 3, 4, dtype=torch.int64),) * 2 + (range(3), "floating"),
    ],
)
def test_constructor_validation(keys, values, ids, msg):
    with pytest.raises(ValueError, match=msg):
        PackedKV(keys, values, ids)


def test_from_entries_validation():
    with pytest.raises(ValueError, match="at least one"):
        PackedKV.from_entries([], [])
    bad = make_entries()
    bad[2] = (bad[2][0][..., :4], bad[2][1][..., :4])
    with pytest.raises(ValueError, match="layer 2"):
        PackedKV.from_entries(bad, range(T))
    mixed = make_entries()
    mixed[1] = (mixed[1][0].half(), mixed[1][1].half())
    with pytest.raises(ValueError, match="layer 1"):
        PackedKV.from_entries(mixed, range(T))
    batch2 = [(torch.zeros(2, H, T, D), torch.zeros(2, H, T, D))]
    with pytest.raises(ValueError, match="batch size"):
        PackedKV.from_entries(batch2, range(T))


def test_non_contiguous_input_is_packed_contiguous():
    k = torch.randn(L, H, D, T).transpose(2, 3)
    p = PackedKV(k, k.clone(), range(T))
    assert p.keys.is_contiguous() and torch.equal(p.keys, k)


def test_equal():
    a, b = make_packed(seed=1), make_packed(seed=1)
    assert a.equal(b)
    assert not a.equal(make_packed(seed=2))
    assert not a.equal(PackedKV(a.keys, a.values, range(T)))
