"""The misreading set's replies on the real model (issue 57: ``bench_misreading.py --replies``).

Each memory of bench/misreading_cases.py (one split) is stored as a member's only memory, its
rules read once as the platform reads them when it is saved (``rules.read``), and its question
asked on a first turn through the worker's executor (``bench_quality.worker_executor``, as
/v1 sends it), greedily, twice: on the defaults, and with the decoder's rules off
(``constrain=False, contrast=0``: no decoding constraint, no guidance). Per kind:

* ``applied``: the default reply was kept to a decoding constraint or guided (what
  ``cache.constraints`` and ``cache.contrast_effective`` report);
* ``changed`` (harm): the two replies differ. Greedy, only a rule can make them differ, so a
  memory read as no rule must give the same reply token for token (tests/injection
  test_misreading.py); a change is a rule nobody asked for, visible in the reply.

The positive controls (standing instructions of the same forms) get the same two replies:
``kept`` is the rule they ask for kept (``verdicts.violates`` for a constraint, langdetect for
a language) in a fluent reply (``quality_stats.fluent``), on the defaults and with the rules
off (what the rules add). Beside them, in the same run and on the same executor: the standing
family's adherence on the defaults at depths 0 and 8 (bench_quality's ``platform`` on every case
of the split), stored in a bench_quality ``--partial`` file that its later runs can reuse.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

import bench_quality
from mdsection import table
from misreading_cases import KINDS, Case, cases, controls
from quality_cases import CASES
from quality_stats import fluent, loops, share

from injection.prompting import rules
from injection.prompting.verdicts import violates

# only this batch of the set (``misreading_cases.Case.batch``; ``--batch``), or all of it
BATCH: int | None = None

TENANT = "bench-misreading"
CODES = {"German": "de", "Spanish": "es", "French": "fr", "Italian": "it", "Dutch": "nl",
         "Portuguese": "pt", "Japanese": "ja", "Greek": "el", "Swedish": "sv",
         "Polish": "pl", "Turkish": "tr", "Norwegian": "no", "Arabic": "ar", "Czech": "cs",
         "Finnish": "fi", "Hindi": "hi", "Hungarian": "hu", "Indonesian": "id", "Korean": "ko",
         "Romanian": "ro", "Vietnamese": "vi", "Welsh": "cy"}
# the standing family's cells run beside them (depth, memories): the goal figures
STANDING = {"every": 1, "cells": {(0, 1): ["platform"], (8, 1): ["platform"]}}


def request(case: Case, on: bool, budget: int):
    """``case``'s question on a first turn, its memory stored with the rules read from it;
    ``on`` False: the decoder's rules off."""
    from injection.base import ExecutionRequest, MemoryItem

    off = {} if on else {"constrain": False, "contrast": 0.0}
    return ExecutionRequest(
        TENANT, hashlib.sha1(case.memory.encode()).hexdigest()[:12],
        [{"role": "user", "content": case.question}],
        memories=(MemoryItem("m0", case.memory, rules=rules.read(case.memory)),),
        max_new_tokens=bench_quality.MAX_NEW_TOKENS, history_token_budget=budget,
        reuse_conversation=False, **off)


def key(case: Case, on: bool) -> str:
    return f"{case.split}|{case.kind}|{case.memory}|{'on' if on else 'off'}"


def generate(ex, budget: int, items: list[Case], workers: int, path: str,
             derive: bool = False) -> dict:
    """Both replies of each case in ``items``, ``workers`` at a time; those stored in ``path``
    reused, and the new ones saved there. ``derive``: the default replies first, then the
    rules-off reply only where a rule applied (and for the controls); where none applied it
    is the default reply, token for token (greedy: tests/injection/test_misreading.py checks
    every kind on the demo model and the issue's examples on SmolLM2), copied and marked."""
    done: dict = json.loads(Path(path).read_text()) if path and Path(path).exists() else {}
    _run(ex, budget, [(c, True) for c in items], workers, path, done)
    offs = [c for c in items if not derive or c.kind == "control" or applied(done[key(c, True)])]
    for c in items if derive else ():
        if c not in offs and key(c, False) not in done:
            done[key(c, False)] = {**done[key(c, True)], "derived": True}
    _run(ex, budget, [(c, False) for c in offs], workers, path, done)
    return done


def _run(ex, budget: int, jobs: list[tuple[Case, bool]], workers: int, path: str,
         done: dict) -> None:
    """Generate ``jobs`` (case, on) not in ``done`` into it, saving ``path`` as it goes."""
    todo = [j for j in jobs if key(*j) not in done]
    print(f"  misreading: {len(jobs) - len(todo)} stored, {len(todo)} to generate",
          flush=True)

    def one(job):
        res = ex.execute(request(*job, budget))
        return key(*job), {"text": res.text, "constraints": list(res.constraints),
                           "contrast": res.contrast_effective,
                           "guide": res.guide_prefill_tokens + res.guide_decode_tokens,
                           "completion": res.completion_tokens}

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for k, (name, row) in enumerate(pool.map(one, todo), 1):
            done[name] = row
            if path and (k % 10 == 0 or k == len(todo)):
                Path(path).write_text(json.dumps(done))
                print(f"  {k}/{len(todo)}", flush=True)


def applied(row: dict) -> bool:
    """The reply was kept to a decoding constraint or guided."""
    return bool(row["constraints"]) or row["contrast"] > 0 or row["guide"] > 0


def kept(reply: str, want: str, memory: str) -> bool:
    """A control's reply keeps the rule it asks (``want``) and is fluent."""
    if want.startswith("language:"):
        from langdetect import DetectorFactory, LangDetectException, detect

        DetectorFactory.seed = 0
        try:
            ok = detect(reply) == CODES[want.split(":", 1)[1]]
        except LangDetectException:
            ok = False
    else:
        ok = bool(reply.strip()) and not violates(want, reply)
    return ok and fluent(reply, memory)


def harm_rows(split: str, done: dict) -> list[list[str]]:
    """Per kind (and all): cases, rules applied, replies changed, default replies that loop."""
    mine = cases(split, BATCH)
    rows = []
    for kind in (*KINDS, "all"):
        here = [c for c in mine if kind in ("all", c.kind)]
        on = [done[key(c, True)] for c in here]
        off = [done[key(c, False)] for c in here]
        n = len(here)
        rows.append([kind, str(n), share(sum(map(applied, on)), n),
                     share(sum(a["text"] != b["text"] for a, b in zip(on, off, strict=True)), n),
                     str(sum(loops(r["text"]) for r in on))])
    return rows


def control_rows(split: str, done: dict) -> list[list[str]]:
    """The controls, constraints and languages apart: kept and fluent, on and off."""
    rows = []
    for group in ("constraint", "language", "all"):
        here = [(c, w) for c, w in controls(split, BATCH)
                if group == "all" or (group == "language") == w.startswith("language:")]
        n = len(here)
        on = [kept(done[key(c, True)]["text"], w, c.memory) for c, w in here]
        off = [kept(done[key(c, False)]["text"], w, c.memory) for c, w in here]
        rows.append([group, str(n), share(sum(on), n), share(sum(off), n),
                     share(sum(applied(done[key(c, True)]) for c, _ in here), n)])
    return rows


def standing_rows(split: str, replies: dict) -> list[list[str]]:
    """The standing family's adherence (fluent) on the defaults at each depth of STANDING."""
    jobs = bench_quality.jobs_for(STANDING, split, family="standing")
    rows = []
    for d, n in STANDING["cells"]:
        ids = [i for i, dd, nn, _ in jobs if (dd, nn) == (d, n)]
        texts = [replies[bench_quality._key((i, d, n, "platform"))]["text"] for i in ids]
        ok = [bench_quality.adheres(CASES[i], t) for i, t in zip(ids, texts, strict=True)]
        check = [bool(CASES[i].check(t)) for i, t in zip(ids, texts, strict=True)]
        rows.append([str(d), share(sum(ok), len(ids)), share(sum(check), len(ids)),
                     str(sum(map(loops, texts)))])
    return rows


def render(split: str, done: dict, standing: dict, command: str, model: str) -> str:
    """The run's tables (docs/benchmarks/misreading.md)."""
    return "\n".join([
        f"## replies-{split}{f'-batch{BATCH}' if BATCH else ''}: the misreading set's replies "
        f"on {model} (issue 57)", "",
        f"`{command}`, {date.today()}, readers `READER_VERSION` {rules.READER_VERSION}, "
        "greedy, 64 new tokens, one memory, first turn, the worker's executor; each reply on "
        "the defaults against the same with the decoder's rules off (`constrain=False, "
        "contrast=0`)" + (f"; {sum(r.get('derived', False) for r in done.values())} "
        "rules-off replies copied from the default one where no rule applied (`--derive`)"
        if any(r.get("derived") for r in done.values()) else "") +
        ". Shares with their Wilson 95 % interval.", "",
        "Memories that are not instructions: rules applied, replies changed by them (harm), "
        "default replies that loop:", "",
        table(["kind", "cases", "rules applied", "replies changed (harm)", "loops"],
              harm_rows(split, done)), "",
        "Positive controls (natural instructions): the rule asked kept in a fluent reply:", "",
        table(["rule", "cases", "kept, defaults", "kept, rules off", "rules applied"],
              control_rows(split, done)), "",
        *([] if not standing else [
            "Standing instructions (bench_quality `platform`, every case of the split, one "
            "memory) in the same run: kept in a fluent reply (the verdict), the check alone, "
            "loops:", "", table(["depth", "adherence (fluent)", "check alone", "loops"],
                                standing_rows(split, standing))])])


def shown(split: str, done: dict) -> list[str]:
    """The replies a rule applied to or changed, and the controls not kept."""
    out = []
    for c in cases(split, BATCH):
        on, off = done[key(c, True)], done[key(c, False)]
        if applied(on) or on["text"] != off["text"]:
            out.append(f"[{c.kind}] {c.memory!r} {on['constraints']} contrast={on['contrast']}"
                       f"\n   on:  {on['text']!r}\n   off: {off['text']!r}")
    for c, want in controls(split, BATCH):
        if not kept(done[key(c, True)]["text"], want, c.memory):
            out.append(f"[control {want}] {c.memory!r}: {done[key(c, True)]['text']!r}")
    return out


def run(split: str, workers: int, path: str, quality_path: str, derive: bool = False,
        standing: bool = True) -> tuple[dict, dict, str]:
    """Load SmolLM2 (``MODEL_PATH``), generate the misreading replies (``generate``) and the
    standing family's beside them (unless not ``standing``); (misreading replies, standing
    replies, model name)."""
    adapter, model = bench_quality.load_model()
    ex, budget = bench_quality.worker_executor(adapter, workers)
    rows: dict = {}
    try:
        items = cases(split, BATCH) + [c for c, _ in controls(split, BATCH)]
        done = generate(ex, budget, items, workers, path, derive)
        if standing:
            jobs = bench_quality.jobs_for(STANDING, split, family="standing")
            rows = bench_quality.generate(ex, budget, jobs, workers, quality_path)
    finally:
        ex.close()
    rows.pop("_seconds", None)
    return done, rows, os.path.basename(str(model))
