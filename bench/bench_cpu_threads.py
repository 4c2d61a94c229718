"""What one multi-threaded torch thread per process saves a member, through the API.

    .venv/bin/python bench/bench_cpu_threads.py [--reps N] [--write-docs]

``injection/model/cpu_threads.py``: on a CPU the model is loaded on a thread that ends and
only the batch engine's scheduler thread computes on every core (``MODEL_CPU_THREADS=
engine``, the default), against every thread on every core as before (``shared``). The
stack of bench_guide_cost.py (its own embedded PostgreSQL + Redis, one ``celery worker
--pool threads``, the web under uvicorn, the real SmolLM2 model, platform defaults) is
started once per mode and rep, in the order engine, shared, shared, engine, ... (ABBA:
drift hits both alike), each with the same members: a preference (unguided by default)
and a standing instruction that is guided ("Always answer in French."). Per stack, warm,
then for each kind: ``/v1`` streamed at batch 1 (3 streams: first chunk, decode tok/s),
then its 8 members' first turns one after another and at once (``/api/chat``), all
greedy, 64 new tokens. Also counted: replies identical across modes (thread counts change
the order of float sums, which may flip a greedy pick).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bench_guide_cost as g  # sets VAR_DIR (var/bench-guide-cost) and Django up
from mdsection import machine, table, write_section

from tenants import actions

MODES = ("engine", "shared")
KINDS = {"preference": g.KINDS["preference"], "guided instruction": g.KINDS["guided instruction"]}
STREAMS = 3


def measure(model: Path, mode: str, keys: dict) -> dict:
    """One stack in ``mode``: per kind, streams and both bursts."""
    os.environ["MODEL_CPU_THREADS"] = mode
    procs, base, _ = g.start(model)
    try:
        for ks in keys.values():
            g.stream(base, ks[0], {})
            with ThreadPoolExecutor(len(ks)) as pool:
                list(pool.map(lambda k: g.warm(base, k), ks))
        out = {}
        for kind, ks in keys.items():
            out[kind] = {"streams": [g.stream(base, ks[0], {}) for _ in range(STREAMS)],
                         "seq": g.burst(base, ks, {}, together=False),
                         "conc": g.burst(base, ks, {}, together=True)}
        return out
    finally:
        g.stop(procs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2, help="ABBA pairs of stacks (default 2)")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    g.call_command("migrate", interactive=False, verbosity=0)
    model = Path(g.settings.MODEL_PATH)
    tenant = actions.do_create_tenant(f"bench-threads-{int(time.time())}")
    keys = {kind: [actions.do_create_api_token(actions.do_add_member(
        tenant, f"{tenant.slug}-{kind[:4]}{i}", preference=memory)) for i in range(g.BURST)]
        for kind, memory in KINDS.items()}
    runs: dict[str, list] = {m: [] for m in MODES}
    t0, load = time.monotonic(), [os.getloadavg()[0]]
    for rep in range(args.reps):
        for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
            runs[mode].append(measure(model, mode, keys))
            load.append(os.getloadavg()[0])
            print(f"rep {rep + 1} {mode} done after {time.monotonic() - t0:.0f} s", flush=True)
    raw = Path(os.environ["VAR_DIR"]) / "cpu_threads_last_run.json"
    raw.write_text(json.dumps(runs))
    report(runs, args, load, model.name)


def figures(runs: list[dict], kind: str) -> dict:
    med = statistics.median
    streams = [s for r in runs for s in r[kind]["streams"]]
    return {"ttft": med(s["ttft"] for s in streams) * 1000,
            "rate": med(s["rate"] for s in streams),
            "seq": med(r[kind]["seq"]["wall"] for r in runs),
            "conc": med(r[kind]["conc"]["wall"] for r in runs),
            "max_ttft": med(max(x["ttft_ms"] for x in r[kind]["conc"]["replies"]) for r in runs)}


def texts(run: dict, kind: str) -> list[str]:
    return ([s["text"] for s in run[kind]["streams"]]
            + [x["text"] for b in ("seq", "conc") for x in run[kind][b]["replies"]])


def report(runs: dict, args, load: list[float], model_name: str) -> None:
    rows, lines = [], []
    for kind in KINDS:
        f = {m: figures(runs[m], kind) for m in MODES}
        for m in MODES:
            x = f[m]
            rows.append([kind, m, f"{x['ttft']:.0f}", f"{x['rate']:.1f}", f"{x['seq']:.1f}",
                         f"{x['conc']:.1f}", f"{x['seq'] / x['conc']:.2f}x",
                         f"{x['max_ttft']:.0f}"])
        e, s = f["engine"], f["shared"]
        ours, theirs = texts(runs["engine"][0], kind), texts(runs["shared"][0], kind)
        same = sum(a == b for a, b in zip(ours, theirs, strict=True))
        lines.append(
            f"- {kind}: engine against shared — first token **{e['ttft'] / s['ttft']:.2f}x**, "
            f"batch-1 decode **{e['rate'] / s['rate']:.2f}x**, 8 one after another "
            f"**{e['seq'] / s['seq']:.2f}x** the time, 8 at once **{e['conc'] / s['conc']:.2f}x**"
            f"; replies identical across modes {same}/{len(ours)}.")
    body = "\n".join([  # the heading and intro stand above the section's markers
        f"`.venv/bin/python bench/bench_cpu_threads.py --reps {args.reps}` — {machine()}, "
        f"1-min load {min(load):.1f}–{max(load):.1f}; model {model_name}; one `celery worker "
        "--pool threads` and the web under uvicorn per stack, platform defaults but "
        f"`MODEL_CPU_THREADS`; stacks in ABBA order, {args.reps} per mode; first turns, memory "
        f"warm, {g.TOKENS} new tokens, greedy; medians of {STREAMS * args.reps} streams and "
        f"{args.reps} bursts per row.",
        "",
        table(["memory", "MODEL_CPU_THREADS", "/v1 b1 first token ms", "/v1 b1 decode tok/s",
               "8 one after another s", "8 at once s", "ratio", "burst max TTFT ms"], rows),
        "",
        *lines,
    ])
    print(body)
    if args.write_docs:
        write_section("cpu-threads", body)


if __name__ == "__main__":
    main()
