"""The rules a memory holds as data (``prompting/rules.py``): read once, stored as JSON,
merged per turn exactly as the readers merge the texts."""

import pytest

from injection.base import ExecutionRequest, MemoryItem
from injection.prompting import rules
from injection.prompting.constraints import detect, merge

MEMORIES = ["Always answer in lowercase.", "Never use the words 'very' or 'really'.",
            "Reply in French.", "I live in Oslo.", "Start every reply with 'Ahoy!'",
            "Keep every answer under 20 words.", "Write all your answers in capital letters.",
            "Answer as exactly 3 bullet points.", ""]
INSTRUCTIONS = ["", "Start every reply with 'Acme:'. Be polite.", "Never use commas.",
                "Answer in capital letters.", "Always reply in English."]


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
