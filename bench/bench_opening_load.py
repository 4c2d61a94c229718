"""The next turn's opening (engine/turns.py) under back-to-back load: what its background
engine row costs when nobody pauses to read.

C client threads each hold one member's conversation of TURNS turns and send every next
message as soon as the reply arrives (the reply sent back, as a chat client does), through
``InjectionExecutor.execute`` with a batch engine; members have one memory each, so from the
third turn their reminder is part of the opening. Conditions, interleaved per repetition:
the opening prefilled after each reply and not (``prefill_opening`` on and off, whatever
the device's default).
Reported: completion tokens/s over the wall time, and the median time to first token of the
turns that continue a conversation (turn 2 on). Greedy: both conditions generate the same
tokens (checked). With a pause to read between turns the opening is off the critical path;
``bench_memory_depth.py``'s live column measures that case.

Run: ``.venv/bin/python bench/bench_opening_load.py [--clients 4] [--turns 6] [--reps 3]``
(``MODEL_PATH``/``MODEL_DEVICE`` for another copy of the model or device)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from bench_personalisation import model_path  # noqa: E402  (MODEL_PATH, or the prepared model)
from mdsection import machine, table  # noqa: E402

from injection import InjectionExecutor, TenantLRU, load_adapter  # noqa: E402
from injection.base import ExecutionRequest  # noqa: E402
from injection.engine.batch import BatchEngine  # noqa: E402
from injection.metrics import Metrics  # noqa: E402

MEMORIES = ["I am vegetarian.", "I live in Oslo.", "I have two cats.", "I am a nurse.",
            "I am learning Spanish.", "I run marathons.", "I hate cilantro.", "I drive a van."]
QUESTIONS = ["What should I do this weekend?", "Any ideas for dinner?", "And for dessert?",
             "How do I stay fit?", "What book should I read?", "Any tips for sleeping well?",
             "What should I pack for a trip?", "How can I save money?"]
TOKENS = 24


def conversation(ex: InjectionExecutor, member: int, turn_count: int, tag: str):
    """One member's chat, back to back: (ttft of turns 2.., completion tokens, replies)."""
    history, ttfts, tokens, replies = [], [], 0, []
    for t in range(turn_count):
        msgs = [*history, {"role": "user", "content": QUESTIONS[(member + t) % len(QUESTIONS)]}]
        res = ex.execute(ExecutionRequest("bench-opening", f"m{member}", msgs,
                                          MEMORIES[member % len(MEMORIES)], max_new_tokens=TOKENS,
                                          reuse_conversation=True,
                                          conversation_id=f"{tag}-{member}"))
        if t:
            ttfts.append(res.ttft_ms)
        tokens += res.completion_tokens
        replies.append(res.text)
        history = [*msgs, {"role": "assistant", "content": res.text}]
    return ttfts, tokens, replies


def run(ex: InjectionExecutor, clients: int, turn_count: int, tag: str):
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        out = list(pool.map(lambda m: conversation(ex, m, turn_count, tag), range(clients)))
    wall = time.perf_counter() - t0
    ex.turns.drain()
    ttfts = [x for o in out for x in o[0]]
    return sum(o[1] for o in out) / wall, statistics.median(ttfts), [o[2] for o in out]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    adapter = load_adapter(model_path(), device=os.environ.get("MODEL_DEVICE") or None)
    ex = InjectionExecutor(adapter, l1=TenantLRU(max_bytes=1024**3), l2=None, metrics=Metrics(),
                           engine=BatchEngine(adapter, max_batch=16),
                           conversation_max_bytes=512 * 1024**2)
    for m in range(args.clients):  # members' segments into L1
        ex.execute(ExecutionRequest("bench-opening", f"m{m}", [{"role": "user", "content": "Hi"}],
                                    MEMORIES[m % len(MEMORIES)], max_new_tokens=1))
    got: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    replies: dict[bool, list] = {}
    for rep in range(args.reps):
        for on in (False, True):
            ex.turns.prefill_opening = on
            tps, ttft, texts = run(ex, args.clients, args.turns, f"r{rep}-{on}")
            got[on].append((tps, ttft))
            replies.setdefault(on, texts)
            print(f"rep {rep} opening {'on' if on else 'off'}: {tps:.1f} tok/s, "
                  f"TTFT p50 {ttft:.1f} ms", flush=True)
    counters = ex.metrics.snapshot()["counters"]
    ex.close()
    same = replies[True] == replies[False]
    print("replies the same with and without the opening" if same else
          "REPLIES DIFFER with the opening (expected only with random weights on a GPU, where "
          "batch composition changes the arithmetic)")
    assert same or os.environ.get("MODEL_PATH"), "greedy replies differ with the opening"
    print(f"openings prefilled {counters.get('conv_extended', 0)}, skipped "
          f"{counters.get('conv_opening_skipped', 0)} (engine busy or the chat moved on)")
    med = {on: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
           for on, v in got.items()}
    print(f"\n{args.clients} clients x {args.turns} turns, back to back, {TOKENS} tokens a "
          f"reply, medians of {args.reps}; {machine()}, torch threads {torch.get_num_threads()}\n")
    print(table(["opening", "tokens/s", "vs off", "TTFT p50 ms (turns 2+)", "vs off"], [
        [name, f"{med[on][0]:.1f}", f"{med[on][0] / med[False][0]:.2f}x", f"{med[on][1]:.1f}",
         f"{med[on][1] / med[False][1]:.2f}x"] for name, on in (("off", False), ("on", True))]))


if __name__ == "__main__":
    main()
