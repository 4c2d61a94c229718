"""The quality benchmark's cases (bench/bench_quality.py): 153 standing instructions, 75
preferences, 75 facts about the member, each with an objective check, in a fixed split;
added since, each set written before it was run: 17 length preferences and 40 validation
standing instructions of the types guidance runs for, 30 tuning language instructions, 84
validation language instructions, 40 validation preferences and 40 validation facts, and 40
validation language requests without a verb, 40 more tuning language instructions
(quality_questions.py).

Written for this benchmark: no case is taken from an issue, bench/memory_cases.py or
bench/personalisation_cases.py (their distractor exchanges and filler memories are reused:
they carry no case). Standing instructions are judged by IFEval's own verifiers
(``if_verifiable.ifeval.instructions``, PyPI ``if-verifiable``: a copy of Google's checkers)
with arguments and member phrasings of our own.

The split is fixed here, by question and by argument: a tuning case and a validation
case never share a question, an instruction's arguments (keyword, word limit, language,
...) or its phrasing, a preference kind or a fact's template. Defaults are chosen on
``tuning`` only; ``validation`` confirms them.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Callable
from typing import NamedTuple

from memory_cases import ALCOHOL, GLUTEN, MEATS, SHELLFISH
from personalisation_cases import avoids, mentions
from quality_questions import (
    FACTS,
    FACTS_FRESH,
    FACTS_FRESH_2,
    GUIDED_MORE,
    GUIDED_QUESTIONS,
    LANGUAGE_BARE,
    LANGUAGE_FRESH,
    LANGUAGE_FRESH_QUESTIONS,
    LANGUAGE_MORE,
    LANGUAGE_MORE_QUESTIONS,
    LANGUAGE_QUESTIONS,
    LANGUAGE_TUNING,
    LANGUAGE_TUNING_2,
    LANGUAGE_TUNING_2_QUESTIONS,
    LENGTH_PREFERENCES,
    PREFERENCES,
    PREFERENCES_FRESH,
    QUESTIONS,
    STANDING,
)


class Case(NamedTuple):
    family: str  # standing | preference | fact
    kind: str  # the instruction type, preference kind or fact template
    split: str  # tuning | validation
    memory: str
    question: str
    check: Callable[[str], bool]


def _ifeval():
    """IFEval's checker module, without the package's ``datasets`` import (it only downloads
    the benchmark's data, which we do not use)."""
    if "datasets" not in sys.modules:
        stub = types.ModuleType("datasets")
        stub.load_dataset = None  # type: ignore[attr-defined]
        sys.modules["datasets"] = stub
    try:
        from if_verifiable.ifeval import instructions
    except ImportError as exc:
        raise SystemExit(
            "bench_quality needs IFEval's verifiers: `make install` "
            f"(pip install --no-deps if-verifiable + langdetect, nltk, immutabledict): {exc}"
        ) from exc
    from langdetect import DetectorFactory

    DetectorFactory.seed = 0  # langdetect samples at random: the same reply, the same verdict
    return instructions


def verifier(kind: str, args: dict, question: str) -> Callable[[str], bool]:
    """IFEval's checker for ``kind`` built with ``args`` (``repeat_prompt``: the question)."""
    ins = _ifeval()
    cls = getattr(ins, STANDING[kind]["checker"])
    checker = cls(kind)
    if kind == "repeat_prompt":
        args = {"prompt_to_repeat": question}
    checker.build_description(**args)
    return lambda reply: bool(reply.strip()) and bool(checker.check_following(reply))


def _standing() -> list[Case]:
    """Each instruction type: its tuning arguments x tuning questions, then validation."""
    out: list[Case] = []
    for t, (kind, spec) in enumerate(STANDING.items()):
        for split in ("tuning", "validation"):
            qs = QUESTIONS[split]
            for j, (phrase, args) in enumerate(spec[split]):
                question = qs[(t * 7 + j * 3) % len(qs)]
                out.append(Case("standing", kind, split, phrase, question,
                                verifier(kind, args, question)))
    return out


def _preferences(entries: list[tuple] = PREFERENCES) -> list[Case]:
    out = []
    for kind, split, memory, check, questions in entries:
        fn = _pref_check(check)
        out += [Case("preference", kind, split, memory, q, fn) for q in questions]
    return out


def _pref_check(check: tuple) -> Callable[[str], bool]:
    op, *words = check
    words = [w for group in words for w in (_GROUPS.get(group, (group,)))]
    if op == "avoid":
        base = avoids(*words)
        return lambda reply: bool(reply.strip()) and base(reply)
    if op == "mention":
        return mentions(*words)
    if op == "regex":
        rx = re.compile(words[0], re.IGNORECASE)
        bad = re.compile(words[1], re.IGNORECASE) if len(words) > 1 else None
        return lambda reply: bool(rx.search(reply)) and not (bad and bad.search(reply))
    raise ValueError(op)


_GROUPS = {"MEATS": MEATS, "SHELLFISH": SHELLFISH, "ALCOHOL": ALCOHOL, "GLUTEN": GLUTEN,
           "NUTS": ("nut", "almond", "cashew", "pecan", "pistachio", "hazelnut", "walnut",
                    "peanut", "praline", "marzipan"),
           "DAIRY": ("milk", "cheese", "butter", "cream", "yogurt", "yoghurt", "parmesan",
                     "mozzarella", "feta", "ricotta"),
           "CAFFEINE": ("coffee", "espresso", "latte", "cappuccino", "caffeine", "black tea",
                        "energy drink", "cola", "matcha"),
           "SPICY": ("chili", "chilli", "jalape", "spicy", "hot sauce", "sriracha", "cayenne",
                     "habanero", "curry"),
           "SUGAR": ("sugar", "candy", "chocolate", "cake", "cookie", "ice cream", "syrup",
                     "soda", "dessert", "honey"),
           "FLYING": ("fly", "flight", "plane", "airport", "airline"),
           "DRIVING": ("drive", "driving", "car ", "rent a car", "road trip")}


def _facts(entries: list[tuple] = FACTS) -> list[Case]:
    out = []
    for kind, split, memory, question, values in entries:
        for v in values:
            names = v if isinstance(v, tuple) else (v,)
            out.append(Case("fact", kind, split, memory.format(names[0]), question,
                            mentions(*(n.lower() for n in names))))
    return out


def _guided_more() -> list[Case]:
    """40 validation cases of the instruction types guidance runs for (GUIDED_MORE)."""
    out = []
    for j, (kind, phrase, args) in enumerate(GUIDED_MORE):
        question = GUIDED_QUESTIONS[(j * 7) % len(GUIDED_QUESTIONS)]
        out.append(Case("standing", kind, "validation", phrase, question,
                        verifier(kind, args, question)))
    return out


def _languages(entries: list[tuple[str, dict]], questions: list[str],
               split: str = "validation") -> list[Case]:
    """Cases of a language instruction (``entries``) in ``split``, one question each."""
    return [Case("standing", "language", split, phrase, questions[j],
                 verifier("language", args, questions[j]))
            for j, (phrase, args) in enumerate(entries)]


# later additions last: the cases before keep their index (quality_questions.py)
CASES: list[Case] = [*_standing(), *_preferences(), *_facts(),
                     *_preferences(LENGTH_PREFERENCES), *_guided_more(),
                     *_languages(LANGUAGE_TUNING, LANGUAGE_QUESTIONS, "tuning"),
                     *_languages(LANGUAGE_MORE, LANGUAGE_MORE_QUESTIONS),
                     *_languages(LANGUAGE_FRESH, LANGUAGE_FRESH_QUESTIONS),
                     *_preferences(PREFERENCES_FRESH), *_facts(FACTS_FRESH),
                     *_languages(LANGUAGE_BARE, LANGUAGE_FRESH_QUESTIONS),
                     *_facts(FACTS_FRESH_2),
                     *_languages(LANGUAGE_TUNING_2, LANGUAGE_TUNING_2_QUESTIONS, "tuning")]


def family_split(family: str, split: str) -> list[Case]:
    return [c for c in CASES if c.family == family and c.split == split]


def _check_split() -> None:
    """No question, phrasing or kind on both sides of the split."""
    for attr in ("question", "memory"):
        seen = {s: {getattr(c, attr) for c in CASES if c.split == s}
                for s in ("tuning", "validation")}
        both = seen["tuning"] & seen["validation"]
        assert not both, f"{attr} on both sides of the split: {sorted(both)[:3]}"
    for fam in ("preference", "fact"):
        kinds = {s: {c.kind for c in CASES if c.family == fam and c.split == s}
                 for s in ("tuning", "validation")}
        assert not kinds["tuning"] & kinds["validation"], fam


_check_split()
