"""Members' leans at tenant scale (injection/engine/guidance/probe.py).

One tenant with ~900-token instructions (bench_tenant_scale.py's) and MEMBERS members whose
memory asks for a language, written as people write them (short, with other facts, long),
served by two workers (two executors in this process: their own L1 and batch engine, one
embedded Redis as the shared L2), the real default model, greedy, first turns of 8 tokens:

1. each member's first chat, on worker A: it measures the member's lean (its probes);
2. each member's second chat (another question), on worker B: the lean from Redis;
3. a third, on A: the lean from L1;
4. the tenant's instructions edited (every entry of the tenant invalidated, as the platform
   does): a chat each on A, each measuring its lean again.

Reported as ratios measured in the same run: first-chat TTFT (measuring) against later
chats' (cached); the leans' bytes in each L1 and in Redis against MEMBERS x one lean's
tensors; where each round's leans came from; the probes' forward tokens per first chat.
Run: ``.venv/bin/python bench/bench_leans.py [--write-docs]`` (MEMBERS=200 by default).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import redis  # noqa: E402
from bench_tenant_scale import INSTRUCTIONS, model_path  # noqa: E402
from mdsection import machine, table, write_section  # noqa: E402

from injection import build_executor, load_adapter  # noqa: E402
from injection.base import ExecutionRequest  # noqa: E402
from injection.engine.guidance import probe  # noqa: E402
from injection.metrics import Metrics  # noqa: E402

MEMBERS = int(os.environ.get("MEMBERS", "200"))
TENANT, SECRET = "bench-leans", "bench-leans-secret-0123456789abcdef"
REDIS_DB = int(os.environ.get("BENCH_REDIS_DB", "12"))  # flushed before and after
LANGS = ["French", "Spanish", "German", "Italian", "Portuguese"]
PLACES = ["Lyon", "Seville", "Hamburg", "Turin", "Porto", "Geneva", "Valencia", "Munich"]
# memories as people write them: a bare ask, an ask with facts around it, a long note
FORMS = [
    "{lang} please.",
    "Always answer me in {lang}.",
    "I grew up near {place} and my English is shaky, so please reply in {lang}.",
    "I'm {n} years old, I cook for my two kids and I have a dog called Pepper. I would "
    "like every answer in {lang}, because that is what we speak at home.",
    "Some things about me: I live in {place}, I work night shifts at a hospital, I read "
    "a lot of crime novels and I am learning to play the piano. I am practising my {lang}, "
    "so write all your answers to me in {lang}, even when I write in English. Keep them "
    "short if you can: I read them on my phone on the bus.",
]
QUESTIONS = ["What should I cook tonight?", "How do I keep basil fresh?",
             "Plan a quiet Sunday for me.", "What is a good book for a long train ride?"]


def memory(i: int) -> str:
    return FORMS[i % len(FORMS)].format(lang=LANGS[i % len(LANGS)],
                                        place=PLACES[i % len(PLACES)], n=20 + i % 50)


def worker(adapter, client):
    ex = build_executor(adapter, batch_max=8, redis_client=client, signing_secret=SECRET,
                        metrics=Metrics())
    ex.l2.async_writes = False  # the next chat may land on the other worker at once
    return ex


def ask(ex, i: int, question: str, instructions: str):
    req = ExecutionRequest(TENANT, f"m{i}", [{"role": "user", "content": question}],
                           memory(i), instructions, max_new_tokens=8, reuse_conversation=False)
    return ex.execute(req)


def round_of(ex, question: str, instructions: str) -> list:
    return [ask(ex, i, question, instructions) for i in range(MEMBERS)]


def lean_bytes(ex) -> tuple[int, int]:
    row = ex.stats()["kinds"]["lean"]
    return row["entries"], row["bytes"]


def redis_lean_bytes(client, one: int) -> tuple[int, int]:
    """Entries in Redis of a lean's size, and their bytes (names are signed, so they are told
    apart by size: a lean's two float16 vectors, ``one`` bytes, and a header; a segment of
    even one token is over twice that)."""
    sizes = [n for n in (client.memory_usage(k) or 0 for k in client.scan_iter(count=500))
             if one <= n < one + 65536]
    return len(sizes), sum(sizes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    from config import embedded

    url = urlparse(embedded.cache_redis_url())
    client = redis.Redis.from_url(urlunparse(url._replace(path=f"/{REDIS_DB}")), socket_timeout=30)
    client.flushdb()
    adapter = load_adapter(str(model_path()), device=os.environ.get("DEVICE") or None)
    a, b = worker(adapter, client), worker(adapter, client)
    vocab = adapter.model.get_output_embeddings().weight.shape[0]
    one = 2 * vocab * 2  # a lean: two float16 [V] vectors
    t0 = time.perf_counter()
    try:
        warm = ExecutionRequest(TENANT, "warm", [{"role": "user", "content": "Hello"}],
                                "I like tea.", INSTRUCTIONS, max_new_tokens=8)
        a.execute(warm)  # the tenant's segment and the kernels, not measured
        a.invalidate(TENANT, "warm")
        rounds = {"1. first chat, worker A": round_of(a, QUESTIONS[0], INSTRUCTIONS),
                  "2. second chat, worker B": round_of(b, QUESTIONS[1], INSTRUCTIONS),
                  "3. third chat, worker A": round_of(a, QUESTIONS[2], INSTRUCTIONS)}
        l1 = [lean_bytes(ex) for ex in (a, b)]
        in_redis = redis_lean_bytes(client, one)
        for ex in (a, b):  # the instructions edited: the platform invalidates the tenant
            ex.invalidate(TENANT)
        edited = INSTRUCTIONS + " Mention our weekly market on Saturdays when it helps."
        rounds["4. after an instructions edit, worker A"] = round_of(a, QUESTIONS[3], edited)
    finally:
        a.close()
        b.close()
        client.flushdb()
    seconds = time.perf_counter() - t0
    # the ideal: one lean per member whose first turns lean (a memory guidance serves)
    ideal = one * sum(r.extra.get("lean") == "probe" for r in rounds["1. first chat, worker A"])
    text = report(rounds, l1, in_redis, ideal, seconds)
    print(text)
    if args.write_docs:
        write_section("leans", text)


def report(rounds: dict, l1: list, in_redis: tuple[int, int], ideal: int, seconds: float) -> str:
    cached = statistics.median(r.ttft_ms for k in list(rounds)[1:3] for r in rounds[k]
                               if r.extra.get("lean"))
    rows = []
    for name, res in rounds.items():
        where = Counter(r.extra.get("lean", "none") for r in res)
        leaned = [r for r in res if r.extra.get("lean")] or res
        ttft = statistics.median(r.ttft_ms for r in leaned)
        probe_tokens = statistics.fmean(r.guide_prefill_tokens + r.guide_decode_tokens
                                        for r in leaned)
        rows.append([name, ", ".join(f"{k} {v}" for k, v in sorted(where.items())),
                     f"{ttft:.0f}", f"**{ttft / cached:.2f}x**", f"{probe_tokens:.0f}"])
    lean_l1 = ", ".join(f"{n} entries {b / 2**20:.1f} MiB ({b / ideal:.2f}x)" for n, b in l1)
    return "\n".join([
        "## Members' leans at tenant scale",
        f"`.venv/bin/python bench/bench_leans.py` — {machine()}; model "
        f"{Path(str(model_path())).name}; {MEMBERS} members of one tenant (~900-token "
        f"instructions), memories asking for one of {len(LANGS)} languages in {len(FORMS)} "
        f"forms; two workers (L1 each, one Redis), 8-token first turns one after another; "
        f"{len(probe.PROBES)} probes of {probe.PROBE_STEPS} steps per lean; {seconds:.0f} s.",
        "",
        table(["round", "lean from (chats)", "TTFT p50 ms (chats with a lean)", "vs cached chats",
               "guide tokens / chat with a lean"], rows),
        "",
        f"- leans in L1 after round 3 (A, B): {lean_l1} of the leaning members x one lean's "
        f"tensors ({ideal / 2**20:.1f} MiB); in Redis {in_redis[0]} entries {in_redis[1] / 2**20:.1f} MiB "
        f"(**{in_redis[1] / ideal:.2f}x**, with their headers and Redis's own).",
    ])


if __name__ == "__main__":
    main()
