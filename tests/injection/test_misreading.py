"""Memories read as their members meant them (issue 57): a memory that is not a request to
the assistant about its replies gets no rule (no decoding constraint, no guidance, not a
standing instruction); a negation never becomes the opposite rule; a tenant's quoted ban is
kept; a language beside a kept constraint is still guided. The readers' misreading figures
are bench/bench_misreading.py's; these are the issue's own examples and a few per kind."""

from __future__ import annotations

import pytest

from injection import build_executor
from injection.base import ExecutionRequest, MemoryItem
from injection.metrics import Metrics
from injection.prompting import rules
from injection.prompting.constraints import detect
from injection.prompting.reminder import standing

NOT_RULES = {
    "dislike": ["Replies in capital letters give me a headache.",
                "I really cannot stand all-caps answers.",
                "I dislike it when someone replies in lowercase.",
                "Answers with no commas at all are hard for me to follow."],
    "others": ["My brother writes all his replies in lowercase.",
               "My manager answers every message in under 15 words.",
               "Her emails always start with 'Dear all'."],
    "condition": ["If I ask about sports, only answer 'Yes' or 'No'.",
                  "On Mondays, start your replies with 'Morning!'.",
                  "If I write in German, reply in German.",
                  "Now and then I enjoy answers in lowercase.",
                  "For questions about tax, keep answers under 20 words."],
    "past": ["I used to reply to every email in capital letters.",
             "At my previous job, answers had to end with 'Regards'."],
    "hypothetical": ["Imagine an assistant that answers only in French.",
                     "It would be strange if every answer started with 'Behold'."],
    "quoted": ["My favourite word is 'lowercase'.", "I am reading 'No Commas Allowed'."],
    "language": ["I teach Portuguese.", "My uncle only speaks Greek.",
                 "We moved to Spain last spring."],
}
NEGATED = ["Please do not reply in lowercase.", "Don't answer me in capital letters.",
           "Never write your replies in all caps.", "Do not answer in Spanish."]


@pytest.mark.parametrize("memory", [m for ms in NOT_RULES.values() for m in ms])
def test_a_memory_that_asks_nothing_gets_no_rule(memory):
    assert rules.read(memory) == rules.NONE
    assert detect([memory]) == () and not standing(memory)
    assert detect([], memory) == ()  # as a tenant's instructions: none for any member


@pytest.mark.parametrize("memory", NEGATED)
def test_a_negation_is_never_the_opposite_rule(memory):
    read = rules.read(memory)
    assert read.standing  # a request, asking for nothing the decoder or the guide keeps
    assert read.constraints == () and read.language is None
    assert not rules.guided(read, ()) and detect([], memory) == ()


def test_requests_of_the_same_forms_are_still_rules():
    assert rules.read("Please reply in lowercase.").constraints == ("lowercase",)
    assert rules.read("Don't use capital letters in your replies.").constraints == (
        "lowercase",)  # the capitals themselves banned: lowercase, as asked
    assert rules.read("I dislike commas, so leave them out of your answers.").constraints == (
        "no_comma",)
    assert rules.read("My family speaks Greek, so reply in Greek.").language == "Greek"
    assert rules.read("Don't use English with me, use German.").language == "German"
    assert rules.read("Reply in French even when I write in English.").language == "French"
    assert rules.read("When you answer, never use commas.").constraints == ("no_comma",)
    assert rules.read("Don't forget to reply in lowercase.").constraints == ("lowercase",)


def test_a_tenants_quoted_ban_is_kept():
    ban = "Never use the word 'basically'."
    assert detect([], ban) == ("ban:basically",)
    # its banned word is no literal the replies hold: a member's capitals stay too
    assert detect(["Always answer in capital letters."], ban) == ("ban:basically", "uppercase")
    assert detect(["Reply in lowercase."], "Start every reply with 'Acme:'.") == (
        "start:Acme:",)  # a literal the replies do hold still wins


def test_a_language_beside_a_kept_constraint_is_still_guided():
    read = rules.read("Answer in French, never with commas.")
    assert (read.constraints, read.language) == (("no_comma",), "French")
    assert rules.guided(read, ("no_comma",))  # the decoder keeps the commas, not French
    alone = rules.read("Answer in lowercase, never with commas.")
    assert not rules.guided(alone, ("lowercase", "no_comma"))


@pytest.mark.slow
@pytest.mark.real_model
def test_a_memory_read_as_no_rule_gets_the_reply_it_gets_with_the_rules_off(smollm):
    """Greedy on SmolLM2, defaults against constraints and guidance off: token for token."""
    ask = [{"role": "user", "content": "How do bees make honey?"}]
    ex = build_executor(smollm, batch_max=4, metrics=Metrics())
    try:
        for memory in ("Please do not reply in lowercase.",
                       "If I ask about sports, only answer 'Yes' or 'No'."):
            mems = (MemoryItem("m", memory),)
            on = ex.execute(ExecutionRequest("t", "u", ask, memories=mems, max_new_tokens=16))
            off = ex.execute(ExecutionRequest("t", "u", ask, memories=mems, max_new_tokens=16,
                                              constrain=False, contrast=0.0))
            assert on.constraints == [] and on.contrast_effective == 0.0
            assert on.text == off.text and on.completion_tokens == off.completion_tokens
    finally:
        ex.close()
