"""Faster number formats for batch-1 decode on the CPU, and what each costs the batch.

    OMP_NUM_THREADS=1 .venv/bin/python bench/probe_number_formats.py

On the default model (``MODEL_PATH`` or var/models/smollm2-135m-instruct), one torch
thread, plain transformers forwards (no engine), greedy:

* decode tokens/s at batch 1 after an 8-token prompt (``TOKENS`` steps, best of
  ``REPEATS``) for fp32 (the baseline, in the same run), bf16 weights, and PyTorch's
  dynamic int8 quantization of every ``nn.Linear`` (weights int8 per tensor, activations
  quantized on the fly with one scale per input tensor);
* row coupling: the largest change of row 0's next-token logits when only row 1 of a
  2-row batch is replaced by other text. A format whose activation scale is computed
  over the whole batch lets one row's content change another row's numbers; the engine
  batches different members (and tenants) together, so such a format would let one
  request influence another's reply.

Nothing here is used by the platform; it records why a format was or was not adopted.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from mdsection import machine, table  # noqa: E402

MODEL = Path(os.environ.get("MODEL_PATH") or ROOT / "var/models/smollm2-135m-instruct")
TOKENS, REPEATS = int(os.environ.get("TOKENS", "32")), int(os.environ.get("REPEATS", "3"))


def load(dtype: torch.dtype, int8: bool = False) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=dtype).eval()
    if int8:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear},
                                                           dtype=torch.qint8)
    return model


@torch.inference_mode()
def decode_rate(model: torch.nn.Module) -> float:
    best = 0.0
    for _ in range(REPEATS):
        out = model(torch.arange(1, 9).unsqueeze(0), use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t0 = time.perf_counter()
        for _ in range(TOKENS):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        best = max(best, TOKENS / (time.perf_counter() - t0))
    return best


@torch.inference_mode()
def coupling(model: torch.nn.Module) -> float:
    """max |row 0's logits with row 1 = A  -  row 0's logits with row 1 = B|."""
    gen = torch.Generator().manual_seed(0)
    row0, a, b = (torch.randint(100, 40000, (1, 16), generator=gen) for _ in range(3))
    first = model(torch.cat([row0, a])).logits[0].float()
    second = model(torch.cat([row0, b])).logits[0].float()
    return float((first - second).abs().max())


def main() -> None:
    torch.set_num_threads(1)
    formats = {"fp32 (baseline)": (torch.float32, False), "bf16 weights": (torch.bfloat16, False),
               "int8 dynamic (per-tensor activations)": (torch.float32, True)}
    rows, base = [], None
    for label, (dtype, int8) in formats.items():
        model = load(dtype, int8)
        rate = decode_rate(model)
        base = base or rate
        rows.append([label, f"{rate:.1f}", f"{rate / base:.2f}x", f"{coupling(model):.2g}"])
        print(rows[-1], flush=True)
        del model
    print("\n".join([
        f"`OMP_NUM_THREADS=1 .venv/bin/python bench/probe_number_formats.py` — {machine()}; "
        f"model {MODEL.name}, 1 torch thread, batch-1 decode of {TOKENS} tokens, best of "
        f"{REPEATS}.", "",
        table(["format", "decode tok/s", "vs fp32", "row coupling (max |Δ logit| of row 0)"],
              rows)]))


if __name__ == "__main__":
    main()
