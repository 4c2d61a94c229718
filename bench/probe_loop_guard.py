"""Where the loop guard could harm: replies whose form repeats by nature (code, JSON, tables,
numbered steps), each asked with the guard off and on, greedy, as the platform serves a
member with no memory, judged by a check of the form that does not look at repetition.

The guard (``injection/engine/decoding/loops.py``) bans any run of n tokens a reply already
holds. bench_quality's cases are prose, so they cannot show what that does to a Python
function (``    return``, ``self.`` come again and again) or a JSON object. Checks: Python
code that ``ast`` parses (the first fenced block, else the reply), a JSON value that
``json`` reads (the first ``{...}`` or ``[...]``), a markdown table whose rows have the
header's number of cells, numbered steps 1..k in order (k >= 3). A reply cut off by the token
limit fails the same way on both sides, so read the paired counts, not the shares alone.

``--cost``: instead, what the guard costs a decoding step: the batch engine alone, 1 and 8
rows of 64 greedy tokens after a short prompt, guard off and on alternated ``--reps`` times,
the median tokens/s of each (the rows' tokens over the wall time; on a quiet machine).

Run: ``.venv/bin/python bench/probe_loop_guard.py [--max-new-tokens 160] [--ngram 4]
[--cost [--reps 5]]`` (``MODEL_PATH`` for another model; prints one table).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_quality import load_model, worker_executor  # noqa: E402
from mdsection import table  # noqa: E402
from quality_stats import paired  # noqa: E402

CODE = [
    "Write a Python function that returns the factorial of n.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that counts the lines of a text file.",
    "Write a Python class for a bank account with deposit and withdraw methods.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python function that returns the first n Fibonacci numbers.",
    "Write a Python function that flattens a nested list.",
    "Write a Python script that prints the multiplication table from 1 to 5.",
    "Write a Python function that counts how often each word appears in a sentence.",
    "Write a Python function that returns the largest of three numbers.",
    "Write a Python function that converts Celsius to Fahrenheit and one for the reverse.",
    "Write a Python class Point with x and y and a method for the distance to another point.",
]
JSON = [
    "Give me a JSON object for a fictional person with the keys name, age and city. "
    "Reply with the JSON only.",
    "Return a JSON list of three fruits, each an object with name and colour. JSON only.",
    "Write a JSON object describing a book: title, author, year and a list of two genres. "
    "Only JSON, please.",
    "Give a JSON object with the keys monday, tuesday and wednesday, each a list of two "
    "tasks. Reply in JSON only.",
    "Output a JSON array of four cities, each an object with name and country. JSON only.",
    "Make a JSON object for a recipe: name, servings and a list of three ingredients. Only JSON.",
]
TABLE = [
    "Make a markdown table of three fruits with their colour and price.",
    "Make a markdown table of four planets with their order from the sun and their size.",
    "Show a markdown table of three programming languages, the year each appeared and its "
    "creator.",
    "Make a markdown table with the days Monday to Friday and one task for each.",
]
STEPS = [
    "List the steps to make a cup of tea, numbered 1, 2, 3 and so on.",
    "Give numbered steps to change a flat bicycle tyre.",
    "Give numbered steps to plant a tomato seedling.",
    "Give numbered steps to back up the photos on a phone.",
    "Give numbered steps to make a paper aeroplane.",
    "Give numbered steps to wash a wool jumper by hand.",
]
_FENCE = re.compile(r"```[a-zA-Z]*\n(.*?)(?:```|$)", re.S)


def python_ok(reply: str) -> bool:
    m = _FENCE.search(reply)
    try:
        ast.parse(m.group(1) if m else reply)
    except (SyntaxError, ValueError):
        return False
    return True


def json_ok(reply: str) -> bool:
    starts = [i for i in (reply.find("{"), reply.find("[")) if i >= 0]
    if not starts:
        return False
    try:
        json.JSONDecoder().raw_decode(reply[min(starts):])
    except ValueError:
        return False
    return True


def table_ok(reply: str) -> bool:
    rows = [ln.strip() for ln in reply.splitlines() if ln.strip().startswith("|")]
    return len(rows) >= 3 and len({ln.strip("|").count("|") for ln in rows}) == 1


def steps_ok(reply: str) -> bool:
    nums = [int(m) for m in re.findall(r"^\s*(\d+)[.)]", reply, re.M)]
    return len(nums) >= 3 and nums == list(range(1, len(nums) + 1))


KINDS = {"python code": (CODE, python_ok), "JSON": (JSON, json_ok),
         "markdown table": (TABLE, table_ok), "numbered steps": (STEPS, steps_ok)}


def cost(adapter, reps: int, ngram: int) -> None:
    """Decode tokens/s with the guard off and on (see module), alternated."""
    import statistics

    from injection.engine.batch import BatchEngine

    asks = [f"Tell me a long story about a {w} who learns to ski." for w in
            ("dog", "cat", "fox", "owl", "bear", "frog", "goat", "duck")]
    prompts = [adapter.renderer.encode(adapter.render_chat([{"role": "user", "content": a}]),
                                       first=True) for a in asks]
    eng = BatchEngine(adapter, max_batch=8)
    rates: dict[tuple[int, bool], list[float]] = {}
    try:
        for rep in range(reps):
            for rows in (1, 8):
                for guard in ((False, True) if rep % 2 else (True, False)):  # order alternated
                    kw = {"no_repeat": ngram} if guard else {}
                    t0 = time.perf_counter()
                    jobs = [eng.start(None, 1.0, p, 64, **kw) for p in prompts[:rows]]
                    n = sum(len(j.wait().token_ids) for j in jobs)
                    rates.setdefault((rows, guard), []).append(n / (time.perf_counter() - t0))
    finally:
        eng.close()
    rows_out = [[str(r), f"{statistics.median(rates[(r, False)]):.1f}",
                 f"{statistics.median(rates[(r, True)]):.1f}",
                 f"{statistics.median(rates[(r, True)]) / statistics.median(rates[(r, False)]):.3f}x"]
                for r in (1, 8)]
    print(f"`.venv/bin/python bench/probe_loop_guard.py --cost --reps {reps}` (run length "
          f"{ngram}, medians of {reps})\n")
    print(table(["rows at once", "tok/s, guard off", "tok/s, guard on", "on / off"], rows_out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--ngram", type=int, default=0, help="the guard's run length (0: the "
                    "model's, loops.NGRAM without a profile entry)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--show", action="store_true")
    ap.add_argument("--cost", action="store_true", help="decode tok/s, guard off and on")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    from injection.base import ExecutionRequest
    from injection.engine.decoding import loops

    if args.ngram:
        loops.NGRAM = args.ngram
    adapter, _ = load_model()
    if args.cost:
        return cost(adapter, args.reps, loops.NGRAM)
    ex, _ = worker_executor(adapter, args.workers)
    jobs = [(kind, q, guard) for kind, (qs, _) in KINDS.items() for q in qs
            for guard in (False, True)]

    def one(job):
        kind, q, guard = job
        req = ExecutionRequest("probe", f"u{hash(q) % 10**6}", [{"role": "user", "content": q}],
                               injection_enabled=False, loop_guard=guard,
                               max_new_tokens=args.max_new_tokens, reuse_conversation=False)
        return job, ex.execute(req).text

    t0 = time.time()
    try:
        with ThreadPoolExecutor(args.workers) as pool:
            replies = dict(pool.map(one, jobs))
    finally:
        ex.close()
    rows = []
    for kind, (qs, check) in KINDS.items():
        off = [check(replies[(kind, q, False)]) for q in qs]
        on = [check(replies[(kind, q, True)]) for q in qs]
        same = sum(replies[(kind, q, False)] == replies[(kind, q, True)] for q in qs)
        w, lo, p = paired(on, off)
        rows.append([kind, str(len(qs)), str(sum(off)), str(sum(on)), f"+{w}/-{lo} (p={p:.2g})",
                     str(same)])
        if args.show:
            for q in qs:
                for g in (False, True):
                    print(f"[{kind} guard={g}] {q}\n{replies[(kind, q, g)]}\n")
    print(f"`.venv/bin/python bench/probe_loop_guard.py --max-new-tokens {args.max_new_tokens}` "
          f"({len(jobs)} replies in {time.time() - t0:.0f} s; run length {loops.NGRAM})\n")
    print(table(["form", "asks", "well-formed, guard off", "well-formed, guard on",
                 "on vs off", "replies identical"], rows))


if __name__ == "__main__":
    main()
