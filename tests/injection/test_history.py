"""History that fits: whole turns, never opening with an assistant message, budget from the model."""

from __future__ import annotations

import pytest

from injection.base import ExecutionRequest
from injection.engine.executor import InjectionExecutor
from injection.errors import ContextLengthExceeded
from injection.kvcache.lru import TenantLRU
from injection.metrics import Metrics
from injection.prompting.history import fit_history, whole_turns


def msg(role: str, text: str) -> dict[str, str]:
    return {"role": role, "content": text}


def words(messages) -> int:
    """A stand-in token count: words of the conversation plus 2 per message."""
    return sum(len(m["content"].split()) + 2 for m in messages)


HISTORY = [msg("assistant", "orphan reply"),
           msg("user", "one two"), msg("assistant", "three four five"),
           msg("user", "six"), msg("assistant", "seven eight"),
           msg("user", "nine ten eleven"), msg("assistant", "twelve")]
TAIL = [msg("user", "new question here")]


def test_whole_turns_drop_a_leading_assistant_message():
    turns = whole_turns(HISTORY)
    assert [t[0]["role"] for t in turns] == ["user"] * 3
    assert [len(t) for t in turns] == [2, 2, 2]


@pytest.mark.parametrize("limit", range(5, 40))
def test_fit_keeps_the_most_recent_whole_turns_that_fit(limit):
    if words(TAIL) > limit:
        with pytest.raises(ContextLengthExceeded):
            fit_history(words, HISTORY, TAIL, limit=limit)
        return
    kept = fit_history(words, HISTORY, TAIL, limit=limit)
    assert kept[-1] == TAIL[0] and words(kept) <= limit
    history = kept[:-1]
    assert not history or history[0]["role"] == "user"
    assert history == HISTORY[len(HISTORY) - len(history):]  # a suffix: newest kept
    assert len(history) % 2 == 0  # whole turns only
    turns = whole_turns(HISTORY)
    if len(history) < 6:  # one more turn would not have fitted
        more = turns[-(len(history) // 2 + 1):]
        assert words([m for t in more for m in t] + TAIL) > limit


def test_over_the_cap_history_is_dropped_in_blocks_so_its_start_is_stable():
    """A growing conversation past its cap: the kept history always fits, and its first
    message changes only when another half-cap of tokens has been added (not every
    turn), so the cached prefix of the history is reused across turns."""
    cap, history, starts, changes = 100, [], [], 0
    for turn in range(40):
        tail = [msg("user", f"question {turn} " + "word " * 6)]
        kept = fit_history(words, history, tail, limit=None, history_cap=cap)
        assert words(kept) - words(tail) <= cap
        first = kept[0] if len(kept) > 1 else None
        if starts and first is not starts[-1]:
            changes += 1
            if starts[-1] is not None:  # a block went: more than one turn at once
                assert history.index(first) - history.index(starts[-1]) >= 4
        starts.append(first)
        history += [*tail, msg("assistant", f"answer {turn} " + "word " * 8)]
    total = words(history)  # ~26 tokens a turn: a per-turn slide would change ~35 times
    assert 0 < changes <= total // (cap // 2) < 35
    assert words(kept) - words(tail) > cap // 2 - 30  # not more than a block dropped


def test_history_cap_bounds_the_history_tokens_alone():
    kept = fit_history(words, HISTORY, TAIL, limit=None, history_cap=8)
    assert kept == [*HISTORY[-2:], *TAIL]  # the newest turn costs 8, two turns cost 13
    assert fit_history(words, HISTORY, TAIL, limit=None, history_cap=0) == TAIL
    head = [msg("system", "be brief")]
    assert fit_history(words, HISTORY, TAIL, limit=None, head=head)[:2] == [head[0], HISTORY[1]]


def test_executor_trims_history_to_the_models_positions(adapter):
    ex = InjectionExecutor(adapter, l1=TenantLRU(max_bytes=64 * 1024**2), l2=None,
                           metrics=Metrics())
    long = " ".join(["vegetables and rice"] * 60)  # a few hundred tokens per message
    history = [m for i in range(12) for m in (msg("user", f"{i} {long}"), msg("assistant", long))]
    req = ExecutionRequest("t", "u", [*history, msg("user", "And now?")], "I like tea.",
                           max_new_tokens=64)
    res = ex.execute(req)
    assert 0 < res.history_messages < len(history) and res.history_messages % 2 == 0
    assert res.prompt_tokens + res.kv_tokens + 64 <= adapter.max_positions
    # a message that cannot fit even alone is a client error before any generation
    too_long = ExecutionRequest("t", "u", [msg("user", long * 12)], "I like tea.",
                                max_new_tokens=64)
    with pytest.raises(ContextLengthExceeded):
        ex.execute(too_long)


def test_with_nothing_before_the_turns_the_cut_is_the_same_block_cut(adapter):
    """No instructions, no memories, no system message: the template refuses to render
    the empty conversation each turn's size is measured against (it raised before), so
    that count comes from a turn rendered twice; the cut is the one a context gets."""
    history = [m for i in range(30) for m in (
        msg("user", f"question {i} about rice and tea"),
        msg("assistant", f"answer {i} " + "word " * (i % 7)))]
    tail = [msg("user", "And now?")]
    limit = adapter.max_positions - 8

    def bare(msgs):
        return adapter.prompt_tokens("", msgs)

    def with_context(msgs):
        return adapter.prompt_tokens("Be brief.", msgs)

    with pytest.raises(ValueError):
        bare([])  # the premise: what the measure falls back from
    kept = fit_history(bare, history, tail, limit=limit, history_cap=120)
    assert kept[0]["role"] == "user" and kept[-1] == tail[0]
    assert kept[:-1] == history[len(history) - len(kept) + 1:]  # newest whole turns
    assert 60 - 40 < bare(kept) - bare(tail) <= 120  # within the cap, one block at most
    assert kept == fit_history(with_context, history, tail, limit=limit, history_cap=120)
