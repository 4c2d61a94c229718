"""A member's memories laid out: the cached segment in the system turn, the rest recalled.

The member part of the system turn is rendered from the member's memories (their
``preference_text`` is then ignored):

* one memory renders exactly as the preference string did (its stripped text), so a
  member with a single memory gets the same tokens, cache entries and replies as before;
* several render one per line, ``"- text"`` (inner whitespace folded to single spaces).

Pinned memories always go in the member's cached segment, then the others in order
while the segment's token budget allows (the first memory goes in even when it alone
exceeds the budget: a member's segment is never empty). The rest are recall
candidates: the planner (``recall.py``) picks those most relevant to each user message
and they are re-stated before that message, with the memory reminder
(``prompting/reminder.py``, ``recall``), not in the system turn. A pick is a pure
function of the message, so it stays the same in every later turn's history: the
system turn is one cached segment whatever is recalled, and the conversation's cached
K/V stays a prefix of the next turn when the next message recalls other memories.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from injection.base import MemoryItem

__all__ = ["BULLET", "MemoryPlan", "render", "split_budget"]

BULLET = "- "


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
    """One request's member text: what is cached, what may be recalled, what was used.

    ``text`` is the member part of the system turn (what ``preference_text`` was);
    without memories it is the request's ``preference_text`` and nothing else changes.
    ``recalled``: the candidates recalled for the latest message (``memories_used``);
    ``recall(message)``: the candidates' texts recalled for any user message (None: no
    candidates, or recall is off), re-stated before it (``prompting/reminder.py``).
    """

    def __init__(self, preference_text: str, *, segment: Sequence[MemoryItem] = (),
                 candidates: Sequence[MemoryItem] = (), recalled: Sequence[MemoryItem] = (),
                 recall: Callable[[str], list[str]] | None = None) -> None:
        self.segment, self.candidates = tuple(segment), tuple(candidates)
        self.recalled, self.recall = tuple(recalled), recall
        self.many = len(self.segment) + len(self.candidates) > 1
        self.text = render(self.segment, many=self.many) if self.segment else preference_text

    @property
    def has_memories(self) -> bool:
        return bool(self.segment)

    def used(self) -> list[dict[str, str]]:
        """``[{"id", "how"}]`` in rendered order (``ExecutionResult.extra``)."""
        return ([{"id": m.id, "how": "segment"} for m in self.segment]
                + [{"id": m.id, "how": "recalled"} for m in self.recalled])

    def extra(self) -> dict[str, Any]:
        return {"memories_used": self.used()} if self.has_memories else {}
