"""Requests sent at once against the same requests one after another, on the worker's executor.

    .venv/bin/python bench/bench_burst.py [--depths 0,8] [--reps 3] [--write-docs]

``ROWS`` (8) requests of bench/quality_cases.py, each a member's memory injected and
``depth`` unrelated exchanges of history before its question (bench/memory_cases.py; as
``/v1`` sends them, no conversation reuse), greedy, 64 new tokens: the wall time of the
``ROWS`` sent at once (threads, as the worker's task pool sends them to its batch engine)
against the same ``ROWS`` one after another, per prefill pacing: the worker's default
(``WORKER_PREFILL_PACE``) and none (pace 0). Conditions interleaved per rep; medians. The
replies are checked identical, alone and at once (greedy). Figures: docs/BENCHMARKS.md
"burst"; an earlier commit's figures come from running this file on its checkout.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import bench_quality as bq  # noqa: E402
from mdsection import machine, table, write_section  # noqa: E402
from quality_cases import CASES  # noqa: E402

ROWS, FIRST = 8, 10  # cases FIRST .. FIRST + ROWS


def timed(ex, budget: int, depth: int, at_once: bool) -> tuple[float, list[str], float]:
    """Wall seconds of the ROWS requests, their replies and the slowest first token (ms)."""
    def one(i: int):
        return ex.execute(bq.request(i, CASES[i], depth, 1, bq.CONDS["platform"], budget))

    t0 = time.perf_counter()
    if at_once:
        with ThreadPoolExecutor(ROWS) as pool:
            res = list(pool.map(one, range(FIRST, FIRST + ROWS)))
    else:
        res = [one(i) for i in range(FIRST, FIRST + ROWS)]
    return time.perf_counter() - t0, [r.text for r in res], max(r.ttft_ms for r in res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--depths", default="0,8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    from config import settings
    from injection import load_adapter
    from injection.model.gguf_import import prepare_model

    path = prepare_model(ROOT / "var" / "models" / "smollm2-135m-instruct")
    adapter = load_adapter(path, cpu_threads="engine")
    ex, budget = bq.worker_executor(adapter, ROWS, None)  # one engine: one scheduler thread
    paces = {"worker's default": settings.WORKER_PREFILL_PACE, "unpaced": 0.0}
    rows, same = [], True
    for depth in (int(d) for d in args.depths.split(",")):
        got: dict = {(k, o): [] for k in paces for o in (False, True)}
        texts_of: list[str] = []
        for rep in range(args.reps + 1):  # the first rep warms the caches: not counted
            for key in (list(got) if rep % 2 else list(reversed(got))):
                ex.engine.pacer.budget = paces[key[0]]
                secs, texts, slowest = timed(ex, budget, depth, key[1])
                got[key].append((secs, slowest))
                texts_of = texts_of or texts  # the depth's first replies: the reference
                same &= texts == texts_of
                print(depth, key, f"{secs:.2f} s", flush=True)
        for k, pace in paces.items():
            alone, burst = ([s for s, _ in got[(k, o)][1:]] for o in (False, True))
            a, b = statistics.median(alone), statistics.median(burst)
            slow = statistics.median(x for _, x in got[(k, True)][1:])
            rows.append([depth, f"{k} ({pace:g})", f"{a:.1f}", f"{b:.1f}", f"**{a / b:.2f}x**",
                         f"{slow:.0f}"])
    ex.close()
    body = "\n".join([
        "## Burst: requests sent at once against one after another (worker's executor)", "",
        f"`.venv/bin/python bench/bench_burst.py --depths {args.depths} --reps {args.reps}` — "
        f"{machine()}; model {path.name}; {ROWS} requests of bench/quality_cases.py, memory "
        "injected, greedy, 64 new tokens; medians of the reps. Replies identical at once and "
        f"alone, in every condition: {'yes' if same else 'NO'}.", "",
        table(["depth (exchanges)", "prefill pace", "one after another s", "at once s",
               "ratio", "slowest first token at once ms"], rows)])
    print(body)
    if args.write_docs:
        write_section("burst", body)


if __name__ == "__main__":
    main()
