"""A model's profile, made by measurement: ``bench_quality.py --calibrate OUT`` (issue 58).

On the **tuning** split only, for whatever model is loaded (``MODEL_PATH``), each mechanism is
paired on and off on the same cases, as the benchmark pairs them (``CELLS``): the platform
with a profile of no guidance (``BASE``: reminder and decoding constraints on, as the
platform's defaults are) against the same with the model's guidance default at
``STRENGTH`` (``+ default guidance``: first turns guided with the member's lean, deep turns
anchored without the deep lean), without the reminder and without the constraints.
``decide`` turns the verdicts into the profile (pure: no model):

* a mechanism is **on** when, over its cells, it wins more paired cases than it loses with
  exact McNemar p < ``ALPHA``, no cell (family x depth) loses with p < ``ALPHA``, and it does
  not make replies less fluent (paired, ``quality_stats.fluent``, p < ``ALPHA``);
* else it is **off**, and the evidence says why (no gain, a loss, or fluency lost).

The reminder is kept on where the anchor is on and the reminder alone shows no gain (not a
loss): the anchor runs on reminded turns only, so switching the reminder off would switch
the anchor off with it.

Guidance is decided twice: on first turns (depth 0: ``guidance.first_turns``, the member's
lean with it) and on deep turns (depth 8: the anchor); its default strength is ``STRENGTH``
where the anchor earns it (first turns alone cannot have it: the anchor runs at the
default strength on deep turns), else 0. Only ``STRENGTH`` is tried, not a sweep; the deep
lean is not tried (off, as SmolLM2's fluency re-decision left it).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any, NamedTuple

from quality_stats import fluent, mcnemar

ALPHA = 0.05
STRENGTH = 1.0
FAMILIES = ("standing", "preference")
DEPTHS = (0, 8)
# (depth, memories) -> conditions: each mechanism on and off, paired on the same cases
CELLS: dict[tuple[int, int], list[str]] = {
    (0, 1): ["platform", "+ default guidance", "- constraints"],
    (8, 1): ["platform", "+ default guidance", "- reminder", "- constraints"],
}


class Mechanism(NamedTuple):
    on: str  # the condition with it
    off: str  # the condition without it
    depths: tuple[int, ...]


MECHANISMS: dict[str, Mechanism] = {
    "guidance first turns": Mechanism("+ default guidance", "platform", (0,)),
    "anchor": Mechanism("+ default guidance", "platform", (8,)),
    "reminder": Mechanism("platform", "- reminder", (8,)),
    "constraints": Mechanism("platform", "- constraints", (0, 8)),
}


class Reply(NamedTuple):
    """One judged reply: case, depth, condition, its verdict, fluency and forward tokens."""

    case: int
    family: str
    depth: int
    cond: str
    ok: bool
    fluent: bool
    prompt: int
    guide: int


def replies(scored: Sequence[tuple], cases: Sequence[Any]) -> list[Reply]:
    """bench_quality's scored rows ``(case, depth, memories, cond, ok, row)`` as ``Reply``."""
    return [Reply(i, cases[i].family, d, name, ok,
                  fluent(row["text"], cases[i].memory, cases[i].family != "fact"),
                  int(row["prompt"]), int(row["guide"]))
            for i, d, _n, name, ok, row in scored]


def _pairs(rows: Sequence[Reply], mech: Mechanism, depths, family: str = ""):
    by = {(r.case, r.depth, r.cond): r for r in rows}
    return [(by[(r.case, r.depth, mech.on)], r) for r in rows
            if r.cond == mech.off and r.depth in depths and family in ("", r.family)
            and (r.case, r.depth, mech.on) in by]


def _count(pairs, attr: str = "ok") -> dict[str, Any]:
    wins = sum(getattr(a, attr) and not getattr(b, attr) for a, b in pairs)
    losses = sum(getattr(b, attr) and not getattr(a, attr) for a, b in pairs)
    return {"cases": len(pairs), "with": sum(getattr(a, attr) for a, _ in pairs),
            "without": sum(getattr(b, attr) for _, b in pairs), "wins": wins,
            "losses": losses, "p": float(f"{mcnemar(wins, losses):.2g}")}


def evidence(rows: Sequence[Reply], mech: Mechanism) -> dict[str, Any]:
    """The paired evidence of one mechanism: per family x depth, pooled, fluency, cost."""
    cells = [{"family": f, "depth": d, **_count(_pairs(rows, mech, (d,), f))}
             for d in mech.depths for f in sorted({r.family for r in rows})]
    pairs = _pairs(rows, mech, mech.depths)
    n = max(len(pairs), 1)
    cost = {"prompt_tokens": round(sum(a.prompt - b.prompt for a, b in pairs) / n, 1),
            "guide_forward_tokens": round(sum(a.guide - b.guide for a, b in pairs) / n, 1)}
    return {"cells": [c for c in cells if c["cases"]], "pooled": _count(pairs),
            "fluent": _count(pairs, "fluent"), "cost_per_reply": cost}


def verdict(ev: dict[str, Any], alpha: float = ALPHA) -> tuple[bool, str]:
    """(on, why) by the rule of this module's docstring."""
    pooled, flu = ev["pooled"], ev["fluent"]
    lost = [c for c in ev["cells"] if c["losses"] > c["wins"] and c["p"] < alpha]
    if lost:
        c = lost[0]
        return False, (f"off: loses {c['family']} at depth {c['depth']} "
                       f"({c['wins']} won / {c['losses']} lost, p={c['p']})")
    if flu["losses"] > flu["wins"] and flu["p"] < alpha:
        return False, (f"off: less fluent ({flu['losses']} replies lost fluency, "
                       f"{flu['wins']} gained, p={flu['p']})")
    if pooled["wins"] > pooled["losses"] and pooled["p"] < alpha:
        return True, (f"on: +{pooled['wins'] - pooled['losses']} ({pooled['wins']} won / "
                      f"{pooled['losses']} lost, p={pooled['p']})")
    return False, (f"off: no gain shown ({pooled['wins']} won / {pooled['losses']} lost, "
                   f"p={pooled['p']})")


def decide(rows: Sequence[Reply], alpha: float = ALPHA) -> dict[str, dict[str, Any]]:
    """Each mechanism's evidence and verdict (``on``, ``why``) from the judged replies."""
    out = {}
    for name, mech in MECHANISMS.items():
        ev = evidence(rows, mech)
        on, why = verdict(ev, alpha)
        out[name] = {"on": on, "why": why, **ev}
    rem = out["reminder"]
    if out["anchor"]["on"] and not rem["on"] and rem["why"].startswith("off: no gain"):
        # the anchor runs on reminded turns only: a reminder off for no gain of its own
        # would switch off the anchor that earned its place (a loss still keeps it off)
        rem["on"], rem["why"] = True, ("on: the anchor runs on reminded turns only; alone "
                                       + rem["why"].removeprefix("off: "))
    return out


def profile(decided: dict[str, dict[str, Any]], model: str, key: str,
            run: dict[str, Any]) -> dict[str, Any]:
    """The profile file (``injection/model/profiles.py`` reads it) from ``decide``'s output;
    ``run``: how it was measured (command, cases, replies, seconds, machine)."""
    first, anchor = decided["guidance first turns"], decided["anchor"]
    strength = STRENGTH if anchor["on"] else 0.0
    today = date.today().isoformat()
    src = f"bench/bench_quality.py --calibrate, tuning split, {today}"

    def entry(d: dict[str, Any], default: Any, applies: str) -> dict[str, Any]:
        return {"default": default, "status": "measured", "applies": applies,
                "verdict": d["why"], "evidence": {k: d[k] for k in (
                    "pooled", "cells", "fluent", "cost_per_reply")} | {"source": src}}

    guidance = entry(anchor, strength, "standing instructions that name a language or ask "
                     "for what no decoding constraint keeps (engine/guidance/contrast.resolve)")
    guidance["first_turns"] = bool(strength and first["on"])
    guidance["first_turns_evidence"] = {"verdict": first["why"] + (
        "" if strength or not first["on"] else "; not used: the anchor did not earn the "
        "default strength"), **{k: first[k] for k in ("pooled", "cells", "fluent",
                                                      "cost_per_reply")}}
    mechanisms = {
        "guidance": guidance,
        "lean": {"default": "on with guided first turns" if guidance["first_turns"] else "off",
                 "status": "measured with the first turns (the member's lean guides them)",
                 "evidence": "guidance.first_turns_evidence"},
        "anchor": {**entry(anchor, "on" if strength else "off",
                           "a deep turn's first token (engine/guidance/anchor.py)"),
                   "deep_lean": False, "deep_lean_evidence": "not tried here: off"},
        "reminder": entry(decided["reminder"], "on" if decided["reminder"]["on"] else "off",
                          "turns deeper than 2 exchanges (prompting/reminder.py)"),
        "constraints": entry(decided["constraints"],
                             "on" if decided["constraints"]["on"] else "off",
                             "standing instructions the decoder can keep "
                             "(prompting/constraints.py)"),
    }
    return {"model": model, "model_key": key, "calibrated": True,
            "note": f"Made by {src} (rule: bench/quality_calibrate.py); validation "
                    "confirms it separately (docs/BENCHMARKS.md, quality).",
            "mechanisms": mechanisms, "calibration": run}


def write(out: str, scored: Sequence[tuple], cases: Sequence[Any], secs: float, path: Any,
          adapter: Any, generated: int) -> dict[str, Any]:
    """Decide from bench_quality's ``scored`` rows and write the profile to ``out``."""
    import json
    import shlex
    import sys
    from pathlib import Path

    from mdsection import machine

    from injection.model.fingerprint import model_key

    rows = replies(scored, cases)
    run = {"command": "bench/bench_quality.py " + shlex.join(sys.argv[1:]),
           "split": "tuning", "families": sorted({r.family for r in rows}),
           "depths": sorted({r.depth for r in rows}), "cases": len({r.case for r in rows}),
           "replies": len(rows), "generated": generated, "seconds": round(secs),
           "machine": machine(), "dtype": str(adapter.dtype).removeprefix("torch."),
           "rule": f"on: wins > losses pooled with exact McNemar p < {ALPHA}, no family x "
                   "depth cell losing with p < ALPHA, no paired loss of fluency with p < ALPHA"}
    decided = decide(rows)
    prof = profile(decided, Path(path).name, model_key(adapter), run)
    Path(out).write_text(json.dumps(prof, indent=2) + "\n")
    for name, d in decided.items():
        print(f"  {name}: {d['why']}")
    return prof
