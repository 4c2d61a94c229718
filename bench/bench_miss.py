"""Engine latency on the paths issue 19 names: a cache miss, and a long prompt arriving
while other rows decode. Real model, the worker's executor (batch engine), one run.

Part 1, miss TTFT (``max_new_tokens=1``, conditions interleaved per round, medians): the
same member turn as

* ``in-prompt``: nothing injected, instructions + preference as the system message
  (the baseline every ratio is against);
* ``miss, two passes``: the member segment computed on its own, then the prompt
  prefilled after it (the engine before the one-pass miss; ``one_pass=False``);
* ``miss, one pass``: the segment prefilled by the request itself, before its prompt,
  and its slice stored;
* ``L1 hit``: the segment from the process's L1.

for a member without tenant instructions (the whole turn is the member's segment) and
one whose tenant's ~160-token instructions are warm (only the member segment misses).

Part 2, a long prompt while rows decode: ``ROWS`` greedy streams decode; after they have
made a few steps a ``LONG``-token prompt arrives. Inter-token gaps of the running
streams while the long prompt is prefilled (chunked, ``prefill_chunk``) against the
median gap of the same streams without it: unchunked, fixed chunks, and paced chunks
(``BatchEngine(pace=...)``: a chunk sized to cost about ``pace`` decoding steps).

Part 3, a burst: ``ROWS`` members' requests arrive together at an idle engine; time to
first token with each row prefilled alone vs the rows prefilled in one forward
(``group_prefill``).

Run: ``.venv/bin/python bench/bench_miss.py [--write-docs]`` (``REPEATS``, default 9;
``ROWS`` 8, ``LONG`` 2000; ``MODEL_PATH`` any local HF chat model dir).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from bench_personalisation import model_path  # noqa: E402
from mdsection import machine, table, write_section  # noqa: E402

from injection import build_executor, load_adapter  # noqa: E402
from injection.base import ExecutionRequest, Tier  # noqa: E402
from injection.engine.batch import BatchEngine  # noqa: E402
from injection.metrics import Metrics  # noqa: E402

REPEATS = int(os.environ.get("REPEATS", "9"))
ROWS, LONG = int(os.environ.get("ROWS", "8")), int(os.environ.get("LONG", "2000"))
INSTR = ("You are the assistant of Northwind Travel, a travel agency for families and "
         "small groups. Recommend destinations, trains, hotels and activities. ") * 6
PREFS = ["I am vegetarian and I do not like spicy food.", "I love mountains and hiking.",
         "I travel with two small children and a dog.", "I hate flying; I prefer trains."]
Q = [{"role": "user", "content": "Where should I go on holiday this summer?"}]


def ms(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000.0, out


def miss_ttft(adapter, instructions: str) -> dict[str, float]:
    one = build_executor(adapter, batch_max=8, metrics=Metrics())
    two = build_executor(adapter, batch_max=8, metrics=Metrics())
    two.planner.one_pass = False  # a missing member segment computed apart
    samples: dict[str, list[float]] = {k: [] for k in
                                       ("in-prompt", "miss, two passes", "miss, one pass",
                                        "L1 hit")}
    try:
        for r in range(REPEATS + 1):
            pref = PREFS[r % len(PREFS)]
            base = ExecutionRequest("b", "u", Q, pref, max_new_tokens=1,
                                    instructions=instructions, reminder=False)
            context = "\n\n".join(p for p in (instructions, pref) if p)
            plain = dataclasses.replace(base, preference_text="", instructions="",
                                        messages=[{"role": "system", "content": context}, *Q])
            for ex in (one, two):  # a new member every round; the tenant segment warm
                ex.clear_l1()
                if instructions:
                    ex.warm("b", "warm", "", instructions)
            runs = [("in-prompt", one, plain), ("miss, two passes", two, base),
                    ("miss, one pass", one, base), ("L1 hit", one, base)]
            for name, ex, req in runs:
                t, res = ms(lambda ex=ex, req=req: ex.execute(req))
                want = Tier.L1 if name == "L1 hit" else (
                    Tier.NONE if name == "in-prompt" else Tier.COMPUTE)
                assert res.tier is want, (name, res.tier)
                if r:  # round 0 warms up
                    samples[name].append(t)
        assert one.metrics.get("computes_one_pass") > 0 and not two.metrics.get(
            "computes_one_pass")
    finally:
        one.close()
        two.close()
    return {k: statistics.median(v) for k, v in samples.items()}


def gaps(adapter, chunk: int, long_prompt: bool, pace: float = 0.0) -> tuple[list[float], float]:
    """Inter-token gaps (ms) of ROWS decoding streams while a LONG prompt arrives, and
    the long prompt's time to its first token (ms)."""
    eng = BatchEngine(adapter, max_batch=ROWS + 1, prefill_chunk=chunk, pace=pace)
    stamps: list[list[float]] = [[] for _ in range(ROWS)]
    started = threading.Event()
    ids = adapter.renderer.encode(adapter.render_chat(Q), first=True)

    def stream(i: int) -> None:
        def on_text(_piece: str, i=i) -> None:
            stamps[i].append(time.perf_counter())
            if i == 0 and len(stamps[0]) == 4:
                started.set()
        eng.run(None, 1.0, ids, 40, on_text=on_text)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(ROWS)]
    for t in threads:
        t.start()
    started.wait(600)
    window = [time.perf_counter(), None]
    if long_prompt:
        words = (" ".join(INSTR.split()) + " ") * 40
        long_ids = adapter.renderer.encode(words, first=True)[:LONG]
        eng.run(None, 1.0, long_ids, 1)
    window[1] = time.perf_counter()
    long_ms = (window[1] - window[0]) * 1000.0
    for t in threads:
        t.join(600)
    eng.close()
    out = []
    for s in stamps:
        for a, b in zip(s, s[1:], strict=False):
            if not long_prompt or (window[0] <= b and a <= window[1]):
                out.append((b - a) * 1000.0)
    return out, long_ms


def burst(adapter, group: int) -> tuple[float, float]:
    """ROWS members' requests arriving together at an idle engine (each with its own
    injected preference): median and last time to first token (ms)."""
    eng = BatchEngine(adapter, max_batch=ROWS, group_prefill=group, join_wait_ms=50)
    rows = []
    for i in range(ROWS):
        pref = PREFS[i % len(PREFS)] + f" My member number is {i}."
        parts = adapter.split_prompt(pref, Q)
        rows.append((adapter.compute_kv(parts.segment),
                     adapter.renderer.encode(parts.prompt, first=False)))
    firsts: list[float] = []
    t0 = time.perf_counter()

    def ask(kv, ids) -> None:
        out = eng.run(kv, 1.0, ids, 1)
        firsts.append((time.perf_counter() - t0) * 1000.0 if out else 0.0)

    threads = [threading.Thread(target=ask, args=row) for row in rows]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    grouped = eng.counters["grouped_rows"]
    eng.close()
    assert (grouped > 0) == (group > 1), grouped
    return statistics.median(firsts), max(firsts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--skip-gaps", action="store_true")
    args = ap.parse_args()
    path = model_path()
    adapter = load_adapter(path, device=os.environ.get("MODEL_DEVICE") or None)
    lines = ["## Engine latency: one-pass miss, and a long prompt arriving during decode", "",
             f"`.venv/bin/python bench/bench_miss.py --write-docs` — {machine()}; model "
             f"{path.name}, torch threads {torch.get_num_threads()}; REPEATS={REPEATS}, "
             f"medians.", "", "Time to first token of a member whose segment misses L1 and "
             "L2, against the same prompt with everything in the system message:", ""]
    rows = []
    for label, instr in (("no tenant instructions", ""),
                         (f"tenant instructions warm ({adapter.count_tokens(INSTR)} tokens)",
                          INSTR)):
        got = miss_ttft(adapter, instr)
        base = got["in-prompt"]
        rows.append([label, *(f"{v:.0f} ({v / base:.2f}x)" for v in got.values())])
        print(label, got, flush=True)
    lines.append(table(["member", "in-prompt ms", "miss, two passes", "miss, one pass",
                        "L1 hit"], rows))
    if not args.skip_gaps:
        calm, _ = gaps(adapter, 512, long_prompt=False)
        med = statistics.median(calm)
        lines += ["", f"{ROWS} greedy streams decoding; a {LONG}-token prompt arrives. "
                  "Inter-token gaps of the running streams while it is prefilled, against "
                  f"their median gap without it ({med:.0f} ms), and the long prompt's own "
                  "time to first token against an unchunked prefill:", ""]
        gap_rows, base_ttft = [], None
        conds = [("unchunked", 0, 0.0), ("chunks of 512", 512, 0.0),
                 ("chunks of 128", 128, 0.0), ("paced, pace 1.5 (cap 512, the default)", 512, 1.5),
                 ("paced, pace 1.0 (cap 512)", 512, 1.0)]
        for label, chunk, pace in conds:
            g, long_ms = gaps(adapter, chunk, long_prompt=True, pace=pace)
            g = sorted(g)
            base_ttft = base_ttft or long_ms
            p99 = g[min(len(g) - 1, int(0.99 * len(g)))]
            gap_rows.append([label, len(g), f"{statistics.median(g):.0f}", f"{p99:.0f}",
                             f"**{p99 / med:.1f}x**", f"{long_ms:.0f} ({long_ms / base_ttft:.2f}x)"])
            print(label, len(g), p99, long_ms, flush=True)
        lines.append(table(["prefill", "gaps", "median ms", "p99 ms", "p99 / calm median",
                            "long prompt TTFT ms"], gap_rows))
    lines += ["", f"A burst: {ROWS} members' requests (each with its own injected preference) "
              "arrive together at an idle engine (join wait 50 ms); time to first token, "
              f"medians of {max(3, REPEATS // 3)} bursts, alternating:", ""]
    got: dict[int, list] = {1: [], ROWS: []}
    for _ in range(max(3, REPEATS // 3)):
        for group in got:
            got[group].append(burst(adapter, group))
    base = statistics.median(m for m, _ in got[1])
    lines.append(table(["prefill", "TTFT p50 ms", "last first token ms", "p50 vs alone"], [
        [("alone (group 1)" if g == 1 else f"grouped (up to {g} rows)"),
         f"{statistics.median(m for m, _ in v):.0f}", f"{statistics.median(x for _, x in v):.0f}",
         f"{statistics.median(m for m, _ in v) / base:.2f}x"] for g, v in got.items()]))
    body = "\n".join(lines)
    print(body)
    if args.write_docs:
        write_section("miss", body)


if __name__ == "__main__":
    main()
