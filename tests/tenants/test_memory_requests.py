"""The chat memory-request parser (tenants.memory_requests): positive and negative cases.

CASES/NOT_REQUESTS were written first and the rules tuned on them (one misfire found and
fixed: "forget about it, let's talk about cars"); HELD_OUT was written afterwards and not
tuned on (0 misfires of 26 when added)."""

from __future__ import annotations

import pytest

from tenants.memory_requests import MemoryRequest, best_match, parse

CASES = [
    ("Remember that I am vegetarian.", "remember", "I am vegetarian"),
    ("remember that my daughter is called Ana", "remember", "my daughter is called Ana"),
    ("Please remember that I live in Lyon.", "remember", "I live in Lyon"),
    ("please remember I prefer short answers", "remember", "I prefer short answers"),
    ("Please, remember: answers in French.", "remember", "answers in French"),
    ("Remember: I'm allergic to peanuts.", "remember", "I'm allergic to peanuts"),
    ("Can you remember that I use metric units?", "remember", "I use metric units"),
    ("Could you please remember that my budget is 50 euros?", "remember",
     "my budget is 50 euros"),
    ("Remember I'm a nurse working nights.", "remember", "I'm a nurse working nights"),
    ("remember my cat is named Tom", "remember", "my cat is named Tom"),
    ("Hey, remember that we have two kids.", "remember", "we have two kids"),
    ("Remember that I'm vegan. What should I cook tonight?", "remember", "I'm vegan"),
    ("Remember this: I never eat pork.", "remember", "I never eat pork"),
    ("Please remember to answer in bullet points.", "remember", "to answer in bullet points"),
    ("Forget that I live in Lyon.", "forget", "I live in Lyon"),
    ("forget that I am vegetarian", "forget", "I am vegetarian"),
    ("Please forget that my budget is 50 euros.", "forget", "my budget is 50 euros"),
    ("Forget about my peanut allergy.", "forget", "my peanut allergy"),
    ("forget my daughter's name", "forget", "my daughter's name"),
    ("Could you forget that I'm a nurse?", "forget", "I'm a nurse"),
    ("Forget: answers in French.", "forget", "answers in French"),
    ("Please forget the thing about metric units.", "forget", "the thing about metric units"),
]
NOT_REQUESTS = [
    "Do you remember what I told you yesterday?",
    "Remember when we talked about Paris?",
    "I can't remember the name of that film.",
    "What do you remember about me?",
    "I always forget my keys.",
    "Don't forget to add salt.",
    "Forget it.",
    "forget about it, let's talk about cars",
    "Forget everything.",
    "I forgot my password, what should I do?",
    "How do I remember vocabulary better?",
    "Tips to remember names?",
    "Remember the Alamo is a famous phrase; where does it come from?",
    "Remembering things is hard for me.",
    "What should I cook tonight?",
    "Can you help me forget a bad day?",
    "Forget how to ride a bike: is that possible?",
    "The remember-me checkbox is broken.",
    "Write a poem titled Remember that summer",
    "Please write a story where the hero must remember that the door is locked.",
    "forget",
    "remember",
    "Remember that?",
    "Why do people forget dreams?",
]
HELD_OUT = [
    ("Remember that I work from home on Fridays.", "remember"),
    ("please remember my son is 7 years old", "remember"),
    ("Could you remember that I'm learning Spanish?", "remember"),
    ("Remember: no dairy for me.", "remember"),
    ("Ok, remember that I hate cilantro.", "remember"),
    ("Please remember that I drive an electric car, thanks!", "remember"),
    ("Remember I run marathons.", "remember"),
    ("Would you remember that my wife is diabetic?", "remember"),
    ("Forget that I work from home on Fridays.", "forget"),
    ("please forget about my son's age", "forget"),
    ("Forget that I'm learning Spanish, I gave up.", "forget"),
    ("Can you forget that I hate cilantro?", "forget"),
    ("Do you remember my name?", None),
    ("I hope you remember our last chat.", None),
    ("Remember how cold it was last winter?", None),
    ("Never forget where you came from, my grandma used to say.", None),
    ("Forget-me-nots are blue flowers, right?", None),
    ("Let's not forget the budget.", None),
    ("Forget about it.", None),
    ("I'll remember that for next time, thanks.", None),
    ("Remembrance Day is in November.", None),
    ("Why can't I remember my dreams?", None),
    ("Please summarise this text: remember that the meeting is at 3.", None),
    ("Can you remember things between chats?", None),
    ("forget it, never mind", None),
    ("Remember, remember the fifth of November is a rhyme; who wrote it?", None),
]


@pytest.mark.parametrize("message, op, text", CASES)
def test_requests_are_recognised(message, op, text):
    assert parse(message) == MemoryRequest(op, text)


@pytest.mark.parametrize("message", NOT_REQUESTS)
def test_other_messages_are_not_requests(message):
    assert parse(message) is None


def test_held_out_cases():
    misfires = [m for m, op in HELD_OUT if (parse(m) or MemoryRequest(None, "")).op != op]
    assert misfires == []


def test_best_match_needs_most_of_the_words():
    memories = [(1, "I am vegetarian"), (2, "I live in Lyon, France"), (3, "I live in Paris")]
    assert best_match("I live in Lyon", memories) == 2
    assert best_match("my vegetarian diet", memories) == 1
    assert best_match("the thing about Lyon", memories) == 2
    assert best_match("my budget", memories) is None
    assert best_match("I am", memories) is None  # nothing but stop words
