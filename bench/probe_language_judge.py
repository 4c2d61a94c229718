"""Do the replies bench_quality counts as following an instruction make sense? The judge's
scores (``quality_judge.py``) of stored bench_quality replies.

Two uses:

* per run and condition (``LABEL=FILE:CONDITION:DEPTH``): the language replies the check
  passes, their median score and how many the judge finds sensible (``--english``: the
  same runs' replies to the other standing instructions, for the judge's score of
  sensible text);
* ``--pair A,B --depth D FILE...``: conditions A and B paired on the standing family, by
  bench_quality's verdict and by the verdict with the judge's (a reply that passes must
  also make sense), with the replies B turns into nonsense where A's made sense (harm) and
  the reverse.

Run: ``.venv/bin/python bench/probe_language_judge.py LABEL=FILE:CONDITION:DEPTH ...
[--english] [--split tuning]`` or ``... --pair 'platform,+ first anchor' --depth 0 FILE``
(FILE: a bench_quality ``--partial`` file, .json or .gz).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_quality import adheres  # noqa: E402
from quality_cases import CASES  # noqa: E402
from quality_judge import SENSIBLE_NLL, Judge, sensible  # noqa: E402
from quality_rescore import load  # noqa: E402
from quality_stats import mcnemar  # noqa: E402


def runs(judge: Judge, specs: list[str], split: str, english: bool) -> list[str]:
    rows = []
    for spec in specs:
        label, rest = spec.split("=", 1)
        path, cond, depth = rest.rsplit(":", 2)
        scores = []
        for (i, d, _n, name), text in sorted(load(path).items()):
            case = CASES[i]
            wanted = (case.family == "standing" and case.kind != "language") if english \
                else (case.kind == "language" and case.check(text))
            if name == cond and d == int(depth) and case.split == split and wanted:
                s = judge.score(case.memory, case.question, text)
                scores.append(s if s is not None else 0.0)
        q = statistics.quantiles(scores, n=20) if len(scores) > 1 else [float("nan")] * 19
        rows.append(f"| {label} | {cond} | {depth} | {len(scores)} | "
                    f"{statistics.median(scores):.2f} | {q[0]:.2f} / {q[-1]:.2f} | "
                    f"{sum(s < SENSIBLE_NLL for s in scores)}/{len(scores)} |")
        print(rows[-1], flush=True)
    return ["| run | condition | depth | replies | median NLL | 5th / 95th percentile | "
            f"under {SENSIBLE_NLL} |", "|---|---|---|---|---|---|---|", *rows]


def pair(judge: Judge, files: list[str], a: str, b: str, depth: int, split: str) -> list[str]:
    replies: dict = {}
    for f in files:
        replies.update(load(f))
    ids = sorted({(i, n) for (i, d, n, c) in replies if d == depth and c == a}
                 & {(i, n) for (i, d, n, c) in replies if d == depth and c == b})
    ids = [(i, n) for i, n in ids if CASES[i].family == "standing" and CASES[i].split == split]
    plain, judged, harm, mended = [0, 0], [0, 0], 0, 0
    totals = {a: [0, 0], b: [0, 0]}
    for i, n in ids:
        case, ta, tb = CASES[i], replies[(i, depth, n, a)], replies[(i, depth, n, b)]
        sa, sb = (sensible(judge.score(case.memory, case.question, t)) for t in (ta, tb))
        va, vb = adheres(case, ta), adheres(case, tb)
        ja, jb = va and sa, vb and sb
        totals[a][0] += va
        totals[b][0] += vb
        totals[a][1] += ja
        totals[b][1] += jb
        plain[0] += vb and not va
        plain[1] += va and not vb
        judged[0] += jb and not ja
        judged[1] += ja and not jb
        harm += sa and not sb
        mended += sb and not sa
    return [f"{len(ids)} cases, depth {depth}, {split}: {a} vs {b}",
            f"  verdict: {totals[a][0]} vs {totals[b][0]} (+{plain[0]}/-{plain[1]}, "
            f"p={mcnemar(*plain):.3g})",
            f"  with the judge: {totals[a][1]} vs {totals[b][1]} (+{judged[0]}/-{judged[1]}, "
            f"p={mcnemar(*judged):.3g})",
            f"  replies {b} made nonsense where {a}'s made sense: {harm}; the reverse: {mended}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="LABEL=FILE:CONDITION:DEPTH or FILE")
    ap.add_argument("--split", default="tuning")
    ap.add_argument("--english", action="store_true")
    ap.add_argument("--pair", default="", metavar="A,B")
    ap.add_argument("--depth", type=int, default=0)
    args = ap.parse_args()
    judge = Judge()
    try:
        if args.pair:
            a, b = args.pair.split(",")
            print("\n".join(pair(judge, args.runs, a, b, args.depth, args.split)))
        else:
            print("\n".join(runs(judge, args.runs, args.split, args.english)))
    finally:
        judge.save()


if __name__ == "__main__":
    main()
