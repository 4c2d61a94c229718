"""The next turn's opening prefilled after a reply (engine/turns.py, prompting/opening.py):
a live chat's next turn reuses the reply, the next user header and a fixed reminder, and
answers exactly as it does without it; a late opening never replaces a newer link."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from injection import InjectionExecutor, TenantLRU, build_executor
from injection.base import CacheKey, ExecutionRequest, MemoryItem
from injection.engine import turns
from injection.engine.batch import BatchEngine
from injection.engine.turns import opening_pays
from injection.kvcache.packed import PackedKV
from injection.metrics import Metrics
from injection.prompting.opening import PROBE, next_opening
from injection.prompting.reminder import Reminder
from tests.injection.test_batch_faults import _Faulty, _until, _with_model

QUESTIONS = ["What should I cook tonight?", "And for dessert?", "Which drink goes with it?",
             "How long will it all take?"]
PREF = "I am vegetarian."


def _chat(ex, *, drain: bool, conversation_id: str | None, between=None, **kw):
    """A live chat: each reply goes back with the next message (``between(turn)`` runs
    before it is sent)."""
    history, results = [], []
    for i, q in enumerate(QUESTIONS):
        msgs = [*history, {"role": "user", "content": q}]
        res = ex.execute(ExecutionRequest("t1", "u1", msgs, PREF, max_new_tokens=8,
                                          reuse_conversation=True,
                                          conversation_id=conversation_id, **kw))
        if drain:
            ex.turns.drain()  # the member reads the reply
        if between is not None:
            between(i + 1)
        results.append(res)
        history += [{"role": "user", "content": q}, {"role": "assistant", "content": res.text}]
    return results


@pytest.mark.real_model  # the replies must come back token for token (a random model's do not)
@pytest.mark.parametrize("conversation_id", ["c1", None])  # /api/chat's id; /v1's hash chain
def test_the_next_turn_reuses_its_opening_and_answers_the_same(smollm,
                                                                conversation_id):
    off = build_executor(smollm, batch_max=4, metrics=Metrics(),
                         conversation_prefill_opening=False)
    try:
        want = _chat(off, drain=False, conversation_id=conversation_id, reminder=True)
    finally:
        off.close()
    on = build_executor(smollm, batch_max=4, metrics=Metrics(), conversation_prefill_opening=True)
    try:
        got = _chat(on, drain=True, conversation_id=conversation_id, reminder=True)
        extended = on.metrics.snapshot()["counters"].get("conv_extended", 0)
    finally:
        on.close()
    assert [r.text for r in got] == [r.text for r in want]
    assert [r.prompt_tokens for r in got] == [r.prompt_tokens for r in want]
    # the first turn is not kept (no history); every later one is extended
    assert extended == len(QUESTIONS) - 1
    # from the third turn: its opening (the reply's end, the header and the reminder) was
    # prefilled ahead, so more of the prompt is reused than the link alone gave
    gained = [g.reused_tokens - w.reused_tokens for g, w in zip(got, want, strict=True)]
    assert gained[:2] == [0, 0] and all(n > 0 for n in gained[2:])
    assert all(g.cached_tokens > w.cached_tokens for g, w in zip(got[2:], want[2:], strict=True))


@pytest.mark.real_model
def test_a_turn_sent_while_its_opening_runs_waits_for_it_and_answers_the_same(smollm):
    """A client that sends the next message at once: its turn finds the opening still being
    prefilled, waits for it and reuses it (before, it looked the shorter link up and
    prefilled those tokens again behind the opening's row)."""
    off = build_executor(smollm, batch_max=4, metrics=Metrics(),
                         conversation_prefill_opening=False)
    try:
        want = _chat(off, drain=False, conversation_id=None, reminder=True)
    finally:
        off.close()
    on = build_executor(smollm, batch_max=4, metrics=Metrics(), conversation_prefill_opening=True)
    started, waiting = threading.Event(), threading.Event()
    real_open, real_await = on.turns._prefill_opening, on.turns._await_opening

    def held_open(*args):  # prefilling (past its delay) until the next turn waits for it
        started.set()
        waiting.wait(30)
        waiting.clear()
        real_open(*args)

    def awaited(key):
        waiting.set()
        real_await(key)

    def between(turn: int) -> None:  # from turn 2, an opening follows each reply
        if turn >= 2:
            assert started.wait(30), "the opening did not start"
            started.clear()

    on.turns._prefill_opening, on.turns._await_opening = held_open, awaited
    try:
        got = _chat(on, drain=False, conversation_id=None, between=between, reminder=True)
        counters = on.metrics.snapshot()["counters"]
    finally:
        waiting.set()  # the last reply's opening: no turn follows it
        on.close()
    assert [r.text for r in got] == [r.text for r in want]
    assert [r.prompt_tokens for r in got] == [r.prompt_tokens for r in want]
    assert counters.get("conv_opening_awaited") == 2  # before turns 3 and 4
    gained = [g.reused_tokens - w.reused_tokens for g, w in zip(got, want, strict=True)]
    assert gained[:2] == [0, 0] and all(n > 0 for n in gained[2:])


def test_a_turn_sent_within_the_delay_cancels_its_opening(adapter, monkeypatch):
    """A client that answers before ``OPENING_DELAY_S`` has passed: the opening never
    runs, its turn prefills those tokens with its message and answers as with openings off;
    closing the executor ends the last reply's opening without waiting out its delay."""
    monkeypatch.setattr(turns, "OPENING_DELAY_S", 600.0)  # every next turn comes within it
    replies = []
    for opening in (False, True):
        ex = build_executor(adapter, batch_max=4, metrics=Metrics(),
                            conversation_prefill_opening=opening)
        try:
            replies.append([r.text for r in _chat(ex, drain=False, conversation_id="c1")])
            counters = ex.metrics.snapshot()["counters"]
        finally:
            ex.close()
    assert replies[0] == replies[1]
    assert counters.get("conv_opening_cancelled") == 2  # before turns 3 and 4
    assert not counters.get("conv_extended") and not counters.get("conv_opening_awaited")


def test_a_queued_opening_is_cancelled_by_its_next_turn(adapter):
    """An opening not started yet when its conversation's next turn comes is cancelled:
    the turn prefills those tokens itself, and nothing runs after it."""
    ex = build_executor(adapter, batch_max=2, metrics=Metrics(),
                        conversation_prefill_opening=True)
    gate, ran = threading.Event(), []
    other, key = (CacheKey("t1", u, "conv-q", adapter.fingerprint) for u in ("u2", "u1"))

    def fake_open(k, *rest):  # the other conversation's holds the one opening thread
        if k == other:
            gate.wait(30)
        ran.append(k)

    ex.turns._open = fake_open
    try:
        ex.turns._submit(other, "", None, 0, lambda: None)
        ex.turns._submit(key, "", None, 0, lambda: None)  # queued behind it
        ex.turns._await_opening(key)
        gate.set()
        ex.turns.drain()
        assert ran == [other]
        assert ex.metrics.snapshot()["counters"]["conv_opening_cancelled"] == 1
    finally:
        gate.set()
        ex.close()


def test_the_opening_text_is_the_reply_the_header_and_a_fixed_reminder(adapter):
    plain = adapter.plain_prompt
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Cook?"}]
    one = Reminder.for_request(ExecutionRequest("t", "u", msgs, PREF, reminder=True),
                               adapter.renderer, True)
    text = next_opening(plain, PREF, one.apply(msgs), "Pasta.", one)
    nxt = one.apply([*msgs, {"role": "assistant", "content": "Pasta."},
                     {"role": "user", "content": PROBE}])
    assert plain(PREF, one.apply(msgs)) + text + PROBE + plain(PREF, nxt).split(PROBE)[1] == \
        plain(PREF, nxt)
    assert text.startswith("Pasta.") and text.endswith(f"({PREF})\n\n")
    # before the reminder's depth, and for a reminder picked per message: no reminder
    early = next_opening(plain, PREF, msgs[:1], "Hello.", one)
    assert early.startswith("Hello.") and PREF not in early
    many = (MemoryItem("a", "I have a cat."), MemoryItem("b", "I live in Oslo."))
    req = ExecutionRequest("t", "u", msgs, memories=many, reminder=True)
    picked = Reminder.for_request(req, adapter.renderer, True, lambda texts, m, top: texts)
    assert picked.next_text(msgs) == "" and one.next_text(msgs) == PREF


def test_a_late_opening_never_replaces_a_newer_link(adapter):
    ex = build_executor(adapter, batch_max=4, metrics=Metrics(), conversation_prefill_opening=True)
    try:
        store = ex.conversations
        key = CacheKey("t1", "u1", "conv-x", adapter.fingerprint)
        keys, values = torch.randn(2, 2, 6, 4), torch.randn(2, 2, 6, 4)  # [L, H, T, D]
        kv = PackedKV(keys, values, (1, 2, 3, 4, 9, 9))
        base = PackedKV(kv.keys[:, :, :4], kv.values[:, :, :4], (1, 2, 3, 4))
        newer = PackedKV(kv.keys[:, :, :5], kv.values[:, :, :5], (1, 2, 3, 4, 5))
        longer = PackedKV(kv.keys, kv.values, (1, 2, 3, 4, 9, 9))
        store.keep(key, newer)  # the next turn stored its link first
        looked = (store.l1.stats()["hits"], store.l1.stats()["misses"])
        assert not store.extend(key, base.token_ids, longer)
        store.keep(key, base)
        assert store.extend(key, base.token_ids, longer)
        # the check is a peek: the L1's hit and miss counts are what lookups did
        assert (store.l1.stats()["hits"], store.l1.stats()["misses"]) == looked
        store.keep(key, newer)
        assert not store.extend(key, base.token_ids, longer)
        assert tuple(store.l1.get(key).token_ids) == (1, 2, 3, 4, 5)
        store.keep(key, base)
        assert store.extend(key, base.token_ids, longer)
        assert tuple(store.l1.get(key).token_ids) == (1, 2, 3, 4, 9, 9)
    finally:
        ex.close()


def test_an_opening_waits_for_an_idle_engine(adapter):
    """While another row runs, the opening is skipped (it would delay that row and mostly
    come too late: bench/bench_opening_load.py); once the engine is idle it is prefilled."""
    release, hold = threading.Event(), threading.Event()

    def before(_call, kw):  # a held row: its decoding steps wait while ``hold`` is set
        if hold.is_set() and kw["input_ids"].shape[1] == 1:
            release.wait()

    eng_adapter = _with_model(adapter, _Faulty(adapter.model, before))
    ex = InjectionExecutor(eng_adapter, l1=TenantLRU(max_bytes=64 * 1024**2), l2=None,
                           metrics=Metrics(), engine=BatchEngine(eng_adapter, max_batch=4),
                           conversation_max_bytes=64 * 1024**2)
    key = CacheKey("t1", "u1", "conv-y", adapter.fingerprint)
    seq = ex.engine.run(None, 1.0, adapter.renderer.encode("Hi there", first=False), 1,
                        keep_kv=True).sequence_kv
    ex.conversations.keep(key, seq)
    opening = lambda: " and more"  # noqa: E731 - the text after the prompt
    try:
        hold.set()
        busy = threading.Thread(target=ex.engine.run, args=(None, 1.0, [1, 2, 3], 4))
        busy.start()
        _until(lambda: ex.engine.stats()["active"] == 1, "a row running")
        first = threading.Thread(target=ex.turns._prefill_opening,
                                 args=(key, "Hi there", seq, 0, opening))
        first.start()

        def skipped() -> int:
            return ex.metrics.snapshot()["counters"].get("conv_opening_skipped", 0)

        # skipped, or (wrongly) queued behind the running row
        _until(lambda: skipped() or ex.engine.stats()["waiting"], "the opening decided")
        assert skipped() == 1 and ex.engine.stats()["waiting"] == 0
        hold.clear()
        release.set()
        busy.join()
        first.join()
        assert not ex.metrics.snapshot()["counters"].get("conv_extended")
        ex.turns._prefill_opening(key, "Hi there", seq, 0, opening)
        assert ex.metrics.snapshot()["counters"].get("conv_extended") == 1
        assert ex.conversations.l1.get(key).num_tokens > seq.num_tokens
    finally:
        release.set()
        ex.close()


def test_openings_by_default_where_the_model_runs_on_a_cpu_and_as_configured(adapter):
    """A GPU prefill of a few dozen tokens costs what the message's alone does, so openings
    are off there unless configured (``opening_pays``; KV_CONVERSATION_PREFILL_OPENING)."""
    on = SimpleNamespace(adapter=SimpleNamespace(device=torch.device("cpu")))
    assert opening_pays(on) and not opening_pays(None)
    assert not opening_pays(SimpleNamespace(adapter=SimpleNamespace(device=torch.device("cuda"))))
    made = build_executor(adapter, batch_max=2, metrics=Metrics())
    assert made.turns.prefill_opening == (adapter.device.type == "cpu")
    made.close()
    for told in (True, False):
        ex = build_executor(adapter, batch_max=2, metrics=Metrics(),
                            conversation_prefill_opening=told)
        try:
            _chat(ex, drain=True, conversation_id="c-told")
            # an opening was handed to the background thread after each kept turn, or never
            assert (ex.turns._openings is not None) is told
            counters = ex.metrics.snapshot()["counters"]
            if not told:
                assert not counters.get("conv_extended") and not counters.get(
                    "conv_opening_skipped")
        finally:
            ex.close()
