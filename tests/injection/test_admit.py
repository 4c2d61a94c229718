"""``ExecutionRequest.admit`` (budgets, issue 33): asked once, just before generating, with
the prompt's real token count (what ``prompt_tokens`` reports: memories, recalled ones,
reminders, history and template included); the generation is capped to what it grants,
and a refusal raised there generates nothing. With and without the batch engine."""

from __future__ import annotations

import pytest

from injection import build_executor
from injection.base import ExecutionRequest, MemoryItem

MEMORIES = tuple(MemoryItem(str(i), text) for i, text in enumerate((
    "I am vegetarian.", "I live in Lyon.", "I have two cats.", "I prefer short answers.")))


class Refused(Exception):
    pass


@pytest.fixture(params=[0, 2], ids=["adapter", "batch-engine"])
def executor(request, adapter):
    ex = build_executor(adapter, batch_max=request.param)
    yield ex
    ex.close()


def ask(executor, admit, *, memories=MEMORIES, n=24):
    messages = [{"role": "user", "content": "Any plans for dinner?"},
                {"role": "assistant", "content": "Soup, maybe."},
                {"role": "user", "content": "What should I cook tonight?"}]
    return executor.execute(ExecutionRequest("t1", "u1", messages, "", memories=memories,
                                             max_new_tokens=n, admit=admit))


def test_admit_sees_the_prompt_it_is_billed_for_and_caps_the_reply(executor):
    seen: list[int] = []
    capped = ask(executor, lambda n: seen.append(n) or 3)
    assert seen == [capped.prompt_tokens]
    assert capped.completion_tokens <= 3
    again = ask(executor, lambda n: seen.append(n) or 3)  # the segment from cache now
    assert again.cached_tokens > 0 and seen[-1] == again.prompt_tokens == capped.prompt_tokens
    whole = ask(executor, lambda n: seen.append(n) or 1000, memories=())  # more than asked
    assert seen[-1] == whole.prompt_tokens and whole.completion_tokens <= 24
    assert whole.prompt_tokens < capped.prompt_tokens  # the memories are counted


def test_a_refusal_generates_nothing(executor):
    def refuse(n: int) -> int:
        raise Refused(n)

    with pytest.raises(Refused):
        ask(executor, refuse)
    with pytest.raises(ValueError, match="must refuse by raising"):
        ask(executor, lambda n: 0)
