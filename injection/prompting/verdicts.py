"""Whether a reply's text keeps a decoding constraint (``constraints.py``), read as IFEval
reads it: a phrase it opens or closes with, a case, a banned or a required word, a limit."""

from __future__ import annotations

import re

from injection.prompting.readers import sentence_count, word_count

__all__ = ["mentions", "phrase", "required", "violates"]

_BULLET = re.compile(r"^[ \t]*(?:\*[^*\n]|-)", re.M)  # a bullet point's line


def phrase(constraint: str) -> tuple[str, str] | None:
    """``("start"|"end"|"ps", text)`` of a phrase the reply opens or closes with (a
    postscript's marker); None for the others."""
    kind, _, text = constraint.partition(":")
    return (kind, text) if kind in ("start", "end", "ps") and text else None


def required(constraint: str) -> tuple[str, int] | None:
    """``(word, n)`` of a ``word:<word>:<n>`` constraint (the reply holds the word, or
    words, at least n times); None for the others."""
    kind, _, rest = constraint.partition(":")
    word, _, n = rest.rpartition(":")
    return (word, int(n)) if kind == "word" and word and n.isdigit() else None


def mentions(text: str, word: str) -> int:
    """How often ``text`` holds ``word`` (any case; whole words: "gardens" is not "garden")."""
    words = r"\s+".join(map(re.escape, word.split()))
    return len(re.findall(rf"(?<![^\W_]){words}(?![^\W_])", text, re.I))


def violates(constraint: str, text: str) -> bool:
    """Whether ``text`` breaks ``constraint`` (for a phrase: the text does not open or
    close with it)."""
    if constraint == "lowercase":
        return any(c.isupper() for c in text)
    if constraint == "uppercase":
        return any(c.islower() for c in text)
    if constraint == "no_comma":
        return "," in text
    if (said := phrase(constraint)) is not None:  # where it is said (a literal says nothing)
        kind, words = said[0], said[1].lower()
        text = text.strip().lower()
        if kind == "ps":
            return words.rstrip(".") not in text
        return not (text.startswith(words) if kind == "start" else text.endswith(words))
    if (asked := required(constraint)) is not None:
        return mentions(text, asked[0]) < asked[1]
    if constraint.startswith("ban:"):
        word = constraint[4:]
        return any(w.lower() == word for w in re.findall(r"[A-Za-z]+", text))
    if constraint == "repeat":  # the message is the planner's: a literal says nothing
        return False
    if constraint.startswith("max_words:"):
        return word_count(text) >= int(constraint[10:])
    if constraint.startswith("choice:"):
        return text.strip() not in constraint[7:].split("|")
    if constraint == "title":
        return re.search(r"<<[^\n]+>>", text) is None
    if constraint.startswith("max_sentences:"):
        return sentence_count(text) > int(constraint[14:])
    if constraint.startswith("bullets:"):  # lines as IFEval counts them ("* x", "- x")
        return len(_BULLET.findall(text)) != int(constraint[8:])
    if constraint.startswith("highlights:"):  # as IFEval counts them: *x* and **x**
        spans = [h.strip("*").strip() for h in re.findall(r"\*[^\n*]*\*", text)]
        bold = [h[2:-2].strip() for h in re.findall(r"\*\*[^\n*]*\*\*", text)]
        return sum(map(bool, spans + bold)) < int(constraint[11:])
    if constraint.startswith("placeholders:"):  # as IFEval counts them
        return len(re.findall(r"\[.*?\]", text)) < int(constraint[13:])
    raise ValueError(f"unknown constraint {constraint!r}")
