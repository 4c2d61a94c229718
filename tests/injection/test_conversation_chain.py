"""Conversation links after the injected chain: only their own tokens, in L1 and real
Redis, keyed by conversation id or the messages' hash chain, admitted once reused."""

from __future__ import annotations

import pytest

from injection import build_executor
from injection.base import ExecutionRequest
from injection.metrics import Metrics

SECRET = "conv-secret-0123456789abcdef"
INSTR = "You are Acme's cooking assistant. Be brief."
QUESTIONS = ["What should I cook tonight?", "And for dessert?", "Which drink goes with it?",
             "How long will it all take?", "Can I freeze leftovers?"]


@pytest.fixture
def executors(adapter, redis_client):
    made = []

    def make(**kw):
        ex = build_executor(adapter, batch_max=2, redis_client=redis_client,
                            signing_secret=SECRET, metrics=Metrics(), **kw)
        ex.l2.async_writes = False  # the next turn may land on another worker at once
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.close()


@pytest.fixture
def plain(adapter):
    return build_executor(adapter, metrics=Metrics())  # no engine: full prefill every turn


def turn(ex, history, q, *, user="u1", conv=None, **kw):
    msgs = [*history, {"role": "user", "content": q}]
    res = ex.execute(ExecutionRequest("t1", user, msgs, "I am vegetarian.", instructions=INSTR,
                                      max_new_tokens=10, conversation_id=conv, **kw))
    return res, [*msgs, {"role": "assistant", "content": res.text}]


def test_links_hold_only_their_tokens_and_continue_on_another_worker(executors, plain):
    # the links as the turns store them (the next turn's opening, prefilled onto a link in
    # the background once the reply is out, is tests/injection/test_opening.py's)
    a, b = (executors(conversation_prefill_opening=False) for _ in range(2))
    history, got = [], []
    for i, q in enumerate(QUESTIONS):
        res, history = turn(a if i < 3 else b, history, q)  # turns 4-5 on worker b
        got.append(res)
    want, h = [], []
    for q in QUESTIONS:
        res, h = turn(plain, h, q)
        want.append(res)
    assert [r.text for r in got] == [r.text for r in want]
    # worker b has never seen this conversation: its first turn continues the link from Redis
    assert got[3].reused_tokens > got[2].reused_tokens > 0
    assert b.metrics.get("conversation_l2_hits") == 1 and got[3].extra["segments"] == {
        "tenant": "l2", "member": "l2"}
    assert got[3].cached_tokens == got[3].kv_tokens + got[3].reused_tokens
    # the /v1 hash chain: each stored turn replaces the link it continued (one per worker
    # in L1, one in Redis), and a link holds none of the injected turn's tokens
    (link,) = [e for e in b.conv_l1._tenants["t1"].entries.values()]
    head = a.adapter.renderer.encode(
        a.adapter.split_prompt(INSTR + "\n\n" + "I am vegetarian.", history).segment, first=True)
    assert link.kv.num_tokens < got[4].prompt_tokens + got[4].completion_tokens - len(head)
    assert tuple(link.kv.token_ids[: len(head)]) != tuple(head)
    conv_names = b.l2.stats(scan=True)["per_tenant"]["t1"]["entries"]
    assert conv_names == 3  # tenant segment + member segment + the newest link


def test_one_shot_requests_are_not_stored(executors):
    ex = executors()
    for q in QUESTIONS:
        res, _ = turn(ex, [], q)
        assert res.reused_tokens == 0
    assert len(ex.conv_l1) == 0 and ex.metrics.get("conv_not_admitted") == len(QUESTIONS)
    assert ex.l2.stats(scan=True)["per_tenant"]["t1"]["entries"] == 2  # the two segments


def test_conversation_id_keys_one_slot_and_eviction_drops_it_from_redis(executors):
    ex = executors()
    history = []
    for q in QUESTIONS[:3]:
        res, history = turn(ex, history, q, conv="api:7")
    assert res.reused_tokens > 0 and len(ex.conv_l1) == 1
    other = executors()  # after a restart: empty L1, the same Redis
    res, history = turn(other, history, QUESTIONS[3], conv="api:7")
    assert res.reused_tokens > 0
    # deleting the member drops its links
    assert other.invalidate("t1", "u1")["l2"] == 2  # member segment + the link
    fresh = executors()
    res, _ = turn(fresh, history, QUESTIONS[4], conv="api:7")
    assert res.reused_tokens == 0 and res.extra["segments"]["member"] == "compute"
    assert res.extra["segments"]["tenant"] == "l2"  # the tenant's segment stays


def test_dropping_a_conversation_drops_its_links_only(executors):
    """A deleted conversation (outbox kind ``links``): its link goes from L1 and Redis;
    the member's segments and another conversation's link stay, on this worker and others."""
    ex = executors(conversation_prefill_opening=False)
    histories = {}
    for conv in ("api:1", "api:2"):
        histories[conv] = turn(ex, turn(ex, [], QUESTIONS[0], conv=conv)[1], QUESTIONS[1],
                               conv=conv)[1]
    segments, names = len(ex.l1), ex.l2.stats(scan=True)["per_tenant"]["t1"]["entries"]
    assert len(ex.conv_l1) == 2 and names == 4  # 2 segments + 2 links
    assert ex.drop_conversation("t1", "u1", "api:1") == {"l1": 1, "l2": 1}
    assert len(ex.l1) == segments and len(ex.conv_l1) == 1
    assert ex.l2.stats(scan=True)["per_tenant"]["t1"]["entries"] == 3
    other = executors()  # another worker: what it finds in Redis
    gone, _ = turn(other, histories["api:1"], QUESTIONS[2], conv="api:1")
    kept, _ = turn(other, histories["api:2"], QUESTIONS[2], conv="api:2")
    assert gone.reused_tokens == 0 and kept.reused_tokens > 0
    assert gone.extra["segments"] == {"tenant": "l2", "member": "l2"}  # nothing recomputed


def test_a_history_trimmed_in_blocks_keeps_being_continued(executors, plain):
    ex = executors()
    history, reused = [], []
    for i in range(12):  # ~33 tokens a turn, the budget holds ~6 turns
        res, history = turn(ex, history, f"Question {i}: what else can I cook with rice?",
                            history_token_budget=200)
        reused.append((res.reused_tokens, res.history_messages))
        assert res.text == turn(plain, history[:-2], history[-2]["content"],
                                history_token_budget=200)[0].text
    assert max(h for _, h in reused) < 2 * 12 - 2  # the budget was passed
    # past it most turns still continue their link: the cut moves in blocks (a sliding
    # window would change the history's start, and miss, on every turn)
    assert sum(1 for n, _ in reused[2:] if n > 0) >= 7, reused
    # the link is keyed by the messages as sent: a cut replaces it, never orphans it
    assert len(ex.conv_l1) == 1
    assert ex.l2.stats(scan=True)["per_tenant"]["t1"]["entries"] == 3  # 2 segments + 1 link


def test_one_shots_sharing_a_few_shot_prefix_keep_one_link_only(executors):
    ex = executors(conversation_prefill_opening=False)
    other = executors(conversation_prefill_opening=False)  # another worker, the same Redis
    shots = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]
    for i, q in enumerate(QUESTIONS):  # the same few-shot history, another question each
        res, _ = turn(ex if i % 2 else other, shots, q)
        assert res.reused_tokens == 0
    # the first is kept (it may be a conversation going on); the others are recognised as
    # one-shots on a fixed prefix, on either worker, and stored nowhere
    assert ex.l2.links.usage("t1")["entries"] == 1
    assert len(ex.conv_l1) + len(other.conv_l1) == 1
    assert ex.metrics.get("conv_not_admitted") + other.metrics.get("conv_not_admitted") == 4
    # a conversation is unaffected: each turn's history is new, each link is kept, and a
    # turn on the other worker continues from Redis
    history = []
    for i, q in enumerate(QUESTIONS[:4]):
        res, history = turn(ex if i % 2 else other, history, q, user="u2")
        if i >= 2:
            assert res.reused_tokens > 0
    usage = ex.l2.links.usage("t1")
    assert usage["entries"] == 2 and usage["bytes"] > 0  # the one-shot's and u2's newest
