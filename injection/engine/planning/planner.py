"""The planner: everything a turn does, decided before any K/V is fetched or computed.

``TurnPlanner.plan(req)`` fills a ``TurnPlan`` in steps, each a function of the request
and what the steps before it decided:

1. ``system_turn``: the effective alpha, the member's memories (segment budget and
   recall, once: ``memory/recall.py``), whether they are injected, the system turn's text
   and the reminder (``prompting/reminder.py``);
2. ``fit_messages``: the history that fits the context and its cap, reminded
   (``prompting/history.py``);
3. ``layout``: the injected segment and the prompt after it, the tenant/member split;
   or, where nothing is injected, the plain prompt (memories recalled beyond the
   segment are re-stated before their messages by step 1's reminder);
4. the conversation's link (``TurnGenerator.plan``): the one step that reads a cache. Its
   *result* (the link found, so how many prompt tokens are cached) is in the plan, and
   the steps after it decide on it: whether a missing member segment is prefilled by the
   turn itself (``defer``) and whether a reminded turn's guide continues the row's prefix;
5. the guide (``engine/guidance/plan.py``): which variant and its input ids. Its K/V head
   (the tenant's segment, the template's system turn, or the row's own prefix) is built
   in the run step (``build_guide``), as are the segments (``SegmentChain.get``). A
   one-memory first turn's guide becomes the member's lean (``guidance/probe.py``: a
   ``LeanPlan``, its probe's input), fetched or measured in the run step.

Only the model's text side is used: its template and tokenizer (``split_prompt``,
``plain_prompt``, ``prompt_tokens``, ``count_tokens``, ``renderer``). Two steps may run
a forward of the model's first layers: recall and a several-memory reminder's pick embed
the user's message (``memory/embed.py``), only for members with memories beyond their
segment; a turn without them is planned from the tokenizer alone.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

from injection.base import ExecutionRequest, SegmentSplit
from injection.engine.guidance import probe
from injection.engine.guidance.plan import first_anchor, plan_anchor, plan_guide, turn_strength
from injection.engine.planning.plan import TurnPlan
from injection.engine.request_checks import sampling_options
from injection.kvcache.chain import segment_split
from injection.kvcache.kvsource import content_hash
from injection.model.profiles import anchors_first_turns, default_on, guides_by_default, loop_ngram
from injection.prompting import rules as memory_rules
from injection.prompting.constraints import DEFAULT_ON, opening, transform
from injection.prompting.history import fit_history
from injection.prompting.reminder import Reminder
from injection.prompting.template import PromptParts, compose_context

__all__ = ["SystemTurn", "TurnPlanner", "constrained", "fit_messages", "layout", "own_constraints"]


class SystemTurn(NamedTuple):
    """Step 1: what of the member goes into the system turn, and how it is reminded."""

    alpha: float  # the request's alpha, capped
    memory: Any  # ``MemoryPlan``
    personal: bool  # the member's text is injected
    context: str  # the system turn's text
    reminder: Reminder
    rules: Any  # ``prompting.rules.TurnRules``: each memory's and the instructions' rules


def constrained(sampling: dict[str, Any], req: ExecutionRequest, personal: bool, *,
                on: bool, rules: memory_rules.TurnRules | None = None,
                default: bool = DEFAULT_ON) -> dict[str, Any]:
    """``sampling`` with the decoding constraints the tenant's instructions and, where they
    are injected (``personal``), the member's memories ask for (``prompting/constraints.py``;
    ``rules``: the turn's, read from the texts where None) when the batch engine runs the
    turn (``on``) and the request asks for them (``req.constrain``; None: ``default``, the
    model's profile's: ``model/profiles.default_on``)."""
    if not on or not (default if req.constrain is None else req.constrain):
        return sampling
    tenant, member = (rules or memory_rules.for_request(req)).decoding(personal)
    asked = next((m.get("content") or "" for m in reversed(req.messages)
                  if m.get("role") == "user"), "")
    found = opening(tuple(sorted(tenant | member)), asked if isinstance(asked, str) else "")
    if not found:
        return sampling
    stream = sampling.get("on_text")
    if stream is not None:  # the stream's pieces as the reply's text (``transform``)
        stream.sink = partial(_transformed, found, stream.sink)
    return {**sampling, "constraints": found}


def own_constraints(found: tuple[str, ...], rules: memory_rules.TurnRules,
                    personal: bool) -> tuple[str, ...]:
    """The member's own of the turn's decoding constraints ``found`` (what the reply
    reports): not those only the tenant's instructions ask for (admin-only)."""
    tenant, member = rules.decoding(personal)
    return tuple(c for c in found if c in member or (
        c.startswith("start:") and c not in tenant and "repeat" in member))


def _transformed(found: tuple[str, ...], sink: Any, piece: str) -> None:
    sink(transform(found, piece))


def defaulted_here(adapter: Any, req: ExecutionRequest, where: str) -> bool:
    """Whether guidance runs ``where`` ("first_turns", "deep_turns", "deep_lean") on this
    turn: always at a strength the request or tenant set, else as the model's profile says
    (``model/profiles.guides_by_default``: chosen on it by measurement)."""
    return req.contrast is not None or guides_by_default(adapter, where)


def fit_messages(adapter: Any, req: ExecutionRequest, context: str,
                 remind: Reminder | None = None) -> list[dict[str, str]]:
    """History in whole turns within the context and cap, reminded (cut sized deep)."""
    messages, remind = [dict(m) for m in req.messages], remind or Reminder()
    n_head = next((i for i, m in enumerate(messages) if m["role"] != "system"), 0)
    max_pos = getattr(adapter, "max_positions", None)
    count = adapter.prompt_tokens
    return remind.apply(fit_history(
        lambda msgs: count(context, remind.apply(msgs)), messages[n_head:-1],
        messages[-1:], limit=max_pos - req.max_new_tokens if max_pos else None,
        history_cap=req.history_token_budget, head=messages[:n_head],
        size_count=lambda msgs: count(context, remind.apply(msgs, deep=True))))


def layout(adapter: Any, instructions: str, context: str, messages: list[dict[str, str]]
           ) -> tuple[PromptParts | None, SegmentSplit | None]:
    """The system turn of ``context`` as the injected segment and the prompt after it
    (None: no context), and the segment's tenant/member split (None: one segment, or
    nothing injected)."""
    parts = adapter.split_prompt(context, messages) if context else None
    split = segment_split(adapter, parts.segment, context, instructions) if (
        parts is not None and parts.segment) else None
    return parts, split


class TurnPlanner:
    """Plans requests for one model (``adapter``), its memory planner and its turns.

    Args:
        alpha_cap, min_alpha: the effective alpha is ``min(request.alpha, alpha_cap)``;
            at or below ``min_alpha`` nothing of the member is injected.
        batching: generation runs as a batch engine row (guides need it).
        one_pass: a missing member segment is prefilled by the turn itself.
        guide_keeps_instructions: the one-memory guide keeps the tenant's instructions
            (``guidance/plan.py``; measured by bench/bench_tenant_precedence.py).
        memory_lean: a one-memory first turn leans with the member's lean measured once
            (``guidance/probe.py``) instead of running a guide row.
    """

    def __init__(self, adapter: Any, memories: Any, turns: Any, *, alpha_cap: float,
                 min_alpha: float, batching: bool, one_pass: bool,
                 guide_keeps_instructions: bool = False, memory_lean: bool = True) -> None:
        self.adapter, self.memories, self.turns = adapter, memories, turns
        self.alpha_cap, self.min_alpha = float(alpha_cap), float(min_alpha)
        self.batching, self.one_pass = batching, one_pass and batching
        self.guide_keeps_instructions, self.memory_lean = guide_keeps_instructions, memory_lean
        self.leans = probe.LeanPlans(adapter)  # a member's lean plan, per system turn

    def plan(self, req: ExecutionRequest) -> TurnPlan:
        system = self.system_turn(req)
        messages = fit_messages(self.adapter, req, system.context, system.reminder)
        parts, split = layout(self.adapter, req.instructions, system.context, messages)
        if not system.personal and split is None:
            prompt = self.adapter.plain_prompt(system.context, messages)
            return self._plain(req, system, messages, PromptParts("", prompt, "none"))
        if not parts.segment:  # the template admits no verified split: context stays text
            return self._plain(req, system, messages, parts)
        return self._injected(req, system, messages, parts, split)

    def system_turn(self, req: ExecutionRequest) -> SystemTurn:
        """Step 1 (the member's part is alpha-scaled; the tenant's shared segment never)."""
        alpha = min(float(req.alpha), self.alpha_cap)
        mem = self.memories.plan(req, on=req.injection_enabled and alpha > self.min_alpha)
        personal = req.injection_enabled and bool(mem.text.strip())
        personal = personal and alpha > self.min_alpha
        context = compose_context(req.instructions, mem.text if personal else "")
        rules = memory_rules.for_request(req)  # each memory read once (where not stored)
        remind = Reminder.for_request(req, getattr(self.adapter, "renderer", None), personal,
                                      partial(self.memories.relevant, req.tenant),
                                      mem.recall,  # recalled: before their messages
                                      [r.standing for r in rules.member],
                                      default=default_on(self.adapter, "reminder"))
        if mem.candidates and remind.text:  # recalled: those re-stated before the message
            shown = remind.shown(req.messages, [m.text for m in mem.candidates])
            mem.recalled = tuple(mem.candidates[i] for i in shown)
        return SystemTurn(alpha, mem, personal, context, remind, rules)

    def _sampling(self, req: ExecutionRequest) -> dict[str, Any]:
        """The request's sampling, with the loop guard's run length where the guard is on
        (the batch engine keeps it: ``engine/decoding/loops.py``)."""
        sampling = sampling_options(req)
        guard = req.loop_guard
        if guard is None:
            guard = default_on(self.adapter, "loop_guard")
        if self.batching and guard:
            sampling["no_repeat"] = loop_ngram(self.adapter)
        return sampling

    def _plain(self, req: ExecutionRequest, system: SystemTurn,
               messages: list[dict[str, str]], parts: PromptParts) -> TurnPlan:
        """Nothing injected: the whole prompt as text (the conversation's link may be
        continued)."""
        link = self.turns.plan(req, messages, parts.prompt, "", 0.0, injected=False)
        return TurnPlan(system.personal, 0.0, 0.0, system.memory, system.context, "", None,
                        "", parts.mode, system.reminder, tuple(messages), parts.prompt,
                        link, False, None, self._sampling(req), req.max_new_tokens)

    def _injected(self, req: ExecutionRequest, system: SystemTurn,
                  messages: list[dict[str, str]], parts: PromptParts,
                  split: SegmentSplit | None) -> TurnPlan:
        mem, personal = system.memory, system.personal
        member_alpha = system.alpha if personal else 1.0
        chash = content_hash(parts.segment)
        link = self.turns.plan(req, messages, parts.prompt, chash, member_alpha,
                               injected=True)  # the cache lookup: its result decides below
        sampling = constrained(self._sampling(req), req, personal, on=self.batching,
                               rules=system.rules,
                               default=default_on(self.adapter, "constraints"))
        found = tuple(sampling.get("constraints", ()))
        on = personal and self.batching
        strength = turn_strength(self.adapter, req, found, system.rules) if on else 0.0
        common = {"on": on, "context": system.context, "strength": strength,
                  "keep_instructions": self.guide_keeps_instructions}
        guide = plan_guide(self.adapter, req, messages, mem, system.reminder,
                           prompt_ids=link.prompt_ids, done=link.done, **common)
        first = None  # a first turn the profile leaves unguided: perhaps anchored
        if guide is not None and not defaulted_here(self.adapter, req, "first_turns"):
            first = first_anchor(self.adapter, guide, messages, context=system.context,
                                 segment=parts.segment) if anchors_first_turns(
                                     self.adapter) else None
            guide, common["on"] = None, False
        anchor = first or (plan_anchor(
            self.adapter, req, messages, mem, system.reminder, guide, segment=parts.segment,
            **common) if defaulted_here(self.adapter, req, "deep_turns") else None)
        deep = probe.DEEP and defaulted_here(self.adapter, req, "deep_lean") and not first
        lean = self.leans.plan(  # a first turn's, instead of its guide; an anchored one's too
            req, guide or (anchor.guide if anchor and deep else None),
            on=self.memory_lean, context=system.context, segment=parts.segment,
            keep_instructions=self.guide_keeps_instructions)  # one lean a member, any alpha
        # one-pass miss: a missing member segment is computed in this turn's own prefill
        # (not for an anchored or leaning turn: its anchor's two prompts, or its lean's
        # probe, start from the segment too)
        defer = (self.one_pass and link.cached is None and member_alpha == 1.0
                 and not anchor and not lean)
        return TurnPlan(personal, system.alpha if personal else 0.0, member_alpha, mem,
                        system.context, parts.segment, split, chash, parts.mode,
                        system.reminder, tuple(messages), parts.prompt, link, defer,
                        None if lean else guide, sampling, req.max_new_tokens, anchor, lean,
                        own_constraints(found, system.rules, personal))
