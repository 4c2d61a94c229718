"""Where the batch engine's time goes, inside a worker-like executor (no servers).

The executor is built as the worker builds it (``build_executor``: batch engine of 8, the
worker's prefill settings, conversation reuse; no L2), on the prepared SmolLM2 model
(``MODEL_PATH`` for another). Members have one preference each (bench/vs_peer_workloads),
warmed first; then, greedy and streamed to a callback:

* ``burst``: 8 members at once, ``TOKENS`` tokens each: wall time, tokens/s;
* ``ttft``: a warm member alone, request to first streamed piece (median);
* the scheduler thread's time split per phase by timers around the engine's methods
  (``_decode``: a step, its forward and its ``_advance``; ``_admit``: prefills, and the
  first token's ``_advance``; ``_run_forwards``: forwards of no row);
* ``--cprofile``: cProfile of the scheduler thread over the bursts (top functions);
* ``--ops``: torch.profiler over decoding steps of 8 rows (1 with ``--decode1``; top
  operators, self time);
* ``--profile-ttft``: cProfile of the warm batch-1 requests (caller and scheduler), then stop;
* ``--decode1 N``: a warm member alone, N tokens: ms a token, a step's forward share; stop;
* ``--ab-lean``: the lean decoding step (``injection/model/lean_step.py``) against the
  model's own forward, alternated ``--bursts`` times: batch-1 decode and 8 at once; stop.

Run: ``.venv/bin/python bench/profile_engine_step.py [--bursts 3] [--cprofile] [--ops]``.
Figures from a shared machine compare only within one run.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from bench_personalisation import model_path  # noqa: E402
from vs_peer_workloads import NAMES, PREFS, QUESTIONS  # noqa: E402

from injection import build_executor, load_adapter  # noqa: E402
from injection.base import ExecutionRequest  # noqa: E402
from injection.engine import batch as batch_mod  # noqa: E402

TOKENS = 48
PHASES = ("_decode", "_admit", "_run_forwards", "_advance")


class Probe:
    """Timers (and optionally cProfile / torch.profiler) around the engine's phases."""

    def __init__(self, cprofile: bool, ops: bool) -> None:
        self.ms: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.forward_ms = 0.0
        self.prof = cProfile.Profile() if cprofile else None
        self.ops = ops
        self.ops_rows = 8  # the steps --ops profiles: of 8 rows (1 with --decode1)
        self.op_ms: dict[str, float] = defaultdict(float)
        self.op_steps = 0
        self.on = False

    def install(self) -> None:
        cls = batch_mod.BatchEngine
        for name in PHASES:
            setattr(cls, name, self._wrap(name, getattr(cls, name)))
        orig = batch_mod.steps.decode

        def decode(*a: Any, **k: Any) -> torch.Tensor:
            t0 = time.perf_counter()
            if self.on and self.ops and len(a[2]) == self.ops_rows:
                out = self._ops(orig, a, k)
            else:
                out = orig(*a, **k)
            if self.on:
                self.forward_ms += (time.perf_counter() - t0) * 1000.0
            return out
        batch_mod.steps.decode = decode

    def _wrap(self, name: str, fn: Any) -> Any:
        def run(engine: Any, *a: Any, **k: Any) -> Any:
            if not self.on:
                return fn(engine, *a, **k)
            t0 = time.perf_counter()
            try:
                if self.prof is not None and name in ("_decode", "_admit", "_run_forwards"):
                    return self.prof.runcall(fn, engine, *a, **k)
                return fn(engine, *a, **k)
            finally:
                self.ms[name] += (time.perf_counter() - t0) * 1000.0
                self.calls[name] += 1
        return run

    def _ops(self, orig: Any, a: Any, k: Any) -> torch.Tensor:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as p:
            out = orig(*a, **k)
        for e in p.key_averages():
            self.op_ms[e.key] += e.self_cpu_time_total / 1000.0
        self.op_steps += 1
        return out


def request(i: int, on_text: Any, tokens: int) -> ExecutionRequest:
    pref = f"{PREFS[i % len(PREFS)]} My name is {NAMES[i % len(NAMES)]}{i}."
    q = [{"role": "user", "content": f"Question {i}: {QUESTIONS[i % len(QUESTIONS)]}"}]
    return ExecutionRequest("t1", f"m{i}", q, pref, max_new_tokens=tokens, on_text=on_text)


def one(executor: Any, i: int, tokens: int) -> tuple[int, float, str]:
    """(completion tokens, ms to the first streamed piece, text)."""
    t0, first = time.perf_counter(), []

    def on_text(piece: str) -> None:
        if not first:
            first.append(time.perf_counter())
    res = executor.execute(request(i, on_text, tokens))
    return res.completion_tokens, (first[0] - t0) * 1000.0 if first else -1.0, res.text


def burst(executor: Any, members: list[int], tokens: int) -> tuple[float, int, list[str]]:
    with ThreadPoolExecutor(len(members)) as pool:
        t0 = time.perf_counter()
        outs = list(pool.map(lambda i: one(executor, i, tokens), members))
        wall = time.perf_counter() - t0
    return wall, sum(o[0] for o in outs), [o[2] for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bursts", type=int, default=3)
    ap.add_argument("--ttft", type=int, default=5)
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--ops", action="store_true")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--decode1", type=int, default=0, metavar="TOKENS",
                    help="batch-1 decode of a warm member (ms a token, the forward's share)")
    ap.add_argument("--ab-lean", action="store_true",
                    help="the lean decoding step against the model's forward, alternated")
    ap.add_argument("--profile-ttft", action="store_true",
                    help="cProfile the warm batch-1 requests (caller and scheduler), then stop")
    args = ap.parse_args()
    probe = Probe(args.cprofile, args.ops)
    probe.install()
    adapter = load_adapter(model_path())
    print("matmul:", adapter.matmul.summary() if adapter.matmul else None, flush=True)
    ex = build_executor(adapter, batch_max=8, l2_enabled=False, batch_prefill_pace=1.5)
    try:
        run(ex, probe, args)
    finally:
        ex.close()


def run(ex: Any, probe: Probe, args: Any) -> None:
    members = list(range(8))
    for i in members + [8]:
        ex.warm("t1", f"m{i}", request(i, None, 1).preference_text)
    burst(ex, members, 4)  # warm-up: every shape once
    probe.on = args.profile_ttft
    main_prof = cProfile.Profile() if args.profile_ttft else None
    ttfts = [(main_prof.runcall if main_prof else (lambda f, *a: f(*a)))(one, ex, 8, 1)[1]
             for _ in range(args.ttft)]
    if main_prof is not None:
        report(probe, main_prof, args.top, "ttft")
        return
    print(f"ttft warm member batch-1: median {statistics.median(ttfts):.1f} ms {ttfts}")
    if args.ab_lean:
        ab_lean(ex, probe, args)
        return
    if args.decode1:
        probe.ops_rows = 1
        decode_one(ex, probe, args.decode1)
        print_ops(probe, args.top)
        return
    probe.on = True
    walls, toks = [], 0
    for _ in range(args.bursts):
        wall, n, texts = burst(ex, members, TOKENS)
        walls.append(wall)
        toks += n
    probe.on = False
    total = sum(walls)
    print(f"burst 8x{TOKENS}: {toks / total:.1f} tok/s, walls {[round(w, 2) for w in walls]}")
    print(f"first reply: {texts[0]!r}")
    print("engine counters:", {k: v for k, v in ex.engine.stats().items() if v})
    steps = probe.calls["_decode"]
    print(f"scheduler ms over bursts (total {total * 1000:.0f} ms wall), {steps} steps:")
    for name in PHASES:
        print(f"  {name:14s} {probe.ms[name]:8.1f} ms  calls {probe.calls[name]}")
    print(f"  decode forward {probe.forward_ms:8.1f} ms  ({probe.forward_ms / max(steps, 1):.1f}"
          f" ms/step); _advance per call {probe.ms['_advance'] / max(probe.calls['_advance'], 1):.2f} ms")
    if probe.prof is not None:
        out = io.StringIO()
        pstats.Stats(probe.prof, stream=out).sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())
    print_ops(probe, args.top)


def ab_lean(ex: Any, probe: Probe, args: Any) -> None:
    """The decoding step's lean forward against the model's own, alternated: batch-1
    decode (``--decode1`` tokens, default 64) and 8 at once, ``--bursts`` rounds each."""
    adapter, lean = ex.engine.adapter, ex.engine.adapter.lean
    if lean is None:
        print("no lean step for this model: nothing to compare")
        return
    for _ in range(args.bursts):
        for name, step in (("model forward", None), ("lean step", lean)):
            adapter.lean = step
            print(f"[{name}]", end=" ")
            decode_one(ex, probe, args.decode1 or 64)
            wall, n, texts = burst(ex, list(range(8)), TOKENS)
            print(f"[{name}] 8 at once: {n / wall:.1f} tok/s; first reply {texts[0][:60]!r}")
    adapter.lean = lean


def print_ops(probe: Probe, top: int) -> None:
    if probe.op_steps:
        print(f"ops: self ms per {probe.ops_rows}-row step over {probe.op_steps} steps")
        for key, ms in sorted(probe.op_ms.items(), key=lambda kv: -kv[1])[:top]:
            print(f"  {ms / probe.op_steps:7.2f}  {key}")


def decode_one(ex: Any, probe: Probe, tokens: int) -> None:
    """A warm member alone, ``tokens`` tokens streamed: ms a token after the first piece,
    beside the scheduler's decode steps and their forwards (the engine's share)."""
    stamps: list[float] = []
    probe.ms.clear(), probe.calls.clear()
    probe.forward_ms, probe.on = 0.0, True
    res = ex.execute(request(8, lambda piece: stamps.append(time.perf_counter()), tokens))
    probe.on = False
    steps = max(probe.calls["_decode"], 1)
    span = (stamps[-1] - stamps[0]) * 1000.0 if len(stamps) > 1 else float("nan")
    print(f"batch-1 decode: {res.completion_tokens} tokens, {len(stamps)} pieces, "
          f"{span / max(len(stamps) - 1, 1):.1f} ms a piece after the first; "
          f"{probe.ms['_decode'] / steps:.1f} ms a decode step, of which forward "
          f"{probe.forward_ms / steps:.1f} ms ({steps} steps)")


def report(probe: Probe, caller: cProfile.Profile, top: int, what: str) -> None:
    print(f"{what}: scheduler phases {dict(probe.ms)}")
    for name, prof in (("caller", caller), ("scheduler", probe.prof)):
        if prof is None:
            continue
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
        print(f"--- {name} thread, cumulative ---", out.getvalue(), sep="\n")


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
