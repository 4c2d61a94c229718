"""Statistics of the quality benchmark: Wilson intervals, exact McNemar, fluency flags."""

from __future__ import annotations

import math
from collections.abc import Sequence

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


def repeats(reply: str, n: int = 4) -> bool:
    """The reply repeats a word n-gram (a degenerate loop)."""
    words = reply.lower().split()
    grams = [tuple(words[k:k + n]) for k in range(len(words) - n + 1)]
    return len(grams) != len(set(grams))
