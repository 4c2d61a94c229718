"""Re-score stored bench_quality replies with the fluency verdict (issue 57), no model.

Each ``platform`` reply of a results file (bench/results/*.json.gz: ``bench_quality.py
--partial`` files, gzipped) is paired with every other condition of its cell, per family and
split, judged before (the check, no recitation, an answer) and now (``bench_quality.adheres``:
a fluent reply too, ``quality_stats.fluent``). A default still wins where its paired gain
over the condition without it stays positive on tuning, and validation confirms it.

Run: ``.venv/bin/python bench/quality_rescore.py bench/results/quality-full-2026-12-01-memory-lean.json.gz
[--family standing] [--base platform] [--write-docs SLUG]`` (``--write-docs``: the tables as
section SLUG of docs/benchmarks/quality.md).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shlex
import sys
from datetime import date
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from bench_quality import QUALITY_DOC, adheres  # noqa: E402
from mdsection import table, write_section  # noqa: E402
from memory_cases import evades, recites  # noqa: E402
from quality_cases import CASES  # noqa: E402
from quality_stats import diff, loops  # noqa: E402


def before(i: int, reply: str) -> bool:
    """The verdict before fluency counted: the check, no recitation (but a fact's), an answer."""
    case = CASES[i]
    recited = case.family != "fact" and recites(case.memory, reply)
    return bool(case.check(reply)) and not recited and not evades(reply)


def load(path: str) -> dict[tuple, str]:
    """(case, depth, memories, condition) -> reply text."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = json.load(f)
    out = {}
    for key, row in rows.items():
        if not key.startswith("_"):
            i, d, n, name = key.split("|", 3)
            out[(int(i), int(d), int(n), name)] = row["text"]
    return out


def compare(replies: dict, base: str, families: tuple[str, ...]) -> list[list[str]]:
    """One row per cell x family x split x condition paired with ``base``."""
    verdicts = {k: (before(k[0], t), adheres(CASES[k[0]], t), loops(t))
                for k, t in replies.items()}
    rows = []
    cells = sorted({(d, n) for _, d, n, _ in replies})
    for d, n in cells:
        names = sorted({c for _, dd, nn, c in replies if (dd, nn) == (d, n)} - {base})
        for fam in families:
            for split in ("tuning", "validation"):
                ids = sorted(i for i, dd, nn, c in replies if (dd, nn, c) == (d, n, base)
                             and CASES[i].split == split and fam in ("all", CASES[i].family))
                for name in names:
                    both = [i for i in ids if (i, d, n, name) in replies]
                    if both:
                        rows.append(_row(verdicts, both, d, n, fam, split, base, name))
    return rows


def _row(verdicts, ids, d, n, fam, split, base, name) -> list[str]:
    ours = [verdicts[(i, d, n, base)] for i in ids]
    theirs = [verdicts[(i, d, n, name)] for i in ids]
    cols = []
    for k in (0, 1):  # before, now
        a, b = [v[k] for v in ours], [v[k] for v in theirs]
        cols.append(f"{sum(a)} vs {sum(b)}: {diff(a, b)}")
    looped = f"{sum(v[2] for v in ours)} / {sum(v[2] for v in theirs)}"
    return [f"{d}x{n}", fam, f"{split} ({len(ids)})", f"{base} vs {name}", *cols, looped]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--base", default="platform")
    ap.add_argument("--family", default="", help="standing, preference, fact or all "
                    "(default: each family)")
    ap.add_argument("--write-docs", default="", metavar="SLUG",
                    help="write the tables as section SLUG of docs/benchmarks/quality.md")
    args = ap.parse_args()
    fams = (args.family,) if args.family else ("standing", "preference", "fact")
    out = [f"## {args.write_docs or 'rescore'}: stored replies re-scored with the fluency verdict",
           "", f"`.venv/bin/python bench/quality_rescore.py {shlex.join(sys.argv[1:])}`, "
           f"{date.today()}: each pair's passing replies and paired gain (+base wins/-losses, "
           "exact McNemar p) before fluency counted and now; loops: replies of each side that "
           "loop (`quality_stats.loops`)."]
    for path in args.files:
        out += ["", f"{Path(path).name}:", "", table(
            ["cell (depth x memories)", "family", "split (cases)", "pair",
             "before: passing, paired gain", "now (fluent): passing, paired gain",
             "loops (base / other)"], compare(load(path), args.base, fams))]
    text = "\n".join(out)
    print(text)
    if args.write_docs:
        write_section(f"quality-{args.write_docs}", text, QUALITY_DOC)


if __name__ == "__main__":
    main()
