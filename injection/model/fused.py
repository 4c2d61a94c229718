"""One product for a decoder layer's q, k and v projections, and one for its gate and up.

Each group reads the same input. Multiplied once by their weights stacked, a decoding
step reads the weights in fewer, longer runs and calls fewer kernels a layer: on
SmolLM2's shapes, a pass over the layers' linears by oneDNN's packed kernel
(``cpu_matmul``, 2 threads) took 18.3 ms at 8 rows against 21.0 separate (by hand,
2026-12-07; docs/benchmarks/vs-peer.md).

Each output column is the same dot product either way. oneDNN's packed kernel splits it
the same way for the stacked shape as for the separate ones, so the stacked product's
slices equal the separate layers' outputs bit for bit; MKL's products (``F.linear``,
``W @ x.T``) do not always. So a group is stacked only on a CPU whose row counts take the
packed kernel, and only for those counts: ``fuse`` measures the equality when the model
loads, on the layers' own weights, at every checked count the packed kernel serves
(``CHECK_ROWS``), and stacks nothing unless all are equal. Other counts (one or two rows
on most CPUs) multiply the separate layers as before. A greedy reply is token for token
what it was.

Memory: a group's layers' weights become views of its stacked weight, and the stacked
weight's reordered copy replaces theirs: nothing is held twice. The separate layers then
take their packed products as slices of the stacked one (the model's own forward, where it
still runs: memory embeddings). Used by the lean step (``lean_step.py``); nothing is
stacked without it (``MODEL_LEAN_STEP`` off).
"""

from __future__ import annotations

import types
import weakref
from typing import NamedTuple

import torch
from torch import nn

from injection.model import cpu_matmul

__all__ = ["CHECK_ROWS", "Stacked", "fuse", "stacked_of"]

CHECK_ROWS = (1, 2, 3, 8, 16, 17, 64, 512, 2048)  # decoding rows, padded counts, prefills
GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))
_STACKED: weakref.WeakKeyDictionary[nn.Module, Stacked] = weakref.WeakKeyDictionary()
# a stacked group's layer -> (the stacked layer, its first column, its width)
_SLICES: weakref.WeakKeyDictionary[nn.Module, tuple[nn.Linear, int, int]] = (
    weakref.WeakKeyDictionary())


class Stacked(NamedTuple):
    """A group's stacked layer, its separate layers and their widths in its output."""

    layer: nn.Linear
    parts: tuple[nn.Linear, ...]
    sizes: tuple[int, ...]

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each separate layer's output: slices of one product where the packed kernel
        serves this many rows, else each layer's own."""
        if cpu_matmul.uses_packed(self.layer, cpu_matmul.rows_of(x)):
            return self.layer(x).split(self.sizes, dim=-1)
        return tuple(p(x) for p in self.parts)


def stacked_of(module: nn.Module) -> Stacked | None:
    """The stacked projections of an attention or MLP module (None: not stacked)."""
    return _STACKED.get(module)


def fuse(model: nn.Module, choice: cpu_matmul.MatmulChoice | None) -> int:
    """Stack every decoder layer's groups (module doc) where the packed kernel serves them
    and the result is bit for bit the separate layers'; returns how many groups were
    stacked (0: none, the model as it was)."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    if choice is None or not choice.packs or not layers:
        return 0
    plans = [(owner, parts) for layer in layers for name, names in GROUPS
             if (parts := _parts(owner := getattr(layer, name, None), names)) is not None]
    if len(plans) != len(GROUPS) * len(layers) or any(
            p not in cpu_matmul._PACKED for _, parts in plans for p in parts):
        return 0
    built = [_stack(parts, choice) for _, parts in plans]
    if built[0] is None or not all(_same(built[i]) for i in {0, 1, len(built) - 2, len(built) - 1}):
        return 0
    for (owner, _), stacked in zip(plans, built, strict=True):
        _adopt(owner, stacked)
    return len(built)


def _parts(owner: nn.Module | None, names: tuple[str, ...]) -> tuple[nn.Linear, ...] | None:
    parts = tuple(getattr(owner, n, None) for n in names)
    if not all(isinstance(p, nn.Linear) for p in parts):
        return None
    first = parts[0]
    if any(p.weight.dtype != first.weight.dtype or p.in_features != first.in_features
           or (p.bias is None) != (first.bias is None) for p in parts):
        return None
    return parts


def _stack(parts: tuple[nn.Linear, ...], choice: cpu_matmul.MatmulChoice) -> Stacked | None:
    w = parts[0].weight
    layer = nn.Linear(parts[0].in_features, sum(p.out_features for p in parts),
                      bias=parts[0].bias is not None, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.cat([p.weight for p in parts]))
        if layer.bias is not None:
            layer.bias.copy_(torch.cat([p.bias for p in parts]))
    layer.requires_grad_(False)
    packed = cpu_matmul.pack([layer])
    if packed is None:
        return None
    cpu_matmul.install(layer, choice, packed)
    return Stacked(layer, parts, tuple(p.out_features for p in parts))


def _same(stacked: Stacked) -> bool:
    """At every count of ``CHECK_ROWS`` the packed kernel serves, the stacked product's
    slices equal the separate layers' outputs."""
    gen = torch.Generator().manual_seed(0)
    w = stacked.layer.weight
    with torch.inference_mode():
        for rows in CHECK_ROWS:
            if not cpu_matmul.uses_packed(stacked.layer, rows):
                continue
            x = torch.randn(rows, w.shape[1], generator=gen).to(w.device, w.dtype)
            outs = stacked.layer(x).split(stacked.sizes, dim=-1)
            if not all(torch.equal(p(x), o) for p, o in zip(stacked.parts, outs, strict=True)):
                return False
    return True


def _adopt(owner: nn.Module, stacked: Stacked) -> None:
    """The separate layers' weights become views of the stacked one, their packed
    products its slices (their own reordered copies dropped)."""
    _STACKED[owner] = stacked
    start = 0
    for part, size in zip(stacked.parts, stacked.sizes, strict=True):
        part.weight.data = stacked.layer.weight.data[start:start + size]
        if part.bias is not None:
            part.bias.data = stacked.layer.bias.data[start:start + size]
        cpu_matmul.forget(part)
        _SLICES[part] = (stacked.layer, start, size)
        part.forward = types.MethodType(_sliced_forward, part)
        start += size


def _sliced_forward(part: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A stacked group's layer: where the packed kernel serves, its columns of the stacked
    product; else its own routed product. A deep copy of the model (not in ``_SLICES``)
    multiplies by its own weights."""
    found = _SLICES.get(part)
    if found is None:
        return nn.functional.linear(x, part.weight, part.bias)
    layer, start, size = found
    if cpu_matmul.uses_packed(layer, cpu_matmul.rows_of(x)):
        return layer(x)[..., start:start + size]
    return cpu_matmul._routed_forward(part, x)
