"""The planner's half of contrastive guidance: which turns get a guide, and its input.

A turn is guided (``contrast.py``) when its effective strength is above 0, the member's
memories are injected, the batch engine runs it, and the turn carries no memory reminder
(``prompting/reminder.py``): measured on the memory-depth cases, contrasting a reply
against a conversation without the reminders' restated memories makes the model recite
them, while the reminder alone keeps deep turns in line (docs/BENCHMARKS.md, memory depth).
So the guide works on the first turns of a conversation and the reminder on the rest.

A member with several memories gets no guide: against a conversation without them, what
the memories add is above all their list, and the model recites it ("- My favourite film
is Casablanca.\n- I grow tomatoes ..."); contrasting only the memories relevant to the
message (the reminder's pick) against the others gained nothing either (measured, docs/
BENCHMARKS.md memory depth). Their reminders start with the first turn instead
(``reminder.MANY_AFTER``).

The guide's input is what the same request renders without the member's memories: the
tenant's instructions (their shared cached segment where they have one) and the same
messages; its prefill is short where it is used (no deep history to repeat).
"""

from __future__ import annotations

import os
from typing import Any

from injection.base import ExecutionRequest
from injection.engine.guidance.contrast import Guide, resolve
from injection.prompting.template import compose_context

__all__ = ["plan_guide"]


def plan_guide(adapter: Any, chain: Any, req: ExecutionRequest,
               messages: list[dict[str, str]], mem: Any, remind: Any, *,
               on: bool) -> Guide | None:
    """The turn's guide, or None (off, nothing personal injected, several memories, or a
    reminded turn)."""
    if not on or mem.many or remind.reminds_last(messages):
        return None
    strength = resolve(adapter, req.contrast)
    if strength <= 0.0:
        return None
    context = compose_context(req.instructions, "")
    if context:
        parts = adapter.split_prompt(context, messages)
        split = chain.split(parts.segment, context, req.instructions) if parts.segment else None
        if split is not None:  # the tenant's shared segment, then the rest of the turn
            head = chain.get(req.tenant, None, parts.segment, split, 1.0)
            return Guide(strength, head.kv, adapter.renderer.encode(parts.prompt, first=False))
    prompt = adapter.plain_prompt(context, messages)
    head = _head(adapter.renderer, prompt) if not context else ""
    if head:  # the template's own system turn, cached once per tenant
        kv, _ = chain.shared(req.tenant, head, adapter.renderer.encode(head, first=True))
        return Guide(strength, kv, adapter.renderer.encode(prompt[len(head):], first=False))
    return Guide(strength, None, adapter.renderer.encode(prompt, first=True))


def _head(renderer: Any, prompt: str) -> str:
    """What ``prompt`` (a conversation without a system message) has before its messages'
    text: the template's default system turn and the first turn's header; '' where it
    cannot be cut token-exactly (the guide is then prefilled whole)."""
    probe = getattr(renderer, "_guide_probe", None)
    if probe is None:
        probe = renderer._guide_probe = renderer.render([{"role": "user", "content": "\x1f"}])
    head = os.path.commonprefix([prompt, probe])
    return head if head and renderer.reproduces(head, prompt[len(head):], prompt) else ""
