"""The loop guard (injection/engine/decoding/loops.py): a guarded reply never holds the same
run of n of its own tokens twice, is the unguarded reply token for token until that reply
would first repeat one, leaves a reply that does not repeat alone, never bans the end of
turn and never leaves a row without a token; the planner puts it in a turn's sampling where
the request, else the model's profile, asks for it, on the batch engine only."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from injection.base import ExecutionRequest
from injection.engine.batch import BatchEngine
from injection.engine.decoding.loops import guard, verbatim
from injection.engine.guidance import contrast
from injection.engine.guidance.contrast import Guide
from injection.model import profiles
from tests.injection.test_batch import _in_threads
from tests.injection.test_planner import ASK, TextOnly, planner

N = 4


def _row(gen: list[int], n: int = 3, text: str = "prose"):
    """A row with its reply's ids and text (the engine's ``GenerationWatch`` keeps it)."""
    return SimpleNamespace(sampler=SimpleNamespace(no_repeat=n, grams={}, indexed=0), gen=gen,
                           watch=SimpleNamespace(text=text))


def test_guard_bans_the_token_that_would_repeat_a_run_of_the_reply():
    scores = torch.zeros(4, 10)
    rows = [_row([5, 6, 7, 5, 6]), _row([5, 6, 9, 5, 6]), _row([5, 6, 7, 5, 6], n=0),
            _row([1, 2, 3, 4, 1], n=2)]
    out = guard(rows, scores, eos={9})
    assert torch.isinf(out[0]).nonzero().flatten().tolist() == [7]  # "5 6" was followed by 7
    assert torch.isfinite(out[1]).all()  # the end of turn (9) is never banned
    assert torch.equal(out[2], scores[2])  # not guarded
    assert torch.isinf(out[3]).nonzero().flatten().tolist() == [2]  # n=2: "1" was before "2"
    assert torch.equal(scores, torch.zeros(4, 10))  # the caller's tensor is left alone


def test_a_row_the_guard_would_leave_without_a_token_keeps_its_scores():
    only = torch.full((1, 10), -float("inf"))
    only[0, 7] = 0.0  # a decoding constraint left one token, the one that repeats
    assert torch.equal(guard([_row([5, 6, 7, 5, 6])], only, eos=()), only)


def test_a_guided_row_whose_plausible_tokens_are_all_banned_writes_its_own_next_token():
    """A guide's or lean's scores keep only the tokens the model finds plausible, often one:
    where that one would repeat a run, the row takes its model's own next most likely token
    (its scores without the guide), not the loop; an unguided row so pinned (a decoding
    constraint's) keeps its scores."""
    pinned = torch.full((2, 10), -float("inf"))
    pinned[:, 7] = 0.0  # the guided scores: one plausible token, the repeat
    own = torch.arange(20, dtype=torch.float32).reshape(2, 10)  # the model's: 9 best, then 8
    guided, plain = _row([5, 6, 7, 5, 6]), _row([5, 6, 7, 5, 6])
    guided.lean, plain.lean = torch.zeros(10), None
    rows = [guided, plain]
    out = guard(rows, pinned, eos={9}, own=lambda r: own[rows.index(r)])
    assert torch.isinf(out[0, 7]) and int(out[0].argmax()) == 9  # its own best, 7 banned
    assert torch.equal(out[0, :7], own[0, :7])
    assert torch.equal(out[1], pinned[1])  # unguided: a constraint's choice stands


def test_guided_replies_are_guarded_too(adapter, engine, monkeypatch):
    """Through the engine: a reply guided against the same question without its memory
    (``contrast.Guide``) never repeats a run of the guard's length, also where its model
    finds one token plausible at each step (the plausible share at 1: the pinned case)."""
    monkeypatch.setattr(contrast, "_LOG_PLAUSIBLE", 0.0)
    def ids(system):
        msgs = [{"role": "user", "content": "Tell me a story."}]
        return adapter.renderer.encode(adapter.render_chat(
            ([{"role": "system", "content": system}] if system else []) + msgs), first=True)

    with_memory, without = ids("Answer in French, always."), ids("")
    free = engine.run(None, 1.0, with_memory, 48, guide=Guide(1.0, None, without))
    assert _repeats(free.token_ids, N) is not None  # else this test shows nothing
    out = engine.run(None, 1.0, with_memory, 48, guide=Guide(1.0, None, without), no_repeat=N)
    assert _repeats(out.token_ids, N) is None


def test_no_guarded_row_long_enough_is_the_same_tensor():
    scores = torch.zeros(2, 10)
    assert guard([_row([1, 2]), _row([], n=0)], scores, eos=()) is scores


@pytest.mark.parametrize(("text", "aside"), [
    ("Sure. Here it is:\n```python\ndef f(x):\n    return f(x", True),  # an open fence
    ("Done:\n```python\nprint(1)\n```\nThat prints one, one", False),  # closed again
    ('  {"name": "a", "name', True), ('[{"a": 1}, {"a"', True),  # a JSON reply
    ("Here:\n| a | b |\n| 1 | 2", True), ("Steps:\n    x = x + 1", True),  # a table, code
    ("The sky is blue because the sky is blue", False)])
def test_the_guard_stands_aside_where_a_form_repeats_by_nature(text, aside):
    assert verbatim(text) is aside


def test_guard_reads_the_reply_text_as_it_grows_and_stands_aside_in_a_code_fence():
    row = _row([0, 1, 2, 0, 1], text=" a b c a b")
    scores = torch.zeros(1, 6)
    assert torch.isinf(guard([row], scores, eos=())[0, 2])
    row.gen += [3, 4, 0, 1, 2, 0, 1]  # a fence opened: "a b" then "c" again is left alone
    row.watch.text += "```\n a b c a b"
    assert guard([row], scores, eos=()) is scores


def _repeats(ids: list[int], n: int) -> int | None:
    """The index of the first token that completes a run of ``n`` seen before, or None."""
    seen = set()
    for k in range(n - 1, len(ids)):
        gram = tuple(ids[k - n + 1:k + 1])
        if gram in seen:
            return k
        seen.add(gram)
    return None


@pytest.fixture
def engine(adapter):
    eng = BatchEngine(adapter, max_batch=4)
    yield eng
    eng.close()


def test_guarded_replies_never_repeat_and_equal_the_free_ones_until_they_would(
        adapter, engine):
    """The random demo model loops under greedy decoding; guarded, alone and beside other
    rows (one with the guard off, whose reply is unchanged by its neighbours)."""
    prompts = [adapter.renderer.encode(adapter.render_chat(
        [{"role": "user", "content": q}]), first=True) for q in ("Tell me a story.", "What is rain?")]
    free = [engine.run(None, 1.0, p, 48) for p in prompts]
    looped = [_repeats(out.token_ids, N) for out in free]
    assert any(k is not None for k in looped)  # else this test shows nothing
    alone = [engine.run(None, 1.0, p, 48, no_repeat=N) for p in prompts]
    together = _in_threads([lambda p=p: engine.run(None, 1.0, p, 48, no_repeat=N)
                            for p in prompts] + [lambda: engine.run(None, 1.0, prompts[0], 48)])
    for k, first, out, again in zip(looped, free, alone, together, strict=False):
        assert _repeats(out.token_ids, N) is None
        assert out.token_ids == again.token_ids
        upto = len(first.token_ids) if k is None else k
        assert out.token_ids[:upto] == first.token_ids[:upto]
    assert together[2].token_ids == free[0].token_ids


def test_the_planner_guards_where_the_request_else_the_profile_asks(adapter, tmp_path):
    text = TextOnly(adapter.tokenizer)
    on = planner(text, batching=True)
    pref = "Always answer me in lowercase."

    def sampling(plans, **kw):
        return plans.plan(ExecutionRequest("t", "u", ASK, pref, **kw)).sampling

    assert "no_repeat" not in sampling(on)  # no profile: off
    assert sampling(on, loop_guard=True)["no_repeat"] == N
    assert sampling(on, loop_guard=True, injection_enabled=False)["no_repeat"] == N
    assert "no_repeat" not in sampling(planner(text), loop_guard=True)  # not the engine
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"model_key": "k" * 16, "mechanisms": {
        "guidance": {"default": 0.0}, "loop_guard": {"default": "on", "ngram": 6}}}))
    text._profile = profiles.read(path)
    assert sampling(on)["no_repeat"] == 6  # the profile's default and run length
    assert "no_repeat" not in sampling(on, loop_guard=False)  # the request's switch wins
