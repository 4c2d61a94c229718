"""How long a prefill chunk may be while other rows decode (Sarathi-style stall bounding).

A chunked prefill runs one chunk between two decoding steps of the running rows, so
those rows wait for the chunk on every step. A fixed chunk size bounds that wait in
tokens, not in time: 512 tokens cost about one decoding step on a GPU and ten on a
2-core CPU (docs/BENCHMARKS.md, engine latency). :class:`Pacer` sizes each chunk from
what the engine measured, so that it costs about ``budget`` decoding steps of the rows
running now: ``chunk = budget * step_seconds / prefill_seconds_per_token``, between
``floor`` and the ``cap`` (the memory bound, ``prefill_chunk``). With no row decoding
there is nobody to stall: the chunk is the cap; nor does the engine pace a burst of more
waiting rows than running ones (``grouping.GroupPrefill._paced``).

Both rates are exponential moving averages of the engine's own clock readings (the
engine's injectable ``clock``): the per-token cost is the ratio of the averaged seconds
to the averaged tokens, so a short prefill's fixed cost makes the estimate cautious,
never optimistic.
"""

from __future__ import annotations

__all__ = ["Pacer"]


class Pacer:
    """Chunk sizes for a chunked prefill; ``budget`` 0 turns pacing off (the cap only)."""

    def __init__(self, cap: int, budget: float = 0.0, *, floor: int = 16,
                 smoothing: float = 0.3) -> None:
        if budget < 0 or not 0 < smoothing <= 1:
            raise ValueError("need budget >= 0 and 0 < smoothing <= 1")
        self.cap, self.budget, self.floor = int(cap), float(budget), int(floor)
        self.smoothing = smoothing
        self.step_s: float | None = None  # a decoding step of the running rows
        self._prefill_s: float | None = None  # averaged seconds of a prefill forward
        self._prefill_tokens: float | None = None  # ... and its averaged tokens

    def chunk(self, remaining: int, *, decoding: bool) -> int:
        """Tokens of the next prefill forward, of ``remaining`` still to prefill."""
        if self.cap <= 0:
            return remaining
        size = self.cap
        per_token = self.token_seconds()
        if decoding and self.budget and self.step_s and per_token:
            fit = self.budget * self.step_s / per_token + 1e-9  # float noise never costs a token
            size = max(self.floor, min(self.cap, int(fit)))
        return min(remaining, size)

    def token_seconds(self) -> float | None:
        if not self._prefill_s or not self._prefill_tokens:
            return None
        return self._prefill_s / self._prefill_tokens

    def stepped(self, seconds: float) -> None:
        """A decoding step took ``seconds``."""
        self.step_s = self._mix(self.step_s, seconds)

    def prefilled(self, tokens: int, seconds: float) -> None:
        """A prefill forward of ``tokens`` took ``seconds``."""
        if tokens > 0 and seconds >= 0:
            self._prefill_s = self._mix(self._prefill_s, seconds)
            self._prefill_tokens = self._mix(self._prefill_tokens, float(tokens))

    def _mix(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)
