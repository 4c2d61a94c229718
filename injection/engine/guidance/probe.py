"""A member's lean, measured once on probe questions and cached: guidance with no guide row.

The lean (``lean.py``) is what a guide's first decoding steps found the member's memory
to change, ``log p(x | memory, ...) - log p(x | ...)`` per vocabulary token. What a language
instruction changes is much the same whatever the member asks, so here it is measured once
per memory: the member's segment and each of ``PROBES`` (8 fixed questions), guided against
the same question with nothing injected (the one-memory guide's input: ``plan.unreminded``)
for ``PROBE_STEPS`` decoding steps, all in the batch together (``probe`` rows). The first
token's difference and the mean of the steps', averaged over the probes, are the member's
``MemoryLean``, cached with the member's segments (L1, then L2: a one-token ``PackedKV``,
``pack``) under a key of everything it depends on (``LeanPlan.digest``). Every first turn of
the member then chooses its first token from ``log p + s x first`` and the rest from
``log p + s x rest`` (over the same plausible tokens as a guide's), one row for the whole
reply: no guide's prefill, no guide's steps, no second batch row, once the lean is cached.
A deep turn, whose first token its anchor chooses (``anchor.py``), leans after it (``DEEP``).

Chosen on bench_quality's tuning cases (the 35 language instructions guidance serves by
default, depth 0; docs/BENCHMARKS.md, quality): the guide leaving after 4 steps 30/35, no
guide 21, the whole-reply guide 31; one probe question 29-32 by question, its first token's
difference kept apart (the mean alone for every token: 26-29), three averaged 30, eight 29.
The best single one ("Tell me a little about yourself.", 32) lost on 56 validation languages
(30 vs the guide row's 35: its lean spoke of itself, looping on "eu eu eu"); those 56 then
chose eight questions about no one (37), and 42 fresh validation cases confirmed them: 28/42
against the guide row's 26 and no guide's 19 (+11/-2, p=0.022).

A failed probe (its forward's own error) leaves the turn without a lean, as a failed anchor
leaves it unanchored. Off (``InjectionExecutor(memory_lean=False)``, the worker's
``GUIDANCE_MEMORY_LEAN=0``): the guide row of ``lean.py`` instead.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from typing import Any, NamedTuple

import torch

from injection.base import CacheKey, ExecutionRequest
from injection.engine.guidance import contrast
from injection.engine.guidance.plan import build_guide, unreminded
from injection.engine.planning.plan import GuidePlan, LeanPlan
from injection.errors import ModelOOMError
from injection.kvcache.chain import LEAN_PREFIX
from injection.kvcache.kvsource import user_or_none
from injection.kvcache.packed import PackedKV
from injection.kvcache.pieces import KVPieces
from injection.prompting.template import compose_context

__all__ = ["LEAN_PREFIX", "PROBES", "PROBE_ALPHA", "PROBE_STEPS", "PROBE_STRENGTH", "LeanPlans",
           "MemoryLean", "MemoryLeans", "at_probe_alpha", "lean_key", "pack", "plan_lean",
           "unpack"]

log = logging.getLogger("injection.engine.batch")

# Eight questions of no one kind, none about the assistant or the member, none a benchmark
# question's (``PROBE_STEPS`` guided steps each; all eight in one batch, once per memory)
PROBES: tuple[str, ...] = (
    "How is paper made?", "How do I boil an egg?", "Why is exercise good for the heart?",
    "Describe a busy market square.", "What makes a good friend?",
    "How do airplanes stay in the air?", "What is the history of the printing press?",
    "How does a computer store information?",
)
PROBE_STEPS = 4  # the probe's guided decoding steps after its first token
# An anchored turn (a deep one: ``anchor.py``) leans too, after the first token its anchor
# chose, with the same lean (False: only first turns lean)
DEEP = True
# The strength the probes are guided with, whatever the turn's: one lean a member, applied at
# the turn's strength (a tenant's new ``memory_contrast`` or a client's ``contrast`` measures
# nothing again); SmolLM2's default strength, where the lean was chosen
PROBE_STRENGTH = 1.0
# The member segment's scale the probes run at, whatever the turn's ``alpha``: likewise one
# lean a member, applied at the turn's alpha (a client varying ``alpha`` per request measured
# 296 probe tokens and stored a 192 KiB lean per value). The segment as cached (``alpha`` 1,
# the default and cap). Measured on SmolLM2 (a French member): the lean at 0.9 is the one at
# 1 within cos 0.998 (first token) / 0.97 (rest), and its size does not shrink with alpha
# (0.5: 1.1x / 1.4x), so it is applied as measured, not scaled by alpha.
PROBE_ALPHA = 1.0
_VERSION = "memory-lean-1"  # part of every key: a change of the recipe misses old leans
_HEADS = ("none", "shared", "tenant")  # a one-memory guide's (not "row", "segment")


class MemoryLean(NamedTuple):
    """A member's lean (``[V]`` float16 on the CPU): the first token's, then the rest's."""

    first: torch.Tensor
    rest: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.first.nbytes + self.rest.nbytes

    def after_first(self) -> MemoryLean:
        """The lean of a turn whose first token is chosen otherwise (its anchor's)."""
        return MemoryLean(torch.zeros_like(self.first), self.rest)


def plan_lean(adapter: Any, req: ExecutionRequest, guide: GuidePlan | None, *, on: bool,
              context: str, segment: str, keep_instructions: bool = False) -> LeanPlan | None:
    """The turn's lean instead of its ``guide`` (a one-memory first turn's: heads
    ``none``/``shared``/``tenant``), or None: off (``on``), no such guide, or a probe renders
    a different segment."""
    if not on or guide is None or guide.head not in _HEADS or not PROBES:
        return None
    negative_context = compose_context(req.instructions if keep_instructions else "", "")
    ids, guides = [], []
    for question in PROBES:
        probe = [{"role": "user", "content": question}]
        parts = adapter.split_prompt(context, probe)
        if parts.segment != segment:
            return None
        ids.append(tuple(adapter.renderer.encode(parts.prompt, first=False)))
        guides.append(unreminded(adapter, PROBE_STRENGTH, req, probe, negative_context))
    digest = _sha(_VERSION, repr(PROBES), str(PROBE_STEPS), repr(contrast.PLAUSIBLE),
                  repr(PROBE_STRENGTH), repr(PROBE_ALPHA), segment, repr(ids),
                  repr(tuple(guides)))
    return LeanPlan(guide.strength, tuple(ids), tuple(guides), digest)


class LeanPlans:
    """``plan_lean`` for one model, kept for the last ``size`` system turns: a plan depends
    on the turn's system text, not on its question (8 probes rendered and encoded, about
    5 ms of the request's planning, once per member instead of per turn)."""

    def __init__(self, adapter: Any, size: int = 1024) -> None:
        self.adapter, self.size = adapter, size
        self._plans: OrderedDict[tuple, LeanPlan | None] = OrderedDict()
        self._lock = threading.Lock()

    def plan(self, req: ExecutionRequest, guide: GuidePlan | None, *, on: bool, context: str,
             segment: str, keep_instructions: bool = False) -> LeanPlan | None:
        if not on or guide is None or guide.head not in _HEADS:
            return None
        key = (req.tenant, context, segment, req.instructions, keep_instructions,
               guide.strength, guide.head)
        with self._lock:
            if key in self._plans:
                self._plans.move_to_end(key)
                return self._plans[key]
        plan = plan_lean(self.adapter, req, guide, on=on, context=context, segment=segment,
                         keep_instructions=keep_instructions)
        with self._lock:
            self._plans[key] = plan
            while len(self._plans) > self.size:
                self._plans.popitem(last=False)
        return plan


def lean_key(tenant: str, user: str, fingerprint: str, plan: LeanPlan) -> CacheKey:
    """The lean's cache key: the member's, its content hash marked as a lean's."""
    return CacheKey(tenant, user, LEAN_PREFIX + plan.digest, fingerprint)


def pack(lean: MemoryLean) -> PackedKV:
    """The lean as the tiers store K/V: one layer, head and token, ``first`` as its keys
    and ``rest`` as its values (``D`` = the vocabulary)."""
    return PackedKV(lean.first.view(1, 1, 1, -1), lean.rest.view(1, 1, 1, -1), (0,))


def unpack(kv: PackedKV, vocab: int) -> MemoryLean | None:
    """``pack``'s inverse; None for an entry of another shape (then measured again)."""
    if tuple(kv.keys.shape) != (1, 1, 1, vocab) or kv.keys.dtype != torch.float16:
        return None
    return MemoryLean(kv.keys.view(-1), kv.values.view(-1))


class MemoryLeans:
    """Finds a turn's lean in the segments' tiers or measures it (``probe``), once per key
    at a time (the tiers' single flight)."""

    def __init__(self, adapter: Any, engine: Any, kv_source: Any, chain: Any) -> None:
        self.adapter, self.engine, self.kv_source, self.chain = adapter, engine, kv_source, chain

    def get(self, plan: LeanPlan | None, tenant: str, user: str | None,
            head: PackedKV | None) -> tuple[MemoryLean | None, str, tuple[int, int]]:
        """``(lean, where, probe_tokens)``: where it came from (``l1``, ``l2``, ``probe``,
        ``shared``: another turn's probe of the same key; ``""`` when none) and the forward
        tokens a probe ran for this turn (``probe``: prefilled, decoded). ``head``: the turn's
        injected segments (the probe's prefix, its member segment rescaled to
        ``PROBE_ALPHA``)."""
        if plan is None or self.engine is None:
            return None, "", (0, 0)
        head = at_probe_alpha(head)
        user = user_or_none(user)
        if user is None:  # no identity: measured for this turn, never cached
            lean, tokens = self.probe(plan, tenant, head)
            return lean, "probe" if lean is not None else "", tokens
        key = lean_key(tenant, user, self.adapter.fingerprint, plan)
        hit = self.kv_source.lookup(key, kind="lean")
        found = unpack(hit[0], self.vocab) if hit is not None else None
        if found is not None:
            return found, hit[1].value, (0, 0)
        ran: list[tuple[int, int]] = []  # the probe's tokens, where this turn ran it
        kv, _ = self.kv_source.flight.do(key, lambda: self._measure(key, plan, tenant, head, ran))
        lean = unpack(kv, self.vocab) if kv is not None else None
        # a turn that waited for another's probe of the same key: "shared"
        where = ("probe" if ran else "shared") if lean is not None else ""
        return lean, where, ran[0] if ran else (0, 0)

    @property
    def vocab(self) -> int:
        return int(self.adapter.model.get_output_embeddings().weight.shape[0])

    def _measure(self, key: CacheKey, plan: LeanPlan, tenant: str, head: PackedKV | None,
                 ran: list[tuple[int, int]]) -> PackedKV | None:
        lean, tokens = self.probe(plan, tenant, head)
        ran.append(tokens)
        if lean is None:
            return None
        kv = pack(lean)
        self.kv_source.keep(key, kv)
        return kv

    def probe(self, plan: LeanPlan, tenant: str, head: PackedKV | None
              ) -> tuple[MemoryLean | None, tuple[int, int]]:
        """Measure the lean: each of ``PROBES`` after ``head``, guided for ``PROBE_STEPS``
        steps (their rows in the batch together), their differences averaged; and the
        forward tokens they ran (prefilled, decoded: their rows' and their guides'). ``(None,
        (0, 0))`` when a forward fails (the turn goes on without a lean)."""
        jobs = []
        try:
            for ids, negative in zip(plan.ids, plan.guides, strict=True):
                guide = build_guide(negative, self.chain, tenant, None, (), 0)
                jobs.append(self.engine.start(head, 1.0, list(ids), PROBE_STEPS + 1,
                                              guide=guide, probe=True))
            outs = [job.wait() for job in jobs]
            self.kv_source.metrics.incr("lean_probes", len(jobs))
        except (RuntimeError, ValueError, ModelOOMError) as exc:
            for job in jobs:
                job.abandoned = True  # the others are dropped at the next step
            self.kv_source.metrics.incr("lean_failures")
            log.warning("lean probe failed (%s): the turn goes on without it",
                        type(exc).__name__)
            return None, (0, 0)
        if any(out.leans is None for out in outs):  # no guide ran (a batch of one row)
            return None, (0, 0)
        first, rest = (torch.stack([out.leans[k].float() for out in outs]).mean(0)
                       .to("cpu", torch.float16).contiguous() for k in (0, 1))
        prefilled = sum(len(ids) for ids in plan.ids) + sum(o.guide_prefill_tokens for o in outs)
        decoded = sum(max(0, len(o.token_ids) - 1) + o.guide_decode_tokens for o in outs)
        return MemoryLean(first, rest), (prefilled, decoded)


def at_probe_alpha(head: PackedKV | KVPieces | None) -> PackedKV | KVPieces | None:
    """``head`` with its member segment (the last piece, the only one scaled: ``chain``)
    at ``PROBE_ALPHA`` instead of the turn's alpha; the same pieces, nothing copied."""
    if not isinstance(head, KVPieces) or head.pieces[-1].scale == PROBE_ALPHA:
        return head
    *rest, last = head.pieces
    return KVPieces([*rest, last._replace(scale=PROBE_ALPHA)])


def _sha(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()
