"""Cost of attention emphasis: prefill and per-token decode with emphasis on vs off, one run.

Formulation measured: transformers' SDPA ``position_bias`` (an additive float bias
``[B, 1, q, kv]`` folded into the attention mask, ``injection/engine/emphasis.py``), built
per forward pass on the host and copied to the device. Off passes no bias at all (today's
call). Both conditions run through the real engine code, interleaved in every round;
ratios are medians of on / off from the same run:

* prefill: ``steps.prefill`` of one row (batch 1) after the injected system turn, for a
  prompt of about ``--history`` tokens (a conversation history), on vs off;
* decode: ``steps.decode`` (one token for every row: what the batch engine runs per
  generated token) on a left-padded batch of ``B`` rows of different lengths, ``--tokens``
  steps per condition, the conditions alternating step by step on the same batch: all rows
  off, all on, half on (a mixed batch: the bias is built for every row).

Run: ``.venv/bin/python bench/bench_emphasis_cost.py [--device cuda] [--rows 1 4]``
(``MODEL_PATH`` = a local HF model dir; default: the prepared SmolLM2-135M-Instruct).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from injection import load_adapter  # noqa: E402
from injection.engine import steps  # noqa: E402
from injection.engine.batchcache import BatchCache  # noqa: E402
from injection.engine.batchrow import RowJob  # noqa: E402
from injection.prompting.emphasis_spans import text_spans  # noqa: E402

PREF = "I am vegetarian, I live in Oslo and I prefer short answers with bullet points."
QUESTION = "Write a long, detailed story about a trip through the mountains."
EMPHASIS = math.log(5)


def model_path() -> str:
    return os.environ.get("MODEL_PATH") or str(ROOT / "var/models/smollm2-135m-instruct")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def case(adapter, history_tokens: int):
    """(prefix K/V, prompt ids, spans): the preference injected, then a history and a question."""
    filler = "We talked about the weather, the mountains and the food in the valley. "
    history = []
    while len(adapter.tokenizer(" ".join(m["content"] for m in history))["input_ids"]) < \
            history_tokens:
        history += [{"role": "user", "content": filler * 4},
                    {"role": "assistant", "content": filler * 4}]
    msgs = [*history, {"role": "user", "content": QUESTION}]
    parts = adapter.split_prompt(PREF, msgs)
    spans = text_spans(adapter.renderer, parts.segment, None, "", [PREF])
    ids = adapter.renderer.encode(parts.prompt, first=False)
    return adapter.compute_kv(parts.segment), ids, spans


def bench_prefill(adapter, prefix, ids, spans, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(repeats + 2):
        for name, value in (("off", 0.0), ("on", EMPHASIS)):
            job = RowJob(prefix, 1.0, list(ids), list(ids), 1, {}, {}, emphasis=value,
                         emphasis_spans=spans if value else ())
            sync(adapter.device)
            t0 = time.perf_counter()
            steps.prefill(adapter, job)
            sync(adapter.device)
            if r >= 2:  # warm-up rounds dropped
                times[name].append((time.perf_counter() - t0) * 1000.0)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_decode(adapter, prefix, ids, spans, rows: int, steps_n: int) -> dict[str, float]:
    """ms per ``steps.decode`` of ``rows`` rows (different lengths: left pads), the
    conditions alternating step by step on the same growing batch."""
    batch, jobs = BatchCache(), []
    for i in range(rows):
        mine = ids[7 * i:]  # rows of different lengths: the batch is left-padded
        job = RowJob(prefix, 1.0, mine, mine, steps_n, {}, {}, emphasis_spans=spans)
        past, logits = steps.prefill(adapter, job)
        batch.add(past)
        job.gen = [int(logits.argmax())]
        jobs.append(job)
    conds = {"off": [0.0] * rows, "on": [EMPHASIS] * rows,
             "mixed": [EMPHASIS if i % 2 == 0 else 0.0 for i in range(rows)]}
    if rows == 1:
        conds.pop("mixed")
    times: dict[str, list[float]] = {k: [] for k in conds}
    for k in range(steps_n + 1):
        for name, values in conds.items():
            for job, value in zip(jobs, values, strict=True):
                job.emphasis = value
            reserve = getattr(batch, "reserve", None)  # a preallocating BatchCache grows first
            if reserve is not None:
                reserve(1)
            sync(adapter.device)
            t0 = time.perf_counter()
            steps.decode(adapter, batch, jobs)
            sync(adapter.device)
            if k:  # the first round warms up
                times[name].append((time.perf_counter() - t0) * 1000.0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--history", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    adapter = load_adapter(model_path(), device=args.device, dtype=args.dtype)
    print(f"model {Path(model_path()).name} on {adapter.device} ({adapter.dtype}), "
          f"attention {adapter.model.config._attn_implementation}, emphasis {EMPHASIS:.3f} nats")
    print("| measure | prompt tokens | rows | off (ms) | on (ms) | on / off | mixed / off |")
    print("|---|---|---|---|---|---|---|")
    for hist in args.history:
        prefix, ids, spans = case(adapter, hist)
        p = bench_prefill(adapter, prefix, ids, spans, args.repeats)
        print(f"| prefill | {len(ids)} | 1 | {p['off']:.2f} | {p['on']:.2f} | "
              f"{p['on'] / p['off']:.3f} | - |")
        for rows in args.rows:
            d = bench_decode(adapter, prefix, ids, spans, rows, args.tokens)
            mixed = f"{d['mixed'] / d['off']:.3f}" if "mixed" in d else "-"
            print(f"| decode ms/step | {len(ids)} | {rows} | {d['off']:.2f} | {d['on']:.2f} | "
                  f"{d['on'] / d['off']:.3f} | {mixed} |", flush=True)


if __name__ == "__main__":
    main()
