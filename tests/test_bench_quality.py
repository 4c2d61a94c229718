"""The quality benchmark's own parts (bench/bench_quality.py): its statistics, its cases and
their split, IFEval's verifiers as the cases use them, and the requests each condition
sends. No model: the benchmark itself is run by ``make bench``."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import bench_quality  # noqa: E402
import quality_cases  # noqa: E402
from quality_stats import mcnemar, paired, wilson  # noqa: E402

CASES = quality_cases.CASES


def test_wilson_interval_matches_the_formula():
    lo, hi = wilson(5, 10)
    assert (round(lo, 3), round(hi, 3)) == (0.237, 0.763)
    assert wilson(0, 20)[0] == 0.0 and 0.16 < wilson(0, 20)[1] < 0.17
    assert wilson(20, 20)[1] == 1.0


def test_exact_mcnemar_on_discordant_pairs():
    assert mcnemar(5, 0) == pytest.approx(0.0625)  # 5 won, none lost: 2 / 2**5
    assert mcnemar(14, 1) == pytest.approx(2 * 16 / 2**15)
    assert mcnemar(4, 5) == 1.0 and mcnemar(0, 0) == 1.0
    assert paired([True, True, False, False], [False, True, True, False])[:2] == (1, 1)


def test_at_least_300_cases_in_three_families_and_a_disjoint_split():
    fam = Counter(c.family for c in CASES)
    assert fam["standing"] >= 150 and fam["preference"] >= 75 and fam["fact"] >= 75
    assert len({c.kind for c in CASES if c.family == "standing"}) >= 15
    for family in fam:
        splits = Counter(c.split for c in CASES if c.family == family)
        assert splits["tuning"] >= 30 and splits["validation"] >= 30, family
    for attr in ("question", "memory"):
        tuning = {getattr(c, attr) for c in CASES if c.split == "tuning"}
        assert not tuning & {getattr(c, attr) for c in CASES if c.split == "validation"}


def _case(kind: str, split: str = "tuning") -> quality_cases.Case:
    return next(c for c in CASES if c.kind == kind and c.split == split)


@pytest.mark.parametrize(("kind", "good", "bad"), [
    ("lowercase", "plants need water and light to grow well.", "Plants need water."),
    ("no_comma", "Water them twice a week and keep them in the sun.", "Water, light, soil."),
    ("capital", "WATER THEM TWICE A WEEK AND KEEP THEM IN THE SUN.", "Water them weekly."),
    ("title", "<<Plant care>>\nWater them twice a week.", "Water them twice a week."),
    ("quotation", '"Water them twice a week."', "Water them twice a week."),
])
def test_ifevals_verifiers_judge_the_cases(kind, good, bad):
    check = _case(kind).check
    assert check(good) and not check(bad) and not check("")


def test_repeat_prompt_is_judged_against_the_cases_own_question():
    case = _case("repeat_prompt", "validation")
    assert case.check(f"{case.question} Here is my answer.")
    assert not case.check("Here is my answer.")


def test_language_and_word_limits_use_the_cases_arguments():
    french = next(c for c in CASES if c.kind == "language" and "French" in c.memory)
    assert french.check("Je pense que vous devriez arroser les plantes deux fois par semaine "
                        "et les garder au soleil.")
    assert not french.check("I think you should water the plants twice a week.")
    short = _case("word_limit")  # under 20 words
    assert short.check("Water them twice a week.") and not short.check("word " * 40)


def test_each_condition_sends_what_it_says():
    case, budget = CASES[0], 1024
    none = bench_quality.request(0, case, 4, 1, bench_quality.CONDS["no memory"], budget)
    system = bench_quality.request(0, case, 4, 20, bench_quality.CONDS["system message"], budget)
    platform = bench_quality.request(3, case, 0, 20, bench_quality.CONDS["- guidance"], budget)
    assert not none.injection_enabled and case.memory not in str(none.messages)
    assert len(none.messages) == 9 and none.messages[-1]["content"] == case.question
    assert system.messages[0]["role"] == "system" and case.memory in system.messages[0]["content"]
    assert not system.injection_enabled and len(system.messages[0]["content"].split("\n")) == 20
    assert platform.injection_enabled and platform.contrast == 0.0 and platform.reminder is None
    assert [m.text for m in platform.memories].count(case.memory) == 1
    assert len(platform.memories) == 20 and platform.history_token_budget == budget


def test_profiles_pair_every_condition_on_the_same_cases():
    jobs = bench_quality.jobs_for(bench_quality.PROFILES["full"], "validation")
    by_cell: dict[tuple, set] = {}
    for i, d, n, name in jobs:
        by_cell.setdefault((d, n, name), set()).add(i)
    for d, n in {(d, n) for d, n, _ in by_cell}:  # paired: a cell's conditions, same cases
        assert len({frozenset(v) for (dd, nn, _), v in by_cell.items() if (dd, nn) == (d, n)}) == 1
    assert by_cell[(8, 20, "platform")] == set(sorted(by_cell[(0, 1, "platform")])[::3])
    assert all(CASES[i].split == "validation" for i, *_ in jobs)
    tail = [j[3] for j in jobs[-len(by_cell[(8, 20, "- recall pick")]):]]
    assert set(tail) == {"- recall pick"}  # the module switch runs last, in a phase


def test_a_reply_without_guidance_is_copied_only_where_the_platform_ran_no_guide():
    jobs = [(1, 0, 1, "platform"), (1, 0, 1, "- guidance"), (2, 0, 1, "platform"),
            (2, 0, 1, "- guidance"), (3, 8, 1, "- guidance")]
    late = [j for j in jobs if bench_quality._derivable(j, jobs)]
    assert late == [(1, 0, 1, "- guidance"), (2, 0, 1, "- guidance")]  # no twin: generated
    done = {"1|0|1|platform": {"text": "unguided", "guide": 0},
            "2|0|1|platform": {"text": "guided", "guide": 90}}
    assert bench_quality._derive(late, done) == {"1|0|1|- guidance"}
    assert done["1|0|1|- guidance"] == {"text": "unguided", "guide": 0, "derived": True}
    assert "2|0|1|- guidance" not in done  # its guide ran: generated without guidance
