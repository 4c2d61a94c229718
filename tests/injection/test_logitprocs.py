"""Sampling parity: the batch engine's processors (``logitprocs``) equal transformers'
``LogitsProcessorList`` for the same rows, and replies under a generation config with
a repetition penalty, no-repeat n-grams and top-k equal ``generate()``."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from injection.engine.batch import BatchEngine
from injection.engine.logitprocs import Knobs, TokenHistory, build_ids, process
from tests.injection.test_batch import PREFS, _in_threads, _row

# (length, temperature, top_p): greedy and sampled rows of different lengths in one batch
ROWS = [(40, 0.0, 1.0), (7, 0.7, 0.9), (25, 1.3, 1.0), (2, 1.0, 0.5), (33, 0.0, 0.8)]


def _theirs(ids: list[int], scores: torch.Tensor, knobs: Knobs, temp: float, top_p: float):
    procs = LogitsProcessorList()
    if knobs.penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(knobs.penalty))
    if knobs.ngram:
        procs.append(NoRepeatNGramLogitsProcessor(knobs.ngram))
    if temp > 0:  # generate() adds the warpers only when sampling
        if temp != 1.0:
            procs.append(TemperatureLogitsWarper(temp))
        if knobs.top_k:
            procs.append(TopKLogitsWarper(knobs.top_k))
        if top_p < 1.0:
            procs.append(TopPLogitsWarper(top_p))
    return procs(torch.tensor([ids]), scores.clone())


@pytest.mark.parametrize("knobs", [Knobs(1.3, 0, 0), Knobs(1.0, 2, 0), Knobs(1.0, 3, 20),
                                   Knobs(0.8, 1, 0), Knobs(1.2, 4, 50), Knobs(1.0, 0, 0)])
def test_batched_processors_equal_transformers_logits_processors(knobs):
    gen = torch.Generator().manual_seed(3)
    vocab = 300
    # a small alphabet, so rows repeat n-grams and tokens
    seqs = [torch.randint(0, 12, (n,), generator=gen).tolist() for n, _, _ in ROWS]
    scores = torch.randn(len(ROWS), vocab, generator=gen) * 3
    ours = process(scores.clone(), knobs, build_ids(seqs, scores.device),
                   [t for _, t, _ in ROWS], [p for _, _, p in ROWS])
    for i, (_, temp, top_p) in enumerate(ROWS):
        want = _theirs(seqs[i], scores[i:i + 1], knobs, temp, top_p)
        assert torch.equal(ours[i:i + 1], want), f"row {i}"
    if knobs.ngram or knobs.penalty != 1.0:
        assert not torch.equal(ours, scores)  # the case exercised the processors


class _Row:
    def __init__(self, ids):
        self.input_ids, self.gen = list(ids), []


def test_token_history_grows_by_a_column_and_rebuilds_when_rows_change():
    rows = [_Row([1, 2, 3]), _Row([4])]
    hist = TokenHistory()
    assert hist.of(rows, torch.device("cpu")).tolist() == [[1, 2, 3], [-1, -1, 4]]
    rows[0].gen.append(9)
    rows[1].gen.append(8)
    assert hist.of(rows, torch.device("cpu")).tolist() == [[1, 2, 3, 9], [-1, -1, 4, 8]]
    assert hist.of(rows[1:], torch.device("cpu")).tolist() == [[4, 8]]


@pytest.fixture
def strict_config(adapter):
    """The demo model's generation config with every processor the engine honours on."""
    gc = adapter.model.generation_config
    saved = (gc.repetition_penalty, gc.no_repeat_ngram_size, gc.top_k)
    gc.repetition_penalty, gc.no_repeat_ngram_size, gc.top_k = 1.2, 3, 40
    yield gc
    gc.repetition_penalty, gc.no_repeat_ngram_size, gc.top_k = saved


def test_greedy_replies_under_the_models_processors_equal_generate(adapter, strict_config):
    rows = [_row(adapter, p, "What should I cook tonight?") for p in PREFS]
    alone = [adapter.generate(p, kv, 1.0, 24) for p, kv in rows]
    eng = BatchEngine(adapter, max_batch=4)
    try:
        outs = _in_threads([lambda r=r: eng.generate(r[0], r[1], 1.0, 24) for r in rows])
    finally:
        eng.close()
    assert [o.token_ids for o in outs] == [a.token_ids for a in alone]
    assert eng.counters["batched_steps"] > 0
    for out in outs:  # the n-gram ban held: no 3-gram twice in prefix + prompt + reply
        grams = [tuple(out.token_ids[i:i + 3]) for i in range(len(out.token_ids) - 2)]
        assert len(grams) == len(set(grams))


def test_a_seeded_sampled_reply_with_top_k_equals_generate(adapter, strict_config):
    prompt, kv = _row(adapter, PREFS[1], "What should I cook tonight?")
    seeded = {"temperature": 0.8, "top_p": 0.9, "seed": 11}
    want = adapter.generate(prompt, kv, 1.0, 20, **seeded)
    eng = BatchEngine(adapter, max_batch=4)
    try:
        other = _row(adapter, PREFS[0], "Where should I travel?")
        outs = _in_threads([lambda: eng.generate(prompt, kv, 1.0, 20, **seeded),
                            lambda: eng.generate(other[0], other[1], 1.0, 20)])
    finally:
        eng.close()
    assert outs[0].token_ids == want.token_ids
