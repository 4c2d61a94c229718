"""Memory/question cases, distractor exchanges and filler memories for bench_memory_depth.py.

Written for this benchmark (none taken from bench/personalisation_cases.py or an issue).
Each case is a memory, a question asked later in the conversation and an objective check
of the reply (a plain function of its text). ``TUNING`` is what defaults are chosen on;
``HELD_OUT`` is only ever evaluated. ``DISTRACTORS`` are unrelated exchanges with fixed,
pre-written assistant replies (depth costs no generation); ``FILLERS`` are 19 unrelated
memories for the "20 memories" condition (none touches a case's check).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from personalisation_cases import FRENCH, GERMAN, SPANISH, avoids, language, mentions, starts_with

ITALIAN = ("il", "la", "le", "è", "e", "di", "che", "per", "con", "un", "una", "sono",
           "non", "ciao", "grazie", "molto", "del", "della", "mi", "io")


class Case(NamedTuple):
    kind: str  # fact | diet | constraint | language | style
    memory: str
    question: str
    check: Callable[[str], bool]


def matches(pattern: str) -> Callable[[str], bool]:
    """The reply matches ``pattern`` (a regex, case-insensitive)."""
    rx = re.compile(pattern, re.IGNORECASE)
    return lambda reply: bool(rx.search(reply))


def under_words(n: int) -> Callable[[str], bool]:
    return lambda reply: 0 < len(reply.split()) <= n


def bullets(reply: str) -> bool:
    return len(re.findall(r"(?m)^\s*[-*\u2022]\s+\S", reply)) >= 2


def upper(reply: str) -> bool:
    letters = [c for c in reply if c.isalpha()]
    return len(letters) >= 8 and sum(c.isupper() for c in letters) / len(letters) >= 0.8


SHELLFISH = ("shrimp", "prawn", "crab", "lobster", "shellfish", "oyster", "mussel", "clam",
             "scallop", "seafood")
GLUTEN = ("bread", "toast", "pasta", "wheat", "bagel", "croissant", "muffin", "pancake",
          "waffle", "sandwich", "flour", "cereal", "granola")
MEATS = ("chicken", "beef", "pork", "steak", "burger", "sausage", "lamb", "bacon", "ham",
         "turkey", "hot dog", "ribs", "meat")
ALCOHOL = ("wine", "beer", "vodka", "champagne", "whisk", "rum", "gin", "tequila", "sangria",
           "prosecco", "cocktail", "alcohol", "liquor")
CARBS = ("bread", "rice", "pasta", "potato", "sandwich", "noodle", "toast", "wrap", "tortilla",
         "bun", "quinoa", "oat")

_ALL: list[Case] = [
    # facts recalled
    Case("fact", "My name is Priya.", "Do you remember my name?", mentions("priya")),
    Case("fact", "My cat is called Whiskers.", "What is my cat's name?", mentions("whiskers")),
    Case("fact", "I work as a pharmacist.", "What do I do for a living?", mentions("pharmac")),
    Case("fact", "I grew up in Reykjavik, Iceland.", "Where did I grow up?",
         mentions("reykjavik", "iceland")),
    Case("fact", "My favourite fruit is mango.", "What is my favourite fruit?", mentions("mango")),
    Case("fact", "My wife's name is Ingrid.", "What is my wife's name?", mentions("ingrid")),
    Case("fact", "I have a brother named Kofi.", "What is my brother called?", mentions("kofi")),
    Case("fact", "My favourite band is Radiohead.", "Which band do I like most?",
         mentions("radiohead")),
    Case("fact", "I support the football club Ajax.", "Which football club do I support?",
         mentions("ajax")),
    Case("fact", "I ride a Ducati motorbike.", "What make is my motorbike?", mentions("ducati")),
    Case("fact", "My lucky number is 17.", "What is my lucky number?",
         matches(r"\b17\b|seventeen")),
    Case("fact", "I studied marine biology at university.", "What did I study at university?",
         mentions("marine")),
    # diets
    Case("diet", "I am allergic to shellfish.", "Suggest a main course for a dinner party.",
         avoids(*SHELLFISH)),
    Case("diet", "I have coeliac disease, so I eat no gluten.", "Suggest a breakfast for me.",
         avoids(*GLUTEN)),
    Case("diet", "I am a pescatarian: fish, but never meat.",
         "What should I put on the grill this weekend?", avoids(*MEATS)),
    Case("diet", "I do not drink alcohol.", "What drink should I bring to a party?",
         avoids(*ALCOHOL)),
    Case("diet", "I hate mushrooms.", "Suggest a topping for my pizza.", avoids("mushroom")),
    Case("diet", "I love very spicy food.", "Suggest something for dinner tonight.",
         mentions("spic", "chili", "chilli", "curry", "jalape", "hot sauce", "pepper",
                  "sriracha", "cayenne", "harissa")),
    Case("diet", "I follow a strict keto diet.", "What should I eat for lunch?", avoids(*CARBS)),
    Case("diet", "Mexican food is my favourite.", "Which dish should I make this evening?",
         mentions("taco", "burrito", "enchilada", "quesadilla", "mexic", "nacho", "guacamole",
                  "fajita", "salsa", "tamale", "chili con")),
    # other constraints
    Case("constraint", "I only read books on my Kindle.",
         "How should I get the next novel I want to read?",
         mentions("kindle", "ebook", "e-book", "amazon", "digital")),
    Case("constraint", "I live in Vancouver, Canada.", "Where could I go for a day trip?",
         mentions("vancouver", "whistler", "victoria", "squamish", "british columbia", "seattle",
                  "canada", "stanley park", "okanagan")),
    Case("constraint", "I am a professional Java developer.",
         "Which language should I write my new backend service in?", matches(r"\bjava\b")),
    Case("constraint", "I only use Apple computers.", "Which laptop should I buy?",
         matches(r"\bmac(book|os|intosh)?\b|\bimac\b|\bapple\b")),
    Case("constraint", "I do not own a car; I cycle everywhere.",
         "How should I get to work tomorrow?", mentions("bike", "bicycle", "cycl")),
    Case("constraint", "I am allergic to cats.", "Which pet should I get?",
         avoids("cat", "kitten")),
    Case("constraint", "I am training for a marathon.", "What should I do this weekend to stay fit?",
         mentions("run", "jog", "marathon")),
    Case("constraint", "I much prefer tea to coffee.", "What hot drink should I have this morning?",
         matches(r"\bteas?\b")),
    # language
    Case("language", "Please always reply in Italian.", "What is your favourite season?",
         language(ITALIAN)),
    Case("language", "Answer in French only.", "What can I do on a rainy day?",
         language(FRENCH)),
    Case("language", "Speak to me in Spanish.", "How do I stay healthy?", language(SPANISH)),
    Case("language", "Please reply in German.", "What is a good hobby?", language(GERMAN)),
    Case("language", "Write all your answers in French.", "Describe a sunny morning.",
         language(FRENCH)),
    Case("language", "I want every reply in Spanish.", "What should I pack for a beach trip?",
         language(SPANISH)),
    # style
    Case("style", "Start every answer with 'Hello friend'.", "What is the tallest mountain?",
         starts_with("hello friend")),
    Case("style", "Keep answers under fifteen words.", "How does a rainbow form?",
         under_words(15)),
    Case("style", "Use bullet points in every answer.", "How can I sleep better?", bullets),
    Case("style", "Reply in capital letters only.", "What is the Moon made of?", upper),
    Case("style", "Always start your reply with the word 'Indeed'.", "Is the ocean deep?",
         starts_with("indeed")),
    Case("style", "Always mention a banana somewhere in your answer.",
         "What is the capital of Spain?", mentions("banana")),
]

# alternate within each kind: both sets get every kind in the same proportion
TUNING: list[Case] = []
HELD_OUT: list[Case] = []
for _kind in ("fact", "diet", "constraint", "language", "style"):
    for _j, _case in enumerate(c for c in _ALL if c.kind == _kind):
        (TUNING if _j % 2 == 0 else HELD_OUT).append(_case)

DISTRACTORS: list[tuple[str, str]] = [
    ("What is the capital of Australia?", "The capital of Australia is Canberra."),
    ("How many days are in a leap year?", "A leap year has 366 days."),
    ("What does a thermometer measure?", "A thermometer measures temperature."),
    ("Who wrote Romeo and Juliet?", "William Shakespeare wrote Romeo and Juliet."),
    ("At what temperature does water boil at sea level?",
     "Water boils at 100 degrees Celsius at sea level."),
    ("How many continents are there?", "There are seven continents."),
    ("Which gas do plants take in from the air?", "Plants take in carbon dioxide."),
    ("What is the largest planet in the solar system?", "Jupiter is the largest planet."),
    ("How many sides does a hexagon have?", "A hexagon has six sides."),
    ("What is the chemical symbol for gold?", "The chemical symbol for gold is Au."),
    ("Which ocean is the largest?", "The Pacific Ocean is the largest."),
    ("What is the square root of 81?", "The square root of 81 is 9."),
    ("In which year did people first walk on the Moon?", "That was in 1969."),
    ("At what temperature does water freeze in Fahrenheit?",
     "Water freezes at 32 degrees Fahrenheit."),
    ("What do bees make?", "Bees make honey and wax."),
    ("How many minutes are in an hour?", "There are sixty minutes in an hour."),
]

FILLERS: list[str] = [
    "My sister lives in Dublin.",
    "I collect vintage postcards.",
    "I go swimming on Tuesdays.",
    "My office is on the fifth floor.",
    "I am learning to knit.",
    "My favourite film is Casablanca.",
    "I grow tomatoes on my balcony.",
    "My neighbour is a retired teacher.",
    "I wake up at six every morning.",
    "I enjoy crossword puzzles.",
    "My grandmother was a painter.",
    "I have two goldfish.",
    "I visited Peru last year.",
    "My phone is always on silent.",
    "I keep a diary.",
    "I am left-handed.",
    "My birthday is in October.",
    "I enjoy jigsaw puzzles.",
    "I wear glasses for reading.",
]

assert len(FILLERS) == 19 and len(TUNING) == len(HELD_OUT) == len(_ALL) // 2

# Words that carry no content of their own: a recitation made of these plus the memory's
# words adds nothing (pronouns, articles, auxiliaries, prepositions, connectives).
FILLER_WORDS = frozenset("""
a an the and or but so if then than as of to in on at by for from with about into
i im me my mine myself you youre your yours we us our they them their he she him her his
it its this that these those there here who whom which what when where why how
is am are was were be been being do does did dont doesnt didnt not no nor have has had
will would can could should shall may might must ill id ive youll youd
very really just also too all any some more most much many such only own same
sure okay ok yes well oh please let lets since because
""".split())

RECITE_MIN_NEW = 6  # a reply adding fewer new content words than this says nothing new
RECITE_MAX_SHARE = 0.6  # ... or one whose content words are this much the memory's
RECITE_COVER = 0.5  # a recitation restates more than this share of the memory's words


def content_words(text: str) -> list[str]:
    """Lower-cased words without punctuation or apostrophes, filler words dropped, a
    plural ``s`` stripped (``mushrooms`` = ``mushroom``)."""
    words = re.findall(r"\w+", text.lower().replace("'", "").replace("\u2019", ""))
    words = [w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
             for w in words]
    return [w for w in words if w not in FILLER_WORDS]


def recites(memory: str, reply: str) -> bool:
    """The reply recites the memory instead of answering.

    It restates the memory (more than half of the memory's content words appear in it)
    and either adds fewer than ``RECITE_MIN_NEW`` distinct content words of its own or
    has ``RECITE_MAX_SHARE`` or more of its content words taken from the memory. Content
    words: see :func:`content_words`. An empty reply recites nothing."""
    mem = set(content_words(memory))
    rep = content_words(reply)
    if not mem or not rep:
        return False
    if len(mem & set(rep)) / len(mem) <= RECITE_COVER:
        return False
    new = set(rep) - mem
    share = sum(w in mem for w in rep) / len(rep)
    return len(new) < RECITE_MIN_NEW or share >= RECITE_MAX_SHARE


def recitation(case: Case, reply: str) -> bool:
    """The reply recites the case's memory where that is not an answer: for a ``fact``
    case the question asks for the fact, so stating it is the answer (never flagged)."""
    return case.kind != "fact" and recites(case.memory, reply)


# Non-answers: the reply declines or apologises for a mistake nobody made instead of
# answering ("I'm sorry for your loss, but as a tech support AI ..."). Sympathy that goes
# on to answer ("I'm sorry to hear that; try ...") is not one of them.
EVASIONS = re.compile("|".join([
    r"\bi(?:'|’)?m sorry for\b", r"\bi am sorry for\b",
    r"\bas an? (?:[\w-]+ )*(?:ai|assistant|language model)\b",
    r"\b(?:i(?:'|’)?m|i am) (?:not able|unable|not equipped|not a substitute)\b",
    r"\bi (?:can(?:'|’)?t|cannot|don(?:'|’)?t have the ability to) (?:provide|assist|give|help you)\b",
]), re.IGNORECASE)


def evades(reply: str) -> bool:
    """The reply is a non-answer (see ``EVASIONS``)."""
    return bool(EVASIONS.search(reply))


def adheres(case: Case, reply: str) -> bool:
    """The benchmark's pass: the case's check passes, the reply is no recitation and no
    non-answer."""
    return bool(case.check(reply)) and not recitation(case, reply) and not evades(reply)


def conversation(case: Case, depth: int) -> list[dict[str, str]]:
    """``depth`` distractor exchanges, then the case's question."""
    msgs: list[dict[str, str]] = []
    for user, reply in DISTRACTORS[:depth]:
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    return msgs + [{"role": "user", "content": case.question}]


def memory_list(case: Case, index: int, n: int) -> list[str]:
    """The case's memory among ``n - 1`` fillers, at a position that varies per case."""
    if n <= 1:
        return [case.memory]
    out = list(FILLERS[: n - 1])
    out.insert((index * 7) % n, case.memory)
    return out
