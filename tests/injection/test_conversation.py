"""Conversation K/V reuse through the executor + batch engine (demo model, real L1)."""

from __future__ import annotations

import pytest

from injection import build_executor
from injection.base import ExecutionRequest, Tier
from injection.metrics import Metrics

QUESTIONS = ["What should I cook tonight?", "And for dessert?", "Which drink goes with it?",
             "How long will it all take?"]


@pytest.fixture
def reusing(adapter):
    ex = build_executor(adapter, batch_max=4, metrics=Metrics())
    yield ex
    ex.close()


@pytest.fixture
def plain(adapter):
    return build_executor(adapter, metrics=Metrics())  # no engine: full prefill every turn


def _talk(ex, questions, *, tenant="t1", user="u1", pref="I am vegetarian.", **kw):
    history, results = [], []
    for q in questions:
        msgs = [*history, {"role": "user", "content": q}]
        res = ex.execute(ExecutionRequest(tenant, user, msgs, pref, max_new_tokens=12, **kw))
        results.append(res)
        history += [{"role": "user", "content": q}, {"role": "assistant", "content": res.text}]
    return results


def test_each_turn_continues_the_last_ones_kv_and_answers_the_same(reusing, plain):
    got, want = _talk(reusing, QUESTIONS), _talk(plain, QUESTIONS)
    assert [r.text for r in got] == [r.text for r in want]
    assert got[0].reused_tokens == 0 and got[0].tier is Tier.COMPUTE
    # admission: the first turn leaves a ghost, the second (the conversation goes on) is
    # stored, every later one continues it
    assert got[1].reused_tokens == 0 and got[1].cached_tokens == got[1].kv_tokens
    for prev, turn in zip(got[1:], got[2:], strict=False):
        # everything up to the last reply is reused: more each turn
        assert turn.tier is Tier.L1 and turn.reused_tokens > prev.reused_tokens
        assert turn.cached_tokens == turn.kv_tokens + turn.reused_tokens < turn.prompt_tokens
    counters = reusing.metrics.snapshot()["counters"]
    assert counters["conv_hits"] == len(QUESTIONS) - 2
    # the first turn looks nothing up (no link is ever kept for a turn without history);
    # the second misses
    assert counters["conv_misses"] == 1 and counters["conversation_l1_misses"] == 1
    reusing.l1.check_integrity()


def test_conversation_entries_are_byte_accounted_per_member_and_evicted_with_them(reusing):
    _talk(reusing, QUESTIONS[:2])
    conv = reusing.conv_l1
    assert conv is not reusing.l1  # conversations have their own budget
    assert conv.stats()["per_tenant"]["t1"]["bytes"] > 0 and len(conv) == 1
    assert len(reusing.l1) == 1  # the member's segment
    assert reusing.invalidate("t1", "u1")["l1"] == 2
    assert len(reusing.l1) == len(conv) == 0
    reusing.l1.check_integrity()
    conv.check_integrity()


@pytest.mark.parametrize("change", [
    {"tenant": "t2"}, {"user": "u2"}, {"pref": "I eat everything."}, {"alpha": 0.5},
])
def test_another_member_tenant_preference_or_alpha_never_continues_it(reusing, plain, change):
    _talk(reusing, QUESTIONS[:2])
    first = [{"role": "user", "content": QUESTIONS[0]}]
    history = [*first, {"role": "assistant", "content": "x"}]
    kw = {k: v for k, v in change.items() if k == "alpha"}
    who = {k: v for k, v in change.items() if k != "alpha"}
    msgs = [*history, {"role": "user", "content": QUESTIONS[1]}]
    req = ExecutionRequest(who.get("tenant", "t1"), who.get("user", "u1"), msgs,
                           who.get("pref", "I am vegetarian."), max_new_tokens=12, **kw)
    res = reusing.execute(req)
    assert res.reused_tokens == 0
    assert res.text == plain.execute(req).text


def test_a_trimmed_history_falls_back_to_a_full_prefill(reusing, plain):
    turns = _talk(reusing, QUESTIONS[:3])
    budget = 20  # only the last turn fits: the prompt after the system turn changed
    history = []
    for q, r in zip(QUESTIONS[:3], turns, strict=True):
        history += [{"role": "user", "content": q}, {"role": "assistant", "content": r.text}]
    req = ExecutionRequest("t1", "u1", [*history, {"role": "user", "content": QUESTIONS[3]}],
                           "I am vegetarian.", max_new_tokens=12, history_token_budget=budget)
    res = reusing.execute(req)
    assert res.history_messages < len(history)
    # the reuse ends where the trimmed prompt departs from the stored sequence (at most a
    # role tag after the system turn), far short of the previous turn's
    assert res.reused_tokens < res.kv_tokens + 4 < turns[2].reused_tokens
    assert res.text == plain.execute(req).text


def test_no_preference_conversations_are_continued_too(reusing, plain):
    got = _talk(reusing, QUESTIONS[:3], pref="")
    want = _talk(plain, QUESTIONS[:3], pref="")
    assert [r.text for r in got] == [r.text for r in want]
    assert got[0].tier is Tier.NONE and got[2].reused_tokens > got[1].reused_tokens == 0


def test_reuse_can_be_turned_off_per_request(reusing):
    _talk(reusing, QUESTIONS[:1])
    res = _talk(reusing, QUESTIONS[:2], reuse_conversation=False)[1]
    assert res.reused_tokens == 0
