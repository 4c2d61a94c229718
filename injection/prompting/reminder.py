"""Memory reminders: the member's memories re-stated just before a user turn, deep in a chat.

A preference stated once in the system turn fades as unrelated exchanges pile up after it
(issue 22, section 3). Once a conversation is ``after`` exchanges deep, every user turn
from then on opens with a short reminder of the member's memories, ``"(<memories>)\n\n"``
before the user's text (measured ahead of a mid-conversation system message
``"Remember: <memories>"``, which ``ROLE = "system"`` selects where the template renders it).

A member with several memories is reminded of their standing instructions (``standing``:
"Reply in French.") and of the ``RELEVANT_TOP`` others most similar to that turn's own user
message (the planner's embedding, ``memory/recall.py``), not of the first memories that fit:
measured with 20 memories, the relevant one drowned among the others.

A member whose memories overflow their cached segment: the reminder's own pick draws
from all their memories, so it re-states those past the segment too; where the reminder
is off, each message opens with the candidates recalled for it (``memory/recall.py``,
``recall``) alone. Never in the system turn, where a change in what is recalled would
re-prefill the whole history after it. (Measured with 20 memories over a 64-token
segment: recall's top 3 added to the reminder's pick gained nothing, +1/-2 tuning and
-3/-1 validation: bench_quality, "recall-placement".)

The reminders are a pure function of the messages, so they stay in the rendered history
once placed: turn k renders the same reminders before turns 1..k-1 as turn k-1 did, so
the conversation's cached K/V (``kvcache/conversation.py``) stays a prefix of the next
turn and only the new turn's reminder is prefilled. Without memories nothing is added:
the messages are returned unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from injection.prompting.intent import requests

__all__ = ["DEFAULT_AFTER", "DEFAULT_ON", "RELEVANT_TOP", "REMINDER_TOKENS", "Reminder",
           "reminder_text", "standing", "turns_before", "with_reminders"]

Message = dict[str, str]

# measured defaults (docs/BENCHMARKS.md, memory depth); ``DEFAULT_ON`` is the platform-wide
# one, where neither the request, the tenant nor the loaded model's profile says
# (``model/profiles.default_on``)
DEFAULT_ON = True
DEFAULT_AFTER = 2  # exchanges before the first reminder
REMINDER_TOKENS = 64  # most tokens of memory text a reminder re-states
# a member with several memories: each reminder re-states their standing instructions
# ("Reply in French.", ``standing``) and the (at most) this many others most relevant to
# its own user message (0: the first memories, whatever is asked)
RELEVANT_TOP = 2
# ... and their first reminder comes after this many exchanges (None: DEFAULT_AFTER):
# measured with 20 memories, a reminder of the relevant ones from the first turn on
MANY_AFTER: int | None = 0
PREFIX = "Remember: "  # of the system-message form
ROLE: str | None = "user"  # "user" | "system" (None: "system" where the template renders it)


def reminder_text(memories: Sequence[str], count: Callable[[str], int] | None = None,
                  budget: int = REMINDER_TOKENS) -> str:
    """``"m1 m2 ..."``: whole memories in order while ``budget`` tokens allow; the first
    always, cut to ``budget`` tokens at a word when it is longer (a reminder is re-stated
    in every user turn of the history: its size bounds how much history fits); '' when
    there are none."""
    texts = [m.strip() for m in memories if m and m.strip()]
    if not texts:
        return ""
    first = _cut(texts[0], count, budget)
    kept, used = [first], count(first) if count else 0
    if first != texts[0]:
        return first
    for text in texts[1:]:
        n = count(text) if count else 0
        if used + n > budget:
            break
        kept.append(text)
        used += n
    return " ".join(kept)


def _cut(text: str, count: Callable[[str], int] | None, budget: int) -> str:
    """``text``, or its longest run of whole words within ``budget`` tokens followed by
    "…" (binary search: a few counts)."""
    words = text.split()
    if count is None or len(words) < 2 or count(text) <= budget:
        return text
    lo, hi = 1, len(words) - 1  # the first word always; never all of them
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count(" ".join(words[:mid]) + "…") <= budget else (lo, mid - 1)
    return " ".join(words[:lo]) + "…"


def with_reminders(messages: Sequence[Message], text: str | Callable[[str], str], *,
                   after: int = DEFAULT_AFTER, role: str = "user") -> list[Message]:
    """``messages`` with ``text`` (or ``text(user message)``) before every user message
    that has at least ``after`` user messages before it; ``role`` "user": prepended to
    that user message instead."""
    of = text if callable(text) else (lambda _content: text)
    out: list[Message] = []
    seen = 0
    for msg in messages:
        msg = dict(msg)
        if msg["role"] == "user":
            here = of(str(msg["content"])) if seen >= after else ""
            if here and role == "system":
                out.append({"role": "system", "content": PREFIX + here})
            elif here:
                msg["content"] = f"({here})\n\n{msg['content']}"
            seen += 1
        out.append(msg)
    return out


class Reminder:
    """What a request's reminders are: the text, where they start, and how they render.

    ``apply(messages)`` is the identity when the reminder is off or there is no text.
    """

    def __init__(self, text: str = "", *, after: int = DEFAULT_AFTER, role: str = "user",
                 pick: Callable[[str], list[str]] | None = None,
                 count: Callable[[str], int] | None = None) -> None:
        self.text, self.after, self.role = text, int(after), role
        self.pick, self.count = pick, count  # ``pick``: the memories relevant to a message
        self._texts: dict[str, str] = {}  # per message: fitting the history renders often

    def text_for(self, content: str) -> str:
        """The reminder before the user message ``content``."""
        if self.pick is None:
            return self.text
        if content not in self._texts:
            self._texts[content] = reminder_text(self.pick(content), self.count)
        return self._texts[content]

    def next_text(self, messages: Sequence[Message]) -> str:
        """The reminder before the user message that will follow ``messages`` (and a
        reply) where it does not depend on that message; '' where there is none, or it is
        picked per message."""
        if not self.text or self.pick is not None:
            return ""
        return self.text if user_turns(messages) >= self.after else ""

    def reminds_last(self, messages: Sequence[Message]) -> bool:
        """Whether the last user message of ``messages`` (as sent) gets a reminder."""
        return bool(self.text) and turns_before(messages) >= self.after and bool(
            self.text_for(str(messages[-1]["content"])))

    def shown(self, messages: Sequence[Message], texts: Sequence[str]) -> list[int]:
        """Indices of ``texts`` (memories) re-stated before the last user message."""
        last = self.text_for(str(messages[-1]["content"])) if self.reminds_last(messages) else ""
        return [i for i, t in enumerate(texts) if t.strip() and t.strip() in last]

    def apply(self, messages: Sequence[Message], *, deep: bool = False) -> list[Message]:
        """``messages`` reminded; ``deep``: as if each user message had ``after`` others
        before it (how a turn renders deep in a conversation: its size for the history's
        block cut, which must not change as the turn ages)."""
        if not self.text:
            return [dict(m) for m in messages]
        return with_reminders(messages, self.text if self.pick is None else self.text_for,
                              after=0 if deep else self.after, role=self.role)

    @classmethod
    def for_request(cls, req: Any, renderer: Any, personal: bool,
                    relevant: Callable[[list[str], str, int], list[str]] | None = None,
                    recall: Callable[[str], list[str]] | None = None,
                    standing_ones: Sequence[bool] | None = None,
                    default: bool | None = None) -> Reminder:
        """The request's reminder: off unless the memory is applied and the request (or
        the default) asks for it. ``relevant(memories, message, top)``: with several
        memories, each reminder re-states those most relevant to its message.
        ``recall(message)``: the candidates beyond the cached segment recalled for a
        message, re-stated before it where the reminder is off (on, its own pick
        covers them). ``standing_ones``: which memories are standing instructions (their
        stored rules: ``rules.py``; None: read from their texts). ``default``: on or off
        where the request does not say (the model's profile: ``model/profiles.default_on``;
        None: ``DEFAULT_ON``)."""
        on = getattr(req, "reminder", None)
        on = (DEFAULT_ON if default is None else default) if on is None else bool(on)
        if not personal or not (on or recall):
            return cls()
        memories = [m.text for m in getattr(req, "memories", ())] or [req.preference_text]
        count, role = _counter(renderer), ROLE or _role(renderer)
        if not on:  # recall alone: each user message opens with what it recalls
            return cls(reminder_text(memories, count), after=0, role=role, pick=recall,
                       count=count)
        pick, after = None, DEFAULT_AFTER
        if len(memories) > 1 and MANY_AFTER is not None:
            after = MANY_AFTER
        if relevant is not None and RELEVANT_TOP > 0 and len(memories) > 1:
            flags = list(standing_ones) if standing_ones is not None else [
                standing(m) for m in memories]
            rest = [m for m, flag in zip(memories, flags, strict=True) if not flag]

            def pick(content: str) -> list[str]:  # once per message (``text_for``)
                chosen = set(relevant(rest, content, RELEVANT_TOP) if rest else ())
                return [m for m, flag in zip(memories, flags, strict=True)
                        if flag or m in chosen]
        return cls(reminder_text(memories, count), after=after, role=role, pick=pick,
                   count=count)


def user_turns(messages: Sequence[Message]) -> int:
    """How many user messages ``messages`` holds."""
    return sum(m["role"] == "user" for m in messages)


def turns_before(messages: Sequence[Message]) -> int:
    """How many user turns come before the last message (the exchanges a reminder and
    the several-memory guide count)."""
    return user_turns(messages[:-1])


def standing(text: str) -> bool:
    """Whether a memory is a standing instruction on how to answer: a request to the
    assistant about its replies (``intent.py``), not a complaint, someone else's habit, a
    past one, something hypothetical or a rule for some messages only."""
    return bool(requests(text))


def _counter(renderer: Any) -> Callable[[str], int] | None:
    tok = getattr(renderer, "tokenizer", None)
    if tok is None:
        return None
    return lambda text: len(tok(text, add_special_tokens=False)["input_ids"])


def _role(renderer: Any) -> str:
    """"system" when the template renders a system message mid-conversation, else "user"."""
    if renderer is None:
        return "system"
    role = getattr(renderer, "_reminder_role", None)
    if role is None:
        probe = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                 {"role": "system", "content": "\x1fprobe\x1f"}, {"role": "user", "content": "c"}]
        try:
            role = "system" if "\x1fprobe\x1f" in renderer.render(probe) else "user"
        except Exception:  # noqa: BLE001 - jinja TemplateError, ValueError, ...
            role = "user"
        renderer._reminder_role = role
    return role
