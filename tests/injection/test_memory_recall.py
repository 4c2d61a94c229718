"""Memories on the prepared default model (SmolLM2-135M-Instruct): one memory is the
preference string token for token; recalled memories re-stated before the message give the
reply of the same plain prompt; recall picks the relevant memory."""

from __future__ import annotations

import pytest

from injection import build_executor
from injection.base import ExecutionRequest, MemoryItem
from injection.memory import MemoryPlanner, RecallOptions
from injection.metrics import Metrics
from tests.injection.recall_cases import SETS

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

INSTR = "You are the assistant of a travel agency."
MEMS = tuple(MemoryItem(f"m{i}", t) for i, t in enumerate([
    "Always answer in French.", "I live in Lisbon.", "My dog is called Biscuit.",
    "I am afraid of flying.", "I am vegetarian.",
]))


def ask(question):
    return [{"role": "user", "content": question}]


def test_one_memory_is_the_preference_string_token_for_token(smollm):
    ex = build_executor(smollm, metrics=Metrics())
    msgs = ask("How are you today?")
    pref = ex.execute(ExecutionRequest("t", "u", msgs, "Always answer in French.",
                                       max_new_tokens=16))
    mem = ex.execute(ExecutionRequest("t", "u", msgs, "", memories=MEMS[:1], max_new_tokens=16))
    plain = smollm.generate(smollm.plain_prompt("Always answer in French.", msgs), None, 1.0, 16)
    assert (mem.content_hash, mem.kv_tokens) == (pref.content_hash, pref.kv_tokens)
    assert mem.tier.value == "l1"  # the very same cached segment
    assert mem.text == pref.text == plain.text and mem.completion_tokens == len(plain.token_ids)
    assert mem.extra["memories_used"] == [{"id": "m0", "how": "segment"}]


@pytest.mark.parametrize("batch_max", [0, 2])
def test_recalled_memories_reply_equals_the_plain_system_message(smollm, batch_max):
    budget = sum(smollm.count_tokens("- " + m.text) + 1 for m in MEMS[:2])
    ex = build_executor(smollm, batch_max=batch_max, metrics=Metrics(),
                        memory_segment_tokens=budget, memory_recall_top_k=2)
    msgs = ask("My pet gets anxious during fireworks. What can I do for him?")
    # contrast and reminder off: the reply is the plain system message's exactly
    # (tests/injection/test_contrast*.py, test_reminder.py cover them)
    req = ExecutionRequest("t", "u", msgs, instructions=INSTR, memories=MEMS, max_new_tokens=24,
                           contrast=0.0, reminder=False)
    plan = ex.memories.plan(req)
    assert [m.id for m in plan.segment] == ["m0", "m1"]
    assert "m2" in [m.id for m in plan.recalled]  # the dog
    system = INSTR + "\n\n" + plan.text  # the segment's memories: all of it cached
    recalled = " ".join(m.text for m in plan.recalled)
    sent = ask(f"({recalled})\n\n{msgs[0]['content']}")  # what the message recalls, before it
    out = ex.execute(req)
    ref = smollm.generate(smollm.plain_prompt(system, sent), None, 1.0, 24)
    assert out.text == ref.text and out.completion_tokens == len(ref.token_ids), (out.text, ref.text)
    assert out.extra["memories_used"] == plan.used()
    head = len(smollm.renderer.encode(smollm.split_prompt(system, sent).segment, first=True))
    assert out.kv_tokens == head  # the system turn is the cached segment, all of it


def recall_scores(smollm, memories, queries, **opts) -> int:
    planner = MemoryPlanner(smollm, RecallOptions(segment_tokens=0, **opts))
    # the pinned memory is the whole segment: every case memory is a recall candidate
    mems = (MemoryItem("p", "My name is Sam.", pinned=True),
            *(MemoryItem(str(i), t) for i, t in enumerate(memories)))
    hits = 0
    for question, relevant in queries:
        plan = planner.plan(ExecutionRequest("t", "u", ask(question), memories=mems))
        assert [m.id for m in plan.segment] == ["p"]
        hits += bool({int(m.id) for m in plan.recalled} & relevant)
    return hits


@pytest.mark.parametrize("name", list(SETS))
def test_recall_picks_the_relevant_memory(smollm, name):
    memories, queries = SETS[name]
    top3 = recall_scores(smollm, memories, queries)  # the defaults: 3, cosine >= 0.1
    top1 = recall_scores(smollm, memories, queries, top_k=1, min_similarity=-1.0)
    print(f"recall {name}: top-1 {top1}/{len(queries)}, top-3 (cos >= 0.1) {top3}/{len(queries)}")
    # measured 9-10/12 top-1 and 10/12 top-3; chance is about 1.3/12 top-1, 3.6/12 top-3
    assert top1 >= 8 and top3 >= 9


def test_each_memory_is_embedded_once_per_tenant(smollm):
    planner = MemoryPlanner(smollm, RecallOptions(segment_tokens=0))
    mems = (MemoryItem("p", "My name is Sam.", pinned=True),
            *(MemoryItem(str(i), t) for i, t in enumerate(SETS["A (tuned on)"][0])))
    planner.plan(ExecutionRequest("t", "u", ask("What is 17 times 23?"), memories=mems))
    assert planner.stats()["misses"] == 11  # 10 candidates + the message (not the pinned)
    planner.plan(ExecutionRequest("t", "u2", ask("And 18 times 23?"), memories=mems))
    assert planner.stats()["misses"] == 12 and planner.stats()["hits"] == 10
    planner.plan(ExecutionRequest("t2", "u", ask("And 18 times 23?"), memories=mems))
    assert planner.stats()["per_tenant"] == {"t": 12, "t2": 11}  # never shared


NINETEEN = [
    "I was born in Nairobi.", "My favourite sport is tennis.", "I am vegetarian.",
    "I have two cats.", "I work as a nurse.", "I live in Lyon.", "I drive an electric car.",
    "My daughter is called Ana.", "I am learning Spanish.", "I run marathons.",
    "I hate cilantro.", "My budget is 50 euros.", "I use metric units.",
    "I work from home on Fridays.", "I am allergic to peanuts.", "My wife is diabetic.",
    "I like jazz music.", "I play the piano.", "I grew up near the sea.",
]


def test_the_reminders_pick_restates_only_memories_that_stand_out(smollm):
    """A message related to none of the memories re-states none of them (the two best
    scores of unrelated memories are no pick: next to the question they outweigh the
    tenant's instructions); a related one re-states its memory."""
    planner = MemoryPlanner(smollm)
    for message in ("What is your name?", "Hello!"):
        assert planner.relevant("t", NINETEEN, message, 2) == [], message
    assert planner.relevant("t", NINETEEN, "Where should I charge my car?", 2) == [
        "I drive an electric car."]
    assert planner.relevant("t", NINETEEN, "Suggest a jazz album for me.", 2) == [
        "I like jazz music."]
    assert "I am learning Spanish." in planner.relevant(
        "t", NINETEEN, "How do I say thank you in the language I am learning?", 2)
