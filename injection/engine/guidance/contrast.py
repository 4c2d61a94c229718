"""Contrastive guidance: what the member's memories change, applied more strongly.

A row may carry a *guide*: the same conversation with nothing injected, or for a member
with several memories the same turn without its memory reminder (``plan.py``),
prefilled with the row and decoded beside it in the batch, always fed the row's own
tokens. The row's token is then chosen from

    (1 + s) * log p(x | memories, conversation) - s * log p(x | conversation)

(context-aware decoding, Shi et al., NAACL 2024), over the tokens the row itself finds
plausible, ``p(x | memories, ...) >= PLAUSIBLE * max`` (the adaptive plausibility of
contrastive decoding, Li et al., ACL 2023), so the guide re-ranks what the model would
say with the memories and never brings in a token it finds implausible. The guide's K/V,
text and stream are never seen by anyone; it leaves the batch with its row.

Only the platform can do this: a client holding a system prompt gets one distribution,
the engine has both. ``s = 0`` means no guide at all: today's output, token for token.
The cost is a second row per request (its prefill, in the same forward as the row's
where it can, ``prefill``; its decoding step in the batch, about free at batch 1 on a CPU
too since ``model/cpu_matmul.py``: docs/BENCHMARKS.md cpu-matmul), reported as the reply's
``guide_prefill_tokens`` (the ids it prefilled after its cached prefix; a row put back
after an OOM prefills them again) and ``guide_decode_tokens`` (the row's tokens it was
fed: one fewer than the reply's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from injection.engine import steps
from injection.engine.batchrow import RowJob
from injection.engine.guidance import lean
from injection.kvcache.packed import PackedKV
from injection.model.profiles import guidance_default
from injection.prompting import rules as memory_rules

__all__ = ["MAX_CONTRAST", "PLAUSIBLE", "Guide", "attach",
           "combine", "count_pair", "first_token", "guide_job", "mirror", "prefill", "prefill_guide",
           "resolve", "shares_forward", "split_rows", "with_guides"]

PLAUSIBLE = 0.1  # a token below this share of the row's best probability is never picked
_LOG_PLAUSIBLE = float(torch.log(torch.tensor(PLAUSIBLE)))  # its log, as float32 computes it
MAX_CONTRAST = 4.0  # requests and tenants are validated against it
# A guide guides the first ``lean.LEAN_AFTER`` decoding steps, then leaves its mean contrast
# behind (``lean.py``). Other cheaper guides were measured and removed (bench_quality,
# standing instructions, depth 0; docs/benchmarks/quality.md): the guide leaving once it had
# changed no pick for 8 or 16 steps in a row lost 3 of its 6 validation wins (word limits
# and a keyword, won late in the reply); guiding only the first 1, 4 or 8 tokens and nothing
# after lost 4-6 of the 35 tuning languages the whole-reply guide keeps.
# The default strength is the loaded model's profile's (``model/profiles.py``:
# ``profiles/<model>.json`` holds it with the evidence that chose it, matched by
# ``fingerprint.model_key``); a model without a profile (the random demo model included)
# is off. SmolLM2-135M-Instruct's: 1.0.
# It is applied by default only to a member with a standing instruction among their memories
# (``reminder.standing``: "Always answer in lowercase."). bench/bench_quality.py, depth 0,
# guided vs not: standing instructions +4 of 85 tuning cases (4 won, 0 lost, p = 0.12)
# and +7 of 68 validation cases (8 won, 1 lost, p = 0.039); preferences -6 of 40 (4 won,
# 10 lost) and facts +5 of 40 (6 won, 1 lost), neither significant (tuning), at a second
# batch row and ~74 more forward tokens per reply (docs/BENCHMARKS.md, quality).
# Not where the decoder keeps the instruction (``prompting/constraints.py``: lowercase, no
# commas, ...): on top of the constraints, guidance changed none of those 30 tuning cases'
# verdicts (its +4 of 85 all on the others: language, keyword, word limit).
# Nor for a standing instruction that names no language and asks for nothing a constraint
# would keep ("I like short answers.", "Be polite."): with the decoder keeping 16 of the 17
# types, every win of guidance in the full profile is a language's (depth 0: tuning 10 of 10,
# validation 8 of 8, p=0.008; the anchor at depth 8: 27 of 27, 10 of 10), and such a memory
# was never shown to gain (the benchmark's few, its reader's misses, lost nothing
# without it: docs/BENCHMARKS.md, quality); a guide there cost a second batch row for nothing
# measured. With the constraints off, a readable instruction is guided again (its wins before
# the decoder kept them: keyword, word limit, placeholders).


class Guide(NamedTuple):
    """A row's guide: ``strength`` s, and its input (``prefix`` K/V then ``ids``)."""

    strength: float
    prefix: PackedKV | None
    ids: list[int]


def resolve(adapter: Any, requested: float | None,
            memories: Sequence[str | memory_rules.MemoryRules] = (),
            constraints: Sequence[str] = ()) -> float:
    """Effective strength: the request's (or tenant's), else the model's measured default
    where it pays: for ``memories`` (texts, or the rules read from them: ``prompting/rules.py``)
    holding a standing instruction that the turn's decoding ``constraints`` do not keep
    whole and that names a language or asks for what a constraint would keep
    (``rules.guided``: e.g. with ``constraints`` off); 0 for the others."""
    if requested is None:
        found = tuple(constraints)
        pays = any(memory_rules.guided(m if isinstance(m, memory_rules.MemoryRules)
                                       else memory_rules.read(m), found) for m in memories)
        requested = guidance_default(adapter) if pays else 0.0
    return min(max(float(requested), 0.0), MAX_CONTRAST)


def attach(job: RowJob, guide: Guide | None, max_batch: int, lean: Any = None) -> None:
    """Give ``job`` its guide row (none at strength 0, or without room for two rows), or the
    member's lean and its strength (``probe.py``: chosen with from the first token, no guide;
    a ``probe`` row measures its guide's)."""
    if lean is not None:
        job.preset, job.guide_strength = lean[0], float(lean[1])
    elif guide is not None and guide.strength > 0 and max_batch >= 2:
        job.guide, job.guide_strength = guide_job(job, guide), guide.strength


def guide_job(main: RowJob, guide: Guide) -> RowJob:
    """The guide row of ``main``: greedy, silent, as long as ``main`` may run."""
    return RowJob(guide.prefix, 1.0, list(guide.ids), list(guide.ids), main.max_new_tokens,
                  {}, {}, solo=True, is_guide=True)


def combine(main: torch.Tensor, guide: torch.Tensor, strength: float | Sequence[float],
            plausible: float = PLAUSIBLE) -> torch.Tensor:
    """``[.., V]`` guided scores of ``main`` against ``guide`` (log-probabilities, with
    implausible tokens at ``-inf``). ``strength``: one for every row, or one per row of a
    ``[k, V]`` pair (each row's scores the same, bit for bit, as combined alone)."""
    lp_main = torch.log_softmax(main.float(), dim=-1)
    lp_guide = torch.log_softmax(guide.float(), dim=-1)
    if isinstance(strength, (int, float)):
        scores = (1.0 + strength) * lp_main - strength * lp_guide
    else:  # a factor per row, rounded to float32 as a Python number's is
        factors = torch.tensor([[1.0 + float(s), float(s)] for s in strength],
                               dtype=torch.float32, device=lp_main.device)
        scores = factors[:, :1] * lp_main - factors[:, 1:] * lp_guide
    log_plausible = (_LOG_PLAUSIBLE if plausible == PLAUSIBLE
                     else float(torch.log(torch.tensor(plausible))))
    floor = lp_main.amax(dim=-1, keepdim=True) + log_plausible
    return scores.masked_fill_(lp_main < floor, float("-inf"))


def split_rows(rows: list[RowJob], logits: torch.Tensor) -> tuple[list[RowJob], torch.Tensor]:
    """The rows that choose a token (guides removed) and their logits, each guided row's
    combined with its guide's when the guide is in the same step: all such pairs in one
    ``combine`` (half the time of one call per pair at 8 pairs of SmolLM2's vocabulary);
    a row whose guide has left chooses with its lean (``lean.py``)."""
    if not any(r.guide is not None or r.is_guide or r.lean is not None for r in rows):
        return rows, logits
    index = {id(r): i for i, r in enumerate(rows)}
    keep = [i for i, r in enumerate(rows) if not r.is_guide]
    pairs = [(j, i, index[id(rows[i].guide)]) for j, i in enumerate(keep)
             if rows[i].guide is not None and id(rows[i].guide) in index]
    leaned = [(j, i) for j, i in enumerate(keep) if lean.leaned(rows[i])]
    if not pairs and not leaned:
        return [rows[i] for i in keep], logits[keep].float()
    if pairs:
        at, mains, guides = (list(x) for x in zip(*pairs, strict=True))
        strengths = [rows[i].guide_strength for i in mains]
        combined = combine(logits[mains], logits[guides],
                           strengths[0] if len(set(strengths)) == 1 else strengths)
        lean.observe([rows[i] for i in mains], logits[mains], logits[guides])
        if len(at) == len(keep):  # every choosing row guided (at == 0, 1, ...)
            return [rows[i] for i in keep], combined
    out = logits[keep].float()
    if pairs:
        out[at] = combined
    if leaned:
        at, mains = (list(x) for x in zip(*leaned, strict=True))
        out[at] = lean.scores(logits[mains], torch.stack([rows[i].lean for i in mains]),
                              _LOG_PLAUSIBLE)
    return [rows[i] for i in keep], out


def own_scores(rows: list[RowJob], logits: torch.Tensor) -> Callable[[RowJob], torch.Tensor]:
    """A row's own scores in this step (``logits``, before ``split_rows`` combines a guided
    row's with its guide's or its lean): the loop guard's way out where a guided row's
    plausible tokens are all banned (``decoding/loops.py``). Looked up only when called:
    nothing is built on a step that needs none."""
    return lambda job: logits[next(i for i, r in enumerate(rows) if r is job)]


def mirror(job: RowJob, token: int) -> None:
    """The guide goes on with the row's token (it leaves the batch with its row); a preset
    lean moves on past the first token (``lean.advance``)."""
    if job.guide is not None:
        job.guide.gen.append(token)
    lean.advance(job)


def first_token(job: RowJob, main: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
    """A guided row's first-token scores (``combine``; a probe keeps the difference:
    ``lean.first``)."""
    lean.first(job, main, guide)
    return combine(main, guide, job.guide_strength)


def with_guides(rows: list[Any]) -> list[Any]:
    """``rows`` and their guides (a row leaves the batch with its guide)."""
    return [*rows, *(r.guide for r in rows if r.guide is not None and r.guide not in rows)]


def prefill(adapter: Any, job: RowJob, ids: list[int], past: Any, *, whole: bool,
            counters: dict[str, int]) -> tuple[Any, torch.Tensor, Any]:
    """``steps.prefill`` of the row's ``ids``, and ``guided`` None; a guided row whose
    prefill is this one whole chunk (not resumed, its guide at most twice as
    long: the shorter row is padded to the longer) runs with its guide in one
    forward (``steps.prefill_group``: both first tokens for about the cost of one row's
    on an accelerator, and one forward's fixed cost on a CPU), ``guided`` its guide's
    ``(cache, logits)``."""
    if (job.guide is None or not whole or past is not None
            or not shares_forward(job, len(ids))):
        return (*steps.prefill(adapter, job, ids, past), None)
    job.guide.gen = []
    rows, logits = steps.prefill_group(adapter, [job, job.guide])
    count_pair(job, counters)
    return rows[0], logits[0], (rows[1], logits[1])


def shares_forward(job: RowJob, row_ids: int) -> bool:
    """Whether ``job``'s guide is prefilled in the same forward as the row's ``row_ids``
    tokens: at most twice as long (the shorter is padded: more would cost what it saves)."""
    return job.guide is not None and len(job.guide.new_ids) <= 2 * row_ids


def count_pair(job: RowJob, counters: dict[str, int]) -> None:
    """A guide prefilled in its row's forward: its tokens (padding is not the guide's) and
    the pair, counted."""
    job.guide_prefilled += len(job.guide.new_ids)
    counters["guided_rows"] += 1
    counters["guide_pairs"] += 1


def prefill_guide(adapter: Any, job: RowJob, resume: bool,
                  counters: dict[str, int]) -> tuple[Any, torch.Tensor] | None:
    """The guide's whole prefill, after its row's (a resumed row's guide goes on with the
    row's tokens); None without a guide."""
    guide = job.guide
    if guide is None:
        return None
    guide.gen = list(job.gen)
    ids = guide.prefill_ids(resume)
    past, logits = steps.prefill(adapter, guide, ids)
    job.guide_prefilled += len(ids)
    counters["guided_rows"] += 1
    return past, logits
