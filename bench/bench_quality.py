"""Quality: are members' memories followed, better than a system message, and what does
each mechanism of the platform add?

554 cases of bench/quality_cases.py (standing instructions judged by IFEval's verifiers,
preferences, facts about the member; a fixed tuning/validation split), each asked after
0, 4, 8 or 16 unrelated exchanges (pre-written replies), with its memory alone or among
19 others, greedily, under the conditions of its cell:

* ``no memory``; ``system message``: the memories as the client's system message;
* ``platform``: the memories stored and injected, every mechanism at its default;
* ``- guidance`` (contrast 0), ``+ guidance`` (contrast 1), ``- reminder``, ``- both``,
  ``guidance only`` (no reminder, contrast 1), ``- recall pick`` (the reminder re-states
  the first memories, not those relevant to the message), ``- memory lean`` (a one-memory
  first turn guided by a guide row leaving after 4 steps, not the member's lean measured
  once: ``guidance/probe.py``).

Requests go through the worker's executor (``injection.build_executor`` with the worker's
settings: batch engine, one-pass segments, conversation reuse, memory recall) exactly as
``/v1`` sends them (the history in the request), sent ``--workers`` at a time so the batch
engine serves them (greedy replies do not depend on it).

Adherence = the check passes and the reply is fluent (not empty, no loop: a fifth or more of
its word 4-grams said again, and no recitation of the memory, not counted for facts:
``quality_stats.fluent``, since 2026-12-04) and no non-answer (bench/memory_cases.py). Per family x cell: the share
with its 95 % Wilson interval, and paired differences (wins/losses, exact McNemar p)
against the system message and the platform without each mechanism. Cost per mechanism:
extra forward tokens per reply (guide rows, reminder tokens) from the results.

Run: ``.venv/bin/python bench/bench_quality.py --profile quick [--split tuning]`` (576 replies,
7.3 min on 2 cores, 2026-11-29). The default ``full`` (5,200 replies; its "- guidance" and
"- anchor" ones copied where neither ran: ``_derivable``) is what ``make bench`` runs: its first
whole run, 4,320 replies, took 50 min on 2 cores (2026-11-29; the replies sent 8 at a time to an
unpaced executor, as one after another token for token); the 880 added since (30 tuning cases, the
anchor's cells) and the replies each change touched were generated again, not the whole: its
replies: bench/results/quality-full-2026-11-29-anchor.json.gz, gunzip it and pass it as
``--partial`` to re-read them. IFEval's verifiers come with ``make install``;
``--partial FILE`` keeps the replies and resumes; ``--write-docs TAG`` writes the tables as section TAG of
docs/benchmarks/quality.md (docs/BENCHMARKS.md's quality section summarises them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import quality_calibrate  # noqa: E402
import quality_report  # noqa: E402
from memory_cases import conversation, evades, memory_list  # noqa: E402
from quality_cases import CASES, Case  # noqa: E402
from quality_stats import fluent  # noqa: E402

QUALITY_DOC = ROOT / "docs" / "benchmarks" / "quality.md"  # every run's full tables
QUALITY_HEAD = ("# Quality runs (bench/bench_quality.py)\n\nEach run's full tables, written by "
                "`--write-docs SLUG`; docs/BENCHMARKS.md (quality) summarises them.\n")
MAX_NEW_TOKENS = int(os.environ.get("MAX_NEW_TOKENS", "64"))
TENANT = "bench-quality"
# the cap the executor gets: above the platform's (KV_ALPHA_CAP) for the "alpha" conditions
# only; every other condition asks for alpha 1, the default
ALPHA_CAP = 2.0
FRAME = ("Facts and preferences of the user you are talking to. Respect them in every "
         "answer:\n{}")
GUIDANCE = 1.0  # the strength measured for SmolLM2 (engine/guidance/contrast.py)
CONDS: dict[str, dict] = {
    "no memory": {"mode": "none"},
    "system message": {"mode": "system"},
    # the same, framed as what the user said of themselves (a trial: not what the platform does)
    "framed system message": {"mode": "system", "frame": FRAME},
    "platform": {},
    "- guidance": {"contrast": 0.0},
    "- reminder": {"reminder": False},
    "- both": {"contrast": 0.0, "reminder": False},
    "+ guidance": {"contrast": GUIDANCE},
    "guidance only": {"contrast": GUIDANCE, "reminder": False},
    # the platform with the model's guidance default at 1 (a candidate profile: first turns
    # guided with the member's lean, deep turns anchored), where the run's profile has none
    # (``--calibrate``: quality_calibrate.py)
    "+ default guidance": {"profile_guidance": 1.0},
    "- recall pick": {"recall_top": 0},
    # a member whose memories overflow their cached segment: with a 64-token segment, 7 of
    # the 20 memories are cached and the rest are recall candidates (``memory/recall.py``)
    "platform (segment 64)": {"segment_tokens": 64},
    "- recall (segment 64)": {"segment_tokens": 64, "recall_k": 0},
    "- constraints": {"constrain": False},
    # a deep turn's first token as its last message alone would pick it (``anchor.py``)
    "- anchor": {"anchor": False, "anchor_many": False},
    # the guide leaving after k decoding steps, its mean contrast kept as a lean (``lean.py``;
    # the platform's: 4), or guiding the whole reply (0: ``LEAN_AFTER = None``)
    **{f"lean {k}": {"lean": k, "memory_lean": False} for k in (1, 2, 8, 16)},
    "whole guide": {"lean": 0, "memory_lean": False},
    # a one-memory first turn guided by a guide row leaving after 4 steps (``lean.py``), not by
    # the member's lean measured once on a probe (``probe.py``, the platform's)
    "- memory lean": {"memory_lean": False},
    # an anchored (deep) turn without the member's lean after its first token (``probe.DEEP``)
    "- deep lean": {"deep_lean": False},
    # the profile's deep lean on (the anchor leaning after its first token), where the run's
    # profile has it off (SmolLM2's since the fluency verdict)
    "+ deep lean": {"profile_guidance": 1.0, "profile_deep_lean": True},
    # a first turn the profile leaves unguided anchored: its first token as the guide would
    # pick it, the rest unguided (the profile's ``anchor.first_turns``)
    "+ first anchor": {"profile_first_anchor": True},
    # deep turns anchored (and leaning, as the profile says) where the profile leaves them not
    "+ anchor": {"profile_deep_anchor": True},
    # guidance where it is not the default (preferences, facts): the anchor and deep lean
    # alone, or the anchor alone
    "+ guidance - deep lean": {"contrast": GUIDANCE, "deep_lean": False},
    # the loop guard (``engine/decoding/loops.py``): on with the model's run length or one of
    # its own (``loop_ngram``), or off
    "+ loop guard": {"loop_guard": True},
    **{f"+ loop guard {k}": {"loop_guard": True, "loop_ngram": k} for k in (3, 4, 6, 8)},
    "- loop guard": {"loop_guard": False},
    **{f"+ default guidance + loop guard {k}": {"profile_guidance": 1.0, "loop_guard": True,
                                                "loop_ngram": k} for k in (4, 6)},
    "system message - loop guard": {"mode": "system", "loop_guard": False},
    # the member's values scaled above 1 (``alpha``; the platform caps it at KV_ALPHA_CAP)
    "alpha 1.5": {"alpha": 1.5},
    "alpha 2": {"alpha": 2.0},
}
# the switches a condition sets outside its request, for a phase of its own (``generate``)
SWITCHES = ("recall_top", "segment_tokens", "recall_k", "anchor", "anchor_many", "lean",
            "memory_lean", "deep_lean", "profile_guidance", "profile_deep_lean", "loop_ngram",
            "profile_first_anchor", "profile_deep_anchor")
# (depth, memories) -> conditions
PROFILES: dict[str, dict] = {
    # day to day (576 replies, 7.3 min on 2 cores): injected with no mechanism (guidance, reminder and
    # decoding constraints off) is the system message token for token, so "system message"
    # stands for "- every mechanism" at both depths
    "quick": {"every": 5, "cells": {
        (0, 1): ["system message", "platform", "- guidance"],
        (8, 1): ["system message", "platform"],
        (8, 20): ["system message", "platform", "- recall pick"],
    }},
    # ``make bench`` (5,200 replies; 4,320 of them took 50 min on 2 cores): every case with each
    # mechanism on and off where defaults are decided (depths 0 and 8), every 3rd case
    # (``"every"``) at the other depths and with 20 memories
    "full": {"every": 1, "cells": {
        (0, 1): ["no memory", "system message", "platform", "- guidance", "- constraints",
                 "- memory lean"],
        (8, 1): ["system message", "platform", "- reminder", "- constraints", "- anchor",
                 "- deep lean"],
        (4, 1): {"conds": ["system message", "platform"], "every": 3},
        (16, 1): {"conds": ["system message", "platform"], "every": 3},
        (0, 20): {"conds": ["platform", "- guidance"], "every": 3},
        (8, 20): {"conds": ["system message", "platform", "- recall pick", "- anchor"],
                  "every": 3},
    }},
}


def worker_executor(adapter, batch: int, pace: float | None = 0.0):
    """The executor the worker builds, with the worker's defaults (config/settings.py) and
    no Redis (L1 only); its prefill unpaced unless ``pace`` (None: the worker's)."""
    for name in ("DATABASE_URL", "REDIS_URL", "KV_CACHE_REDIS_URL"):  # no servers needed
        os.environ.setdefault(name, "postgres://bench@localhost/bench" if name[0] == "D"
                              else "redis://localhost:1/0")
    from config import settings as s
    from injection import build_executor

    return build_executor(
        adapter, l2_enabled=False, batch_max=batch, alpha_cap=ALPHA_CAP,
        batch_kv_budget_bytes=s.WORKER_BATCH_KV_BUDGET_BYTES,
        batch_join_wait_ms=s.WORKER_BATCH_JOIN_WAIT_MS, batch_prefill_chunk=s.WORKER_PREFILL_CHUNK,
        # here no pacing: it bounds running streams' stalls at the cost of throughput, and the
        # replies are the same token for token (greedy); 32 depth-8 replies took 40 s, 74 s paced
        batch_prefill_pace=s.WORKER_PREFILL_PACE if pace is None else pace,
        batch_prefill_group=None if s.WORKER_PREFILL_GROUP < 0 else s.WORKER_PREFILL_GROUP,
        conversation_max_bytes=s.KV_CONVERSATION_MAX_BYTES,
        conversation_prefill_opening=s.KV_CONVERSATION_PREFILL_OPENING,
        memory_segment_tokens=s.MEMORY_SEGMENT_TOKENS,
        memory_recall_top_k=s.MEMORY_RECALL_TOP_K,
        memory_recall_min_similarity=s.MEMORY_RECALL_MIN_SIMILARITY,
        memory_lean=s.GUIDANCE_MEMORY_LEAN), s.CHAT_HISTORY_TOKEN_BUDGET


def request(index: int, case: Case, depth: int, n: int, cond: dict, budget: int):
    from injection.base import ExecutionRequest, MemoryItem

    msgs, texts = conversation(case, depth), memory_list(case, index, n)
    kw = {"max_new_tokens": MAX_NEW_TOKENS, "history_token_budget": budget,
          "reuse_conversation": False}
    mode = cond.get("mode", "platform")
    if mode == "system":
        msgs = [{"role": "system", "content": cond.get("frame", "{}").format("\n".join(texts))},
                *msgs]
    kw["loop_guard"] = cond.get("loop_guard")
    if mode != "platform":
        return ExecutionRequest(TENANT, f"q{index}-{n}", msgs, injection_enabled=False, **kw)
    for name in ("contrast", "reminder", "constrain"):
        kw[name] = cond.get(name)
    kw["alpha"] = cond.get("alpha", 1.0)
    return ExecutionRequest(TENANT, f"q{index}-{n}", msgs, injection_enabled=True,
                            memories=tuple(MemoryItem(f"m{j}", t) for j, t in enumerate(texts)),
                            **kw)


def adheres(case: Case, reply: str) -> bool:
    """The verdict: the case's check passes, the reply is fluent (``quality_stats.fluent``:
    not empty, no loop, no recitation of the memory but a fact's) and answers."""
    return (bool(case.check(reply)) and fluent(reply, case.memory, case.family != "fact")
            and not evades(reply))


def jobs_for(profile: dict, split: str, limit: int = 0, family: str = "",
             kinds: tuple[str, ...] = (), first: int = 0) -> list[tuple]:
    """(case index, depth, memories, condition) in the profile, ``recall pick`` last;
    ``first``: only the cases from that index on (a set added last); ``family``: one, or
    several comma-separated."""
    families = family.split(",") if family else ()
    picked = [i for i, c in enumerate(CASES) if split in ("both", c.split) and i >= first
              and (not families or c.family in families) and (not kinds or c.kind in kinds)]
    picked = picked[:: profile["every"]][: limit or None]
    jobs = []
    for (d, n), cell in profile["cells"].items():
        names, every = (cell, 1) if isinstance(cell, list) else (cell["conds"], cell["every"])
        jobs += [(i, d, n, name) for i in picked[::every]
                 for name in names]  # a case's conditions together: paired
    return sorted(jobs, key=lambda j: (_phase(j), j[1], j[2]))


def _phase(job: tuple) -> tuple:
    """The switches the job's condition sets (the reminder's recall pick, a module switch;
    the memory planner's segment and recall): each set runs in a phase of its own."""
    cond = CONDS.get(job[3], {})  # an imported condition (``imported``) sets nothing
    return tuple((k, cond[k]) for k in SWITCHES if k in cond)


def _set_switches(ex, phase: tuple, defaults: tuple) -> None:
    """The phase's switches set on the modules and the executor's memory planner;
    ``defaults`` (``_defaults``) where the phase does not set them."""
    from injection.engine.decoding import loops
    from injection.engine.guidance import lean, plan, probe
    from injection.model import profiles
    from injection.prompting import reminder

    sw, (top, options, anchors, leans, profile, ngram) = dict(phase), defaults
    loops.NGRAM = sw.get("loop_ngram", ngram)
    adapter = ex.planner.adapter
    adapter._profile = (candidate(adapter, sw["profile_guidance"],
                                  profile or profiles.for_adapter(adapter),
                                  sw.get("profile_deep_lean", False))
                        if "profile_guidance" in sw else profile)
    for switch, key in (("profile_first_anchor", "first_turns"),
                        ("profile_deep_anchor", "deep_turns")):
        if switch in sw:
            adapter._profile = _anchored(adapter._profile or profiles.for_adapter(adapter), key)
    lean.LEAN_AFTER = sw.get("lean", leans[0]) or None
    ex.planner.memory_lean = sw.get("memory_lean", leans[1])
    probe.DEEP = sw.get("deep_lean", leans[2])
    plan.ONE_ANCHORED_DEEP = sw.get("anchor", anchors[0])
    plan.MANY_ANCHORED = sw.get("anchor_many", anchors[1])
    reminder.RELEVANT_TOP = sw.get("recall_top", top)
    ex.memories.options = options._replace(
        segment_tokens=sw.get("segment_tokens", options.segment_tokens),
        top_k=sw.get("recall_k", options.top_k))


def _defaults(ex) -> tuple:
    from injection.engine.decoding import loops
    from injection.engine.guidance import lean, plan, probe
    from injection.prompting import reminder

    return (reminder.RELEVANT_TOP, ex.memories.options,
            (plan.ONE_ANCHORED_DEEP, plan.MANY_ANCHORED),
            (lean.LEAN_AFTER, ex.planner.memory_lean, probe.DEEP),
            getattr(ex.planner.adapter, "_profile", None), loops.NGRAM)


def _anchored(profile, key: str):
    """``profile`` with ``anchor.<key>`` on (first turns it leaves unguided, or deep turns,
    anchored)."""
    m = dict(profile.mechanisms)
    m["anchor"] = {**m.get("anchor", {}), key: True}
    return profile._replace(mechanisms=m)


def candidate(adapter, strength: float, base=None, deep_lean: bool = False):
    """A profile for the loaded model with guidance default ``strength`` (first turns guided,
    deep turns anchored, leaning after their first token where ``deep_lean``): a
    calibration's. The switches (the reminder, the constraints, the loop guard) are
    ``base``'s (a profile the model has), else the platform's defaults."""
    from injection.model.fingerprint import model_key
    from injection.model.profiles import SWITCHES, Profile

    kept = {k: v for k, v in (base.mechanisms if base is not None else {}).items()
            if k in SWITCHES}
    return Profile("calibration candidate", model_key(adapter), strength, False,
                   "bench_quality", {**kept,
                                     "guidance": {"default": strength, "first_turns": True},
                                     "anchor": {"deep_lean": deep_lean}})


def generate(ex, budget: int, jobs: list[tuple], workers: int, partial: str,
             extra: dict | None = None) -> dict:
    """Every job's reply and figures, ``workers`` at a time; those in ``partial`` (and the
    imported ``extra``) reused."""
    done: dict[str, dict] = {}
    if partial and Path(partial).exists():
        done = json.loads(Path(partial).read_text())
    done.update(extra or {})
    done.setdefault("_seconds", 0.0)  # generation time, over the runs of a partial file
    todo = [j for j in jobs if _key(j) not in done]
    missing = sorted({j[3] for j in todo if j[3] not in CONDS})
    if missing:
        raise SystemExit(f"imported conditions without every reply (--import): {missing}")
    late = [j for j in todo if _derivable(j, jobs)]
    todo = [j for j in todo if j not in late]
    print(f"  {len(jobs) - len(todo) - len(late)} stored, {len(todo) + len(late)} to generate",
          flush=True)
    _run(ex, budget, todo, workers, partial, done)
    derived = _derive(late, done)
    _run(ex, budget, [j for j in late if _key(j) not in derived], workers, partial, done)
    if late:
        print(f"  {len(derived)} of {len(late)} replies of conditions that change nothing for "
              "their case: the platform's (_derivable)", flush=True)
    if partial:
        Path(partial).write_text(json.dumps(done))
    return done


def _derivable(job: tuple, jobs: list[tuple]) -> bool:
    """A ``- guidance``, ``- anchor``, ``lean k`` or ``RULED`` job whose ``platform`` twin is
    in the run (``RULED``: copied where ``_unchanged`` says; the others as follows):
    where the platform runs no guide and no anchor (its guide forward tokens are 0: guidance
    is not applied to that member), the reply without them (or with a guide leaving early)
    is the platform's, token for token (greedy; tests/injection test the switches), so it is
    copied instead of generated again (``_derive``)."""
    return ((job[3] in ("- guidance", "- anchor", "whole guide", "- memory lean", "- deep lean",
                        *RULED) or job[3].startswith("lean "))
            and (*job[:3], "platform") in jobs)


# conditions whose reply is the platform's token for token where the case's memories say so,
# read without a model (``_unchanged``)
RULED = ("- constraints", "+ default guidance")


def _unchanged(job: tuple) -> bool:
    """A ``RULED`` job whose request changes nothing: ``- constraints`` where the turn finds
    no decoding constraint (the planner's own ``constrained``), ``+ default guidance`` where
    no memory is one guidance pays for beside them (``rules.guided``, as
    ``contrast.resolve``): its strength is 0 under any profile."""
    from injection.engine.planning.planner import constrained
    from injection.prompting import rules as memory_rules

    i, d, n, name = job
    req = request(i, CASES[i], d, n, CONDS["platform"], 0)
    rules = memory_rules.for_request(req)
    found = tuple(constrained({}, req, True, on=True, rules=rules).get("constraints", ()))
    if name == "- constraints":
        return not found
    return not any(memory_rules.guided(r, found) for r in rules.member)


def _derive(late: list[tuple], done: dict) -> set[str]:
    """The keys of ``late`` copied from their ``platform`` twin (``_derivable``)."""
    out = set()
    for job in late:
        twin = done.get(_key((*job[:3], "platform")))
        same = (_unchanged(job) if job[3] in RULED
                else twin is not None and twin["guide"] == 0 and not twin.get("contrast"))
        if twin is not None and same and _key(job) not in done:
            done[_key(job)] = {**twin, "derived": True}
            out.add(_key(job))
    return out


def _run(ex, budget: int, todo: list[tuple], workers: int, partial: str, done: dict) -> None:
    """Generate ``todo`` into ``done`` (``generate``), saving ``partial`` as it goes."""
    defaults, t0 = _defaults(ex), time.perf_counter()

    def one(job):
        i, d, n, name = job
        res = ex.execute(request(i, CASES[i], d, n, CONDS[name], budget))
        return _key(job), {"text": res.text, "prompt": res.prompt_tokens,
                           "completion": res.completion_tokens, "ttft_ms": res.ttft_ms,
                           "guide": res.guide_prefill_tokens + res.guide_decode_tokens,
                           "contrast": res.contrast_effective, "lean": res.extra.get("lean", ""),
                           "constraints": list(res.constraints)}

    for phase in sorted({_phase(j) for j in todo}):  # the switches' phases (``_phase``)
        batch = [j for j in todo if _phase(j) == phase]
        _set_switches(ex, phase, defaults)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for k, (key, row) in enumerate(pool.map(one, batch), 1):
                done[key] = row
                if k % 50 == 0 or k == len(batch):
                    done["_seconds"] += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    print(f"  {k}/{len(batch)}, {done['_seconds']:.0f} s", flush=True)
                    if partial:
                        Path(partial).write_text(json.dumps(done))
    _set_switches(ex, (), defaults)


def imported(spec: str) -> dict[str, dict]:
    """``FILE:FROM=TO``: the replies of condition FROM in another run's partial FILE (e.g.
    another commit's), as condition TO, to be paired with this run's (name TO in --cells)."""
    path, _, names = spec.rpartition(":")
    src, _, dst = names.partition("=")
    rows = json.loads(Path(path).read_text())
    out = {k.rsplit("|", 1)[0] + "|" + dst: v for k, v in rows.items()
           if not k.startswith("_") and k.rsplit("|", 1)[1] == src}
    if not out or dst in CONDS:
        raise SystemExit(f"--import {spec}: no replies of {src!r}, or {dst!r} is a condition")
    return out


def _key(job: tuple) -> str:
    i, d, n, name = job
    return f"{i}|{d}|{n}|{name}"


def load_model():
    """(adapter, path) of ``MODEL_PATH``, else SmolLM2 prepared under var/models/, loaded as
    the ``MODEL_*`` variables say."""
    import torch

    from injection import load_adapter
    from injection.model.gguf_import import prepare_model

    torch.manual_seed(0)
    path = Path(os.environ.get("MODEL_PATH") or prepare_model(
        ROOT / "var" / "models" / "smollm2-135m-instruct"))
    return load_adapter(path, device=os.environ.get("MODEL_DEVICE") or None,
                        dtype=os.environ.get("MODEL_DTYPE") or None,
                        cpu_matmul=os.environ.get("MODEL_CPU_MATMUL", "auto"),
                        cpu_threads=os.environ.get("MODEL_CPU_THREADS", "engine")), path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", choices=sorted(PROFILES), default="full")
    ap.add_argument("--split", choices=("tuning", "validation", "both"), default="both")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--partial", default="", help="JSON file of the replies so far")
    ap.add_argument("--write-docs", default="", metavar="SLUG",
                    help="write the report as section SLUG (letters, digits, -) of "
                         "docs/benchmarks/quality.md")
    ap.add_argument("--show", action="store_true", help="print every reply")
    ap.add_argument("--cells", default="", help="instead of the profile's cells, e.g. "
                    "'0x1=platform,- guidance;8x20=platform' (depth x memories = conditions)")
    ap.add_argument("--family", default="", help="standing, preference or fact "
                    "(comma-separated for several)")
    ap.add_argument("--calibrate", default="", metavar="OUT.json", help="make the loaded "
                    "model's profile (quality_calibrate.py: tuning split, its cells) into OUT")
    ap.add_argument("--kinds", default="", help="only these case kinds (comma-separated, "
                    "e.g. postscript,title)")
    ap.add_argument("--every", type=int, default=0, help="every Nth case (0: the profile's)")
    ap.add_argument("--base", default="platform", help="the condition the others are "
                    "paired against (default: platform, against its variants)")
    ap.add_argument("--import", dest="imports", action="append", default=[],
                    metavar="FILE:FROM=TO", help="pair with condition FROM of another run's "
                    "partial FILE (another commit's), named TO in --cells")
    ap.add_argument("--limit", type=int, default=0, help="first N cases of each cell (0: all)")
    ap.add_argument("--first", type=int, default=0, help="only the cases from index N on "
                    "(a set added last, e.g. 554: LANGUAGE_BARE)")
    args = ap.parse_args()
    adapter, path = load_model()
    ex, budget = worker_executor(adapter, args.workers)
    profile = dict(PROFILES[args.profile])
    if args.calibrate:  # the base: no guidance default, whatever profile the model has
        from injection.model.profiles import for_adapter

        adapter._profile = candidate(adapter, 0.0, for_adapter(adapter))
        profile = {"every": 1, "cells": quality_calibrate.CELLS}
        args.split, args.family = "tuning", args.family or ",".join(quality_calibrate.FAMILIES)
    if args.cells:
        profile["cells"] = {tuple(int(x) for x in cell.split("=")[0].split("x")):
                            [c.strip() for c in cell.split("=")[1].split(",")]
                            for cell in args.cells.split(";")}
    profile["every"] = args.every or profile["every"]
    jobs = jobs_for(profile, args.split, args.limit, args.family,
                    tuple(k for k in args.kinds.split(",") if k), args.first)
    print(f"{len(jobs)} replies, profile {'calibrate' if args.calibrate else args.profile}, "
          f"split {args.split}", flush=True)
    rows = generate(ex, budget, jobs, args.workers, args.partial,
                    {k: v for spec in args.imports for k, v in imported(spec).items()})
    secs = rows.pop("_seconds", 0.0)
    generated = sum(not rows[_key(j)].get("derived") for j in jobs)
    ex.close()
    scored = [(*j, adheres(CASES[j[0]], rows[_key(j)]["text"]), rows[_key(j)]) for j in jobs]
    if args.show:
        for i, d, n, name, ok, row in scored:
            print(f"[{i} {CASES[i].family}/{CASES[i].kind} d={d} n={n}] {name:16s} "
                  f"{'PASS' if ok else 'fail'} {row['text']!r}")
    text = quality_report.render(scored, CASES, profile, args, secs, path, adapter)
    print(text)
    if args.calibrate:
        quality_calibrate.write(args.calibrate, scored, CASES, secs, path, adapter, generated)
    if args.write_docs:
        from mdsection import write_section

        if not QUALITY_DOC.exists():
            QUALITY_DOC.write_text(QUALITY_HEAD)
        write_section(f"quality-{args.write_docs}", text.replace(
            "## Quality: adherence", f"## {args.write_docs}: adherence", 1), QUALITY_DOC)


if __name__ == "__main__":
    main()
