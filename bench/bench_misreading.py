"""How many memories that are not instructions the readers turn into rules (issue 57).

Each memory of bench/misreading_cases.py is read as the planner reads it on the defaults
(``prompting/rules.py``: ``read``, the turn's merge, ``rules.guided``), alone, as a member's
only memory:

* ``constraint``: a decoding constraint on every reply (``cache.constraints``);
* ``guided``: contrastive guidance toward it on every first reply (a standing language, or
  a constraint the turn does not keep; SmolLM2's default strength applies);
* ``rule``: either of them (the figure that must be 0);
* ``standing``: read as a standing instruction (re-stated in every reminder: no rule on the
  reply, but what ``rule`` requires);
* ``tenant``: the memory as a tenant's instructions (``read_instructions``): a constraint
  for every member.

Reported per kind and split with a Wilson 95 % interval, and the positive controls (the
same surface forms asked as requests): how many keep the rule they ask for. No model is
loaded: the reading is what decides a rule.

Run: ``.venv/bin/python bench/bench_misreading.py [--split tuning] [--show tuning|validation]
[--write-docs]``
(``--show`` lists the memories read as rules; look at validation once, after tuning).

``--replies`` asks the real model instead (``misreading_replies.py``: SmolLM2, or
``MODEL_PATH``): each memory's reply on the defaults against the decoder's rules off, the
replies a rule changed (harm), the controls kept in fluent replies, and the standing family's
adherence at depths 0 and 8 beside them; ``--write-docs`` then writes its tables as section
``replies-SPLIT`` of docs/benchmarks/misreading.md. ``.venv/bin/python bench/bench_misreading.py
--replies --split validation --partial FILE --quality-partial FILE2 [--show validation]
[--write-docs]`` (the partial files keep the replies and resume; FILE2 is bench_quality's
``--partial`` format); ``--derive`` generates a rules-off reply only where a rule applied (the
others are the default reply token for token: tests/injection/test_misreading.py),
``--no-standing`` leaves the standing family out.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from mdsection import table, write_section  # noqa: E402
from misreading_cases import KINDS, UNSEEN, cases, controls  # noqa: E402
from quality_stats import share, wilson  # noqa: E402

from injection.prompting import rules  # noqa: E402


def reading(memory: str) -> dict[str, bool | tuple[str, ...]]:
    """What the defaults make of ``memory`` as a member's only memory (and as a tenant's
    instructions)."""
    r = rules.read(memory)
    _, member = rules.TurnRules((r,), rules.NONE).decoding(True)
    found = tuple(sorted(member))
    guided = rules.guided(r, found)
    tenant = rules.TurnRules((), rules.read_instructions(memory)).decoding(False)[0]
    return {"constraints": found, "constraint": bool(found), "guided": guided,
            "rule": bool(found) or guided, "standing": r.standing, "tenant": bool(tenant),
            "language": r.language}


def kept(memory: str, want: str) -> bool:
    """Whether a positive control keeps the rule it asks (``want``)."""
    read = reading(memory)
    if want.startswith("language:"):
        return read["language"] == want.split(":", 1)[1] and bool(read["guided"])
    return want in read["constraints"]


def report(show: str | None, splits: tuple[str, ...]) -> list[str]:
    cols = ("rule", "constraint", "guided", "standing", "tenant")
    lines = ["| kind | split | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 2)]
    for split in splits:
        mine = cases(split)
        for kind in (*KINDS, "all"):
            here = [c for c in mine if kind in ("all", c.kind)]
            reads = [reading(c.memory) for c in here]
            n = len(here)
            lines.append(f"| {kind} | {split} | " + " | ".join(
                share(sum(bool(r[c]) for r in reads), n) for c in cols) + " |")
    lines.append("")
    for split in splits:
        ctl = controls(split)
        ok = [kept(c.memory, want) for c, want in ctl]
        lines.append(f"positive controls kept ({split}): {share(sum(ok), len(ok))}")
    if show:
        lines += ["", f"read as rules ({show}):"]
        for c in cases(show):
            r = reading(c.memory)
            if r["rule"] or r["tenant"]:
                lines.append(f"  [{c.kind}] {c.memory!r} -> {r['constraints']} "
                             f"guided={r['guided']} tenant={r['tenant']}")
        lines += [f"  [control] {c.memory!r} wants {want}: {reading(c.memory)}"
                  for c, want in controls(show) if not kept(c.memory, want)]
    return lines


def read_cost(repeats: int = 20) -> float:
    """Microseconds ``rules.read`` takes per memory (what a memory's save pays once)."""
    texts = [c.memory for c in cases()] + [c.memory for c, _ in controls()]
    start = time.perf_counter()
    for _ in range(repeats):
        for t in texts:
            rules.read(t)
    return 1e6 * (time.perf_counter() - start) / (repeats * len(texts))


def section() -> str:
    """docs/BENCHMARKS.md's section: rules per kind and split, the controls kept."""
    rows = []
    for split, batch, name in (("tuning", None, "tuning"), ("validation", None, "validation"),
                               ("validation", UNSEEN, f"validation, batch {UNSEEN}")):
        mine = cases(split, batch)
        got = {k: [reading(c.memory)["rule"] for c in mine if c.kind == k] for k in KINDS}
        every = [r for k in KINDS for r in got[k]]
        lo, hi = wilson(sum(every), len(every))
        ctl = [kept(c.memory, want) for c, want in controls(split, batch)]
        rows.append([name, *(f"{sum(got[k])}/{len(got[k])}" for k in KINDS),
                     f"**{sum(every)}/{len(every)}** [{100 * lo:.1f}-{100 * hi:.1f} %]",
                     f"{sum(ctl)}/{len(ctl)}"])
    return "\n".join([
        "## Misreading: memories that are not instructions, read as rules (issue 57)",
        f"`.venv/bin/python bench/bench_misreading.py --write-docs`, {date.today()}, readers "
        f"`READER_VERSION` {rules.READER_VERSION}; no model: the memories of "
        "bench/misreading_cases.py that become a rule on the defaults (a decoding constraint, or "
        "guidance toward them) as a member's only memory; controls: standing instructions of the "
        f"same forms that keep the rule they ask; batch {UNSEEN} (in the row above, and alone) "
        "is the unseen check: no reader was changed knowing its validation half. Reading costs "
        f"{read_cost():.0f} µs a memory, once, when it is saved.", "",
        table(["split", *KINDS, "all (Wilson 95 %)", "controls kept"], rows)])


REPLIES_DOC = ROOT / "docs" / "benchmarks" / "misreading.md"
REPLIES_HEAD = ("# Misreading: replies on the real model (bench/bench_misreading.py --replies)"
                "\n\nEach run's tables, written by `--replies --write-docs`; docs/BENCHMARKS.md "
                "(misreading) summarises them.\n")


def replies(args: argparse.Namespace) -> None:
    """``--replies``: the real model's replies (``misreading_replies``), reported and written."""
    import shlex

    import misreading_replies as mr

    split = args.split or "validation"
    mr.BATCH = args.batch
    done, standing, model = mr.run(split, args.workers, args.partial, args.quality_partial,
                                   args.derive, not args.no_standing)
    cmd = ".venv/bin/python bench/bench_misreading.py " + shlex.join(sys.argv[1:])
    text = mr.render(split, done, standing, cmd, model)
    print(text)
    if args.show:
        print("\n".join(mr.shown(args.show, done)))
    if args.write_docs:
        if not REPLIES_DOC.exists():
            REPLIES_DOC.write_text(REPLIES_HEAD)
        write_section(f"replies-{split}" + (f"-batch{args.batch}" if args.batch else ""), text,
                      REPLIES_DOC)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=("tuning", "validation"),
                    help="only this split (default: both)")
    ap.add_argument("--show", choices=("tuning", "validation"))
    ap.add_argument("--write-docs", action="store_true",
                    help="rewrite docs/BENCHMARKS.md's misreading section")
    ap.add_argument("--replies", action="store_true",
                    help="the real model's replies (default split: validation)")
    ap.add_argument("--workers", type=int, default=8, help="--replies: requests at once")
    ap.add_argument("--partial", default="", help="--replies: JSON file of the replies so far")
    ap.add_argument("--quality-partial", default="",
                    help="--replies: the standing family's replies (bench_quality --partial)")
    ap.add_argument("--derive", action="store_true", help="--replies: the rules-off reply "
                    "copied where no rule applied (misreading_replies.generate)")
    ap.add_argument("--batch", type=int, help="--replies: only this batch of the set (3, 4, 5)")
    ap.add_argument("--no-standing", action="store_true",
                    help="--replies: without the standing family's replies")
    args = ap.parse_args()
    if args.replies:
        return replies(args)
    if args.write_docs:
        write_section("misreading", section())
    print(f"readers: READER_VERSION {rules.READER_VERSION}")
    splits = (args.split,) if args.split else ("tuning", "validation")
    print("\n".join(report(args.show, splits)))


if __name__ == "__main__":
    main()
