"""Statistics of the quality benchmark: Wilson intervals, exact McNemar, the fluency verdict."""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Sequence

from memory_cases import recites

Z95 = 1.959963984540054


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """95 % Wilson score interval of ``k`` successes in ``n`` (as shares, 0..1)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar(wins: int, losses: int) -> float:
    """Exact two-sided McNemar p: the discordant pairs against Binomial(n, 1/2)."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(a: Sequence[bool], b: Sequence[bool]) -> tuple[int, int, float]:
    """(cases ``a`` passes and ``b`` fails, the reverse, exact McNemar p)."""
    assert len(a) == len(b)
    wins = sum(x and not y for x, y in zip(a, b, strict=True))
    losses = sum(y and not x for x, y in zip(a, b, strict=True))
    return wins, losses, mcnemar(wins, losses)


def share(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} {100 * k / max(n, 1):.0f} % [{100 * lo:.0f}-{100 * hi:.0f}]"


def diff(a: Sequence[bool], b: Sequence[bool]) -> str:
    """``+w/-l (p)``: the paired difference of ``a`` over ``b``."""
    w, lo, p = paired(a, b)
    return f"{w - lo:+d} (+{w}/-{lo}, p={p:.2g})"


# A reply loops when LOOP_SHARE or more of its word LOOP_N-grams repeat an earlier one of the
# same reply. Words are runs of letters (digits and punctuation dropped, so a list's numbers or
# "German: German:" colons do not hide a loop). Chosen on the 5,186 distinct replies stored in
# bench/results (2026-12-04): 874 (16.9 %) reach 0.2; read samples at 0.2-0.3 and every list
# flagged were loops (a sentence or list item said again, a word over and over), at 0.15-0.2 a
# mix (repetitive prose and real loops), so 0.2 flags the plain loops and no ordinary list.
LOOP_N = 4
LOOP_SHARE = 0.2
_WORDS = re.compile(r"[^\W\d_]+")


def loop_share(reply: str, n: int = LOOP_N) -> float:
    """The share of the reply's word n-grams that repeat an earlier one of the reply."""
    words = _WORDS.findall(reply.lower())
    grams = [tuple(words[k:k + n]) for k in range(len(words) - n + 1)]
    return (len(grams) - len(set(grams))) / len(grams) if grams else 0.0


# A second, independent look at repetition, for a mechanism that acts on exact repeats (the
# loop guard: a reply that varies a word each time round is no loop by ``loops`` but still
# compresses): a reply of 120 or more characters that zlib packs below half its size. On the
# stored replies of 2026-12-01 (5,203 of 120+ characters) it flags 85 % of those ``loops``
# flags and 2.3 % of the others.
PACKED_BELOW, PACKED_MIN_CHARS = 0.5, 120


def compressible(reply: str) -> bool:
    """The reply repeats itself enough for zlib to halve it (``PACKED_BELOW``)."""
    raw = reply.encode()
    return len(raw) >= PACKED_MIN_CHARS and len(zlib.compress(raw, 9)) < PACKED_BELOW * len(raw)


def loops(reply: str) -> bool:
    """The reply is a degenerate loop (``LOOP_SHARE``)."""
    return loop_share(reply) >= LOOP_SHARE


def fluent(reply: str, memory: str, recital_counts: bool = True) -> bool:
    """Fluency, part of every family's verdict (issue 57): the reply says something, does not
    loop and does not recite the memory (``recital_counts`` False for a fact: its question asks
    for the memory, so stating it is the answer)."""
    return (bool(reply.strip()) and not loops(reply)
            and not (recital_counts and recites(memory, reply)))
