"""A member's memories laid out in the system turn: the cached segment, then the recalled.

The member part of the system turn is rendered from the member's memories (their
``preference_text`` is then ignored):

* one memory renders exactly as the preference string did (its stripped text), so a
  member with a single memory gets the same tokens, cache entries and replies as before;
* several render one per line, ``"- text"`` (inner whitespace folded to single spaces).

Pinned memories always go in the member's cached segment, then the others in order
while the segment's token budget allows (the first memory goes in even when it alone
exceeds the budget: a member's segment is never empty). The rest are recall
candidates: the planner (``recall.py``) picks the most relevant to the latest user
message, and they are rendered after the segment's memories, still inside the system
turn, but *not cached*: :meth:`MemoryPlan.cut` ends the injected segment right after the
segment's memories and moves the recalled lines and the end of the turn to the start of
the prompt, which is prefilled with the conversation. The cut is verified token-exactly
(``encode(segment) + encode(prompt) == encode(whole)``); where it does not hold, the
recalled lines stay in the segment (cached by content: still exact, just not shared).

A member with candidates always gets the cut (also when nothing is recalled), so their
cached segment is one entry whatever is recalled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from injection.base import MemoryItem
from injection.prompting.emphasis_spans import find_spans
from injection.prompting.template import PromptParts, compose_context

__all__ = ["BULLET", "MemoryPlan", "render", "split_budget"]

BULLET = "- "
Spans = tuple[tuple[int, int], ...]


def _line(item: MemoryItem) -> str:
    return " ".join(item.text.split())


def render(items: Sequence[MemoryItem], *, many: bool) -> str:
    """The member text of ``items``: one memory as its text, several as ``- text`` lines."""
    if not items:
        return ""
    if not many:
        return items[0].text.strip()
    return "\n".join(BULLET + _line(m) for m in items)


def split_budget(memories: Sequence[MemoryItem], budget: int,
                 count: Callable[[str], int]) -> tuple[list[MemoryItem], list[MemoryItem]]:
    """``(segment, candidates)``: pinned memories, then the others in order while the
    rendered lines' token count stays within ``budget`` (the first always goes in)."""
    pinned = [m for m in memories if m.pinned]
    rest = [m for m in memories if not m.pinned]
    segment = list(pinned)
    used = sum(count(BULLET + _line(m)) + 1 for m in segment)
    taken = 0
    for m in rest:
        cost = count(BULLET + _line(m)) + 1  # + the newline
        if segment and used + cost > budget:
            break
        segment.append(m)
        used += cost
        taken += 1
    return segment, rest[taken:]


class MemoryPlan:
    """One request's member text: what is cached, what is recalled, what was used.

    ``text`` is the member part of the system turn (what ``preference_text`` was);
    without memories it is the request's ``preference_text`` and nothing else changes.
    """

    def __init__(self, preference_text: str, *, segment: Sequence[MemoryItem] = (),
                 candidates: Sequence[MemoryItem] = (), recalled: Sequence[MemoryItem] = (),
                 instructions: str = "") -> None:
        self.segment, self.candidates = tuple(segment), tuple(candidates)
        self.recalled, self.instructions = tuple(recalled), instructions
        many = len(self.segment) + len(self.candidates) > 1
        self.many = many
        self.segment_text = render(self.segment, many=many) if self.segment else preference_text
        self.recalled_text = ("\n" + render(self.recalled, many=True)) if self.recalled else ""
        self.text = self.segment_text + self.recalled_text
        self.tail_cut = False  # the recalled lines follow the cached segment (``cut``)

    @property
    def has_memories(self) -> bool:
        return bool(self.segment)

    def texts(self, items: Sequence[MemoryItem]) -> list[str]:
        """The rendered texts of ``items`` as they appear in the system turn."""
        return [(_line(m) if self.many else m.text.strip()) for m in items]

    def emphasis_texts(self) -> list[str] | None:
        """The member texts inside the injected segment, in rendered order (None: no
        memories, the emphasis falls back to the request's preference)."""
        if not self.has_memories:
            return None
        return self.texts(self.segment + (() if self.tail_cut else self.recalled))

    def used(self) -> list[dict[str, str]]:
        """``[{"id", "how"}]`` in rendered order (``ExecutionResult.extra``)."""
        return ([{"id": m.id, "how": "segment"} for m in self.segment]
                + [{"id": m.id, "how": "recalled"} for m in self.recalled])

    def extra(self) -> dict[str, Any]:
        return {"memories_used": self.used()} if self.has_memories else {}

    def cut(self, adapter: Any, parts: PromptParts | None,
            context: str) -> tuple[PromptParts | None, str]:
        """``(parts, head_context)``: the injected segment ended after the segment's
        memories (the recalled lines and the end of the turn open the prompt), verified
        token-exactly; unchanged (and ``context``) when there is nothing to cut or the
        cut does not reproduce the whole prompt's tokens."""
        renderer = getattr(adapter, "renderer", None)
        if not (self.candidates and parts is not None and parts.segment and renderer):
            return parts, context
        head_context = compose_context(self.instructions, self.segment_text)
        start = parts.segment.find(context)
        if start < 0 or not context.startswith(head_context):
            return parts, context
        pos = start + len(head_context)
        segment, prompt = parts.segment[:pos], parts.segment[pos:] + parts.prompt
        if not renderer.reproduces(segment, prompt, parts.segment + parts.prompt):
            return parts, context
        self.tail_cut = True
        return PromptParts(segment, prompt, parts.mode), head_context

    def recalled_spans(self, adapter: Any, prompt: str, head: int) -> Spans:
        """Absolute key spans of the recalled memories' tokens: they open ``prompt``, which
        follows the ``head`` injected tokens (empty unless the tail was cut)."""
        renderer = getattr(adapter, "renderer", None)
        if not (self.tail_cut and self.recalled and renderer is not None):
            return ()
        enc = renderer.tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"]) != renderer.encode(prompt, first=False):
            return ()
        found = find_spans(prompt, enc["offset_mapping"], self.texts(self.recalled))
        return tuple((head + lo, head + hi) for lo, hi in found)
