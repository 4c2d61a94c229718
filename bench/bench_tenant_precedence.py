"""Tenant instructions against member memories under contrastive guidance.

Each case of bench/memory_cases.py (a memory, a question, an objective check) is asked as a
first turn by a member of a tenant with instructions (each of ``INSTRUCTIONS``, with its
own objective check), through the real engine, greedily, under each condition in one run:

* ``no guide``: contrast 0 (the memory injected after the tenant's instructions);
* ``guide keeps instructions``: contrast 1 against the conversation with the tenant's
  instructions and without the memory (``InjectionExecutor(guide_keeps_instructions=True)``);
* ``guide without instructions``: contrast 1 against the conversation with nothing
  injected (the default).

Reported per condition: how often the tenant's instruction is followed (each and all), how
often the memory is (``memory_cases.adheres``), and both. The tenant's instructions take
precedence (issue 22): a guide must not buy memory adherence with instruction adherence.

Run: ``.venv/bin/python bench/bench_tenant_precedence.py [--sets tuning] [--write-docs]``
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from mdsection import machine, table, write_section  # noqa: E402
from memory_cases import HELD_OUT, TUNING, adheres  # noqa: E402
from personalisation_cases import FRENCH, language  # noqa: E402

from injection import InjectionExecutor, TenantLRU, load_adapter  # noqa: E402
from injection.base import ExecutionRequest  # noqa: E402
from injection.engine.batch import BatchEngine  # noqa: E402
from injection.metrics import Metrics  # noqa: E402

MAX_NEW_TOKENS = 40


def sentences_at_most(n: int):
    return lambda reply: 0 < len([s for s in re.split(r"[.!?]+", reply) if s.strip()]) <= n


# written for this benchmark: instructions a tenant gives, each checkable on any reply
INSTRUCTIONS = {
    "French": ("Always answer in French.", language(FRENCH)),
    "Acme:": ("Start every reply with the word 'Acme:'.",
              lambda r: r.strip().lower().startswith("acme")),
    "2 sentences": ("Answer in at most two sentences.", sentences_at_most(2)),
}
CONDITIONS = {
    "no guide": (0.0, False),
    "guide keeps instructions": (1.0, True),
    "guide without instructions (default)": (1.0, False),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="tuning,held-out")
    ap.add_argument("--cases", type=int, default=0, help="first N cases of each set (0: all)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    path = Path(os.environ.get("MODEL_PATH") or ROOT / "var/models/smollm2-135m-instruct")
    adapter = load_adapter(path, device=os.environ.get("MODEL_DEVICE") or None)
    sets = {"tuning": TUNING, "held-out": HELD_OUT}
    cases = [c for s in args.sets.split(",") for c in sets[s][: args.cases or None]]
    t0, rows = time.perf_counter(), []
    for cond, (strength, keeps) in CONDITIONS.items():
        ex = InjectionExecutor(adapter, l1=TenantLRU(max_bytes=2 * 1024**3), l2=None,
                               alpha_cap=1.0, metrics=Metrics(),
                               engine=BatchEngine(adapter, max_batch=args.workers),
                               guide_keeps_instructions=keeps)
        try:
            jobs = [(name, i, c) for name in INSTRUCTIONS for i, c in enumerate(cases)]

            def one(job, strength=strength, ex=ex):
                name, i, case = job
                text, _ = INSTRUCTIONS[name]
                req = ExecutionRequest(f"tenant-{list(INSTRUCTIONS).index(name)}", f"m{i}", [
                    {"role": "user", "content": case.question}], case.memory, text,
                    max_new_tokens=MAX_NEW_TOKENS, contrast=strength)
                return name, case, ex.execute(req).text

            with ThreadPoolExecutor(args.workers) as pool:
                replies = list(pool.map(one, jobs))
        finally:
            ex.close()
        rows.append(score(cond, replies))
        print(rows[-1], flush=True)
    report(args, rows, len(cases), time.perf_counter() - t0, path, adapter)


def score(cond: str, replies: list) -> list:
    n = len(replies)
    inst = [INSTRUCTIONS[name][1](text) for name, _, text in replies]
    mem = [adheres(case, text) for _, case, text in replies]
    per = []
    for name in INSTRUCTIONS:
        got = [ok for (nm, _, _), ok in zip(replies, inst, strict=True) if nm == name]
        per.append(f"{sum(got)}/{len(got)}")
    both = sum(a and b for a, b in zip(inst, mem, strict=True))
    return [cond, *per, f"**{sum(inst)}/{n}**", f"{sum(mem)}/{n}", f"{both}/{n}"]


def report(args, rows, n_cases, seconds, path, adapter) -> None:
    header = ["condition", *(f"{k}" for k in INSTRUCTIONS), "instruction followed",
              "memory followed", "both"]
    text = "\n".join([
        "## Tenant instructions and member memories under contrastive guidance", "",
        f"Command: `.venv/bin/python bench/bench_tenant_precedence.py "
        f"{' '.join(sys.argv[1:])}` ({n_cases} cases of bench/memory_cases.py x "
        f"{len(INSTRUCTIONS)} tenant instructions per condition, first turns, greedy, "
        f"max_new_tokens={MAX_NEW_TOKENS}, {seconds:.0f} s)  ",
        f"Machine: {machine()}, torch threads {torch.get_num_threads()}  ",
        f"Model: {path.name} ({adapter.device}, {str(adapter.dtype)[6:]})", "",
        table(header, rows)])
    print(text)
    if args.write_docs:
        write_section("tenant-precedence", text)


if __name__ == "__main__":
    main()
