"""Decode-shaped linear layers on a CPU: ``W @ x.T`` where it beats ``x @ W.T``, measured.

A decoding step multiplies every weight matrix by a few rows (one per sequence in the
batch, a guided request's guide included). ``F.linear`` hands MKL ``x @ W.T``: one row
goes to its matrix-vector kernel, two or more to a general multiply that, for so few
rows, reads the weights far slower than the memory allows. The same product computed as
``(W @ x.T).T`` with ``W`` untransposed (one row padded to two) reads them about as fast
as memory allows on the 2-core CPU this was measured on: a whole SmolLM2 decoding step
at 2 rows cost 1.6x the step at 1 row with ``F.linear``, about 1.0x with this
(bench/bench_cpu_matmul.py, docs/BENCHMARKS.md "CPU matmul").

Which is faster depends on the CPU, its threads and the model, so it is measured when the
model loads (``calibrate``: the model's own linear layers in order, each size of
``ROWS``, both kernels interleaved, best of a few) and each row count gets the faster
(``install``); more rows than ``ROWS`` keep ``F.linear`` (a prefill), and so does a model
small enough to sit in the CPU's caches (``AUTO_MIN_BYTES``: the random demo and test
models). The results differ from ``F.linear``'s by float rounding only. Float32 on a CPU
only: elsewhere nothing changes.
"""

from __future__ import annotations

import time
import types
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MODES", "ROWS", "MatmulChoice", "calibrate", "install", "setup", "small_linear"]

ROWS = (1, 2, 4, 8, 16)  # row counts measured; a count between two takes the larger's pick
MODES = ("auto", "wxt", "linear")  # measured per row count; W @ x.T always; F.linear always
MARGIN = 0.95  # W @ x.T is picked only when it takes less than this share of F.linear
# "auto" leaves a model whose linear weights are smaller than this to F.linear: they stay in
# the CPU's caches, where the kernels' difference (reading memory) does not arise and their
# timings (microseconds) are noise that would pick differently from one load to the next
AUTO_MIN_BYTES = 64 * 2**20


class MatmulChoice(NamedTuple):
    """Per row count 0..max(ROWS): whether ``W @ x.T`` is used; and the measured
    milliseconds of one pass over the model's linears, ``{rows: (linear, wxt)}``."""

    use: tuple[bool, ...]
    timings: dict[int, tuple[float, float]]

    def summary(self) -> dict[str, Any]:
        return {"wxt_rows": [n for n in range(1, len(self.use)) if self.use[n]],
                "ms_per_pass": {n: [round(a, 2), round(b, 2)] for n, (a, b)
                                in self.timings.items()}}


def small_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 rows: int) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for ``rows`` rows of ``x``, as ``(W @ x.T).T``."""
    flat = x.reshape(rows, x.shape[-1])
    if rows == 1:  # MKL's matrix-vector kernel is the slow one: two columns, one kept
        flat = torch.cat([flat, flat])
    out = torch.mm(weight, flat.t())[:, :rows].t().contiguous()
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)
            and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]


def _pass_ms(linears: list[nn.Linear], xs: dict[int, torch.Tensor], rows: int,
             wxt: bool) -> float:
    """Milliseconds for one product per linear layer, in the model's order."""
    t0 = time.perf_counter()
    for m in linears:
        x = xs[m.in_features]
        if wxt:
            small_linear(x, m.weight, m.bias, rows)
        else:
            F.linear(x, m.weight, m.bias)
    return (time.perf_counter() - t0) * 1000.0


def calibrate(model: nn.Module, reps: int = 3) -> MatmulChoice:
    """Time both kernels on the model's linears for each of ``ROWS`` (see module doc)."""
    linears = _linears(model)
    use, timings = [False] * (max(ROWS) + 1), {}
    gen = torch.Generator().manual_seed(0)  # the global generator is left as it was
    with torch.inference_mode():
        low = 0
        for rows in ROWS:
            xs = {n: torch.randn(rows, n, generator=gen) for n in {m.in_features for m in linears}}
            best = [float("inf"), float("inf")]
            for _ in range(reps + 1):  # the first round warms up and is kept only if best
                for wxt in (False, True):
                    best[wxt] = min(best[wxt], _pass_ms(linears, xs, rows, wxt))
            timings[rows] = (best[0], best[1])
            use[low + 1: rows + 1] = [best[1] < MARGIN * best[0]] * (rows - low)
            low = rows
    return MatmulChoice(tuple(use), timings)


def install(model: nn.Module, use: tuple[bool, ...]) -> int:
    """Route each float32 CPU linear layer's products of ``rows`` rows through
    ``small_linear`` where ``use[rows]``; returns how many layers were routed."""
    linears = _linears(model) if any(use) else []
    for m in linears:
        m.wxt_rows = use  # a bound method: a deep copy of the model routes its own layers
        m.forward = types.MethodType(_routed_forward, m)
    return len(linears)


def _routed_forward(m: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if 0 < rows < len(m.wxt_rows) and m.wxt_rows[rows]:
        return small_linear(x, m.weight, m.bias, rows)
    return F.linear(x, m.weight, m.bias)


def setup(model: nn.Module, device: torch.device, mode: str = "auto") -> MatmulChoice | None:
    """Measure and install on a CPU (``mode``: one of ``MODES``); None elsewhere or when
    the model has no float32 linear layer."""
    if mode not in MODES:
        raise ValueError(f"cpu matmul mode must be one of {MODES}, not {mode!r}")
    linears = _linears(model) if device.type == "cpu" else []
    if not linears or mode == "linear":
        return None
    if mode == "wxt":
        choice = MatmulChoice((False,) + (True,) * max(ROWS), {})
    elif sum(m.weight.nbytes for m in linears) < AUTO_MIN_BYTES:
        return None
    else:
        choice = calibrate(model)
    install(model, choice.use)
    return choice
