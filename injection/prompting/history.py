"""Fitting a conversation's history into the model's context, in whole turns.

The budget comes from the model: its positions minus ``max_new_tokens`` minus what
the rendered prompt (injected system turn included) takes; an optional cap bounds
the history's own tokens (prefill cost). History is dropped oldest turn first, a
turn being a user message and the replies that follow it, so the kept history never
starts with an assistant message (strict-alternation templates raise on that).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from injection.errors import ContextLengthExceeded

__all__ = ["fit_history", "whole_turns"]

Message = dict[str, str]


def whole_turns(history: Sequence[Message]) -> list[list[Message]]:
    """Group oldest-first messages into turns; leading non-user messages are dropped."""
    turns: list[list[Message]] = []
    for msg in history:
        if msg["role"] == "user":
            turns.append([msg])
        elif turns:
            turns[-1].append(msg)
    return turns


def fit_history(
    count: Callable[[list[Message]], int],
    history: Sequence[Message],
    tail: Sequence[Message],
    *,
    limit: int | None,
    history_cap: int | None = None,
    head: Sequence[Message] = (),
) -> list[Message]:
    """``head`` + the most recent whole turns of ``history`` + ``tail`` that fit.

    ``count(messages)`` is the token count of the rendered prompt; ``limit`` the most
    it may be (None: unbounded). Raises ContextLengthExceeded if ``tail`` alone does
    not fit. Binary search: O(log turns) renders.
    """
    head, tail = list(head), list(tail)
    base = count(head + tail)
    if limit is not None and base > limit:
        raise ContextLengthExceeded(
            f"the message needs {base} tokens of context; the model allows {limit} "
            f"with the requested max_new_tokens"
        )
    turns = whole_turns(history)

    def fits(k: int) -> bool:
        if k == 0:
            return True
        n = count(head + _flatten(turns[-k:]) + tail)
        return (limit is None or n <= limit) and (history_cap is None or n - base <= history_cap)

    lo, hi = 0, len(turns)  # fits(lo) is always true; find the largest k that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return head + (_flatten(turns[-lo:]) if lo else []) + tail


def _flatten(turns: list[list[Message]]) -> list[Message]:
    return [m for turn in turns for m in turn]
