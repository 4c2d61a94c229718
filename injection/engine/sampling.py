"""Per-row next-token choice for the batch engine: greedy, or temperature + top-p.

Each seeded row samples from its own ``torch.Generator``, so a seeded reply does not
depend on which other rows share its batch (or on the process-wide RNG).
"""

from __future__ import annotations

import torch

__all__ = ["RowSampler"]


class RowSampler:
    """Chooses one row's next token from its logits (``[V]``)."""

    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                 *, device: torch.device | str = "cpu", repetition_penalty: float = 1.0) -> None:
        self.temperature, self.top_p = float(temperature or 0.0), float(top_p or 1.0)
        self.penalty = float(repetition_penalty or 1.0)  # the model's generation_config's
        self.generator: torch.Generator | None = None
        if self.temperature > 0.0 and seed is not None:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(int(seed))

    @property
    def greedy(self) -> bool:
        """Plain argmax of the logits (the engine batches these rows' argmax)."""
        return self.temperature <= 0.0 and self.penalty == 1.0

    def __call__(self, logits: torch.Tensor, seen: list[int] | None = None) -> int:
        """The next token; ``seen`` (input + generated ids) feeds the repetition penalty."""
        if self.penalty != 1.0 and seen:
            logits = _penalise(logits, seen, self.penalty)
        if self.temperature <= 0.0:
            return int(torch.argmax(logits))
        scores = logits.float() / self.temperature
        if self.top_p < 1.0:
            scores = _top_p(scores, self.top_p)
        probs = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator))


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches ``top_p`` (always one)."""
    ordered, order = torch.sort(scores, descending=True)
    cum = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
    drop = cum - torch.softmax(ordered, dim=-1) >= top_p  # mass before this token
    drop[0] = False
    out = scores.clone()
    out[order[drop]] = float("-inf")
    return out


def _penalise(logits: torch.Tensor, seen: list[int], penalty: float) -> torch.Tensor:
    """transformers' repetition penalty: seen tokens' scores divided (if > 0) or multiplied."""
    ids = torch.tensor(sorted(set(seen)), device=logits.device)
    picked = logits[ids]
    out = logits.clone()
    out[ids] = torch.where(picked < 0, picked * penalty, picked / penalty)
    return out
