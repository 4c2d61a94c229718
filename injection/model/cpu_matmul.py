"""Linear layers on a CPU: the kernel timed fastest when the model loads.

A decoding step multiplies every weight matrix by a few rows (one per sequence in the
batch, a guided request's guide included). ``F.linear`` hands MKL ``x @ W.T``: one row
goes to its matrix-vector kernel, two or more to a general multiply that, for so few
rows, reads the weights far slower than the memory allows. Two kernels do better:

- ``packed``: oneDNN's linear over weights reordered once, at load, into its blocked
  layout (``torch.ops.mkldnn``, what ``torch.compile`` uses for a float32 linear on a
  CPU). On the 2-core CPU of docs/BENCHMARKS.md "CPU matmul", a pass over SmolLM2's linears
  took 30 ms at 8 rows and 36 at 16 against 51 and 60 for ``W @ x.T`` and 63 and 72 for
  ``F.linear``, and 98 against 148 ms at 64 rows (a prefill). A row's result is the same
  bit for bit whatever the other rows of the step, up to 64 (measured; above it oneDNN may
  split the reduction differently): with ``packed`` for every count (``MODES``), a greedy
  reply does not depend on what else is in the batch. The reordered copy is held beside
  the weights (the model's linear weights twice in memory: 0.5 GB more for SmolLM2-135M).
- ``wxt``: ``(W @ x.T).T`` with ``W`` untransposed (one row padded to two): MKL reads the
  weights about as fast as memory allows for few rows, but multiplies 16 columns far faster
  than 14 (60 against 100 ms a pass), so a count takes the padded size timed fastest.

Which is faster depends on the CPU, its threads, the model and the row count, so it is
measured when the model loads (``calibrate``: the model's own linear layers in order, the
kernels interleaved, best of a few rounds, at each size of ``ROWS``, and ``F.linear`` against
``packed`` at ``PREFILL_ROWS``), and each count of up to ``max(ROWS)`` rows gets the fastest
at the next size of ``ROWS`` (``choose``; ``W @ x.T`` padded to a larger size where that is
faster); more rows get ``packed`` where it beat ``F.linear`` at ``PREFILL_ROWS``. On that
CPU: ``W @ x.T`` for 1 and 2 rows (20 ms a pass against 26 and 29), ``packed`` above. A
model small enough to sit in the CPU's caches keeps ``F.linear`` (``AUTO_MIN_BYTES``: the
random demo and test models). The results differ from ``F.linear``'s by float rounding
only. Float32 on a CPU, and bfloat16 where oneDNN computes it (``_dtypes``): elsewhere
nothing changes.
"""

from __future__ import annotations

import time
import types
import weakref
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MODES", "PACKED", "ROWS", "MatmulChoice", "calibrate", "choose", "forget", "install",
           "pack", "packed_linear", "rows_of", "setup", "small_linear", "uses_packed"]

ROWS = (1, 2, 4, 8, 16)  # decoding row counts measured; a count between two: the larger's
PREFILL_ROWS = 64  # a prefill-sized product, timed for ``packed`` against ``F.linear``
MODES = ("auto", "packed", "wxt", "linear")  # measured; one kernel always; F.linear always
MARGIN = 0.95  # another kernel is picked only when it takes less than this share of F.linear
# "auto" leaves a model whose linear weights are smaller than this to F.linear: they stay in
# the CPU's caches, where the kernels' difference (reading memory) does not arise and their
# timings (microseconds) are noise that would pick differently from one load to the next
AUTO_MIN_BYTES = 64 * 2**20
PACKED = -1  # ``MatmulChoice.use``: the packed kernel
# a layer's reordered weight, outside the layer: a deep copy of the model (its own weights,
# perhaps changed) falls back to F.linear instead of multiplying by the original's
_PACKED: weakref.WeakKeyDictionary[nn.Module, torch.Tensor] = weakref.WeakKeyDictionary()


class MatmulChoice(NamedTuple):
    """``use``, per row count 0..max(ROWS): ``PACKED``, the rows ``W @ x.T`` multiplies
    (the count, or more: padded), or 0 for ``F.linear``; ``prefill_packed``: more rows take
    the packed kernel; ``timings``: milliseconds of one pass over the model's linears,
    ``{rows: (linear, wxt, packed)}`` (None: not timed)."""

    use: tuple[int, ...]
    timings: dict[int, tuple[float | None, float | None, float | None]]
    prefill_packed: bool = False

    def summary(self) -> dict[str, Any]:
        return {"wxt_rows": [n for n in range(1, len(self.use)) if self.use[n] > 0],
                "packed_rows": [n for n in range(1, len(self.use)) if self.use[n] == PACKED],
                "padded": {n: m for n, m in enumerate(self.use) if m > n},
                "prefill_packed": self.prefill_packed,
                "ms_per_pass": {n: [None if t is None else round(t, 2) for t in ts]
                                for n, ts in self.timings.items()}}

    @property
    def packs(self) -> bool:
        return self.prefill_packed or PACKED in self.use


def small_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 rows: int, pad_to: int = 0) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for ``rows`` rows of ``x``, as ``(W @ x.T).T`` over
    ``pad_to`` columns (zeros past ``rows``; at least 2)."""
    flat = x.reshape(rows, x.shape[-1])
    if rows == 1 and pad_to <= 1:  # MKL's matrix-vector kernel is the slow one: two columns
        flat = torch.cat([flat, flat])
    elif pad_to > rows:
        flat = torch.cat([flat, flat.new_zeros(pad_to - rows, flat.shape[1])])
    out = torch.mm(weight, flat.t())[:, :rows].t().contiguous()
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` by oneDNN over a weight reordered by ``pack``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def pack(linears: list[nn.Linear]) -> dict[nn.Module, torch.Tensor] | None:
    """Each layer's weight reordered for oneDNN; None where this torch has no oneDNN."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        with torch.inference_mode():
            return {m: torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), max(ROWS))
                    for m in linears}
    except (RuntimeError, AttributeError):  # a build without the op
        return None


def _linears(model: nn.Module) -> list[nn.Linear]:
    dtypes = _dtypes()
    found = [m for m in model.modules() if isinstance(m, nn.Linear)
             and m.weight.dtype in dtypes and m.weight.device.type == "cpu"]
    return [m for m in found if m.weight.dtype == found[0].weight.dtype]  # one dtype timed


def _dtypes() -> tuple[torch.dtype, ...]:
    """The weights' dtypes measured: float32, and bfloat16 where oneDNN computes it on this
    CPU (AVX-512 BF16 or AMX: ``MODEL_DTYPE=bf16``, docs/BENCHMARKS.md cpu-matmul)."""
    try:
        bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (RuntimeError, AttributeError):  # a build without oneDNN
        bf16 = False
    return (torch.float32, torch.bfloat16) if bf16 else (torch.float32,)


def _pass_ms(linears: list[nn.Linear], xs: dict[int, torch.Tensor], rows: int, kernel: str,
             packed: dict[nn.Module, torch.Tensor] | None = None) -> float:
    """Milliseconds for one product per linear layer, in the model's order."""
    t0 = time.perf_counter()
    for m in linears:
        x = xs[m.in_features]
        if kernel == "wxt":
            small_linear(x, m.weight, m.bias, rows)
        elif kernel == "packed":
            packed_linear(x, packed[m], m.bias)
        else:
            F.linear(x, m.weight, m.bias)
    return (time.perf_counter() - t0) * 1000.0


def _best(linears: list[nn.Linear], rows: int, kernels: tuple[str, ...], reps: int,
          gen: torch.Generator, packed: Any = None) -> dict[str, float]:
    """Best of ``reps`` interleaved rounds (after a warm-up round, kept only if best)."""
    dtype = linears[0].weight.dtype
    xs = {n: torch.randn(rows, n, generator=gen).to(dtype)
          for n in {m.in_features for m in linears}}
    best = dict.fromkeys(kernels, float("inf"))
    for _ in range(reps + 1):
        for k in kernels:
            best[k] = min(best[k], _pass_ms(linears, xs, rows, k, packed))
    return best


def calibrate(model: nn.Module, reps: int = 3,
              packed: dict[nn.Module, torch.Tensor] | None = None) -> MatmulChoice:
    """Time the kernels on the model's linears and pick (module doc); ``packed``: the
    layers' reordered weights (``pack``), None to leave that kernel out."""
    linears, timings = _linears(model), {}
    gen = torch.Generator().manual_seed(0)  # the global generator is left as it was
    extra = ("packed",) if packed else ()
    with torch.inference_mode():
        for rows in (*ROWS, PREFILL_ROWS):
            kernels = ("linear", "wxt", *extra) if rows in ROWS else ("linear", *extra)
            best = _best(linears, rows, kernels, reps, gen, packed)
            timings[rows] = (best["linear"], best.get("wxt"), best.get("packed"))
    lin, _, pk = timings[PREFILL_ROWS]
    return MatmulChoice(choose(timings), timings, pk is not None and pk < MARGIN * lin)


def choose(timings: dict[int, tuple[float | None, ...]]) -> tuple[int, ...]:
    """Per count up to ``max(ROWS)``: at the next size of ``ROWS``, the kernel timed fastest,
    ``W @ x.T`` padded to that size or a larger one, where it takes under ``MARGIN`` of
    ``F.linear``; else 0 (``F.linear``)."""
    inf = float("inf")
    use = [0] * (max(ROWS) + 1)
    for rows in range(1, len(use)):
        size = min(r for r in ROWS if r >= rows)
        linear, _, packed = timings[size][:3]
        pad = min((r for r in ROWS if r >= rows), key=lambda r: (timings[r][1] or inf, r))
        wxt = timings[pad][1] or inf
        fastest = min((packed or inf, PACKED), (wxt, pad))
        use[rows] = fastest[1] if fastest[0] < MARGIN * (linear or inf) else 0
    return tuple(use)


def install(model: nn.Module, choice: MatmulChoice,
            packed: dict[nn.Module, torch.Tensor] | None = None) -> int:
    """Route each CPU linear layer's products (float32, or bfloat16: ``_dtypes``) through
    the kernel ``choice`` picks for their row count (``packed``: the reordered weights it
    needs); returns how many layers were routed."""
    if choice.packs and not packed:
        raise ValueError("the packed kernel needs the layers' packed weights")
    linears = _linears(model) if any(choice.use) or choice.packs else []
    for m in linears:
        m.wxt_rows, m.prefill_packed = choice.use, choice.prefill_packed
        if choice.packs:
            _PACKED[m] = packed[m]
        m.forward = types.MethodType(_routed_forward, m)  # a deep copy routes its own layers
    return len(linears)


def forget(layer: nn.Module) -> None:
    """Drop ``layer``'s reordered weight (its products go elsewhere now: ``fused.py``)."""
    _PACKED.pop(layer, None)


def rows_of(x: torch.Tensor) -> int:
    """The rows a linear layer multiplies in ``x`` (every dimension but the last)."""
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def uses_packed(m: nn.Module, rows: int) -> bool:
    """Whether a routed layer multiplies ``rows`` rows by its reordered weight."""
    return _pick(m, rows) == PACKED and m in _PACKED


def _pick(m: nn.Module, rows: int) -> int:
    use = getattr(m, "wxt_rows", ())
    return use[rows] if rows < len(use) else PACKED * getattr(m, "prefill_packed", False)


def _routed_forward(m: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = rows_of(x)
    pick = _pick(m, rows)
    if pick == PACKED and (w := _PACKED.get(m)) is not None:
        return packed_linear(x, w, m.bias)
    if pick > 0:
        return small_linear(x, m.weight, m.bias, rows, pick)
    return F.linear(x, m.weight, m.bias)


def setup(model: nn.Module, device: torch.device, mode: str = "auto") -> MatmulChoice | None:
    """Measure and install on a CPU (``mode``: one of ``MODES``); None elsewhere, when the
    model has no linear layer of a dtype measured (``_dtypes``), or (``packed``) this torch
    has no oneDNN."""
    if mode not in MODES:
        raise ValueError(f"cpu matmul mode must be one of {MODES}, not {mode!r}")
    linears = _linears(model) if device.type == "cpu" else []
    if not linears or mode == "linear":
        return None
    if mode == "wxt":
        choice, packed = MatmulChoice(tuple(range(max(ROWS) + 1)), {}), None
    elif mode == "packed":
        packed = pack(linears)
        if packed is None:
            return None
        choice = MatmulChoice((0,) + (PACKED,) * max(ROWS), {}, True)
    elif sum(m.weight.nbytes for m in linears) < AUTO_MIN_BYTES:
        return None
    else:
        packed = pack(linears)
        choice = calibrate(model, packed=packed)
        packed = packed if choice.packs else None  # not kept where not used
    install(model, choice, packed)
    return choice
