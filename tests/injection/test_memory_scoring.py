"""The memory-depth benchmark's recitation rule (bench/memory_cases.py: ``recites``).

A reply that only restates the member's memory ("I am vegetarian and I do not like spicy
food.") must fail adherence even when the case's keyword check passes it; a real answer
that mentions the memory in passing, or a fact case answered with the fact, must not.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from memory_cases import TUNING, Case, adheres, avoids, mentions, recitation, recites  # noqa: E402

VEG = "I am vegetarian and I do not like spicy food."


def test_verbatim_recitation():
    assert recites(VEG, "I am vegetarian and I do not like spicy food.")
    assert recites(VEG, "I am vegetarian and I do not like spicy food. I am vegetarian and "
                        "I do not like spicy food. I am vegetarian")


def test_paraphrased_recitation():
    assert recites(VEG, "You are a vegetarian, and you don't like spicy food!")
    assert recites("I hate mushrooms.", "You hate mushrooms, so you hate mushrooms.")


def test_recitation_padded_with_memory_words():
    # many new words, but most of the reply is the memory's (share >= 60 %)
    reply = ("Vegetarian food, not spicy: vegetarian food that is not spicy food, vegetarian "
             "and not spicy, like vegetarian food. Mild, gentle, calm, soft, plain, simple.")
    assert recites(VEG, reply)


def test_answer_mentioning_memory_in_passing():
    reply = ("Since you are vegetarian and don't like spicy food, try a creamy mushroom "
             "risotto with peas, lemon zest and parmesan, served with a green salad.")
    assert not recites(VEG, reply)


def test_answer_not_restating_memory():
    assert not recites(VEG, "Try a mild lentil soup.")  # short, but no restatement
    assert not recites("Keep answers under fifteen words.",
                       "Sunlight bends in raindrops.")
    assert not recites(VEG, "")


def test_fact_answer_is_not_recitation():
    name = next(c for c in TUNING if c.kind == "fact" and "Priya" in c.memory)
    reply = "Your name is Priya."
    assert recites(name.memory, reply)  # the bare rule would flag it ...
    assert not recitation(name, reply)  # ... but a fact case asks for the fact
    assert adheres(name, reply)


def test_adheres_fails_recitation_that_passes_the_check():
    case = Case("diet", VEG, "Suggest a dinner recipe for me.", avoids("chicken", "chili"))
    recited = "I am vegetarian and I do not like spicy food."
    assert case.check(recited) and recitation(case, recited) and not adheres(case, recited)
    answer = ("A vegetable lasagne: layers of pasta, spinach, ricotta and tomato sauce, "
              "baked until golden.")
    assert adheres(case, answer) and not recitation(case, answer)
    keyword = Case("constraint", "I only read books on my Kindle.",
                   "How should I get the next novel I want to read?", mentions("kindle"))
    assert not adheres(keyword, "You only read books on your Kindle.")
    assert adheres(keyword, "Buy it from the Kindle store and it downloads to your device "
                            "in seconds; you can also borrow ebooks from a library app.")


def test_topic_word_alone_is_not_recitation():
    # measured false positives of a looser rule: the question's topic word ("cat",
    # "drink") is half of a two-word memory, and a short wrong answer is no recitation
    assert not recites("I am allergic to cats.", "A cat is the best pet.")
    assert not recites("I do not drink alcohol.", "A glass of wine is a great drink to bring.")
    assert recites("I am allergic to cats.", "I'm not a fan of cats. I'm allergic to them.")


def test_non_answers_fail_even_when_the_check_passes():
    from memory_cases import evades

    case = Case("diet", "I am allergic to shellfish.", "What should I order?",
                avoids("shrimp", "crab", "lobster"))
    for reply in ["I'm sorry for your loss, but as a tech support AI, I can't help.",
                  "As a text-based AI assistant, I'm unable to provide guidance on that.",
                  "I cannot provide specific orders."]:
        assert case.check(reply) and evades(reply) and not adheres(case, reply), reply
    for reply in ["I'm sorry to hear that. Try the grilled salmon or a garden salad.",
                  "I can't help but recommend the grilled salmon."]:
        assert not evades(reply) and adheres(case, reply), reply
