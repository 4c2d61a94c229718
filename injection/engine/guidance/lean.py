"""A guide that leaves early and leaves its contrast behind (a *lean*).

Contrastive guidance (``contrast.py``) decodes a second row beside the member's for the
whole reply. Here the guide runs ``LEAN_AFTER`` decoding steps only; meanwhile the row
keeps, per vocabulary token, the mean of ``log p(x | memories, ...) - log p(x | ...)``
over those steps (a token masked by a decoding constraint counts 0). The guide then
leaves the batch, and the row's token is chosen from

    log p(x | memories, conversation) + s * lean(x)

over the same plausible tokens as the guide's (``contrast.PLAUSIBLE``): what the memories
changed early in the reply (the language a member asked for) keeps being leaned towards,
for a ``[V]`` vector added per step instead of a second row. ``LEAN_AFTER = None``: the
guide guides the whole reply (no lean).

A *probe* row (``probe.py``, the member's lean measured once on a probe question) keeps its
first token's difference too, and every step's (``measured``); a row given such a lean
(``RowJob.preset``) chooses with it from its first token on, with no guide at all: ``s``
times the first token's difference for the first token, ``s`` times the mean for the rest
(``advance``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from injection.engine.batchrow import RowJob

__all__ = ["LEAN_AFTER", "advance", "due", "first", "leaned", "leaving", "measured", "observe",
           "scores"]

# Guided decoding steps before the guide leaves (None: never, the whole reply guided).
# Chosen on bench_quality's tuning cases (standing instructions, depth 0, the 35 language
# cases guidance serves by default): the whole-reply guide 31/35, no guide 21/35; a lean
# after 1 step 26, 2: 30, 4: 30, 8: 29, 16: 30, at 16-31 guide forward tokens per reply
# against 74. 4, two steps clear of 1's loss. Validation (108 standing cases): 96/108 with
# it, 98 with the whole-reply guide (0 won, 2 lost, p=0.5), 90 with no guide (6 won, 0 lost,
# p=0.031); 20 memories 34/37 against 33/37 (docs/BENCHMARKS.md, quality).
LEAN_AFTER: int | None = 4


def due(job: RowJob) -> bool:
    """Whether ``job``'s guide still adds its step's contrast to the row's lean (a probe's:
    every step it runs)."""
    if job.guide is None:
        return False
    return job.probe or (LEAN_AFTER is not None and job.lean_steps < LEAN_AFTER)


def _diff(main: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
    """``log p(row) - log p(guide)``, 0 where either is not finite (a masked token)."""
    diff = (torch.log_softmax(main.float(), dim=-1)
            - torch.log_softmax(guide.float(), dim=-1))
    return torch.where(torch.isfinite(diff), diff, torch.zeros_like(diff))


def observe(rows: Sequence[RowJob], main: torch.Tensor, guide: torch.Tensor) -> None:
    """Add each pair's ``[k, V]`` log-probability difference to its row's lean (rows whose
    lean is not ``due`` are skipped)."""
    at = [i for i, job in enumerate(rows) if due(job)]
    if not at:
        return
    for i, d in zip(at, _diff(main[at], guide[at]), strict=True):
        job = rows[i]
        job.lean = d.clone() if job.lean is None else job.lean.add_(d)
        job.lean_steps += 1


def leaving(rows: Sequence[RowJob]) -> list[RowJob]:
    """The guides whose rows have their lean now: each row keeps ``s`` times its mean
    difference and no guide (its decoding steps counted in ``guide_fed``; the guide kept in
    ``guide_left`` for a row that starts over after an OOM: ``RowJob.reset``)."""
    out = []
    for job in rows:
        if (LEAN_AFTER is not None and job.guide is not None and not job.is_guide
                and not job.probe and job.lean_steps >= LEAN_AFTER):
            out.append(job.guide)
            job.lean = job.lean.mul_(job.guide_strength / job.lean_steps)
            job.guide_fed, job.guide_left, job.guide = job.lean_steps, job.guide, None
    return out


def leaned(job: RowJob) -> bool:
    """Whether ``job`` chooses with its lean: its guide has left (``leaving`` sets
    ``guide_fed`` with the lean and takes the guide; ``RowJob.reset`` clears all three)."""
    return job.guide_fed is not None


def first(job: RowJob, main: torch.Tensor, guide: torch.Tensor) -> None:
    """A probe's first token: its ``[V]`` difference kept (``measured``)."""
    if job.probe:
        job.first_lean = _diff(main, guide)


def measured(job: RowJob) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A probe's first-token difference and the mean of its steps' (zeros where it stopped
    before them); None for any other row."""
    if not job.probe or job.first_lean is None:
        return None
    mean = (job.lean / job.lean_steps if job.lean is not None and job.lean_steps
            else torch.zeros_like(job.first_lean))
    return job.first_lean, mean


def advance(job: RowJob) -> None:
    """After a row's first token, its preset lean (``RowJob.preset``) is the mean's."""
    if job.preset is not None and len(job.gen) == 1 and job.lean is not None:
        job.lean = job.preset.rest.to(job.lean.device, torch.float32) * job.guide_strength


def scores(main: torch.Tensor, leans: torch.Tensor, log_plausible: float) -> torch.Tensor:
    """``[k, V]`` scores of rows with their ``[k, V]`` leans, implausible tokens ``-inf``."""
    lp = torch.log_softmax(main.float(), dim=-1)
    floor = lp.amax(dim=-1, keepdim=True) + log_plausible
    return (lp + leans).masked_fill_(lp < floor, float("-inf"))
