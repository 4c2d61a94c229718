"""Next-token choice for the batch engine: the generation config's processors on the whole
step at once (``logitprocs``), then argmax (greedy rows) or a draw (sampled rows).

Each seeded row draws from its own ``torch.Generator``, so a seeded reply does not depend
on which other rows share its batch (or on the process-wide RNG); the draw is
``torch.multinomial`` on the row's ``[1, V]`` probabilities, as ``generate()`` draws.
"""

from __future__ import annotations

from typing import Any

import torch

from injection.engine.logitprocs import Knobs, TokenHistory, build_ids, process

__all__ = ["BatchChooser", "RowSampler"]


class RowSampler:
    """One row's sampling settings (temperature 0: greedy), its seeded generator and its
    decoding constraints (``engine/decoding/bans.py``)."""

    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                 *, device: torch.device | str = "cpu", token_map: Any = None,
                 forced: Any = None, no_repeat: int = 0) -> None:
        self.temperature, self.top_p = float(temperature or 0.0), float(top_p or 1.0)
        self.token_map = token_map  # where its tokens go (``bans.TokenMap``), or None
        self.forced = forced  # the phrases its reply opens and closes with (``bans.Phrases``)
        self.no_repeat = int(no_repeat or 0)  # the loop guard's run length (0: off; ``loops``)
        self.grams: dict = {}  # the loop guard's index of the reply's runs (``loops``),
        self.indexed = 0  # of that many of its tokens
        self.ending: int | None = None  # where the closing phrase started
        self.postscript: int | None = None  # where its marker started (-1: none due)
        self.title: int | None = None  # where its title's ">>" started
        self.titled: int | None = None  # the reply's length when its title closed (done)
        self.bullets: list[int] = []  # where each of its bullet points' "*" was forced
        self.highlights: list[int] = []  # where its highlights' stars stand (open, close, ..)
        self.placeholders: list[int] = []  # where its placeholders' brackets stand (the same)
        self.keywords: list[tuple[int, tuple[int, ...]]] = []  # where a word was forced, its ids
        self.generator: torch.Generator | None = None
        if self.temperature > 0.0 and seed is not None:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(int(seed))

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def draw(self, probs: torch.Tensor) -> int:
        """A token from ``probs`` (``[1, V]``); raises on non-finite probabilities."""
        return int(torch.multinomial(probs, 1, generator=self.generator))


class BatchChooser:
    """Processes a step's logits for all its rows at once and picks each row's token."""

    def __init__(self, generation_config: Any) -> None:
        self.knobs = Knobs.from_config(generation_config)
        self.history = TokenHistory()

    def __call__(self, rows: list[Any], logits: torch.Tensor, *,
                 cached: bool = True) -> list[tuple[Any, int | torch.Tensor]]:
        """``(row, token id)`` for greedy rows, ``(row, probabilities [1, V])`` for sampled
        rows (drawn by the caller, so a bad row fails alone). ``cached=False``: rows that
        are not the decoding batch (a prefill's first token) leave the history alone."""
        samplers = [r.sampler for r in rows]
        drawn = [i for i, s in enumerate(samplers) if not s.greedy]
        with torch.inference_mode():
            scores = logits.float()  # as generate(): processors run in float32
            ids = None
            if self.knobs.needs_history:
                ids = (self.history.of(rows, scores.device) if cached
                       else build_ids([r.input_ids + r.gen for r in rows], scores.device))
            scores = process(scores, self.knobs, ids, [s.temperature for s in samplers],
                             [s.top_p for s in samplers])
            best = scores.argmax(dim=-1).tolist()  # one device sync for the greedy rows
            probs = torch.softmax(scores[drawn], dim=-1) if drawn else None
        slot = {i: j for j, i in enumerate(drawn)}
        return [(r, best[i] if i not in slot else probs[slot[i]: slot[i] + 1])
                for i, r in enumerate(rows)]
