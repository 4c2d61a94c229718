"""Throughput and time to first token: the batch engine vs one request at a time, and
conversation K/V reuse vs a full prefill every turn.

Part 1 (concurrency 1, 2, 4, 8, 16, interleaved per level): C client threads send chat
requests back to back through ``InjectionExecutor.execute`` (members with different
preferences, each preference K/V already in L1). ``batch-1`` is today's worker without
the engine: one ``generate()`` at a time behind a lock (the solo pool); ``batching`` is
the executor with a :class:`BatchEngine` (up to 16 rows). Tokens/s = completion tokens
/ wall time; time to first token per request = waiting for the model + the engine's
first token, p50/p95. Greedy, so both conditions generate the same tokens.

Part 2: one conversation per member over TURNS turns (the history grows every turn);
time to first token at turns 1, 5, 10, 20 with reuse (the last turn's K/V continued)
and without (full prefill), the same messages for both, interleaved per turn.

Part 0 (``--decode``; ``--decode-only`` runs just this part): decode tokens/s of the
engine at batch 1 against the ceiling measured in the same run (read bandwidth of a
weights-sized buffer / bytes of weights), and at concurrency 8 and 16 against batch 1,
preallocated K/V cache vs reallocating every step (``decode_speed.py``).

Run: ``.venv/bin/python bench/bench_throughput.py [--quick] [--decode[-only]] [--write-docs]``
(``MODEL_PATH``: any local HF chat model dir; default: the prepared SmolLM2-135M-Instruct;
``MODEL_DEVICE`` e.g. ``cuda``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import decode_speed  # noqa: E402
import torch  # noqa: E402
from bench_personalisation import model_path  # noqa: E402
from mdsection import machine, table, write_section  # noqa: E402

from injection import build_executor, load_adapter  # noqa: E402
from injection.base import ExecutionRequest  # noqa: E402
from injection.metrics import Metrics  # noqa: E402

PREFS = ["I am vegetarian and I do not like spicy food.", "Answer like a pirate.",
         "I live in Norway, I love skiing and I have two dogs.", "Keep every answer short.",
         "I am a beginner programmer learning Python.", "I am allergic to nuts.",
         "I prefer trains to planes when I travel.", "Reply in a formal tone."]
QUESTIONS = ["Suggest a dinner recipe for me.", "What should I do this weekend?",
             "Tell me a fun fact.", "How do I start running?", "Recommend a book.",
             "Plan a day trip for me.", "What is a good hobby?", "Explain what a loop is."]
TOKENS = int(os.environ.get("MAX_NEW_TOKENS", "40"))
TURN_TOKENS = 24


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def request(i: int) -> ExecutionRequest:
    q = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
    return ExecutionRequest("bench", f"m{i % len(PREFS)}", q, PREFS[i % len(PREFS)],
                            max_new_tokens=TOKENS, reuse_conversation=False)


def run_level(executor, concurrency: int, n: int, lock: threading.Lock | None) -> dict:
    """``n`` requests from ``concurrency`` client threads; tokens/s and TTFT figures."""
    def one(i: int) -> tuple[int, float]:
        asked = time.perf_counter()
        if lock is None:
            res = executor.execute(request(i))
            return res.completion_tokens, res.ttft_ms
        with lock:  # batch-1: the worker runs one request at a time
            waited = (time.perf_counter() - asked) * 1000.0
            res = executor.execute(request(i))
        return res.completion_tokens, waited + res.ttft_ms

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, range(n)))
    wall = time.perf_counter() - t0
    ttfts = [r[1] for r in results]
    return {"tps": sum(r[0] for r in results) / wall, "p50": statistics.median(ttfts),
            "p95": pct(ttfts, 95), "tokens": sum(r[0] for r in results)}


def throughput(adapter, levels: list[int], per_level: int) -> dict:
    serial = build_executor(adapter, metrics=Metrics())
    batched = build_executor(adapter, batch_max=16, metrics=Metrics())
    for ex in (serial, batched):  # preference K/V in L1, code paths warm
        for i in range(len(PREFS)):
            ex.execute(request(i))
    lock = threading.Lock()
    figures = {}
    for k, c in enumerate(levels):
        n = max(per_level, 2 * c)
        order = [("batch-1", serial, lock), ("batching", batched, None)]
        for name, ex, lk in (order if k % 2 == 0 else order[::-1]):
            figures[(name, c)] = run_level(ex, c, n, lk)
            print(name, c, {k: round(v, 1) for k, v in figures[(name, c)].items()}, flush=True)
    batched.close()
    return figures


def conversation(adapter, turns: list[int], members: int) -> dict:
    """TTFT at ``turns`` with and without conversation reuse (same messages, interleaved)."""
    reuse = build_executor(adapter, batch_max=4, metrics=Metrics())
    full = build_executor(adapter, batch_max=4, metrics=Metrics(), conversation_max_bytes=0)
    out: dict[tuple[str, int], list[float]] = {}
    for m in range(members):
        for ex in (reuse, full):  # turn 1 finds the preference K/V in L1, as later turns do
            ex.warm("bench", f"c{m}", PREFS[m % len(PREFS)])
        history: list[dict] = []
        for t in range(1, turns[-1] + 1):
            msgs = [*history, {"role": "user", "content": QUESTIONS[(t + m) % len(QUESTIONS)]}]
            req = ExecutionRequest("bench", f"c{m}", msgs, PREFS[m % len(PREFS)],
                                   max_new_tokens=TURN_TOKENS, history_token_budget=4096)
            b = reuse.execute(req)  # every turn: it keeps the conversation's K/V
            history = [*msgs, {"role": "assistant", "content": b.text}]
            if t not in turns:
                continue
            a = full.execute(req)
            assert a.text == b.text, (t, a.text, b.text)  # reuse changes no reply
            context = a.prompt_tokens + a.kv_tokens
            for name, v in (("full prefill", a.ttft_ms), ("reuse", b.ttft_ms),
                            ("context", context),
                            ("prefilled", context - max(b.reused_tokens, b.kv_tokens))):
                out.setdefault((name, t), []).append(v)
    reuse.close()
    full.close()
    return {**{k: statistics.median(v) for k, v in out.items()}, "members": members}


def report(figures: dict, conv: dict, levels: list[int], turns: list[int], args,
           label: str) -> str:
    rows = []
    for c in levels:
        s, b = figures[("batch-1", c)], figures[("batching", c)]
        rows.append([c, f"{s['tps']:.1f}", f"{b['tps']:.1f}", f"**{b['tps'] / s['tps']:.2f}x**",
                     f"{s['p50']:.0f} / {s['p95']:.0f}", f"{b['p50']:.0f} / {b['p95']:.0f}",
                     f"{b['p50'] / s['p50']:.2f}x"])
    conv_rows = [[t, f"{conv[('context', t)]:.0f}", f"{conv[('prefilled', t)]:.0f}",
                  f"{conv[('full prefill', t)]:.0f}", f"{conv[('reuse', t)]:.0f}",
                  f"{conv[('reuse', t)] / conv[('reuse', turns[0])]:.2f}x",
                  f"{conv[('full prefill', t)] / conv[('full prefill', turns[0])]:.2f}x"]
                 for t in turns]
    cmd = f"`.venv/bin/python bench/bench_throughput.py{' --quick' if args.quick else ''}`"
    return "\n".join([
        "### Continuous batching and conversation K/V reuse",
        "",
        f"{cmd} — {machine()}; {label}; {TOKENS} new tokens per request, greedy, "
        "preference K/V on L1 hits; one run, the two conditions interleaved per level.",
        "",
        table(["concurrency", "batch-1 tok/s", "batching tok/s", "throughput ratio",
               "batch-1 TTFT p50/p95 ms", "batching TTFT p50/p95 ms", "TTFT p50 ratio"], rows),
        "",
        f"Conversation reuse: time to first token per turn ({TURN_TOKENS}-token replies, "
        f"median over {conv['members']} conversations of different members; the same "
        "messages with and without reuse, and the replies are asserted equal):",
        "",
        table(["turn", "tokens in context", "tokens prefilled with reuse",
               "full prefill TTFT ms", "reuse TTFT ms", "reuse vs its turn 1",
               "full prefill vs its turn 1"], conv_rows),
        "",
        "With reuse a turn prefills only what follows the previous turn's K/V (the end of "
        "the last reply and the new user turn); turn 1 prefills its user turn after the "
        "cached system turn. The rest of the growth is attention over the longer context.",
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--decode", action="store_true", help="also decode vs ceiling")
    parser.add_argument("--decode-only", action="store_true")
    args = parser.parse_args()
    levels = [1, 2, 4, 8] if args.quick else [1, 2, 4, 8, 16]
    turns = [1, 5, 10] if args.quick else [1, 5, 10, 20]
    device = os.environ.get("MODEL_DEVICE") or None
    path = model_path()
    adapter, label = load_adapter(path, device=device), f"model {path.name}"
    if args.decode or args.decode_only:
        levels_d = [1, 8, 16]
        lines = decode_speed.report(decode_speed.measure(adapter, levels_d), levels_d)
        body = "\n".join([f"`.venv/bin/python bench/bench_throughput.py --decode-only` — "
                          f"{machine()}; {label}; torch threads {torch.get_num_threads()}.",
                          "", *lines])
        print(body)
        if args.decode_only:
            if args.write_docs:
                write_section("decode-speed", body)
            return
    figures = throughput(adapter, levels, per_level=4 if args.quick else 8)
    conv = conversation(adapter, turns, members=1 if args.quick else 5)
    body = report(figures, conv, levels, turns, args, label)
    print(body)
    if args.write_docs:
        write_section("throughput", body)


if __name__ == "__main__":
    main()
