"""The values a turn is planned as: immutable, built before any K/V is fetched or computed.

``TurnPlan`` is everything ``InjectionExecutor`` runs: the injected segment and where its
K/V comes from (the tenant/member chain ``split``, the member's ``memory`` plan), the
rendered prompt, the reminder and the fitted messages, the conversation's link
(``LinkPlan``), whether a missing member segment is prefilled by the turn itself
(``defer``) and the contrastive guide to build (``GuidePlan``) or the member's lean to
fetch or measure (``LeanPlan``). Only the
run step touches K/V: it fetches or computes the segments, builds the guide's K/V head,
generates and keeps the turn's link (``engine/executor.py``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from injection.base import CacheKey, SegmentSplit
from injection.kvcache.packed import PackedKV

__all__ = ["AnchorPlan", "GuidePlan", "LeanPlan", "LinkPlan", "TurnPlan"]

Message = dict[str, str]


class LinkPlan(NamedTuple):
    """The conversation's link: the slot looked up, the prompt encoded once, and what the
    lookup found (``engine/turns.py``, ``TurnGenerator.plan``)."""

    key: CacheKey | None  # the conversation's slot (None: no reuse for this request)
    prompt: str
    prompt_ids: list[int] | None  # the tokens after the injected turn, encoded once
    cached: PackedKV | None  # the conversation's link to continue (None: a miss)
    admitted: bool = False  # the turn's link is stored (see ConversationStore)

    @property
    def done(self) -> int:
        """Tokens of the prompt the cached link already holds."""
        return self.cached.num_tokens if self.cached is not None else 0


class GuidePlan(NamedTuple):
    """Which contrastive guide a turn gets, and its input (``engine/guidance/plan.py``).

    ``head`` says where the guide row's K/V starts: ``"row"`` after the turn's own prefix
    (the reminded turn without its reminder: ``ids`` are that turn's whole prompt, of
    which the row's cached link covers the first tokens), ``"tenant"`` after the tenant's
    shared segment (``segment``/``split``), ``"shared"`` after the template's own system
    turn (``segment``, encoded as ``head_ids``), ``"none"``: ``ids`` start the sequence;
    an anchor's (``AnchorPlan``) also ``"segment"``: after the turn's own injected segment.
    """

    strength: float
    head: str
    ids: tuple[int, ...]
    segment: str = ""
    split: SegmentSplit | None = None
    head_ids: tuple[int, ...] = ()


class AnchorPlan(NamedTuple):
    """A deep turn's first token, chosen as its conversation's first turn would choose it
    (``engine/guidance/anchor.py``): ``ids``, the turn's last message alone after the
    member's segment, contrasted with ``guide`` (the same message with nothing injected)
    at ``strength``."""

    strength: float
    ids: tuple[int, ...]
    guide: GuidePlan


class LeanPlan(NamedTuple):
    """A first turn's lean, measured once per member on probe questions
    (``engine/guidance/probe.py``): ``ids``, each probe after the member's segment, guided
    against its ``guides`` (the probe with nothing injected) at ``strength``; ``digest``:
    what the lean depends on (its cache key's content hash)."""

    strength: float
    ids: tuple[tuple[int, ...], ...]
    guides: tuple[GuidePlan, ...]
    digest: str


class TurnPlan(NamedTuple):
    """What one turn does (``planner.TurnPlanner.plan``)."""

    # what is injected, and from where
    personal: bool  # the member's text is injected (scaled by ``member_alpha``)
    alpha: float  # the effective alpha reported (0: nothing personal injected)
    member_alpha: float  # the member segment's scale, part of the link's key
    memory: Any  # ``MemoryPlan``: the member's memories, cached and recalled
    context: str  # the system turn's text: the tenant's instructions, the member's text
    segment: str  # the system turn injected as K/V ('': nothing injected)
    split: SegmentSplit | None  # the segment as tenant + member parts (None: one segment)
    chash: str  # the segment's content hash ('' when nothing is injected)
    mode: str  # system | user_prefix | inline | none (``prompting/template.py``)
    # what is rendered
    reminder: Any  # ``Reminder``: the member's memories re-stated before user turns
    messages: tuple[Message, ...]  # the history that fits, reminders placed
    prompt: str  # the text after the segment (the whole prompt when nothing is injected)
    # how it runs
    link: LinkPlan  # the conversation's link to continue and keep
    defer: bool  # a missing member segment is prefilled by the turn itself (one pass)
    guide: GuidePlan | None  # the contrastive guide to build (None: no guide row)
    sampling: dict[str, Any]  # temperature, top_p, seed, stop, ... (``request_checks``)
    max_new_tokens: int
    anchor: AnchorPlan | None = None  # the first token as a first turn picks it (None: none)
    lean: LeanPlan | None = None  # the member's lean instead of a guide row (None: none)
    # the member's own of ``sampling["constraints"]`` (what the reply reports; the tenant's
    # instructions' are kept but not shown)
    own_constraints: tuple[str, ...] = ()

    @property
    def injected(self) -> bool:
        return bool(self.segment)
