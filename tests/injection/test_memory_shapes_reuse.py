"""Long conversations keep continuing their cached K/V with memories as people write them
(issue 32): one 60-word memory, one 4,000-character memory. Every user turn deep in a chat
carries a memory reminder; the reminder is bounded, and the history's block cut sizes each
turn with its reminder, so the kept history stays a stable prefix instead of a window that
slides (and re-prefills) every turn. Demo model, real executor, batch engine and
conversation store; 24-token replies, a 1,024-token history budget. Twenty memories, past
the member segment's budget: the ones each message recalls are re-stated before it, so a
change in what is recalled leaves the history before the new turn cached."""

from __future__ import annotations

import pytest

from injection import build_executor
from injection.base import ExecutionRequest, MemoryItem
from injection.metrics import Metrics
from injection.prompting.reminder import REMINDER_TOKENS, Reminder

SIXTY_WORDS = (
    "I am a vegetarian who cooks for my partner and our two young children most evenings. "
    "We live in a small flat in Oslo with a tiny kitchen, two hobs and an old oven. I "
    "prefer quick recipes under thirty minutes, seasonal vegetables, little waste, and no "
    "spicy food because the kids will not eat it at all.")
LONG = " ".join(f"Note {i}: I keep my pantry stocked with rice, lentils, oats and canned "
                f"tomatoes, and I shop at the market on Saturday mornings." for i in range(32))
SHAPES = {"sixty-words": [SIXTY_WORDS], "4000-chars": [LONG]}
TWENTY = [f"Memory {i}: I once spent a long weekend in town number {i} with my cousin "
          f"and we walked along the river every morning." for i in range(20)]
TURNS = 30


@pytest.fixture
def executor(adapter):
    ex = build_executor(adapter, batch_max=2, metrics=Metrics(),
                        conversation_prefill_opening=False)
    yield ex
    ex.close()


def question(k: int) -> str:
    return f"Turn {k}: what could I cook on a rainy evening this week?"


def reuse(ex, memories: list[str], used: list | None = None, **kw) -> list[float]:
    """The cached share of each turn's prompt over a TURNS-turn conversation (``used``:
    each turn's recalled memory ids appended; ``kw``: request fields)."""
    items = tuple(MemoryItem(str(i), text) for i, text in enumerate(memories))
    history, shares = [], []
    for k in range(TURNS):
        msgs = [*history, {"role": "user", "content": question(k)}]
        res = ex.execute(ExecutionRequest(
            "t1", "u1", msgs, memories[0], memories=items, max_new_tokens=24,
            history_token_budget=1024, conversation_id="c1", **kw))
        shares.append(res.cached_tokens / res.prompt_tokens)
        if used is not None:
            used.append(tuple(m["id"] for m in res.extra["memories_used"]
                              if m["how"] == "recalled"))
        history = [*msgs, {"role": "assistant", "content": res.text}]
    return shares


@pytest.mark.parametrize("shape", SHAPES)
def test_turns_keep_reusing_their_conversation_with_real_memories(executor, shape):
    shares = reuse(executor, SHAPES[shape])
    later = shares[1:]  # turns 2..30
    served = sum(s >= 0.5 for s in later) / len(later)
    assert served >= 0.8, (shape, [round(s, 2) for s in shares])


@pytest.mark.parametrize("reminder", [None, False])
def test_twenty_memories_keep_their_history_cached_when_the_recalled_ones_change(
        adapter, reminder):
    """Memories past the segment re-stated before each message change from message to
    message: with the reminder off (``False``), each message's 3 recalled (any cosine: on
    the demo model's random embeddings the pick changes); by default, those of them the
    reminder's own pick holds. Before, recalled memories opened the prompt, and every
    change re-prefilled the whole history after the system turn."""
    ex = build_executor(adapter, batch_max=2, metrics=Metrics(),
                        conversation_prefill_opening=False, memory_recall_min_similarity=-1.0)
    try:
        used: list = []
        shares = reuse(ex, TWENTY, used, reminder=reminder)
    finally:
        ex.close()
    if reminder is False:  # 3 recalled, as many as fit the reminder's 64 tokens shown
        assert all(used) and len(set(used)) >= 5
    else:
        assert len(set(used)) > 1  # what is re-stated changes
    served = sum(s >= 0.5 for s in shares[1:]) / (TURNS - 1)
    assert served >= 0.8, [round(s, 2) for s in shares]


def test_a_long_memory_is_reminded_within_the_reminder_budget(adapter):
    tok = adapter.renderer.tokenizer
    req = ExecutionRequest("t1", "u1", [{"role": "user", "content": "Hi"}], LONG)
    remind = Reminder.for_request(req, adapter.renderer, True)
    n = len(tok(remind.text, add_special_tokens=False)["input_ids"])
    assert remind.text.endswith("…") and n <= REMINDER_TOKENS
    assert LONG.startswith(remind.text[:-1])
