"""Memory reminders (injection/prompting/reminder.py) through the real executor and engine:
placed deterministically past a depth, nothing changes without a memory, and a running
conversation keeps continuing its cached K/V with reminders in it."""

from __future__ import annotations

import pytest

from injection import InjectionExecutor, TenantLRU, build_executor
from injection.base import ExecutionRequest, MemoryItem
from injection.metrics import Metrics
from injection.prompting import reminder
from injection.prompting.reminder import Reminder, reminder_text, with_reminders

QUESTIONS = ["What should I cook tonight?", "And for dessert?", "Which drink goes with it?",
             "How long will it all take?", "Can I freeze the rest?"]
PREF = "I am vegetarian."


def _deep(n: int) -> list[dict[str, str]]:
    msgs = []
    for k in range(n):
        msgs += [{"role": "user", "content": f"Question {k}?"},
                 {"role": "assistant", "content": f"Answer {k}."}]
    return msgs + [{"role": "user", "content": "Last question?"}]


def test_reminders_open_every_user_turn_past_the_depth_and_nothing_else_changes():
    msgs = _deep(3)
    out = with_reminders(msgs, "I am vegetarian.", after=2)
    users = [m["content"] for m in out if m["role"] == "user"]
    assert users == ["Question 0?", "Question 1?", "(I am vegetarian.)\n\nQuestion 2?",
                     "(I am vegetarian.)\n\nLast question?"]
    assert [m for m in out if m["role"] != "user"] == [m for m in msgs if m["role"] != "user"]
    sys_form = with_reminders(msgs, "x", after=3, role="system")
    assert sys_form[-2] == {"role": "system", "content": "Remember: x"} and len(sys_form) == 8
    assert with_reminders(msgs, "", after=0) == msgs  # no memory: unchanged
    assert Reminder().apply(msgs) == msgs


def test_reminder_text_keeps_whole_memories_within_the_budget():
    count = len  # one "token" per character, for the arithmetic
    assert reminder_text(["aaaa", "bbb", "cc"], count, budget=7) == "aaaa bbb"
    assert reminder_text(["a" * 50, "b"], count, budget=7) == "a" * 50  # one word: whole
    # a first memory over the budget is cut at a word (and nothing follows it): a reminder
    # is re-stated in every user turn, so its size bounds how much history fits
    assert reminder_text(["aaaa bbbb cccc dddd", "e"], count, budget=10) == "aaaa bbbb…"
    assert reminder_text(["aaaa bbbb cccc dddd", "e"], count, budget=6) == "aaaa…"
    assert reminder_text(["aaaa bbbb cccc dddd"], count, budget=2) == "aaaa…"  # a word at least
    assert reminder_text(["", "  "], count) == ""


def test_each_turns_rendering_is_a_prefix_of_the_next(adapter):
    """Reminders stay where they were placed: turn k's prompt (plus its reply) starts
    the rendering of turn k+1, so the conversation's cached K/V stays a prefix."""
    history: list[dict[str, str]] = []
    prev = None
    for k, q in enumerate(QUESTIONS):
        msgs = with_reminders([*history, {"role": "user", "content": q}], PREF, after=2)
        rendered = adapter.render_chat(msgs)
        if prev is not None:
            assert rendered.startswith(prev)
        history += [{"role": "user", "content": q}, {"role": "assistant", "content": f"r{k}"}]
        prev = rendered + f"r{k}"


@pytest.fixture
def reusing(adapter):
    ex = build_executor(adapter, batch_max=4, metrics=Metrics())
    yield ex
    ex.close()


def _talk(ex, pref: str, **kw):
    history, results = [], []
    for q in QUESTIONS:
        msgs = [*history, {"role": "user", "content": q}]
        res = ex.execute(ExecutionRequest("t1", "u1", msgs, pref, max_new_tokens=10, **kw))
        results.append(res)
        history += [{"role": "user", "content": q}, {"role": "assistant", "content": res.text}]
    return results


def test_without_a_memory_the_reminder_changes_nothing(adapter):
    on = build_executor(adapter, metrics=Metrics())
    for instructions in ("", "You are the assistant of Acme."):
        a = _talk(on, "", reminder=True, instructions=instructions)
        b = _talk(on, "", reminder=False, instructions=instructions)
        assert [(r.text, r.prompt_tokens) for r in a] == [(r.text, r.prompt_tokens) for r in b]


def test_a_conversation_with_reminders_continues_its_cached_kv_and_answers_the_same(
        adapter, reusing):
    plain = build_executor(adapter, metrics=Metrics())  # no engine: full prefill each turn
    got, want = _talk(reusing, PREF, reminder=True), _talk(plain, PREF, reminder=True)
    off = _talk(plain, PREF, reminder=False)
    assert [r.text for r in got] == [r.text for r in want]
    # the reminders are in the prompt from the third turn on (after=2), not before
    after = reminder.DEFAULT_AFTER
    assert [(r.text, r.prompt_tokens) for r in want[:after]] == [
        (r.text, r.prompt_tokens) for r in off[:after]]
    assert want[after].prompt_tokens > off[after].prompt_tokens  # same history + reminder
    for prev, turn in zip(got[2:], got[3:], strict=False):
        assert turn.reused_tokens > prev.reused_tokens  # the whole history is reused


def test_memories_feed_the_reminder_in_order(adapter):
    req = ExecutionRequest("t", "u", _deep(3), memories=(
        MemoryItem("1", "I am vegetarian."), MemoryItem("2", "I live in Oslo.")), reminder=True)
    rem = Reminder.for_request(req, adapter.renderer, personal=True)
    assert rem.text == "I am vegetarian. I live in Oslo."
    assert Reminder.for_request(req, adapter.renderer, personal=False).text == ""
    off = ExecutionRequest("t", "u", _deep(3), PREF, reminder=False)
    assert Reminder.for_request(off, adapter.renderer, personal=True).text == ""


@pytest.mark.slow
@pytest.mark.real_model
def test_real_model_reminder_renders_as_designed_and_is_inert_without_memory(smollm):
    ex = InjectionExecutor(smollm, l1=TenantLRU(max_bytes=1024**3), l2=None, alpha_cap=1.0,
                           metrics=Metrics())
    msgs = _deep(4)[:-1] + [{"role": "user", "content": "What should I cook tonight?"}]
    on = ex.execute(ExecutionRequest("t", "u", msgs, PREF, max_new_tokens=16, reminder=True))
    want = smollm.generate(smollm.plain_prompt(PREF, with_reminders(msgs, PREF)), None, 1.0, 16)
    assert on.text == want.text
    none_on = ex.execute(ExecutionRequest("t", "u", msgs, "", max_new_tokens=16, reminder=True))
    none_off = ex.execute(ExecutionRequest("t", "u", msgs, "", max_new_tokens=16,
                                           reminder=False))
    assert none_on.text == none_off.text and none_on.prompt_tokens == none_off.prompt_tokens


MANY = ("I live in Oslo.", "Reply in French.", "My cat is called Tom.", "I am a nurse.")


def test_with_several_memories_each_reminder_carries_the_standing_and_the_relevant_ones():
    asked: list[tuple[list[str], str, int]] = []

    def relevant(texts, message, top):  # stands in for the planner's embedding pick
        asked.append((list(texts), message, top))
        return [t for t in texts if "cat" in t and "cat" in message.lower()]

    req = ExecutionRequest("t", "u", _deep(3), memories=tuple(
        MemoryItem(str(i), t) for i, t in enumerate(MANY)), reminder=True)
    rem = Reminder.for_request(req, None, personal=True, relevant=relevant)
    assert rem.text_for("What is my cat called?") == "Reply in French. My cat is called Tom."
    assert rem.text_for("Plan my weekend.") == "Reply in French."  # standing only
    # the standing instruction is always in, never a candidate; top = RELEVANT_TOP
    assert asked[0] == ([MANY[0], MANY[2], MANY[3]], "What is my cat called?",
                        reminder.RELEVANT_TOP)
    msgs = _deep(2)[:-1] + [{"role": "user", "content": "Is my cat hungry?"}]
    out = rem.apply(msgs)
    users = [m["content"] for m in out if m["role"] == "user"]
    # several memories: reminded from the first turn on (reminder.MANY_AFTER)
    assert rem.after == reminder.MANY_AFTER == 0
    assert users == ["(Reply in French.)\n\nQuestion 0?", "(Reply in French.)\n\nQuestion 1?",
                     "(Reply in French. My cat is called Tom.)\n\nIs my cat hungry?"]
    # fitting the history renders the turns many times: each message is picked once
    assert rem.apply(msgs) == out and rem.reminds_last(msgs)
    assert sorted(m for _, m, _ in asked) == sorted(
        ["What is my cat called?", "Plan my weekend.", "Question 0?", "Question 1?",
         "Is my cat hungry?"])
    # one memory: the memory itself, no pick
    one = ExecutionRequest("t", "u", _deep(3), PREF, reminder=True)
    single = Reminder.for_request(one, None, True, relevant)
    assert single.pick is None and single.after == reminder.DEFAULT_AFTER


def test_a_turn_with_nothing_to_remind_is_not_reminded():
    facts = tuple(MemoryItem(str(i), t) for i, t in enumerate(("I live in Oslo.", "I am a nurse.")))
    rem = Reminder.for_request(ExecutionRequest("t", "u", _deep(3), memories=facts,
                                                reminder=True), None, True,
                               lambda texts, message, top: [])
    assert rem.apply(_deep(3)) == _deep(3) and not rem.reminds_last(_deep(3))


def test_standing_instructions_are_told_from_facts():
    assert all(reminder.standing(t) for t in (
        "Always answer in Spanish.", "Please keep replies short.", "Use British spelling.",
        "Don't use emojis.", "I like my answers as bullet points."))
    assert not any(reminder.standing(t) for t in (
        "I live in Oslo.", "My dog is called Rex.", "I use Linux at work.",
        "I prefer tea to coffee.", "I am allergic to peanuts."))


def test_relevant_reminders_keep_the_conversation_a_prefix(adapter, reusing):
    """Each reminder is picked by its own user message, so earlier turns render the same
    reminders every time and the running conversation keeps continuing its cached K/V."""
    plain = build_executor(adapter, metrics=Metrics())
    memories = tuple(MemoryItem(str(i), t) for i, t in enumerate(MANY))
    got = _talk(reusing, "", reminder=True, memories=memories)
    want = _talk(plain, "", reminder=True, memories=memories)
    assert [r.text for r in got] == [r.text for r in want]
    for prev, turn in zip(got[2:], got[3:], strict=False):
        assert turn.reused_tokens > prev.reused_tokens


def test_reminder_off_is_the_reply_without_it_token_for_token(adapter, reusing):
    """Deep in a conversation, ``reminder=False`` gives the reply (and the prompt size) of
    the conversation as sent with the memory as its system message; on, the reminded one's
    (contrast 0: the guide is another switch)."""
    msgs = _deep(3)
    want_off = adapter.generate(adapter.plain_prompt(PREF, msgs), None, 1.0, 12)
    want_on = adapter.generate(adapter.plain_prompt(PREF, with_reminders(msgs, PREF)), None,
                               1.0, 12)
    for ex in (build_executor(adapter, metrics=Metrics()), reusing):
        def run(on: bool, ex=ex):
            return ex.execute(ExecutionRequest("t", "u", msgs, PREF, max_new_tokens=12,
                                               reminder=on, contrast=0.0))
        off, on = run(False), run(True)
        assert (off.text, off.prompt_tokens) == (want_off.text, len(want_off.prompt_token_ids))
        assert (on.text, on.prompt_tokens) == (want_on.text, len(want_on.prompt_token_ids))
        assert on.prompt_tokens > off.prompt_tokens
