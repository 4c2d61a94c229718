"""What a text asks of every reply, as decoding constraints (``constraints.py`` names and
keeps them): the patterns of case, commas, banned and required words, opening and closing
phrases, a postscript, a title, the reply's options, limits, bullet points, highlights and
placeholders, read from the words (``readers.py``)."""

from __future__ import annotations

import re

from injection.prompting.readers import (
    NEG,
    QUOTED,
    TITLES,
    bullet_count,
    capped,
    choice,
    denied,
    forbids,
    highlight_count,
    keywords,
    negated,
    placeholder_count,
    sentence_limit,
    word_limit,
)
from injection.prompting.verdicts import phrase

__all__ = ["ABBREVIATION", "PS", "SENTENCE", "SENTENCES", "asked"]

_LOWER = re.compile(r"lower[\s-]?case|small\s+letters", re.I)
_UPPER = re.compile(r"upper[\s-]?case|capital\s+letters?|\b(?:in|all|block)\s+(?:all\s+)?"
                    r"(?:caps|capitals)\b|all[\s-]caps|block\s+letters", re.I)
_CAPITALS = re.compile(r"\bcapitals?\b(?!\s+(?:of|city|cities))", re.I)  # "never capitals"
_COMMA = re.compile(r"\bcomma(?=s?\b|[\s-]free)", re.I)  # the word: "comma-free" counts its "free"
_WORDS = re.compile(r"\bwords?\b|\bsay\b|\bsaying\b|\bterms?\b", re.I)
_Q = (r"(?<![A-Za-z])[\"'‘“](?P<phrase>[^\"’”\n]+?)[\"'’”]"
      r"(?![A-Za-z])")  # a quoted phrase (apostrophes inside it allowed)
_WITH = (r"\b[^\"'‘“\n]{0,40}?\bwith\s+(?:(?:the|this)\s+)?(?:exact\s+)?"
         r"(?:(?:phrase|words?|sentence|line|text)\s+)?(?:exactly\s+)?:?\s*" + _Q)
_BE = r"\b[^\"'‘“\n]{0,30}?\b(?:be|is|are)\s+(?:exactly\s+)?:?\s*" + _Q
_START = (re.compile(r"\b(?:start|begin|open|preface)(?:s|ing)?" + _WITH, re.I),
          re.compile(r"\bfirst\s+(?:words?|line|sentence)" + _BE, re.I))
_END = (re.compile(r"\b(?:end|finish|close|conclude|sign\s+off)(?:s|ing)?" + _WITH, re.I),
        re.compile(r"\blast\s+(?:words?|line|sentence)" + _BE, re.I))
_DOUBLE = re.compile(r"\b(?:(?:wrap|enclose|inside|within|quote|surround)\w*\b[^.\n]{0,50}?|"
                     r"start\w*\s+and\s+end\w*\s+with\s+(?:an?\s+)?)double\s+(?:quot|\")",
                     re.I)  # the whole reply in double quotes
_ASKED = (r"(?:my|the\s+user'?s)\s+(?:exact\s+|own\s+|original\s+|whole\s+)?"
          r"(?:question|request|prompt|message|query)s?\b")
_REPEAT = re.compile(  # the reply opens with the user's message, as written
    r"\b(?:repeat|restat|cop[yi]|quot|echo|recit|reproduc)\w*\s+(?:back\s+)?" + _ASKED
    + r"|\b(?:begin|start|open|preface)\w*\b[^.\n]{0,30}?\bwith\s+" + _ASKED
    + r"|\bwrit\w*\s+" + _ASKED + r"\s+back\b", re.I)
PS = re.compile(r"(?<![A-Za-z]\.)\bP\.\s?(?P<pp>P\.\s?)?S\b\.?|\bpost-?scripts?\b",
                 re.I)  # not "U.P.S."
ABBREVIATION = re.compile(r"\b(?:e\.\s?g|i\.\s?e|etc|vs|cf)\.", re.I)
_TITLE = re.compile(r"\btitle[sd]?\b", re.I)
_ANGLE = re.compile(r"<<|\b(?:double\s+)?ang(?:le|ular)[\s-]+brackets?\b", re.I)
_STYLE = re.compile(r"(?:in|into|all|block)$", re.I)  # "in capitals", "all caps": a style
_LEAVE_OUT = re.compile(r"\bleave\s+((?:[\w']+\s+){0,2}?[\w']+)\s+out\b(?!\s+of)", re.I)
# a removal after a negation ("don't drop the capital letters"): writing as usual, no case rule
_DROPPED = re.compile(r"\b(?:don'?t|do\s+not|never|not)\s+(?:\w+\s+)?(?:drop|remove|lose|strip|"
                      r"ditch|omit|skip|stop|leave\s+(?:out|off)|get\s+rid\s+of)\b|\b(?:don'?t|"
                      r"do\s+not|never|not)\s+(?:\w+\s+){0,3}without\b", re.I)
SENTENCE = re.compile(r"[.;!?]+\s*")
# a tenant's instructions, sentence by sentence (not after a title: "Mrs. Okafor")
SENTENCES = re.compile(TITLES + r"(?<=[.!?])\s+(?=[A-Z])")
_CLAUSE = re.compile(r"[.;:!?]+\s*|,\s*(?=(?:and\s+)?(?:no|never|not|with|without|only)\b)", re.I)


def _letters(clause: str, m: re.Match) -> bool:
    """Whether the capitals at ``m`` are letters ("never use capital letters", "no
    capitals": lowercase asked), not a style ("not in capitals", "never all caps")."""
    before = (clause[:m.start()].split() or [""])[-1]
    return not (_STYLE.match(m.group().split()[0]) or _STYLE.match(before)
                or re.search(r"caps\b", m.group(), re.I))


def asked(text: str) -> set[str]:
    """The decoding constraints ``text`` asks for, as ``constraints.py`` names them."""
    text = _LEAVE_OUT.sub(r"leave out \1", text)  # "leave commas out": "leave out commas"
    out: set[str] = set()
    lower = upper = False
    for clause in _CLAUSE.split(text):
        for m in _LOWER.finditer(clause):  # "not in lowercase": no rule, never capitals
            lower = lower or not denied(clause, m.start())
        for m in _UPPER.finditer(clause):  # "never in capitals": no shouting, that is all
            if _DROPPED.search(clause[:m.start()]):  # "don't drop the capitals": as usual
                continue
            neg = denied(clause, m.start())
            upper, lower = upper or not neg, lower or (neg and _letters(clause, m))
        lower = lower or any(denied(clause, m.start()) and _letters(clause, m)
                             and not _DROPPED.search(clause[:m.start()])
                             for m in _CAPITALS.finditer(clause))
    for sentence in SENTENCE.split(text):
        if NEG.search(sentence) and any(forbids(sentence, *m.span())
                                        for m in _COMMA.finditer(sentence)):
            out.add("no_comma")
        if _WORDS.search(sentence) and NEG.search(sentence) and not capped(sentence):
            out |= {f"ban:{m.group(1).lower()}" for m in QUOTED.finditer(sentence)
                    if re.fullmatch(r"\s*[A-Za-z]+\s*", m.group(1)) and forbids(sentence, *m.span())}
    if lower != upper:
        out.add("lowercase" if lower else "uppercase")
    for kind, patterns in (("start", _START), ("end", _END)):  # the first asked, not negated
        for m in (m for pattern in patterns for m in pattern.finditer(text)):
            if not negated(text, m.start()) and (said := m.group("phrase") or "").strip():
                out.add(f"{kind}:{said.strip()}")
                break
    if any(not negated(text, m.start()) for m in _REPEAT.finditer(text)):
        out.add("repeat")
    marks = [m for m in PS.finditer(text) if not negated(text, m.start())]
    if marks:  # "a postscript marked P.P.S": the marker named anywhere
        out.add("ps:P.P.S." if any(m.group("pp") for m in marks) else "ps:P.S.")
    said = {phrase(c)[1].lower() for c in out if phrase(c)}
    for sentence in SENTENCE.split(text):  # a word it opens or closes with: said already
        out |= {f"word:{w}:{n}" for w, n in keywords(sentence) if w not in said}
    if not any(phrase(c) for c in out) and (options := choice(text)):  # "'Yes' or 'No', no
        words = {"ban:" + w.lower() for w in options}  # other words": not banned then
        out = {c for c in out if c not in words and not c.startswith("word:")} | {
            "choice:" + "|".join(options)}
    if (k := word_limit(text)) is not None:
        out.add(f"max_words:{k}")
    if (k := sentence_limit(text)) is not None:
        out.add(f"max_sentences:{k}")
    if (k := bullet_count(text)) is not None:
        out.add(f"bullets:{k}")
    if (k := highlight_count(text)) is not None:
        out.add(f"highlights:{k}")
    if (k := placeholder_count(text)) is not None:
        out.add(f"placeholders:{k}")
    title = _TITLE.search(text)
    if title and _ANGLE.search(text) and not negated(text, title.start()):
        out.add("title")
    double = _DOUBLE.search(text)
    if double and not negated(text, double.start()):
        out |= {'start:"', 'end:"'}
    return out


