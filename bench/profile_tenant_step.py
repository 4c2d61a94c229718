"""Where a decoding step's time goes when the rows are members of one tenant with long
instructions (issue 59's "where the design should win" workload), in the engine alone.

    .venv/bin/python bench/profile_tenant_step.py [--rows 16] [--bursts 2] [--tokens 48]

The executor is built as the worker builds it (no L2), on the prepared SmolLM2 model
(``MODEL_PATH`` for another). ``--rows`` members of one tenant, each with one preference,
all with bench/vs_peer_workloads.py's 3,913-character instructions, are warmed, then ask a
new question each, all at once, ``--bursts`` times. Printed: tokens/s and the slowest first
token per burst, the prompt's length, and per decoding step of ``--rows`` rows the
milliseconds in the linear layers, in attention and in writing the step's K/V (timers
around them; the rest is norms, rotary embedding, the head's sampling and Python).
Every row holds its own copy of the tenant's K/V in the batch; rows whose copies are equal
attend to it in one read (``injection/engine/heads.py``). ``--ab``: bursts alternate with
that on and off (every row reading its own copy), each split printed, replies compared.
Figures from a shared machine compare only within one run.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_personalisation import model_path  # noqa: E402
from vs_peer_workloads import INSTRUCTIONS, NAMES, PREFS, QUESTIONS  # noqa: E402

from injection import build_executor, load_adapter  # noqa: E402
from injection.base import ExecutionRequest  # noqa: E402
from injection.engine import batch as batch_mod  # noqa: E402
from injection.engine import batchcache, steps  # noqa: E402
from injection.model import cpu_matmul, shared_attention  # noqa: E402


class Split:
    """Milliseconds per part, summed over decoding steps of ``rows`` rows."""

    def __init__(self, rows: int) -> None:
        self.rows, self.ms, self.steps, self.on = rows, defaultdict(float), 0, False
        self.inside: set[str] = set()

    def timed(self, name: str, fn: Any) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            if not self.on or name in self.inside:  # a part inside itself counts once
                return fn(*a, **k)
            self.inside.add(name)
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.ms[name] += (time.perf_counter() - t0) * 1000.0
                self.inside.discard(name)
        return run

    def install(self) -> None:
        """Before the model loads (its linear layers bind the routed forward then)."""
        cpu_matmul._routed_forward = self.timed("linear layers", cpu_matmul._routed_forward)
        batchcache.SlabLayer.update = self.timed("K/V writes", batchcache.SlabLayer.update)
        decode = batch_mod.steps.decode

        def step(*a: Any, **k: Any) -> Any:
            self.on = self.recording and len(a[2]) == self.rows
            t0 = time.perf_counter()
            try:
                return decode(*a, **k)
            finally:
                if self.on:
                    self.ms["step"] += (time.perf_counter() - t0) * 1000.0
                    self.steps += 1
                self.on = False
        batch_mod.steps.decode = step
        self.recording = False


def request(i: int, tokens: int, on_text: Any = None) -> ExecutionRequest:
    pref = f"{PREFS[i % len(PREFS)]} Call me {NAMES[i % len(NAMES)]}{i}."
    q = [{"role": "user", "content": f"Question {i}: {QUESTIONS[i % len(QUESTIONS)]}"}]
    return ExecutionRequest("t1", f"m{i % 1000}", q, pref, instructions=INSTRUCTIONS,
                            max_new_tokens=tokens, on_text=on_text)


def burst(ex: Any, rows: int, k: int, tokens: int) -> tuple[float, float, list[str]]:
    """(tokens/s, the slowest first token in seconds, replies) of ``rows`` members at once."""
    def one(i: int) -> tuple[int, float, str]:
        t0, first = time.perf_counter(), []
        res = ex.execute(request(1000 * k + i, tokens,
                                 lambda p: first or first.append(time.perf_counter())))
        return res.completion_tokens, first[0] - t0, res.text
    with ThreadPoolExecutor(rows) as pool:
        t0 = time.perf_counter()
        outs = list(pool.map(one, range(rows)))
        wall = time.perf_counter() - t0
    return sum(o[0] for o in outs) / wall, max(o[1] for o in outs), [o[2] for o in outs]


def measure(ex: Any, split: Split, args: Any, label: str, k: int) -> list[str]:
    """One burst with the split recorded; its figures printed; its replies."""
    split.ms.clear()
    split.steps, split.recording = 0, True
    rate, slowest, texts = burst(ex, args.rows, k, args.tokens)
    split.recording = False
    steps_n = max(split.steps, 1)
    parts = ", ".join(f"{name} {split.ms[name] / steps_n:.1f}"
                      for name in ("step", "linear layers", "attention", "K/V writes"))
    print(f"{label}{args.rows} members at once: {rate:.1f} tok/s, slowest first token "
          f"{slowest * 1000:.0f} ms; per step of {args.rows} rows ({split.steps}), ms: {parts}")
    return texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--bursts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--ab", action="store_true", help="alternate shared heads on and off")
    args = ap.parse_args()
    split = Split(args.rows)
    split.install()
    adapter = load_adapter(model_path())
    adapter.lean._attend = split.timed("attention", adapter.lean._attend)
    shared_attention.attend = split.timed("attention", shared_attention.attend)
    ex = build_executor(adapter, batch_max=max(8, args.rows), l2_enabled=False,
                        batch_prefill_pace=1.5)
    try:
        for i in range(args.rows):
            ex.execute(request(i, 2))  # each member's segment cached, the tenant's shared
        burst(ex, args.rows, 0, 4)  # warm-up: every shape once
        print(f"prompt tokens of a turn: {ex.execute(request(999, 1)).prompt_tokens}")
        for k in range(1, args.bursts + 1):
            if not args.ab:
                measure(ex, split, args, "", k)
                continue
            texts = {}
            for share in (True, False) if k % 2 else (False, True):  # each first in turn
                steps.SHARE_HEADS = share
                texts[share] = measure(ex, split, args, "shared head: " if share else
                                       "a copy per row: ", k)
            steps.SHARE_HEADS = True
            same = sum(a == b for a, b in zip(texts[True], texts[False], strict=True))
            print(f"replies equal: {same}/{args.rows}")
    finally:
        ex.close()


if __name__ == "__main__":
    main()
