"""Fitting a conversation's history into the model's context, in whole turns.

The budget comes from the model: its positions minus ``max_new_tokens`` minus what
the rendered prompt (injected system turn included) takes; an optional cap bounds
the history's own tokens (prefill cost). History is dropped oldest turn first, a
turn being a user message and the replies that follow it, so the kept history never
starts with an assistant message (strict-alternation templates raise on that).

One rule for every layer: the engine counts the rendered prompt (``InjectionExecutor``);
the web's budget estimate and the worker's pre-cut of a stored conversation call the
same :func:`fit_history` with a count of stored tokens plus markup (``tenants.history``),
so all three keep the same messages wherever their counts agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from injection.errors import ContextLengthExceeded

__all__ = ["fit_history", "whole_turns"]

Message = dict[str, Any]  # "role", and whatever the caller's count reads ("content")


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
    size_count: Callable[[list[Message]], int] | None = None,
) -> list[Message]:
    """``head`` + the most recent whole turns of ``history`` + ``tail`` that fit.

    ``count(messages)`` is the token count of the rendered prompt; ``limit`` the most
    it may be (None: unbounded). Raises ContextLengthExceeded if ``tail`` alone does
    not fit. Binary search: O(log turns) renders. ``size_count``: the count that sizes
    one turn for the block cut, as it renders deep in the conversation (default
    ``count``; the executor's adds the memory reminder every deep turn carries).
    """
    head, tail = list(head), list(tail)
    base = count(head + tail)
    if limit is not None and base > limit:
        raise ContextLengthExceeded(
            f"the message needs {base} tokens of context; the model allows {limit} "
            f"with the requested max_new_tokens"
        )
    turns = whole_turns(history)
    if turns and history_cap:
        kept = _block_trim(count, size_count or count, head, turns, tail, base,
                           history_cap, limit)
        if kept is not None:
            return head + _flatten(turns[len(turns) - kept:]) + tail

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


def block_start(sizes: Sequence[int], cap: int) -> int:
    """Index of the first of ``sizes`` (oldest first) to keep so the kept ones fit ``cap``,
    dropping the oldest in blocks of ``cap // 2``: the cut moves only when the total passes
    another half of the cap, so the kept prefix (and its cached K/V) stays the same for
    many turns instead of sliding every turn."""
    total = sum(sizes)
    if total <= cap:
        return 0
    step = max(1, cap // 2)
    target = -(-(total - cap) // step) * step  # ceil to the next block
    dropped = 0
    for i, size in enumerate(sizes):
        if dropped >= target:
            return i
        dropped += size
    return len(sizes)


def _block_trim(count: Callable[[list[Message]], int],
                size_count: Callable[[list[Message]], int], head: list[Message],
                turns: list[list[Message]], tail: list[Message], base: int, cap: int,
                limit: int | None) -> int | None:
    """How many newest turns to keep under ``cap`` by :func:`block_start` (None: the
    block cut does not fit the context; the caller then keeps the most that fit)."""
    full = count(head + _flatten(turns) + tail)
    if full - base <= cap and (limit is None or full <= limit):
        return len(turns)
    # each turn's size depends on that turn alone (not on the new message or the
    # window), so the same turns give the same cut on every request
    alone = _alone(size_count, head, turns[-1])
    start = block_start([size_count(head + turn) - alone for turn in turns], cap)
    kept = len(turns) - start
    n = count(head + _flatten(turns[start:]) + tail) if kept else base
    if n - base <= cap and (limit is None or n <= limit):
        return kept
    return None


def _alone(size_count: Callable[[list[Message]], int], head: list[Message],
           probe: list[Message]) -> int:
    """``size_count(head)``: what every measured turn's count holds besides the turn.

    With no head and nothing else to render (no context), a chat template refuses the
    empty conversation (transformers raises ValueError); its count is then what a turn
    rendered twice shows: ``2 * size_count(probe) - size_count(probe + probe)``.
    """
    try:
        return size_count(head)
    except ValueError:
        if head:
            raise
        return 2 * size_count(probe) - size_count(probe + probe)


def _flatten(turns: list[list[Message]]) -> list[Message]:
    return [m for turn in turns for m in turn]
