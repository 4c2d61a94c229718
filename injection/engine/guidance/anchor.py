"""A deep turn's first token, chosen as the conversation's first turn would choose it.

Deep in a conversation the model answers as its earlier replies did: a member who asked
for French, after eight exchanges in English, gets English, guided or reminded
(bench/bench_quality.py, languages at depth 8: 0 of 14 validation cases in every
condition, 13 of 14 at depth 0). What a reply is written in is settled by its first
token: forced to the first token the turn would pick with no history, SmolLM2 went on
in the member's language in 29 of 35 tuning cases at depth 8 (0 unforced).

So a reminded turn of a member whom guidance would serve at depth 0 (one memory, a
standing instruction the decoding constraints do not keep: ``contrast.resolve``) gets an
*anchor*: the turn's last message alone after the member's segment (the cached system
turn, as in a first turn), contrasted as a first turn is against the same message with
nothing injected (``plan.unreminded``). A member with several memories, past the first
turns their guide serves (``plan.MANY_GUIDED_BEFORE``, no tenant instructions): the last
message alone with its reminder against without it, both after the turn's segment, as
their guide contrasts at depth 0. Both are prefilled in one forward of their own
(``EngineForwards.forward_rows``, kind ``anchor``: two short prompts, no history; the anchors
of concurrent turns queued together share one), and their
guided scores replace the row's first-token logits (``first``); decoding constraints and
sampling then apply to them as to any first token. No row is added to the batch and
nothing is decoded: the cost is that forward, counted in the reply's
``guide_prefill_tokens``. A failed anchor forward leaves the turn unanchored.

Chosen on bench_quality's tuning cases (35 language instructions, 30 written for it), the
platform with and without the anchor: one memory, depth 4 +29/35 (0 lost), depth 8 +27
(0 lost), depth 16 +28 (0 lost); 20 memories at depth 8 +21 (0 lost); among the other
standing instructions one lost at every depth ("Answer everything with one of these
exactly: My answer is yes. / ...", not read as a constraint: the anchor opened it with a
blank line); preferences and facts are not anchored (no standing instruction). Confirmed
on validation (the full profile, docs/BENCHMARKS.md quality): depth 8, languages 10/14
against 0/14 (10 won, 0 lost, p=0.002); 20 memories at depth 8 one won, one lost of 30.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import torch

from injection.engine.batchrow import RowJob
from injection.engine.guidance.contrast import combine
from injection.engine.guidance.plan import build_guide
from injection.errors import ModelOOMError
from injection.kvcache.packed import PackedKV

__all__ = ["Anchor", "build_anchor", "first", "firsts", "scores"]

log = logging.getLogger("injection.engine.batch")


class Anchor(NamedTuple):
    """The anchor's two inputs, each a prefix K/V then ids, and the strength."""

    strength: float
    prefix: PackedKV | None
    ids: list[int]
    guide_prefix: PackedKV | None
    guide_ids: list[int]


def build_anchor(plan: Any, chain: Any, tenant: str, chain_kv: PackedKV | None
                 ) -> Anchor | None:
    """The planned anchor (``AnchorPlan``) after the turn's injected ``chain_kv`` (never a
    deferred segment: an anchored turn's is computed first, ``planner``); its negative after
    the same (head ``"segment"``) or built as a guide's (``plan.build_guide``: ``chain``'s
    cached heads)."""
    if plan is None:
        return None
    if plan.guide.head == "segment":
        return Anchor(plan.strength, chain_kv, list(plan.ids), chain_kv, list(plan.guide.ids))
    guide = build_guide(plan.guide, chain, tenant, None, (), 0)
    return Anchor(plan.strength, chain_kv, list(plan.ids), guide.prefix, list(guide.ids))


def scores(engine: Any, anchor: Anchor | None) -> tuple[torch.Tensor | None, int]:
    """The anchor's guided first-token scores (``[V]``, on the CPU) and its prefilled
    tokens; ``(None, 0)`` without an anchor or when its forward fails (the turn goes on
    unanchored)."""
    if anchor is None or engine is None:
        return None, 0
    rows = [RowJob(anchor.prefix, 1.0, anchor.ids, anchor.ids, 1, {}, {}, solo=True),
            RowJob(anchor.guide_prefix, 1.0, anchor.guide_ids, anchor.guide_ids, 1, {}, {},
                   solo=True, is_guide=True)]

    def then(logits: torch.Tensor) -> torch.Tensor:  # the two rows' first-token logits
        return combine(logits[0], logits[1], anchor.strength).cpu()

    try:  # concurrent turns' anchors queued together run as one forward (``forwards``)
        out = engine.forward_rows("anchor", rows, then)
    except (RuntimeError, ValueError, ModelOOMError) as exc:  # the forward's own failure:
        # an anchor is a refinement, never the turn's failure (a time limit reaching the
        # waiting caller, or the engine stopping, is the turn's: raised on)
        engine.counters["anchor_failures"] += 1
        log.warning("anchor forward failed (%s): the turn goes on unanchored",
                    type(exc).__name__)
        return None, 0
    return out, len(anchor.ids) + len(anchor.guide_ids)


def first(job: RowJob, logits: torch.Tensor) -> torch.Tensor:
    """``job``'s first-token ``[V]`` logits: its anchor's scores where it has one and has
    chosen no token yet (a row put back before its first token is anchored again)."""
    if job.first_scores is None or job.gen:
        return logits
    return job.first_scores.to(logits.device)


def firsts(jobs: list[RowJob], logits: torch.Tensor) -> torch.Tensor:
    """``[rows, V]`` first-token logits of ``jobs``, each anchored row's its anchor's."""
    if all(j.first_scores is None for j in jobs):
        return logits
    return torch.stack([first(j, logits[i].float()) for i, j in enumerate(jobs)])
