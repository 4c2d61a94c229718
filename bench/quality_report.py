"""The quality benchmark's report: adherence tables with intervals, paired differences,
fluency and each condition's forward-token cost (bench/bench_quality.py)."""

from __future__ import annotations

import os
import shlex
import statistics
import sys

from mdsection import machine, table
from memory_cases import evades, recites
from quality_stats import compressible, diff, fluent, loops, share

FAMILIES = ("standing", "preference", "fact")
# the paired comparisons reported: (row, against it); "platform" over its variants is what
# the variant's missing mechanism adds
VERSUS = ("system message", "no memory", "- guidance", "+ guidance", "+ default guidance",
          "- reminder", "- both",
          "guidance only", "- recall pick", "- constraints", "- anchor", "whole guide",
          "lean 1", "lean 2", "lean 8", "lean 16", "- memory lean",
          "- deep lean")


def _cell_rows(scored, split, d, n):
    return [r for r in scored if r[1] == d and r[2] == n and (split == "all" or r[6] == split)]


def versus(names: list[str], base: str) -> list[str]:
    """The conditions ``base`` is paired against: "platform" against its variants
    (``VERSUS``), any other base against every other condition."""
    return [v for v in VERSUS if v in names] if base == "platform" else [
        v for v in names if v != base]


def adherence(scored, cases, cells, split: str, base: str = "platform") -> str:
    """One table per split: family x cell rows, each condition's share [95 % CI]
    (``cells``: (depth, memories) -> condition names), paired against ``base``."""
    names = list(dict.fromkeys(c for names in cells.values() for c in names))
    against = versus(names, base)
    header = ["family", "depth", "memories", *names, *[f"{base} vs {v}" for v in against]]
    rows = []
    for (d, n), conds in cells.items():
        for fam in (*FAMILIES, "all"):
            mine = [r for r in _cell_rows(scored, split, d, n)
                    if fam == "all" or cases[r[0]].family == fam]
            by = {c: sorted((r[0], r[4]) for r in mine if r[3] == c) for c in conds}
            if not by.get(base):
                continue
            row = [fam, str(d), str(n)]
            row += [share(sum(ok for _, ok in by[c]), len(by[c])) if c in by else "-"
                    for c in names]
            ours = [ok for _, ok in by[base]]
            row += [diff(ours, [ok for _, ok in by[v]]) if v in by else "-" for v in against]
            rows.append(row)
    return table(header, rows)


def fluency(scored, cases, names) -> str:
    rows = []
    for c in names:
        mine = [r for r in scored if r[3] == c]
        if not mine:
            continue
        texts = [r[5]["text"] for r in mine]
        recited = sum(cases[r[0]].family != "fact" and recites(cases[r[0]].memory, r[5]["text"])
                      for r in mine)
        unfluent = sum(not fluent(r[5]["text"], cases[r[0]].memory,
                                  cases[r[0]].family != "fact") for r in mine)
        rows.append([c, str(len(mine)), _pct(sum(not t.strip() for t in texts), mine),
                     _pct(sum(loops(t) for t in texts), mine),
                     _pct(sum(compressible(t) for t in texts), mine), _pct(recited, mine),
                     _pct(unfluent, mine),
                     _pct(sum(evades(t) for t in texts), mine),
                     f"{statistics.mean(r[5]['prompt'] for r in mine):.0f}",
                     f"{statistics.mean(r[5]['completion'] for r in mine):.1f}",
                     f"{statistics.mean(r[5]['guide'] for r in mine):.1f}",
                     str(sum(r[5].get("lean") == "probe" for r in mine))])
    # a reply that measured its member's lean counts the probes' tokens (once per member: in
    # this benchmark every case is a new member) in its guide forward tokens
    return table(["condition", "replies", "empty", "loops", "zlib < 0.5", "recites",
                  "not fluent", "non-answers",
                  "prompt tokens (mean)", "reply tokens (mean)",
                  "guide forward tokens (mean)", "replies measuring a lean"], rows)


def _pct(k: int, of: list) -> str:
    return f"{100 * k / len(of):.1f} %"


def render(scored, cases, profile, args, secs, path, adapter) -> str:
    """The markdown section: command, split sizes, tables per split, fluency and cost."""
    scored = [(*r[:5], r[5], cases[r[0]].split) for r in scored]
    cells = {k: v if isinstance(v, list) else v["conds"] for k, v in profile["cells"].items()}
    names = list(dict.fromkeys(c for names in cells.values() for c in names))
    splits = ("tuning", "validation") if args.split == "both" else (args.split,)
    base = getattr(args, "base", "platform")
    sizes = {s: sum(1 for i in {r[0] for r in scored} if cases[i].split == s) for s in splits}
    head = [
        f"Command: `.venv/bin/python bench/bench_quality.py {shlex.join(sys.argv[1:])}` "
        f"({len(scored)} replies in {secs:.0f} s; cases: "
        + ", ".join(f"{sizes[s]} {s}" for s in splits)
        + f"; greedy, max_new_tokens={args_tokens()})",
        f"Machine: {machine()}; model {path.name} ({adapter.device}, {str(adapter.dtype)[6:]})",
        "Cells: share passing (the check, a fluent reply, an answer) [95 % Wilson interval]; "
        f"`{base} vs X`: paired difference in cases (+{base} wins/-losses, exact McNemar p).",
    ]
    out = ["## Quality: adherence per family, depth and mechanism", "", "  \n".join(head)]
    for s in splits:
        out += ["", f"**{s}**", "", adherence(scored, cases, cells, s, base)]
    out += ["", "Fluency and forward tokens per condition (all cells, both splits):", "",
            fluency(scored, cases, names)]
    return "\n".join(out)


def args_tokens() -> int:
    return int(os.environ.get("MAX_NEW_TOKENS", "64"))
