"""The planner's half of contrastive guidance: which turns get a guide, and its input.

By default (no strength asked by the request or tenant) only a member with a standing
instruction among their memories is guided, and not where the turn's decoding constraints
keep it (``contrast.resolve``): measured on bench/bench_quality.py, that is where guidance
pays for its second row.

A one-memory turn is guided (``contrast.py``) when its effective strength is above 0,
the member's memories are injected, the batch engine runs it, and the turn carries no
memory reminder (``prompting/reminder.py``): measured on the memory-depth cases,
contrasting a reply against a conversation without the reminders' restated memories
makes the model recite them, while the reminder alone keeps deep turns in line
(docs/BENCHMARKS.md, memory depth). So the guide works on the first turns of a
conversation and the reminder on the rest, whose first token is anchored instead
(``plan_anchor``, ``anchor.py``: the last message alone, guided, picks it).

A member with several memories is never guided against a conversation without them:
what the memories add is above all their list, and the model recites it ("- My favourite
film is Casablanca.\n- I grow tomatoes ..."); contrasting only the memories relevant to
the message (the reminder's pick) against the others gained nothing either (measured,
docs/BENCHMARKS.md memory depth). Their reminders start with the first turn instead
(``reminder.MANY_AFTER``), and those first turns (``MANY_GUIDED_BEFORE``) are guided
against the same turn *without its reminder* (``_reminded``): the same injected
memories and history, so the guide starts from the row's own prefix K/V and prefills only
the un-reminded last turn. What is amplified is what re-stating the relevant memories
next to the question changes.

For one memory, the guide's input is what the same request renders with nothing injected:
the template's default system turn (cached once per tenant) and the same messages, so the
tenant's instructions are amplified together with the memory and keep precedence
(``keep_instructions`` keeps them in the guide instead, through their shared segment:
bench/bench_tenant_precedence.py measures both); its prefill is short where it is used (no
deep history to repeat).

Planned before any K/V is fetched (``plan_guide``: a ``GuidePlan``, the guide's input ids
and where its K/V head comes from), built in the run step (``build_guide``: the head's
K/V, from the tenant's cache or the row's own prefix).
"""

from __future__ import annotations

import os
from typing import Any

from injection.base import ExecutionRequest
from injection.engine.guidance.contrast import Guide, resolve
from injection.engine.planning.plan import AnchorPlan, GuidePlan
from injection.kvcache.chain import segment_split
from injection.prompting.reminder import turns_before
from injection.prompting.template import compose_context

__all__ = ["build_guide", "first_anchor", "guide_figures", "plan_anchor", "plan_guide",
           "turn_strength", "unreminded"]

# A member with several memories: a turn with fewer exchanges before it than this is
# guided against the same turn without its reminder (0: never). Measured on the memory
# depth cases, 20 memories, depth 0: 12/20 against 9/20 unguided (tuning), 12/20 against
# 8/20 (held-out), before the reminder pick's stand-out rule (with it, guided: 11/20 and
# 12/20); guiding at depth 8 too: 8/20 against 10/20 and 6/20 against 6/20.
MANY_GUIDED_BEFORE = 2
# A member with one memory, on a reminded turn (deep in a conversation): anchored
# (``anchor.py``): the reply's first token as the turn's last message alone, guided, would
# pick it (False: not). Guiding such a turn against itself without its last reminder, as
# above, was measured instead: tuning languages at depth 8, 5/35 against 2/35 unguided
# (the anchor: 29/35), at a second row for the whole reply.
ONE_ANCHORED_DEEP = True
# A member with several memories, on a turn no longer guided (``MANY_GUIDED_BEFORE``):
# anchored on the last message alone with its reminder against it without (False: not).
MANY_ANCHORED = True


def plan_guide(adapter: Any, req: ExecutionRequest, messages: list[dict[str, str]],
               mem: Any, remind: Any, *, on: bool, context: str, prompt_ids: list[int] | None,
               done: int, strength: float, keep_instructions: bool = False
               ) -> GuidePlan | None:
    """The turn's guide, or None (off, nothing personal injected, several memories, or a
    reminded turn). ``context``, ``prompt_ids`` and ``done``: the turn's system text, its
    prompt's ids and how many of them its cached link holds (a reminded turn's guide
    continues the row's own prefix). ``keep_instructions``: the one-memory guide keeps the
    tenant's instructions (measured: they then lose precedence; bench_tenant_precedence).
    ``strength``: the turn's (``turn_strength``)."""
    if not on or strength <= 0.0:
        return None
    if remind.reminds_last(messages):
        # several memories, a first turn, and no tenant instructions: both rows have them,
        # so only the memories would be amplified, over the instructions (a precedence
        # test failed with it: tests/injection/test_memory_instructions.py)
        early = turns_before(messages) < MANY_GUIDED_BEFORE
        use = mem.many and early and not req.instructions and prompt_ids is not None
        return _reminded(adapter, strength, context, [*messages[:-1], dict(
            req.messages[-1])], prompt_ids, done) if use else None
    if mem.many:
        return None
    return unreminded(adapter, strength, req, messages,
                       compose_context(req.instructions if keep_instructions else "", ""))


def plan_anchor(adapter: Any, req: ExecutionRequest, messages: list[dict[str, str]],
                mem: Any, remind: Any, guide: GuidePlan | None, *, on: bool, context: str,
                segment: str, strength: float, keep_instructions: bool = False
                ) -> AnchorPlan | None:
    """A reminded turn's anchor (``anchor.py``), for memories that guidance would serve at
    depth 0 (``contrast.resolve``), where no guide runs (several memories: past their guided
    turns, no tenant instructions); None otherwise. ``segment``: the turn's injected system
    turn (the anchor's prefix: it must be the same); ``strength``: the turn's
    (``turn_strength``)."""
    if not (on and (MANY_ANCHORED if mem.many else ONE_ANCHORED_DEEP)) or guide is not None:
        return None
    if not remind.reminds_last(messages) or (mem.many and req.instructions):
        return None  # (several memories and tenant instructions: as for their guide)
    if strength <= 0.0:
        return None
    system = [m for m in messages if m["role"] == "system"]
    alone = [*system, dict(req.messages[-1])]
    if mem.many:  # the same segment, the message with its reminder against without
        return _anchor_many(adapter, strength, context, segment, [*system, messages[-1]], alone)
    parts = adapter.split_prompt(context, alone)
    if parts.segment != segment:
        return None
    negative = unreminded(adapter, strength, req, alone, compose_context(
        req.instructions if keep_instructions else "", ""))
    return AnchorPlan(strength, tuple(adapter.renderer.encode(parts.prompt, first=False)),
                      negative)


def first_anchor(adapter: Any, guide: GuidePlan, messages: list[dict[str, str]], *,
                 context: str, segment: str) -> AnchorPlan | None:
    """A one-memory first turn that its model's profile leaves unguided, anchored
    (``anchor.first_turns``): its first token as ``guide`` (the turn's unreminded guide)
    would pick it, then its model's own tokens. The positive is the turn's own prompt after
    its segment, the negative the guide's input; None where the segment differs."""
    parts = adapter.split_prompt(context, messages)
    if parts.segment != segment:
        return None
    return AnchorPlan(guide.strength, tuple(adapter.renderer.encode(parts.prompt, first=False)),
                      guide)


def turn_strength(adapter: Any, req: ExecutionRequest, constraints: tuple[str, ...],
                  rules: Any = None) -> float:
    """The turn's guidance strength (``contrast.resolve``) over its memories' rules
    (``rules``: the turn's ``prompting.rules.TurnRules``; None: read from their texts), given
    its decoding ``constraints`` (by default, an instruction they keep is not guided);
    resolved once per turn for its guide and its anchor."""
    memories = rules.member if rules is not None else (
        [m.text for m in req.memories] or [req.preference_text])
    return resolve(adapter, req.contrast, memories, constraints)


def _anchor_many(adapter: Any, strength: float, context: str, segment: str,
                 reminded: list[dict[str, str]], alone: list[dict[str, str]]
                 ) -> AnchorPlan | None:
    """Several memories: the last message with its reminder (``reminded``) and without
    (``alone``), each after the turn's segment (the guide's head ``"segment"``)."""
    pos, neg = (adapter.split_prompt(context, m) for m in (reminded, alone))
    if pos.segment != segment or neg.segment != segment or pos.prompt == neg.prompt:
        return None
    encode = adapter.renderer.encode
    return AnchorPlan(strength, tuple(encode(pos.prompt, first=False)),
                      GuidePlan(strength, "segment", tuple(encode(neg.prompt, first=False))))


def unreminded(adapter: Any, strength: float, req: ExecutionRequest,
                messages: list[dict[str, str]], context: str) -> GuidePlan:
    """One memory: the same messages after ``context`` ('' : nothing injected)."""
    encode = adapter.renderer.encode
    if context:
        parts = adapter.split_prompt(context, messages)
        split = segment_split(adapter, parts.segment, context, req.instructions) if (
            parts.segment) else None
        if split is not None:  # the tenant's shared segment, then the rest of the turn
            return GuidePlan(strength, "tenant", tuple(encode(parts.prompt, first=False)),
                             parts.segment, split)
    prompt = adapter.plain_prompt(context, messages)
    head = _head(adapter.renderer, prompt) if not context else ""
    if head:  # the template's own system turn, cached once per tenant
        return GuidePlan(strength, "shared", tuple(encode(prompt[len(head):], first=False)),
                         head, head_ids=tuple(encode(head, first=True)))
    return GuidePlan(strength, "none", tuple(encode(prompt, first=True)))


def _reminded(adapter: Any, strength: float, context: str,
              messages: list[dict[str, str]], prompt_ids: list[int],
              done: int) -> GuidePlan | None:
    """The same turn without its last reminder (``messages``), after the row's own prefix
    (the chain and the conversation's cached link, ``done`` tokens of ``prompt_ids``)."""
    parts = adapter.split_prompt(context, messages)
    ids = adapter.renderer.encode(parts.prompt, first=False)
    if ids[:done] != prompt_ids[:done] or ids == prompt_ids:
        return None
    return GuidePlan(strength, "row", tuple(ids))


def build_guide(plan: GuidePlan | None, chain: Any, tenant: str, prefix: Any,
                lead: tuple[int, ...], done: int) -> Guide | None:
    """The planned guide with its K/V head: the row's own ``prefix`` (``lead``: a deferred
    segment's ids, prefilled first; ``done``: prompt tokens its cached link holds), the
    tenant's shared segment, the template's system turn (both cached per tenant), or none."""
    if plan is None:
        return None
    if plan.head == "row":
        return Guide(plan.strength, prefix, [*lead, *plan.ids[done:]])
    if plan.head == "tenant":
        head = chain.get(tenant, None, plan.segment, plan.split, 1.0)
        return Guide(plan.strength, head.kv, list(plan.ids))
    if plan.head == "shared":
        kv, _ = chain.shared(tenant, plan.segment, list(plan.head_ids))
        return Guide(plan.strength, kv, list(plan.ids))
    return Guide(plan.strength, None, list(plan.ids))


def guide_figures(guide: Guide | None, out: Any,
                  anchored: tuple[float, int, int] | None = None) -> dict[str, Any]:
    """The result's guidance figures: the strength applied and the guide row's tokens as
    the engine ran them (``out``: the ``GenerationOutput``; 0 where no guide row ran);
    ``anchored``: an anchor's strength and prefilled tokens (``anchor.py``), or a member's
    lean's and the tokens its probe prefilled and decoded for this turn (``probe.py``; 0 and
    0 once cached), counted as the guide's."""
    strength, prefilled, decoded = anchored or (guide.strength if guide else 0.0, 0, 0)
    return {"contrast_effective": strength,
            "guide_prefill_tokens": int(getattr(out, "guide_prefill_tokens", 0)) + prefilled,
            "guide_decode_tokens": int(getattr(out, "guide_decode_tokens", 0)) + decoded}


def _head(renderer: Any, prompt: str) -> str:
    """What ``prompt`` (a conversation without a system message) has before its messages'
    text: the template's default system turn and the first turn's header; '' where it
    cannot be cut token-exactly (the guide is then prefilled whole)."""
    probe = getattr(renderer, "_guide_probe", None)
    if probe is None:
        probe = renderer._guide_probe = renderer.render([{"role": "user", "content": "\x1f"}])
    head = os.path.commonprefix([prompt, probe])
    return head if head and renderer.reproduces(head, prompt[len(head):], prompt) else ""
