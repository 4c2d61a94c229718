"""The rules a memory holds as data (``prompting/rules.py``): read once, stored as JSON,
merged per turn exactly as the readers merge the texts."""

import pytest
from transformers import AutoTokenizer

from injection.base import ExecutionRequest, MemoryItem
from injection.prompting import rules
from injection.prompting.constraints import detect, merge
from tests.injection.test_planner import ASK, TextOnly, planner

MEMORIES = ["Always answer in lowercase.", "Never use the words 'very' or 'really'.",
            "Reply in French.", "I live in Oslo.", "Start every reply with 'Ahoy!'",
            "Keep every answer under 20 words.", "Write all your answers in capital letters.",
            "Answer as exactly 3 bullet points.", ""]
INSTRUCTIONS = ["", "Start every reply with 'Acme:'. Be polite.", "Never use commas.",
                "Answer in capital letters.", "Always reply in English."]


@pytest.fixture(scope="module")
def text(demo_model_path) -> TextOnly:
    return TextOnly(AutoTokenizer.from_pretrained(str(demo_model_path)))


def test_json_round_trip_is_plain():
    r = rules.read("Always answer in lowercase, in French.")
    d = rules.to_json(r)
    assert rules.from_json(d) == r
    assert all(isinstance(v, (list, str, bool, type(None))) for v in d.values())
    assert rules.from_json({}) == rules.NONE
    with pytest.raises(ValueError):
        rules.from_json({"constraints": "lowercase"})


def test_read_names_what_a_memory_asks():
    r = rules.read("Always answer in lowercase.")
    assert r.constraints == ("lowercase",) and r.standing and r.language is None
    assert rules.read("Reply in French.").language == "French"
    assert rules.read("I live in Oslo.") == rules.NONE


@pytest.mark.parametrize("instructions", INSTRUCTIONS)
def test_merging_stored_rules_is_what_detect_reads(instructions):
    for k in range(len(MEMORIES)):
        texts = MEMORIES[k:] + MEMORIES[:k]
        tenant = rules.read_instructions(instructions)
        merged = merge([r.constraints for r in map(rules.read, texts)], tenant.constraints,
                       tenant.literals)
        assert tuple(sorted(set().union(*merged))) == detect(texts, instructions)


def test_fields_default_to_reading_the_text():
    assert MemoryItem("a", "x").rules is None
    assert ExecutionRequest("t", "u", ()).instruction_rules is None


def test_the_planner_keeps_stored_rules_instead_of_reading_the_text(text, monkeypatch):
    """A memory asking for lowercase whose rules were switched off (``NONE``) gets no
    constraint; stored rules are taken as they are, and a text without them is read once
    per turn."""
    on = planner(text, batching=True)
    lower = "Always answer in lowercase."
    off = (MemoryItem("a", lower, rules=rules.NONE), MemoryItem("b", "I live in Oslo."))
    assert "constraints" not in on.plan(ExecutionRequest("t", "u", ASK, memories=off,
                                                         reminder=False)).sampling
    stored = (MemoryItem("a", "I live in Oslo.", rules=rules.read(lower)),)
    assert on.plan(ExecutionRequest("t", "u", ASK, memories=stored)).sampling[
        "constraints"] == ("lowercase",)
    calls = []
    real = rules.read
    monkeypatch.setattr(rules, "read", lambda t: calls.append(t) or real(t))
    mems = tuple(MemoryItem(str(i), t) for i, t in enumerate([lower, "I like jazz.", "Be kind."]))
    on.plan(ExecutionRequest("t", "u", ASK, memories=mems, instructions="Be brief.",
                             reminder=False))
    assert sorted(calls) == sorted(m.text for m in mems)
    calls.clear()
    on.plan(ExecutionRequest("t", "u", ASK, memories=tuple(
        m._replace(rules=real(m.text)) for m in mems), reminder=False))
    assert calls == []


def test_stored_instruction_rules_and_the_members_own_constraints(text):
    """The tenant's rules apply to decoding but the reply lists only the member's own."""
    on = planner(text, batching=True)
    acme = "Start every reply with 'ACME:'. Never use commas."
    req = ExecutionRequest("t", "u", ASK, "Always answer in capital letters, never commas.",
                           acme)
    plan = on.plan(req)
    assert plan.sampling["constraints"] == ("no_comma", "start:ACME:", "uppercase")
    assert plan.own_constraints == ("no_comma", "uppercase")
    stored = ExecutionRequest("t", "u", ASK, "I like jazz.", acme,
                              instruction_rules=rules.NONE)
    assert "constraints" not in on.plan(stored).sampling
    echo = on.plan(ExecutionRequest("t", "u", ASK, "Begin every answer by repeating my "
                                    "question word for word.", acme))
    assert echo.own_constraints == ()  # the tenant's opening wins: no echo; commas theirs
