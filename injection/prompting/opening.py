"""The next turn's opening: what a chat's next prompt holds between this turn's prompt and
the member's next message, known as soon as the reply is.

A chat's next turn starts with this turn's reply (the client sends it back), the
template's end of the assistant turn and the next user header, and, for a member whose
reminder does not depend on the message (one memory, past the reminder's depth), the
reminder ``"(<memory>)\\n\\n"``. None of it depends on the next message, so the engine
prefills it onto the conversation's link while the member reads the reply
(``engine/turns.py``), and the next turn prefills only the message. The K/V is what that
turn would compute itself: the same tokens after the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from injection.prompting.reminder import with_reminders

__all__ = ["PROBE", "next_opening"]

Message = dict[str, str]
PROBE = "\x1fnext message\x1f"  # stands in for the message nobody has written yet


def next_opening(plain: Callable[[str, list[Message]], str], context: str,
                 messages: list[Message], reply: str, remind: Any) -> str | None:
    """The text after ``plain(context, messages)`` and before the next user message, once
    ``reply`` comes back (``messages`` as rendered: history fitted, reminders placed);
    None where the template does not render the next turn as a continuation of this one.
    """
    before = plain(context, messages)
    text = remind.next_text(messages) if remind is not None else ""
    ask = [{"role": "user", "content": PROBE}]
    nxt = [*messages, {"role": "assistant", "content": reply},
           *(with_reminders(ask, text, after=0, role=remind.role) if text else ask)]
    after = plain(context, nxt)
    if not after.startswith(before) or after.count(PROBE) != 1:
        return None
    return after[len(before):after.index(PROBE)]
