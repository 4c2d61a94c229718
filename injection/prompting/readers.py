"""How a standing instruction's words are read (``constraints.py``): negation, quoted
literals, the options a reply is to be one of, a word limit, a sentence limit, a bullet count,
highlights and the words a reply is to hold."""

from __future__ import annotations

import re

__all__ = ["NEG", "QUOTED", "TITLES", "asked_language", "bullet_count", "capped", "choice", "denied",
           "forbids", "highlight_count",
           "keywords", "names_language", "negated", "placeholder_count",
           "sentence_count", "sentence_limit", "word_count", "word_limit"]

NEG = re.compile(r"\b(?:no|not|never|without|avoid|don'?t|do\s+not|didn'?t|did\s+not|none|"
                 r"nothing|zero|free|omit(?:s|ted|ting)?|skip(?:s|ped|ping)?|out\s+of|leave\s+out|"
                 r"ban|hate|stop)\b", re.I)
# after a negation, asks for it: "nothing but capitals", "no other words, only 'Yes'"; an
# "only" in the negated clause does not: "don't answer only with 'Yes'" is "not only"
_BUT = re.compile(r"\b(?:but|except|other\s+than)\b|[,;:]\s*only\b", re.I)
# no sentence ends after a title ("Mrs. Okafor"): lookbehinds for a sentence splitter
TITLES = r"(?<!\bMr\.)(?<!\bMrs\.)(?<!\bMs\.)(?<!\bDr\.)(?<!\bSt\.)"
QUOTED = re.compile(r"(?<![A-Za-z])[\"'‘“]([^\"'’”]+?)[\"'’”](?![A-Za-z])")
_ONLY = re.compile(r"\b(?:only|one\s+of|just|nothing\s+(?:else|more)|whole\s+reply|pick|"
                   r"choose|must\s+be|may\s+be)\b", re.I)  # the quoted options are the reply
_REPLY = re.compile(r"\b(?:reply|replies|answer\w*|respon\w*|say)\b", re.I)  # "Only recommend
# 'Pro' or 'Lite'" names no reply: not the reply's options
_LISTED = re.compile(r":\s*([^:\n/]{1,80}(?:\s/\s[^:\n/]{1,80})+)$")  # after a colon
_TENS = {"ten": 10, "fifteen": 15, "twenty": 20, "twenty-five": 25, "thirty": 30, "forty": 40,
         "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90, "hundred": 100,
         "a hundred": 100, "one hundred": 100}
_K = r"(\d+|" + "|".join(sorted(_TENS, key=len, reverse=True)) + r")"  # a word limit's number
_FEWER = re.compile(r"\b(?:under|fewer\s+than|less\s+than|below|within)\s+" + _K + r"\s+words?\b",
                    re.I)  # fewer than k
_AT_MOST = re.compile(r"\b(?:at\s+most|no\s+more\s+than|not\s+more\s+than|up\s+to|"
                      r"(?:a\s+)?max(?:imum)?\.?(?:\s+of)?)\s+" + _K + r"\s+words?\b"
                      r"|\b" + _K + r"\s+words?\s+(?:max(?:imum)?|at\s+most|or\s+(?:less|fewer)|"
                      r"tops)\b", re.I)
_WORD = re.compile(r"\w+")
_MORE = re.compile(r"\b(?:(?:more|longer)\s+than|over|beyond|exceed\w*)\s+" + _K + r"\s+words?\b",
                   re.I)  # "never more than k words": at most k


def negated(clause: str, at: int) -> bool:
    """Whether a negation comes in the six words before ``at`` in ``clause`` (and no "but"
    after it: "nothing but capitals" asks for them)."""
    before = _NOT_NEG.sub(" ", " ".join(clause[:at].split()[-6:]))
    neg = list(NEG.finditer(before))
    return bool(neg) and not _BUT.search(before[neg[-1].end():])


_LEADING = re.compile(r"^\s*(?:please\s+)?(?:don'?t|do\s+not|never|stop|avoid)\b"
                      r"|^\s*(?:I|we)\s+(?:really\s+)?(?:don'?t|do\s+not)\s+(?:need|want|require)\b"
                      r"|^\s*(?:there'?s\s+)?no\s+need\b"
                      r"|^\s*you\s+(?:don'?t|do\s+not)\s+(?:have|need)\s+to\b", re.I)
_TURN = re.compile(r"[,;:]|\b(?:and|but|so|then|instead|only|except)\b", re.I)  # a new clause
_NOT_LAPSE = re.compile(r"\b(?:don'?t|do\s+not|never)\s+(?:forget|fail)\b", re.I)


def denied(clause: str, at: int) -> bool:
    """Whether what comes at ``at`` in ``clause`` is asked NOT to be (``negated``, or a
    clause opened by a negation: "Don't write your answers to me in all lowercase"); "don't
    forget to ..." asks for it."""
    before = clause[:at]
    if _NOT_LAPSE.search(before):
        return False
    return negated(clause, at) or (_LEADING.match(before) is not None
                                   and not _TURN.search(before))


def asked_language(text: str) -> str | None:
    """The language ``text`` (a request) asks replies in: the first it names that is not
    denied ("Don't reply in German": none), capitalised; None for none."""
    for pattern in (_IN_LANGUAGE, _LANGUAGE):
        for m in pattern.finditer(text):
            cut = max(text.rfind(p, 0, m.start()) for p in ".;:!?,") + 1  # its clause
            clause = text[cut:]
            if not denied(clause, m.start() - cut) and not (
                    pattern is _LANGUAGE and _THEIRS.match(clause)):
                return m.group().split()[-1].capitalize()
    return None


# a clause about someone else ("my wife is the Norwegian one"): a bare language named there
# is theirs, not one asked for
_THEIRS = re.compile(r"\s*(?:my|our|his|her|their|we|they|he|she|everyone|everybody|people)\b",
                     re.I)


_LAPSE = re.compile(r"\b(?:forget(?:ting|s)?|forgot|fail(?:s|ing)?|miss(?:es|ing)?|"
                    r"lack(?:s|ing)?)\b", re.I)  # a negation too: "never forget to use 'x'"
_NOT_NEG = re.compile(r"\bno\s+(?:matter|exceptions?)\b", re.I)  # an intensifier


def _negations(text: str) -> int:
    text = _NOT_NEG.sub(" ", text)
    return len(NEG.findall(text)) + len(_LAPSE.findall(text))


def forbids(sentence: str, start: int, end: int) -> bool:
    """Whether ``sentence`` forbids the literal at ``start:end``: an odd number of
    negations before it ("Never use 'x'"; "never answer without 'x'" asks for it), or, with
    none before, after it ("Keep 'x' out of your answers"; "use 'x', never forget it")."""
    before = _negations(sentence[:start])
    return (before or _negations(sentence[end:])) % 2 == 1


def choice(text: str) -> list[str]:
    """The options ``text`` asks the whole reply to be one of: at least two, quoted or
    listed after a colon with " / " between them, asked for alone ("only", "one of", ...)
    as the reply, not negated; [] for none."""
    options, first = [o.strip() for o in QUOTED.findall(text)], QUOTED.search(text)
    if len(options) < 2 and (listed := _LISTED.search(text)):  # "one of: Yes / No / Maybe"
        options, first = [o.strip() for o in listed.group(1).split(" / ")], listed
    if (len(options) < 2 or not all(options) or any("|" in o for o in options)
            or not (_ONLY.search(text) and _REPLY.search(text)) or negated(text, first.start())):
        return []
    return list(dict.fromkeys(options))


def word_count(text: str) -> int:
    """``text``'s words as IFEval counts them (runs of letters, digits and ``_``)."""
    return len(_WORD.findall(text))


def word_limit(text: str) -> int | None:
    """k where ``text`` asks for replies of fewer than k words (the tightest asked)."""
    limits = [_number(next(g for g in m.groups() if g)) + (pattern is not _FEWER)
              for pattern, neg in ((_FEWER, False), (_AT_MOST, False), (_MORE, True))
              for m in pattern.finditer(text) if negated(text, m.start()) == neg]
    return min(limits) if limits and min(limits) > 1 else None


_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
            "eight": 8, "nine": 9, "ten": 10}
_BULLETS = re.compile(  # "exactly 3 bullet points", "two markdown bullets", "four bulleted items"
    r"\b(\d+|" + "|".join(_NUMBERS) + r")\s+(?:(?:markdown|short|brief|concise|clear|simple|"
    r"separate|distinct|key|main|plain)\s+){0,2}(?:bullet(?:ed)?[\s-]*"
    r"(?:points?|items?|lines?)|bullets)\b", re.I)
_BOUND = re.compile(r"\b(?:at\s+(?:least|most)|up\s+to|or\s+(?:more|fewer|less)|more\s+than|"
                    r"fewer\s+than|less\s+than|no\s+more\s+than|between|max\w*|min\w*)\W*"
                    r"(?:\w+\W+){0,2}$", re.I)


def bullet_count(text: str) -> int | None:
    """n where ``text`` asks for replies of exactly n bullet points (1 to 10; not "at most
    3", not negated); None for none."""
    for m in _BULLETS.finditer(text):
        n = int(m.group(1)) if m.group(1).isdigit() else _NUMBERS[m.group(1).lower()]
        bounded = _BOUND.search(text[:m.start()]) or re.match(
            r"\W*(?:or\s+(?:more|fewer|less)|at\s+(?:most|least))\b", text[m.end():], re.I)
        if 1 <= n <= 10 and not bounded and not denied(text, m.start()):
            return n
    return None


_MARK = re.compile(r"\b(?:highlight|emphasi[sz]|mark(?!down))\w*", re.I)
_MARKDOWN = re.compile(r"\*[^*\s][^*\n]*\*|\basterisks?\b|\bmarkdown\b|\bitalics?\b|\bbold\b",
                       re.I)
_N = r"(\d+|" + "|".join(_NUMBERS) + r")"
_AT_LEAST = re.compile(r"\bat\s+least\s+(?:(once)|(twice)|" + _N + r")\b|\b" + _N
                       + r"\s+(?:or\s+more\s+)?(?:\w+\s+)?(?:parts?|phrases?|sections?|passages?|"
                       r"spans?|terms?|words?)\b", re.I)


def highlight_count(text: str) -> int | None:
    """n where ``text`` asks for at least n sections highlighted with markdown asterisks
    ("Highlight at least two parts with *this*", "emphasise a phrase in *asterisks*": 1
    where no count is said; 1 to 10), not negated; None for none."""
    mark = _MARK.search(text)
    if mark is None or not _MARKDOWN.search(text) or negated(text, mark.start()):
        return None
    return _count_at_least(_AT_LEAST, text)


def _count_at_least(pattern: re.Pattern, text: str) -> int | None:
    """The count ``pattern`` reads in ``text`` (a digit, a number's name, "once",
    "twice"): 1 where it reads none; None outside 1 to 10."""
    m = pattern.search(text)
    if m is None:
        return 1
    said = next(g for g in m.groups() if g).lower()
    n = {"once": 1, "twice": 2}.get(said) or (int(said) if said.isdigit() else _NUMBERS[said])
    return n if 1 <= n <= 10 else None


_SLOT = re.compile(r"\bplace-?holders?\b|\bblanks?\b|\bfill-?in\b|\bfields?\b", re.I)
_SQUARE = re.compile(r"\bsquare[\s-]+brackets?\b|\bbracket(?:ed|s)?\b|\[[^\]\n]+\]", re.I)
_SLOTS_AT_LEAST = re.compile(r"\bat\s+least\s+(?:(once)|(twice)|" + _N + r")\b|\b" + _N
                             + r"\s+(?:or\s+more\s+)?(?:\S+\s+){0,2}?(?:place-?holders?|"
                             r"blanks?|fields?)\b|\b(once)\b|\b(twice)\b", re.I)


def placeholder_count(text: str) -> int | None:
    """n where ``text`` asks for at least n placeholders in square brackets ("Include at
    least two placeholders in square brackets, like [name]", "leave a blank in square
    brackets such as [date]": 1 where no count is said; 1 to 10), not negated; None for
    none."""
    slot = _SLOT.search(text)
    if slot is None or not _SQUARE.search(text) or negated(text, slot.start()):
        return None
    return _count_at_least(_SLOTS_AT_LEAST, text)


_LANGUAGE = re.compile(r"\b(?:" + "|".join(
    "English French Spanish German Italian Portuguese Dutch Swedish Norwegian Danish Finnish "
    "Polish Czech Slovak Hungarian Romanian Bulgarian Greek Turkish Russian Ukrainian Serbian "
    "Croatian Slovenian Catalan Basque Galician Irish Welsh Icelandic Estonian Latvian "
    "Lithuanian Arabic Hebrew Persian Farsi Hindi Urdu Bengali Punjabi Tamil Telugu Marathi "
    "Gujarati Chinese Mandarin Cantonese Japanese Korean Vietnamese Thai Indonesian Malay "
    "Tagalog Filipino Swahili Afrikaans Zulu Esperanto Latin".split()) + r")\b")
_IN_LANGUAGE = re.compile(r"\b(?:in|into)\s+" + _LANGUAGE.pattern, re.I)  # "answer in french"


def names_language(text: str) -> bool:
    """Whether ``text`` names a language ("Always answer in French.", "I only read
    Portuguese"; lower-case after "in": "reply in german"), where a standing instruction
    asks for replies in it."""
    return _LANGUAGE.search(text) is not None or _IN_LANGUAGE.search(text) is not None


_COUNT = r"(\d+|" + "|".join(_NUMBERS) + r"|a\s+single|single)"
_SENTENCES = r"(?:\s+(?:short|brief|concise|simple|clear|full|complete))?[\s-]+sentences?\b"
_SENT_AT_MOST = re.compile(r"\b(?:at\s+most|no\s+more\s+than|not\s+more\s+than|up\s+to|"
                           r"(?:a\s+)?max(?:imum)?\.?(?:\s+of)?)\s+" + _COUNT + _SENTENCES, re.I)
_SENT_FEWER = re.compile(r"\b(?:fewer\s+than|less\s+than|under|below)\s+" + _COUNT + _SENTENCES,
                         re.I)  # fewer than n: at most n - 1
_SENT_MORE = re.compile(r"\b(?:(?:more|longer)\s+than|beyond|exceed\w*)\s+" + _COUNT + _SENTENCES, re.I)  # negated
_SENT_PLAIN = re.compile(r"\b(?:in|of|to|with|within|as|using|by|be)\s+(?:just\s+|only\s+|one\s+"
                         r"or\s+|two\s+or\s+)?" + _COUNT + _SENTENCES + r"(?!\s+(?:or\s+more|"
                         r"at\s+least|minimum))|\b" + _COUNT + r"-sentences?\b", re.I)
_SENT_END = re.compile(r"[^\W\d_][.!?]+[\"')\]]*(?=\s|$)")  # a word's end, then .!? ("1." no)


def _number(said: str) -> int:
    """A count as said: digits, "single", or a number word (``_NUMBERS``, ``_TENS``)."""
    said = said.lower()
    return 1 if "single" in said else int(said) if said.isdigit() else (
        _NUMBERS.get(said) or _TENS[said])


def sentence_limit(text: str) -> int | None:
    """n where ``text`` asks for replies of at most n sentences (1 to 10): "in one or two
    sentences" and "no more than 2 sentences" (2), "fewer than 3 sentences" (2), "never more
    than two sentences" (2), "a one-sentence answer" (1); not "at least 3 sentences", "3 or
    more", nor negated ("never answer in one sentence"); the tightest asked; None for none."""
    limits = []
    for pattern, neg in ((_SENT_FEWER, False), (_SENT_AT_MOST, False), (_SENT_MORE, True),
                         (_SENT_PLAIN, False)):
        for m in pattern.finditer(text):
            said = next((g for g in m.groups() if g), None)
            if said is not None and negated(text, m.start()) == neg:
                limits.append(_number(said) - (pattern is _SENT_FEWER))
    limits = [n for n in limits if 1 <= n <= 10]
    return min(limits) if limits else None


def sentence_count(text: str) -> int:
    """``text``'s sentence ends: a word, then ".", "!" or "?", then a space or the end."""
    return len(_SENT_END.findall(text))


_INCLUDE = re.compile(  # a verb that puts a word in the reply ("work 'x' into", "say 'x'")
    r"\b(?:us(?:e|es|ing)|includ(?:e|es|ing)|mention(?:s|ing)?|contain(?:s|ing)?|"
    r"say(?:s|ing)?|put(?:s|ting)?|work(?:s|ing)?|add(?:s|ing)?|insert(?:s|ing)?|repeat\w*|"
    r"weav(?:e|es|ing)|sprinkl(?:e|es|ing)|incorporat\w*|feature|appear\w*|slip)\b", re.I)
_INSTEAD = re.compile(r"\b(?:instead\s+of|rather\s+than|in\s+place\s+of|than)\s*$", re.I)
_TIMES = re.compile(r"\b(?:at\s+least\s+)?(?:(once)|(twice)|(thrice)|" + _N + r"\s+times)"
                    r"(?:\s+or\s+more)?\b|\b(more\s+than\s+once|multiple\s+times|several\s+"
                    r"times|repeatedly)\b", re.I)
_CAPPED = re.compile(r"\b(?:at\s+most|no\s+more\s+than|not\s+more\s+than|up\s+to|"
                     r"fewer\s+than|less\s+than|only|max\w*)\s*$", re.I)


def capped(sentence: str) -> bool:
    """Whether ``sentence`` caps how often something comes ("no more than twice", "at most
    3 times"): a limit, neither a ban nor a request."""
    m = _TIMES.search(sentence)
    return m is not None and _CAPPED.search(sentence[:m.start()]) is not None


def keywords(sentence: str) -> list[tuple[str, int]]:
    """The quoted words (one to three, letters only) ``sentence`` asks every reply to hold,
    lower-cased, each with how often (at least; "twice", "2 times or more", "more than
    once": 2; 1 where none is said): a word it puts in the reply ("Work 'x' into your
    answers", "Say 'x' at least twice"), not forbidden ("never use 'x'"), not one instead
    of which another comes, nor a count it caps ("at most twice"); [] for none."""
    if not _INCLUDE.search(sentence) or capped(sentence):
        return []
    n = 1
    if (m := _TIMES.search(sentence)) is not None:
        said = next(g for g in m.groups() if g).lower()
        n = ({"once": 1, "twice": 2, "thrice": 3}.get(said)
             or (_NUMBERS.get(said) or (int(said) if said.isdigit() else 2)))
    out = []
    for m in QUOTED.finditer(sentence):
        said = " ".join(m.group(1).split())
        if (re.fullmatch(r"[A-Za-z]+(?: [A-Za-z]+){0,2}", said) and 1 <= n <= 10
                and not forbids(sentence, *m.span()) and not _INSTEAD.search(sentence[:m.start()])):
            out.append((said.lower(), n))
    return out
