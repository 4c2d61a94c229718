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
from quality_stats import fluent, loop_share, loops, mcnemar, paired, wilson  # noqa: E402

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


# issue 57: replies the guided languages gave ("…": the reply went on as it started)
LOOPS = [
    "Bees préférer les bœufs pour les bœufs, les bœufs pour les bœufs…",
    "Deutsch: Für Deutsch: German: German: German: German: German: German: German: German:",
    "1. I should not panic.\n2. I should not panic.\n3. I should not panic.\n4. I should not",
    "Mochi, my cat, I'm not sure what to say. I'm not sure what to say.",
    "Die köpern von menschen würden die köpern von menschen können darauf können können "
    "können können können können",
]
NOT_LOOPS = [
    "1. Water them twice a week.\n2. Keep them in the sun.\n3. Feed them in spring.\n"
    "4. Repot them every two years.\n5. Check the leaves for pests.",
    "- Use a soft brush.\n- Use warm water.\n- Use a mild soap.\n- Rinse and dry it well.",
    "A great way to relax is a walk. It's also a great way to meet people, and a great way "
    "to see the city.",  # a phrase said three times in ordinary prose
    "Yes.",
    "",
]


@pytest.mark.parametrize("reply", LOOPS)
def test_a_looping_reply_is_not_fluent(reply):
    assert loops(reply) and not fluent(reply, "Always answer in German.")


@pytest.mark.parametrize("reply", NOT_LOOPS)
def test_ordinary_lists_and_prose_do_not_loop(reply):
    assert not loops(reply)


def test_loop_share_counts_repeated_word_4grams_of_letters():
    # 9 4-grams, the last two said before; digits and punctuation are no words
    assert loop_share("Bees préférer les bœufs pour les bœufs, les bœufs pour les bœufs") == \
        pytest.approx(2 / 9)
    assert loop_share("1. a b c d 2. a b c d") == pytest.approx(1 / 5)  # abcd said again
    assert loop_share("one two three") == 0.0  # no 4-gram


def test_fluent_is_not_empty_and_recites_no_memory_but_a_facts():
    memory = "My cat is called Mochi and she is three years old."
    assert not fluent("  ", memory)
    assert not fluent("Your cat is called Mochi and she is three years old.", memory)
    assert fluent("Your cat is called Mochi and she is three years old.", memory,
                  recital_counts=False)
    assert fluent("Water them twice a week and keep them in the sun.", memory)


def test_the_verdict_of_every_family_needs_a_fluent_reply():
    french = next(c for c in CASES if c.kind == "language" and "French" in c.memory)
    loop = ("Je suis toujou dans les toileux pour faire troupeau pour les toileux.\n\n"
            "Je suis toujou dans les toileux pour faire troupeau pour les toileux.\n\n"
            "Je suis toujou dans les toileux pour faire troupeau pour les toileux.")
    assert french.check(loop) and not bench_quality.adheres(french, loop)
    fine = ("Je pense que vous devriez arroser les plantes deux fois par semaine et les garder "
            "au soleil.")
    assert bench_quality.adheres(french, fine)
    fact = next(c for c in CASES if c.family == "fact")
    looped = " ".join([fact.memory] * 3)
    assert fact.check(looped) and not bench_quality.adheres(fact, looped)


def test_rescoring_stored_replies_pairs_each_condition_with_the_platform_before_and_now():
    import quality_rescore

    i = next(k for k, c in enumerate(CASES) if c.kind == "language" and "French" in c.memory)
    fine = "Je pense que vous devriez arroser les plantes deux fois par semaine."
    loop = " ".join(["Je suis toujou dans les toileux pour faire troupeau."] * 3)
    replies = {(i, 0, 1, "platform"): loop, (i, 0, 1, "- guidance"): fine}
    [row] = quality_rescore.compare(replies, "platform", ("standing",))
    assert row[:4] == ["0x1", "standing", f"{CASES[i].split} (1)", "platform vs - guidance"]
    assert row[4].startswith("1 vs 1: +0")  # before: both pass the language check
    assert row[5].startswith("0 vs 1: -1")  # now: the loop is not fluent
    assert row[6] == "1 / 0"


def test_the_fluency_table_counts_loops_and_replies_that_are_not_fluent():
    import quality_report

    row = {"prompt": 10, "completion": 5, "guide": 0}
    loop = " ".join(["Je suis toujou dans les toileux pour faire troupeau."] * 3)
    scored = [(0, 0, 1, "platform", False, {**row, "text": loop}),
              (1, 0, 1, "platform", False, {**row, "text": ""}),
              (2, 0, 1, "platform", True, {**row, "text": "Water them twice a week."}),
              (3, 0, 1, "platform", True, {**row, "text": "Keep them in the sun."})]
    header, _, line = quality_report.fluency(scored, CASES, ["platform"]).splitlines()
    cols = dict(zip(header.strip("|").split(" | "), line.strip("|").split(" | "), strict=True))
    assert cols["loops"].strip() == "25.0 %" and cols["empty"] == "25.0 %"
    assert cols["not fluent"] == "50.0 %"
