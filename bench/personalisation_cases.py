"""Preference/question pairs with objective checks, for bench_personalisation.py.

Written for this benchmark (not taken from an issue): personal facts recalled,
dietary and other constraints respected, language and style. Each check is a
plain function of the reply text; no model grades another.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

MEAT = ("chicken", "beef", "pork", "bacon", "ham", "steak", "lamb", "turkey", "sausage",
        "salmon", "tuna", "shrimp", "prawn", "fish", "meat", "duck", "veal", "anchov", "crab")
DAIRY = ("milk", "cheese", "butter", "cream", "yogurt", "yoghurt", "parmesan", "mozzarella")
FRENCH = ("le", "la", "les", "est", "et", "je", "vous", "une", "un", "pour", "avec", "des",
          "bonjour", "merci", "c'est", "que", "pas", "du")
SPANISH = ("el", "la", "los", "las", "es", "y", "que", "para", "con", "una", "un", "hola",
           "gracias", "por", "muy", "del")
GERMAN = ("der", "die", "das", "und", "ist", "ich", "sie", "nicht", "ein", "eine", "mit",
          "für", "hallo", "danke", "zu", "auf")


class Case(NamedTuple):
    kind: str  # fact | diet | constraint | language | style
    preference: str
    question: str
    check: Callable[[str], bool]


def mentions(*words: str) -> Callable[[str], bool]:
    """The reply names at least one of ``words`` (case-insensitive, word start)."""
    pats = [re.compile(r"\b" + re.escape(w.lower())) for w in words]
    return lambda reply: any(p.search(reply.lower()) for p in pats)


def avoids(*words: str) -> Callable[[str], bool]:
    """The reply is non-trivial and names none of ``words``."""
    has = mentions(*words)
    return lambda reply: len(reply.split()) >= 3 and not has(reply)


def language(stopwords: tuple[str, ...], share: float = 0.2) -> Callable[[str], bool]:
    """At least ``share`` of the reply's words are common words of the language."""
    def check(reply: str) -> bool:
        words = re.findall(r"[\w']+", reply.lower())
        return len(words) >= 3 and sum(w in stopwords for w in words) / len(words) >= share
    return check


def at_most_words(n: int) -> Callable[[str], bool]:
    return lambda reply: 0 < len(reply.split()) <= n


def starts_with(word: str) -> Callable[[str], bool]:
    return lambda reply: reply.strip().lower().startswith(word.lower())


def numbered_list(reply: str) -> bool:
    return len(re.findall(r"(?m)^\s*\d+[.)]\s", reply)) >= 2


COOK = "What should I cook for dinner tonight? Suggest one dish."

CASES: list[Case] = [
    # personal facts recalled
    Case("fact", "My name is Alice.", "What is my name?", mentions("alice")),
    Case("fact", "I am called Tomasz and I work as a nurse.", "What is my name?",
         mentions("tomasz")),
    Case("fact", "I live in Lisbon, Portugal.", "Which city do I live in?", mentions("lisbon")),
    Case("fact", "My dog is a beagle named Biscuit.", "What is my dog's name?",
         mentions("biscuit")),
    Case("fact", "I work as a firefighter.", "What is my job?", mentions("firefight")),
    Case("fact", "My favourite colour is green.", "What is my favourite colour?",
         mentions("green")),
    Case("fact", "My birthday is in March.", "In which month is my birthday?",
         mentions("march")),
    Case("fact", "I drive a red Toyota.", "What brand is my car?", mentions("toyota")),
    Case("fact", "My daughter is called Maya.", "What is my daughter's name?",
         mentions("maya")),
    Case("fact", "I play the cello in an orchestra.", "Which instrument do I play?",
         mentions("cello")),
    Case("fact", "I was born in Nairobi.", "Where was I born?", mentions("nairobi")),
    Case("fact", "My favourite sport is tennis.", "What is my favourite sport?",
         mentions("tennis")),
    # dietary constraints respected
    Case("diet", "I am vegetarian.", COOK, avoids(*MEAT)),
    Case("diet", "I never eat meat or fish.", "Give me an idea for a quick lunch.",
         avoids(*MEAT)),
    Case("diet", "I follow a vegan diet.", "Suggest a breakfast for me.", avoids(*MEAT, *DAIRY)),
    Case("diet", "I am allergic to peanuts.", "Suggest a snack for a long hike.",
         avoids("peanut")),
    Case("diet", "I am lactose intolerant and avoid all dairy.", "What dessert could I make?",
         avoids(*DAIRY)),
    Case("diet", "I do not eat pork for religious reasons.", COOK,
         avoids("pork", "bacon", "ham", "sausage")),
    Case("diet", "I love Italian food.", COOK,
         mentions("pasta", "pizza", "risotto", "lasagn", "spaghetti", "italian", "gnocchi")),
    # other constraints
    Case("constraint", "I am afraid of flying.", "How should I travel from Paris to Rome?",
         mentions("train", "car", "bus", "drive", "rail")),
    Case("constraint", "I live in Tokyo.", "Which city should I explore this weekend near home?",
         mentions("tokyo", "japan", "kyoto", "yokohama", "kamakura", "nikko", "hakone")),
    Case("constraint", "I use Python for all my programming.",
         "Which programming language should I use for a small script?", mentions("python")),
    Case("constraint", "I only use Linux, never Windows.", "Which operating system should I install?",
         mentions("linux", "ubuntu", "debian", "fedora")),
    Case("constraint", "I am a beginner at chess.", "How should I improve at chess?",
         mentions("beginner", "basic", "basics", "simple", "start")),
    # language
    Case("language", "Always answer in French.", "How are you today?", language(FRENCH)),
    Case("language", "Reply only in French, please.", "What is a good book to read?",
         language(FRENCH)),
    Case("language", "Always answer in Spanish.", "What is the weather like in summer?",
         language(SPANISH)),
    Case("language", "Respond in Spanish only.", "Tell me about the sea.", language(SPANISH)),
    Case("language", "Always answer in German.", "What is your favourite food?",
         language(GERMAN)),
    # style
    Case("style", "Keep every answer to one short sentence.", "Why is the sky blue?",
         at_most_words(25)),
    Case("style", "Answer in at most ten words.", "What is photosynthesis?", at_most_words(10)),
    Case("style", "Always begin your answer with the word 'Ahoy'.", "How are you?",
         starts_with("ahoy")),
    Case("style", "Always start your reply with 'Sure'.", "Can you help me plan my week?",
         starts_with("sure")),
    Case("style", "Format every answer as a numbered list.", "How do I make tea?", numbered_list),
    Case("style", "Always answer with a single word.", "What colour is grass?", at_most_words(2)),
    Case("style", "Answer every question with just yes or no.", "Is water wet?",
         lambda r: bool(re.match(r"\s*(yes|no)\b", r.lower())) and len(r.split()) <= 3),
]
