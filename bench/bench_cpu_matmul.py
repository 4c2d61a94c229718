"""What the CPU's decoding kernel (``injection/model/cpu_matmul.py``) buys, in one run.

    .venv/bin/python bench/bench_cpu_matmul.py [--reps N] [--write-docs | --bf16]

The real default model (SmolLM2-135M-Instruct, ``var/models/smollm2-135m-instruct``
unless ``MODEL_PATH`` names another) loaded three times on the CPU: ``linear``
(``F.linear`` only: the baseline), ``wxt`` (``W @ x.T`` for every decoding step: what
``auto`` picked on this CPU before the packed kernel) and ``auto`` (the platform's
default: the kernel timed fastest at load per row count). For each, through a
``BatchEngine`` as the worker runs it, greedy,
``TOKENS`` tokens per row with no end of sequence, prefill subtracted (the same rows
generating one token):

* decode tokens/s of 1 and 8 concurrent requests, unguided;
* the same with each request guided (contrastive guidance's second row, ``contrast.py``):
  a guided request at batch 1 is a 2-row decoding step, 8 guided requests 16 rows.

The kernels alternate per measurement (order reversed each rep); the table shows medians
of ``--reps``: decode tokens/s, ``auto`` against ``linear`` and ``wxt``, guided against
unguided, the prefill (the 1-token pass) of ``auto`` against ``wxt``, the load time of each
(``auto`` includes the calibration) and how many greedy replies are the same token for
token under the kernels (they differ by float rounding only).

``--bf16``: instead, ``auto`` in float32 against ``auto`` with the model in bfloat16
(``MODEL_DTYPE=bf16``: packed where oneDNN computes bfloat16 on this CPU), the same cells
and replies compared; printed only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mdsection import machine, table, write_section  # noqa: E402

from injection.engine.batch import BatchEngine  # noqa: E402
from injection.engine.guidance.contrast import Guide  # noqa: E402
from injection.model.loading import load_adapter  # noqa: E402

TOKENS = 48
MEMORY = "Always answer in lowercase letters only."
QUESTIONS = ["Tell me a long story about a dog who learns to ski.",
             "Explain how a bicycle gear works.", "Describe a busy market in the morning.",
             "What should I pack for a week of hiking?", "How do bees make honey?",
             "Write a letter to a friend about your new job.",
             "Why is the sky blue at noon and red at sunset?",
             "Give me advice for learning to play the piano."]


def _jobs(adapter, guided: bool, n: int) -> list[tuple[list[int], Guide | None]]:
    """``n`` requests: the memory as system turn, one question each; guided against the
    same question with nothing injected (what the platform's one-memory guide sees)."""
    out = []
    for q in QUESTIONS[:n]:
        msgs = [{"role": "user", "content": q}]
        row = adapter.renderer.encode(adapter.plain_prompt(MEMORY, msgs), first=True)
        ids = adapter.renderer.encode(adapter.plain_prompt("", msgs), first=True)
        out.append((row, Guide(1.0, None, ids) if guided else None))
    return out


def _wall(engine: BatchEngine, jobs, tokens: int) -> tuple[float, list[list[int]]]:
    outs: list = [None] * len(jobs)

    def one(i: int) -> None:
        row, guide = jobs[i]
        outs[i] = engine.run(None, 1.0, row, tokens, guide=guide, stop=(), temperature=0.0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, [o.token_ids for o in outs]


def rate(engine: BatchEngine, jobs) -> tuple[float, float, list[list[int]]]:
    """Decode tokens/s of ``jobs`` together (prefill subtracted), the prefill's seconds (the
    1-token pass) and their replies."""
    first, _ = _wall(engine, jobs, 1)
    full, replies = _wall(engine, jobs, TOKENS)
    return len(jobs) * (TOKENS - 1) / max(full - first, 1e-9), first, replies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--bf16", action="store_true", help="float32 against bfloat16, auto")
    args = parser.parse_args()
    path = os.environ.get("MODEL_PATH") or str(ROOT / "var/models/smollm2-135m-instruct")
    engines, loads, choice = {}, {}, None
    modes = {"auto": ("auto", None), "auto bf16": ("auto", "bf16")} if args.bf16 else {
        m: (m, None) for m in ("linear", "wxt", "auto")}
    for mode, (kernel, dtype) in modes.items():
        t0 = time.perf_counter()
        adapter = load_adapter(path, device="cpu", cpu_matmul=kernel, dtype=dtype)
        loads[mode] = time.perf_counter() - t0
        choice = adapter.matmul or choice
        engines[mode] = BatchEngine(adapter, max_batch=8)
        engines[mode]._eos = set()  # every row runs TOKENS steps
    cells = [(g, n) for g in (False, True) for n in (1, 8)]
    rates = {(m, c): [] for m in engines for c in cells}
    firsts = {(m, c): [] for m in engines for c in cells}
    replies: dict = {}
    alone: dict = {}
    try:
        for rep in range(args.reps):
            for cell in cells:
                for mode in (list(engines) if rep % 2 == 0 else list(engines)[::-1]):
                    r, first, out = rate(engines[mode], _jobs(engines[mode].adapter, *cell))
                    rates[(mode, cell)].append(r)
                    firsts[(mode, cell)].append(first)
                    replies[(mode, cell)] = out
                    print(f"rep {rep} {mode} guided={cell[0]} n={cell[1]}: {r:.1f} tok/s",
                          flush=True)
        if args.bf16:  # each of the 8 unguided questions alone, against its reply in the 8
            alone = {m: [_wall(e, [job], TOKENS)[1][0] for job in _jobs(e.adapter, False, 8)]
                     for m, e in engines.items()}
    finally:
        for e in engines.values():
            e.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    pre = {k: statistics.median(v) for k, v in firsts.items()}
    if args.bf16:
        print(_bf16_report(cells, med, pre, replies, args.reps, loads, Path(path).name))
        print("\nThe same greedy reply alone as in the batch of 8 (unguided): " + ", ".join(
            f"{m} {sum(a == b for a, b in zip(alone[m], replies[(m, (False, 8))], strict=True))}/8"
            for m in engines))
        return
    rows = []
    for guided, n in cells:
        lin, wxt, auto = (med[(m, (guided, n))] for m in ("linear", "wxt", "auto"))

        def same(mode: str, cell=(guided, n)) -> int:
            return sum(a == b for a, b in zip(replies[(mode, cell)], replies[("auto", cell)],
                                             strict=True))
        rows.append([f"{n} {'guided' if guided else 'unguided'}", f"{lin:.1f}", f"{wxt:.1f}",
                     f"{auto:.1f}", f"**{auto / lin:.2f}x**", f"**{auto / wxt:.2f}x**",
                     f"**{auto / med[('auto', (False, n))]:.2f}x**",
                     f"{pre[('auto', (guided, n))] / pre[('wxt', (guided, n))]:.2f}x",
                     f"{same('linear')}/{n}, {same('wxt')}/{n}"])
    body = "\n".join([
        f"`.venv/bin/python bench/bench_cpu_matmul.py --reps {args.reps}` — {machine()}, "
        f"torch threads {__import__('torch').get_num_threads()}, {Path(path).name} "
        f"float32, {TOKENS} tokens per row, greedy, prefill subtracted, median of "
        f"{args.reps}. Load: " + ", ".join(f"{m} {t:.1f} s" for m, t in loads.items()) +
        " (auto's calibration included); auto picked " + _picked(choice) + ".", "",
        table(["requests", "linear tok/s", "wxt tok/s", "auto tok/s", "auto / linear",
               "auto / wxt", "guided / unguided (auto)", "prefill auto / wxt",
               "same greedy replies as auto (linear, wxt)"], rows)])
    print(body)
    if args.write_docs:
        write_section("cpu-matmul", body)


def _bf16_report(cells, med, pre, replies, reps: int, loads: dict, model: str) -> str:
    rows = [[f"{n} {'guided' if g else 'unguided'}", f"{med[('auto', (g, n))]:.1f}",
             f"{med[('auto bf16', (g, n))]:.1f}",
             f"**{med[('auto bf16', (g, n))] / med[('auto', (g, n))]:.2f}x**",
             f"{pre[('auto bf16', (g, n))] / pre[('auto', (g, n))]:.2f}x",
             f"{sum(a == b for a, b in zip(replies[('auto', (g, n))], replies[('auto bf16', (g, n))], strict=True))}/{n}"]
            for g, n in cells]
    return "\n".join([
        f"`.venv/bin/python bench/bench_cpu_matmul.py --bf16 --reps {reps}` — {machine()}, "
        f"{model}, {TOKENS} tokens per row, greedy, prefill subtracted, median "
        f"of {reps}. Load: " + ", ".join(f"{m} {t:.1f} s" for m, t in loads.items()) + ".", "",
        table(["requests", "float32 tok/s", "bfloat16 tok/s", "bf16 / fp32",
               "prefill bf16 / fp32", "same greedy replies"], rows)])


def _picked(choice) -> str:
    if choice is None:
        return "F.linear throughout"
    s = choice.summary()
    return (f"W @ x.T for rows {s['wxt_rows']} (padded: {s['padded']}), packed for rows "
            f"{s['packed_rows']}{' and prefills' if s['prefill_packed'] else ''}")


if __name__ == "__main__":
    main()
