"""The misreading benchmark's replies mode (bench/bench_misreading.py --replies,
bench/misreading_replies.py): the two requests each memory sends and how their replies are
counted. No model: the replies themselves come from a run on SmolLM2."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import misreading_replies as mr  # noqa: E402
from misreading_cases import cases, controls  # noqa: E402

from injection.prompting import rules  # noqa: E402


def test_each_memory_is_asked_on_the_defaults_and_with_the_decoders_rules_off():
    case = cases("validation")[0]
    on, off = mr.request(case, True, 1024), mr.request(case, False, 1024)
    assert on.messages == off.messages == [{"role": "user", "content": case.question}]
    assert (on.constrain, on.contrast) == (None, None)  # the defaults
    assert (off.constrain, off.contrast) == (False, 0.0)
    assert on.memories == off.memories and on.memories[0].text == case.memory
    assert on.memories[0].rules == rules.read(case.memory)  # read once, as when saved
    assert on.user == off.user and on.injection_enabled and on.history_token_budget == 1024


def _row(text: str, constraints=(), contrast=0.0) -> dict:
    return {"text": text, "constraints": list(constraints), "contrast": contrast, "guide": 0,
            "completion": len(text.split())}


def test_harm_counts_rules_applied_and_replies_they_changed_per_kind():
    mine = cases("validation")
    done = {mr.key(c, on): _row("Bees make honey from nectar.") for c in mine
            for on in (True, False)}
    first, second = mine[0], mine[1]  # the first kind's first two cases
    done[mr.key(first, True)] = _row("BEES MAKE HONEY FROM NECTAR.", ["uppercase"])
    done[mr.key(second, True)] = _row("Bees make honey from nectar.", contrast=1.0)
    rows = {r[0]: r for r in mr.harm_rows("validation", done)}
    n = sum(c.kind == first.kind for c in mine)
    assert rows[first.kind][1] == str(n)
    assert rows[first.kind][2].startswith("2/") and rows[first.kind][3].startswith("1/")
    assert rows["all"][1] == str(len(mine)) and rows["all"][3].startswith("1/")


def test_a_control_is_kept_only_in_a_fluent_reply_that_keeps_its_rule():
    memory = "Please reply in lowercase."
    assert mr.kept("bees make honey from the nectar of flowers.", "lowercase", memory)
    assert not mr.kept("Bees make honey.", "lowercase", memory)
    assert not mr.kept(" ".join(["bees make honey from nectar"] * 4), "lowercase", memory)
    assert not mr.kept("", "no_comma", memory)
    german = "Bienen machen Honig aus dem Nektar der Blumen, den sie im Stock lagern."
    assert mr.kept(german, "language:German", "Answer in German from now on.")
    assert not mr.kept("Bees make honey from nectar.", "language:German", "Answer in German.")


def test_every_control_language_has_a_code():
    wants = {w.split(":", 1)[1] for _, w in controls() if w.startswith("language:")}
    assert wants <= set(mr.CODES)
