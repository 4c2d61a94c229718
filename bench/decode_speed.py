"""Decode speed of the batch engine against the machine's ceiling, measured in one run.

Ceiling: decoding one token reads every weight once, so batch-1 decode can go no faster
than (read bandwidth) / (bytes of weights). The bandwidth is measured here, on a buffer
the size of the weights (``torch.sum`` over it, best of several reads, torch's threads).

Engine: R rows (concurrency) each generate ``TOKENS`` tokens after a short prompt through
a :class:`BatchEngine`; decode tokens/s = R * (TOKENS - 1) / (wall time - the time of
the same rows generating 1 token), so prefill is left out. ``preallocated`` is the K/V
cache written in place (``batchcache``), ``realloc`` reallocates every step as
``DynamicCache``'s ``cat`` did; the two are interleaved per level.

Used by ``bench_throughput.py --decode``.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Any

import torch

from injection.engine.batch import BatchEngine

TOKENS = int(os.environ.get("DECODE_TOKENS", "64"))
REPEATS = int(os.environ.get("DECODE_REPEATS", "3"))
PROMPT = [{"role": "user", "content": "Tell me a long story about a dog who learns to ski."}]


def weight_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def read_bandwidth(nbytes: int, reads: int = 12) -> float:
    """Bytes/s reading a weights-sized buffer once (best of ``reads``)."""
    buf = torch.ones(nbytes // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(reads):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def _rows(engine: BatchEngine, prompt: str, rows: int, tokens: int) -> float:
    """Wall seconds for ``rows`` concurrent greedy generations of ``tokens`` tokens."""
    out: list[Any] = []

    def one() -> None:
        out.append(engine.generate(prompt, None, 1.0, tokens, stop=()))

    threads = [threading.Thread(target=one) for _ in range(rows)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    assert all(len(o.token_ids) == tokens for o in out), "a row stopped early"
    return wall


def decode_rate(engine: BatchEngine, prompt: str, rows: int, repeats: int) -> float:
    """Decode tokens/s of ``rows`` rows (median of ``repeats``; prefill subtracted)."""
    rates = []
    for _ in range(repeats):
        first = _rows(engine, prompt, rows, 1)
        full = _rows(engine, prompt, rows, TOKENS)
        rates.append(rows * (TOKENS - 1) / max(full - first, 1e-9))
    return statistics.median(rates)


def measure(adapter: Any, levels: list[int], repeats: int = REPEATS) -> dict:
    """Ceiling and decode tokens/s per (cache kind, concurrency), interleaved."""
    prompt = adapter.render_chat(PROMPT)
    engines = {"preallocated": BatchEngine(adapter, max_batch=max(levels), join_wait_ms=20),
               "realloc": BatchEngine(adapter, max_batch=max(levels), join_wait_ms=20,
                                      preallocate=False)}
    try:
        for eng in engines.values():
            eng._eos = set()  # no end of sequence: every row runs TOKENS steps
            decode_rate(eng, prompt, 2, 1)  # warm
        figures: dict[Any, float] = {}
        nbytes = weight_bytes(adapter.model)
        figures["weight_bytes"] = nbytes
        figures["bandwidth"] = read_bandwidth(nbytes)
        for k, rows in enumerate(levels):
            names = list(engines) if k % 2 == 0 else list(engines)[::-1]
            for name in names:
                figures[(name, rows)] = decode_rate(engines[name], prompt, rows, repeats)
                print(f"decode {name} rows={rows}: {figures[(name, rows)]:.1f} tok/s", flush=True)
        figures["bandwidth_after"] = read_bandwidth(nbytes)
    finally:
        for eng in engines.values():
            eng.close()
    return figures


def report(f: dict, levels: list[int]) -> list[str]:
    bw = (f["bandwidth"] + f["bandwidth_after"]) / 2
    ceiling = bw / f["weight_bytes"]
    rows = []
    for n in levels:
        p, r = f[("preallocated", n)], f[("realloc", n)]
        rows.append([n, f"{r:.1f}", f"{p:.1f}", f"{p / r:.2f}x",
                     f"{r / f[('realloc', levels[0])]:.2f}x",
                     f"**{p / f[('preallocated', levels[0])]:.2f}x**", f"{p / ceiling:.2f}x"])
    head = (f"Weights {f['weight_bytes'] / 2**20:.0f} MiB read at {bw / 2**30:.1f} GiB/s "
            f"(mean of a read before and after the runs: {f['bandwidth'] / 2**30:.1f} and "
            f"{f['bandwidth_after'] / 2**30:.1f} GiB/s) = ceiling **{ceiling:.1f} tok/s** "
            f"at batch 1; decode after a short prompt, {TOKENS} tokens per row, greedy, "
            f"prefill subtracted, median of {REPEATS}.")
    return [head, "", "| rows | realloc tok/s | preallocated tok/s | preallocated/realloc | "
            "realloc vs its batch-1 | preallocated vs its batch-1 | preallocated vs ceiling |",
            "|---|---|---|---|---|---|---|",
            *("| " + " | ".join(str(c) for c in r) + " |" for r in rows)]
