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
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from injection.engine.batchrow import RowJob

__all__ = ["LEAN_AFTER", "due", "leaned", "leaving", "observe", "scores"]

# Guided decoding steps before the guide leaves (None: never, the whole reply guided).
# Chosen on bench_quality's tuning cases (standing instructions, depth 0, the 35 language
# cases guidance serves by default): the whole-reply guide 31/35, no guide 21/35; a lean
# after 1 step 26, 2: 30, 4: 30, 8: 29, 16: 30, at 16-31 guide forward tokens per reply
# against 74. 4, two steps clear of 1's loss. Validation (108 standing cases): 96/108 with
# it, 98 with the whole-reply guide (0 won, 2 lost, p=0.5), 90 with no guide (6 won, 0 lost,
# p=0.031); 20 memories 34/37 against 33/37 (docs/BENCHMARKS.md, quality).
LEAN_AFTER: int | None = 4


def due(job: RowJob) -> bool:
    """Whether ``job``'s guide still adds its step's contrast to the row's lean."""
    return LEAN_AFTER is not None and job.guide is not None and job.lean_steps < LEAN_AFTER


def observe(rows: Sequence[RowJob], main: torch.Tensor, guide: torch.Tensor) -> None:
    """Add each pair's ``[k, V]`` log-probability difference to its row's lean (rows whose
    lean is not ``due`` are skipped)."""
    at = [i for i, job in enumerate(rows) if due(job)]
    if not at:
        return
    diff = (torch.log_softmax(main[at].float(), dim=-1)
            - torch.log_softmax(guide[at].float(), dim=-1))
    diff = torch.where(torch.isfinite(diff), diff, torch.zeros_like(diff))
    for i, d in zip(at, diff, strict=True):
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
                and job.lean_steps >= LEAN_AFTER):
            out.append(job.guide)
            job.lean = job.lean.mul_(job.guide_strength / job.lean_steps)
            job.guide_fed, job.guide_left, job.guide = job.lean_steps, job.guide, None
    return out


def leaned(job: RowJob) -> bool:
    """Whether ``job`` chooses with its lean: its guide has left (``leaving`` sets
    ``guide_fed`` with the lean and takes the guide; ``RowJob.reset`` clears all three)."""
    return job.guide_fed is not None


def scores(main: torch.Tensor, leans: torch.Tensor, log_plausible: float) -> torch.Tensor:
    """``[k, V]`` scores of rows with their ``[k, V]`` leans, implausible tokens ``-inf``."""
    lp = torch.log_softmax(main.float(), dim=-1)
    floor = lp.amax(dim=-1, keepdim=True) + log_plausible
    return (lp + leans).masked_fill_(lp < floor, float("-inf"))
