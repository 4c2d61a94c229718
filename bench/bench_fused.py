"""Stacked projections (``injection/model/fused.py``) against separate ones: one decoding
step of the lean forward, alternated, on the same batch.

    .venv/bin/python bench/bench_fused.py [--steps 24] [--rows 1,8,16]

The model (SmolLM2, ``MODEL_PATH`` for another) is loaded twice with every product on
oneDNN's packed kernel (``MODEL_CPU_MATMUL=packed``, so both sides multiply with the same
kernel): once as the worker loads it (q/k/v and gate/up stacked), once with nothing
stacked and the lean forward built over the separate layers. Both decode the same
left-padded batch of ``rows`` rows of about 150 tokens, one step each in turn, the step's
column dropped after each so every step sees the same cache. Printed per row count: the
median and best milliseconds a step, the ratio stacked / separate, and whether the logits
were equal bit for bit at every step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from bench_personalisation import model_path  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from injection import load_adapter  # noqa: E402
from injection.engine.batchcache import BatchCache  # noqa: E402
from injection.model.lean_step import lean_step  # noqa: E402


def batch(lean, rows: int, gen: torch.Generator) -> BatchCache:
    out = BatchCache()
    for r in range(rows):
        ids = torch.randint(3, 40000, (1, 150 - 7 * (r % 8)), generator=gen)
        cache = DynamicCache()
        with torch.inference_mode():
            lean(ids, None, None, cache)
        out.add(cache)
    return out


def step_ms(lean, cache: BatchCache, last: torch.Tensor) -> tuple[float, torch.Tensor]:
    """One decoding step's milliseconds and logits; its column dropped after."""
    cache.reserve(1)
    mask, positions, _ = cache.step_inputs(torch.device("cpu"))
    t0 = time.perf_counter()
    with torch.inference_mode():
        logits = lean(last, mask, positions, cache.cache)
    ms = (time.perf_counter() - t0) * 1000.0
    for layer in cache.cache.layers:
        layer.set(layer.kbuf, layer.vbuf, layer.rows, layer.n - 1)
    return ms, logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rows", default="1,8,16")
    args = ap.parse_args()
    stacked = load_adapter(model_path(), cpu_matmul="packed", cpu_threads="shared")
    plain = load_adapter(model_path(), cpu_matmul="packed", cpu_threads="shared",
                         lean_step=False)
    separate = lean_step(plain.model)
    print(f"model {Path(model_path()).name}; groups stacked {stacked.fused}; "
          f"torch threads {torch.get_num_threads()}")
    for rows in (int(r) for r in args.rows.split(",")):
        cache = batch(stacked.lean, rows, torch.Generator().manual_seed(rows))
        last, ms, equal = torch.full((rows, 1), 5), {"stacked": [], "separate": []}, True
        for _ in range(args.steps):
            a, la = step_ms(stacked.lean, cache, last)
            b, lb = step_ms(separate, cache, last)
            ms["stacked"].append(a)
            ms["separate"].append(b)
            equal = equal and torch.equal(la, lb)
        med = {k: statistics.median(v) for k, v in ms.items()}
        print(f"{rows:3d} rows: stacked {med['stacked']:.2f} ms (best {min(ms['stacked']):.2f}),"
              f" separate {med['separate']:.2f} ms (best {min(ms['separate']):.2f}); "
              f"{med['stacked'] / med['separate']:.3f}x; logits equal: {equal}")


if __name__ == "__main__":
    main()
