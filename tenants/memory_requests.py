"""Explicit memory requests in a chat message ("remember that ...", "forget ..."): a pure,
conservative parser (issue 22). Pure functions, no Django: unit-tested on positive and
negative cases (tests/tenants/test_memory_requests.py).

Only an explicit request at the very start of the message counts (after an optional
"please"/"can you"), so a question about memory ("do you remember ...?", "remember when
...") or a mention in passing ("I always forget my keys", "don't forget to ...") is not a
request. The remembered text is the request's own sentence; the rest of the message is
chatted about as usual. A "forget" removes a memory only when one matches its words well
(``best_match``), never by position or at random.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class MemoryRequest(NamedTuple):
    op: str  # "remember" | "forget"
    text: str


_POLITE = r"(?:(?:hey|hi|ok|okay)[,!]?\s+)?(?:please[,]?\s+|(?:can|could|would|will)\s+you\s+" \
          r"(?:please\s+)?)?"
_REMEMBER = re.compile(
    _POLITE + r"(?P<please>please\s+)?remember(?:\s*:\s*|\s+that\s+|\s+(?=(?:i|i'm|my|we|our)\b))"
    r"(?P<text>.+)", re.IGNORECASE | re.DOTALL)
_PLEASE_REMEMBER = re.compile(r"(?:please[,]?\s+remember|remember\s+this)\s*[:,]?\s+(?P<text>.+)",
                              re.IGNORECASE | re.DOTALL)
_FORGET = re.compile(
    _POLITE + r"forget(?:\s*:\s*|\s+that\s+|\s+about\s+|\s+)(?P<text>.+)",
    re.IGNORECASE | re.DOTALL)
# "forget it", "forget about it", "forget everything": not a request about one memory
_VAGUE = {"it", "that", "this", "everything", "all", "all of it", "all that", "about it",
          "them", "what i said", "i said that", "me"}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n")
_WORD = re.compile(r"[a-z0-9']+")
_STOP = {"a", "an", "the", "i", "i'm", "im", "my", "me", "am", "is", "are", "was", "that",
         "to", "of", "and", "or", "in", "on", "for", "about", "do", "don't", "dont", "you",
         "it", "be", "with", "at", "as", "so", "please", "really", "very"}
MIN_TEXT_CHARS = 3


def _first_sentence(text: str) -> str:
    first = _SENTENCE_END.split(text.strip(), maxsplit=1)[0].strip()
    return first.rstrip(" .!").strip()


def parse(message: str) -> MemoryRequest | None:
    """The memory request a message opens with, or None (most messages)."""
    head = message.strip()
    if not head:
        return None
    for op, pattern in (("remember", _REMEMBER), ("remember", _PLEASE_REMEMBER),
                        ("forget", _FORGET)):
        match = pattern.match(head)
        if match is None:
            continue
        text = _first_sentence(match.group("text"))
        if op == "forget":  # "forget about it, let's ..." names no memory
            text = re.split(r"[,;]", text, maxsplit=1)[0].strip()
        if text.endswith("?") and op == "remember" and not re.match(
                r"(?:can|could|would|will)\s+you", head, re.IGNORECASE):
            return None  # "remember that day ...?" is a question
        text = text.rstrip("?").strip()
        if len(text) < MIN_TEXT_CHARS or text.lower() in _VAGUE:
            return None
        if op == "forget" and re.match(r"(?:to|how|why|where|who)\b", text, re.IGNORECASE):
            return None  # "forget how to ..." is not a request about a memory
        return MemoryRequest(op, text)
    return None


def words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def best_match(query: str, memories: list[tuple[int, str]], threshold: float = 0.5
               ) -> int | None:
    """The id of the memory ``query`` names best: the largest share of the query's content
    words found in the memory (ties: the earlier memory); None below ``threshold``."""
    wanted = words(query)
    if not wanted:
        return None
    best, best_score = None, threshold
    for pk, text in memories:
        score = len(wanted & words(text)) / len(wanted)
        if score > best_score or (best is None and score >= threshold):
            best, best_score = pk, score
    return best
