"""Memories in the engine on the demo model: the segment's budget, rendering, recalled
memories re-stated before their message, memories_used, and the embedding cache's tenant
keys."""

from __future__ import annotations

import threading

import pytest
import torch

from injection import build_executor
from injection.base import ExecutionRequest, MemoryItem
from injection.memory import HiddenStateEmbedder, MemoryPlan, render, split_budget
from injection.memory.embed import _EXITS, early_exit
from injection.metrics import Metrics
from injection.prompting.output_filter import strip_control_chars

INSTR = "You are the assistant of Acme Foods. Answer briefly."
MEMS = tuple(MemoryItem(str(i), t) for i, t in enumerate([
    "I am a vegetarian.", "I live in Oslo and love skiing.", "My dog is called Biscuit.",
    "I am allergic to peanuts.", "I work night shifts as a nurse.",
]))
MSGS = [{"role": "user", "content": "What should I cook tonight?"}]


def words(text: str) -> int:
    return len(text.split())


def test_budget_takes_pinned_first_then_in_order_while_it_fits():
    mems = [MemoryItem("a", "one two three"), MemoryItem("b", "four five", pinned=True),
            MemoryItem("c", "six seven eight nine"), MemoryItem("d", "ten")]
    # a line costs its words + "-" + the newline
    seg, cands = split_budget(mems, 10, words)
    assert [m.id for m in seg] == ["b", "a"] and [m.id for m in cands] == ["c", "d"]
    seg, cands = split_budget(mems, 100, words)
    assert [m.id for m in seg] == ["b", "a", "c", "d"] and cands == []
    # nothing fits: the first memory still goes in; pinned ones always do
    seg, cands = split_budget(mems[:1] + mems[2:], 1, words)
    assert [m.id for m in seg] == ["a"] and [m.id for m in cands] == ["c", "d"]
    seg, _ = split_budget(mems, 0, words)
    assert [m.id for m in seg] == ["b"]


def test_rendering_one_memory_is_its_text_several_are_lines():
    assert render([MemoryItem("1", "  I am a vegetarian.\n")], many=False) == "I am a vegetarian."
    assert render(MEMS[:2], many=True) == "- I am a vegetarian.\n- I live in Oslo and love skiing."
    assert render([MemoryItem("1", "two\n lines")], many=True) == "- two lines"
    plan = MemoryPlan("", segment=MEMS[:1])
    assert plan.text == "I am a vegetarian." and plan.used() == [{"id": "0", "how": "segment"}]
    plan = MemoryPlan("", segment=MEMS[:2], candidates=MEMS[2:], recalled=MEMS[3:4])
    assert plan.text == "- I am a vegetarian.\n- I live in Oslo and love skiing."  # cached
    assert [u["how"] for u in plan.used()] == ["segment", "segment", "recalled"]
    assert MemoryPlan("my preference").text == "my preference"  # no memories: as before


def two_lines(adapter) -> int:
    """A segment budget that holds exactly the first two memories."""
    return sum(adapter.count_tokens("- " + m.text) + 1 for m in MEMS[:2])


def reference(adapter, context: str, msgs: list[dict[str, str]], n: int) -> list[int]:
    ids = adapter.renderer.encode(adapter.plain_prompt(context, msgs), first=True)
    out = adapter.model.generate(input_ids=torch.tensor([ids]), max_new_tokens=n,
                                 do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("batch_max", [0, 2])
def test_recalled_memories_open_their_message_and_the_reply_is_the_plain_prompts(
        adapter, batch_max):
    ex = build_executor(adapter, batch_max=batch_max, metrics=Metrics(),
                        memory_segment_tokens=two_lines(adapter), memory_recall_top_k=2,
                        memory_recall_min_similarity=-1.0)
    # the reminder off: the recalled memories alone open the message (with the reminder,
    # they join its pick: tests/injection/test_reminder.py)
    req = ExecutionRequest("t1", "u1", MSGS, "ignored preference", instructions=INSTR,
                           memories=MEMS, max_new_tokens=8, reminder=False)
    plan = ex.memories.plan(req)
    assert [m.id for m in plan.segment] == ["0", "1"] and len(plan.recalled) == 2
    out = ex.execute(req)
    again = ex.execute(req)
    system = INSTR + "\n\n" + plan.text  # the segment's memories only: all of it cached
    assert "ignored preference" not in system and plan.text.count("\n- ") == 1
    assert out.extra["memories_used"] == plan.used()
    recalled = " ".join(m.text for m in plan.recalled)
    msgs = [{"role": "user", "content": f"({recalled})\n\n{MSGS[0]['content']}"}]
    whole = adapter.renderer.encode(adapter.split_prompt(system, msgs).segment, first=True)
    assert out.kv_tokens == len(whole)
    assert out.prompt_tokens == len(adapter.renderer.encode(
        adapter.plain_prompt(system, msgs), first=True))
    assert again.tier.value == "l1"
    if batch_max:
        assert again.extra["segments"] == {"tenant": "l1", "member": "l1"}
    want = adapter.tokenizer.decode(reference(adapter, system, msgs, 8),
                                    skip_special_tokens=True)
    assert out.text == again.text == strip_control_chars(want)[0]
    # recall off: the message as sent, the same cached segment
    off = ExecutionRequest("t1", "u1", MSGS, instructions=INSTR, memories=MEMS,
                           max_new_tokens=8, reminder=False)
    ex.memories.options = ex.memories.options._replace(top_k=0)
    plain = ex.execute(off)
    want = adapter.tokenizer.decode(reference(adapter, system, MSGS, 8),
                                    skip_special_tokens=True)
    assert plain.text == strip_control_chars(want)[0] and plain.tier.value == "l1"
    assert [m["how"] for m in plain.extra["memories_used"]] == ["segment", "segment"]


def test_no_memories_and_the_preference_work_as_before(adapter):
    ex = build_executor(adapter, metrics=Metrics())
    pref = ExecutionRequest("t1", "u1", MSGS, "I am a vegetarian.", instructions=INSTR,
                            max_new_tokens=6)
    one = ExecutionRequest("t1", "u1", MSGS, "something else", instructions=INSTR,
                           memories=MEMS[:1], max_new_tokens=6)
    a, b = ex.execute(pref), ex.execute(one)
    assert "memories_used" not in a.extra
    assert b.extra["memories_used"] == [{"id": "0", "how": "segment"}]
    # one memory = the preference string: the same segment (content hash), tokens, reply
    assert (a.content_hash, a.kv_tokens, a.text) == (b.content_hash, b.kv_tokens, b.text)
    assert b.tier.value == "l1"


def test_embedding_cache_is_keyed_by_tenant(adapter):
    emb = HiddenStateEmbedder(adapter, max_entries=3)
    a = emb.embed("tenant-a", ["I am a vegetarian."])
    # poison tenant a's entry: tenant b's identical text must not see it
    key = next(iter(emb._cache))
    assert key[0] == "tenant-a" and key[1] == adapter.fingerprint
    emb._cache[key] = torch.zeros_like(a[0])
    b = emb.embed("tenant-b", ["I am a vegetarian."])
    assert torch.allclose(b, a) and emb.stats()["per_tenant"] == {"tenant-a": 1, "tenant-b": 1}
    assert torch.count_nonzero(emb.embed("tenant-a", ["I am a vegetarian."])) == 0
    assert emb.evict("tenant-a") == 1 and emb.stats()["per_tenant"] == {"tenant-b": 1}
    emb.embed("tenant-b", ["x", "y", "z"])  # bounded: the oldest goes
    assert emb.stats()["entries"] == 3
    assert abs(float(b[0].norm()) - 1.0) < 1e-5


def _forward_counts(model):
    layers = model.get_decoder().layers
    calls = [0] * len(layers)
    handles = [layer.register_forward_pre_hook(
        lambda _m, _a, i=i: calls.__setitem__(i, calls[i] + 1)) for i, layer in
        enumerate(layers)]
    return calls, handles


@pytest.mark.parametrize("index", [1, 2, 3])
def test_early_exit_is_the_full_forwards_hidden_state_and_skips_the_later_layers(
        adapter, index):
    ids = torch.tensor([adapter.tokenizer("Text: I live in Oslo.")["input_ids"]],
                       device=adapter.device)
    with torch.inference_mode():
        full = adapter.model(input_ids=ids, output_hidden_states=True,
                             use_cache=False).hidden_states[index]
    calls, handles = _forward_counts(adapter.model)
    try:
        got = early_exit(adapter.model, ids, index)
    finally:
        for h in handles:
            h.remove()
    assert torch.equal(got, full)
    assert calls == [1] * index + [0] * (adapter.num_layers - index)


def test_early_exit_stops_only_its_own_threads_forward(adapter):
    ids = torch.tensor([adapter.tokenizer("Text: hello")["input_ids"]], device=adapter.device)
    early_exit(adapter.model, ids, 2)  # the hook is on layer 1 from now on
    flag = _EXITS[adapter.model.get_decoder().layers[1]]
    flag.on = True  # as if this thread were inside early_exit
    try:
        out: list = []
        t = threading.Thread(target=lambda: out.append(adapter.model(input_ids=ids).logits))
        t.start()
        t.join()
    finally:
        flag.on = False
    assert out and out[0].shape[-1] == adapter.model.config.vocab_size
    # and on this thread, with the flag down again, a forward runs whole too
    assert adapter.model(input_ids=ids).logits.shape == out[0].shape


def test_a_model_without_decoder_layers_is_embedded_by_a_whole_forward(adapter, monkeypatch):
    ids = torch.tensor([adapter.tokenizer("Text: I live in Oslo.")["input_ids"]],
                       device=adapter.device)
    want = early_exit(adapter.model, ids, 2)
    monkeypatch.setattr(type(adapter.model), "get_decoder", lambda self: object())
    assert torch.equal(early_exit(adapter.model, ids, 2), want)


def test_warm_caches_the_segment_a_request_with_memories_uses(adapter):
    ex = build_executor(adapter, metrics=Metrics(), memory_segment_tokens=two_lines(adapter),
                        memory_recall_min_similarity=-1.0)
    assert ex.warm("t1", "u1", "stale preference", INSTR, memories=MEMS).value == "compute"
    out = ex.execute(ExecutionRequest("t1", "u1", MSGS, instructions=INSTR, memories=MEMS,
                                      max_new_tokens=4, reminder=False))  # recall alone
    assert out.tier.value == "l1" and out.extra["memories_used"][2]["how"] == "recalled"
    assert ex.warm("t1", "u1", "", INSTR, memories=MEMS).value == "l1"


def test_invalidating_a_tenant_drops_its_memories_embeddings(adapter):
    """A deleted or edited tenant's memories leave the embedding cache with its K/V; a
    member's invalidation leaves them (they are keyed by text, shared by its members)."""
    ex = build_executor(adapter, metrics=Metrics())
    try:
        for tenant in ("gone", "stays"):
            ex.memories.embedder.embed(tenant, ["I am a vegetarian.", "I live in Lyon."])
        ex.invalidate("gone", "u1")
        assert ex.memories.stats()["per_tenant"] == {"gone": 2, "stays": 2}
        ex.invalidate("gone")
        assert ex.memories.stats()["per_tenant"] == {"stays": 2}
    finally:
        ex.close()


def test_with_the_reminder_on_recall_adds_nothing_to_its_pick(adapter):
    """The reminder's own pick draws from every memory, so recall's top k are not added
    (measured to gain nothing: bench_quality, recall-placement): the same prompt and reply
    as with recall off, and ``recalled`` lists the candidates the reminder re-stated."""
    outs = []
    for k in (2, 0):
        ex = build_executor(adapter, batch_max=2, metrics=Metrics(),
                            memory_segment_tokens=two_lines(adapter), memory_recall_top_k=k,
                            memory_recall_min_similarity=-1.0)
        try:
            outs.append(ex.execute(ExecutionRequest("t1", "u1", MSGS, instructions=INSTR,
                                                    memories=MEMS, max_new_tokens=8)))
        finally:
            ex.close()
    on, off = outs
    assert (on.prompt_tokens, on.text) == (off.prompt_tokens, off.text)
    assert on.extra["memories_used"] == off.extra["memories_used"]
    recalled = {m["id"] for m in on.extra["memories_used"] if m["how"] == "recalled"}
    assert recalled <= {"2", "3", "4"}
