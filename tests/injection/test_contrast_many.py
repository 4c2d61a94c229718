"""Contrastive guidance for a member with several memories: their first turns carry the
memory reminder, and are guided against the same turn without it (same injected
memories, same history); the reply equals the formula's step-by-step reference."""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest

from injection import InjectionExecutor, TenantLRU
from injection.base import ExecutionRequest, MemoryItem
from injection.engine.batch import BatchEngine
from injection.engine.guidance import plan as guide_plan
from injection.metrics import Metrics
from injection.prompting.reminder import Reminder
from injection.prompting.template import compose_context
from tests.injection.test_contrast import (
    QUESTION,
    _executor,
    _history,
    _ids,
    client_text,
    reference,
)

MEMS = tuple(MemoryItem(str(i), t) for i, t in enumerate([
    "Reply in French.", "I am vegetarian and I never eat fish.", "My dog is called Biscuit.",
]))


def _reminded_pair(ex, req) -> tuple[list[int], list[int]]:
    """The row's ids (reminded turn) and the guide's (the same turn without its reminder)."""
    adapter = ex.adapter
    mem = ex.memories.plan(req)
    remind = Reminder.for_request(req, adapter.renderer, True,
                                  partial(ex.memories.relevant, req.tenant))
    msgs = remind.apply(list(req.messages))
    assert msgs[-1]["content"] != req.messages[-1]["content"]  # the turn is reminded
    context = compose_context(req.instructions, mem.text)
    return (_ids(adapter, context, msgs),
            _ids(adapter, context, [*msgs[:-1], dict(req.messages[-1])]))


@pytest.mark.parametrize("exchanges", [0, 1])
def test_an_early_turn_with_several_memories_is_guided_without_its_reminder(
        adapter, exchanges):
    ex = _executor(adapter)
    req = ExecutionRequest("t1", "u1", _history(exchanges), memories=MEMS, max_new_tokens=12,
                           contrast=1.0)
    try:
        res = ex.execute(req)
        with_ids, without_ids = _reminded_pair(ex, req)
    finally:
        ex.close()
    assert res.contrast_effective == 1.0
    want = reference(adapter, with_ids, without_ids, 12, 1.0)
    assert client_text(adapter, want) == res.text.strip()


def test_deeper_turns_and_strength_zero_are_not_guided(adapter):
    """Past the guided turns no guide row runs (the first token is anchored: anchor.py)."""
    ex = _executor(adapter)
    try:
        deep = ex.execute(ExecutionRequest("t1", "u1", _history(2), memories=MEMS,
                                           max_new_tokens=4, contrast=1.0))
        off = ex.execute(ExecutionRequest("t1", "u1", QUESTION, memories=MEMS,
                                          max_new_tokens=4, contrast=0.0))
    finally:
        ex.close()
    assert deep.guide_decode_tokens == 0 and deep.guide_prefill_tokens > 0
    assert deep.contrast_effective == 1.0  # anchored
    assert off.contrast_effective == 0.0 and off.guide_prefill_tokens == 0


def test_a_guided_turn_continuing_its_cached_conversation_shares_the_rows_prefix(
        adapter, monkeypatch):
    """Where a guided turn continues a cached conversation (guided deeper than the default
    here), the guide starts from the row's own prefix: the same reply as the reference."""
    monkeypatch.setattr(guide_plan, "MANY_GUIDED_BEFORE", 5)
    ex = InjectionExecutor(adapter, l1=TenantLRU(max_bytes=64 * 1024**2), l2=None,
                           metrics=Metrics(), engine=BatchEngine(adapter, max_batch=4),
                           conversation_max_bytes=64 * 1024**2)
    first = ExecutionRequest("t1", "u1", _history(1), memories=MEMS, max_new_tokens=6,
                             contrast=1.0, conversation_id="c1", reuse_conversation=True)
    try:
        out = ex.execute(first)
        history = [*_history(1), {"role": "assistant", "content": out.text},
                   {"role": "user", "content": "And for dessert?"}]
        req = dataclasses.replace(first, messages=history, max_new_tokens=12)
        res = ex.execute(req)
        with_ids, without_ids = _reminded_pair(ex, req)
    finally:
        ex.close()
    assert res.reused_tokens > 0 and res.contrast_effective == 1.0
    want = reference(adapter, with_ids, without_ids, 12, 1.0)
    assert client_text(adapter, want) == res.text.strip()
