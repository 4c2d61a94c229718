"""Rows that begin with the same K/V (a tenant's instructions) attend to it in one read
(``injection/engine/heads.py``, ``injection/model/shared_attention.py``): the same
attention as the model's up to float rounding, rows grouped only when their first
columns are equal, and the same greedy replies through the engine."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from injection import build_executor
from injection.base import ExecutionRequest
from injection.engine import batchcache, heads, steps
from injection.metrics import Metrics
from injection.model.loading import load_adapter
from injection.model.shared_attention import HeadGroup, attend

HQ, HKV, D = 8, 2, 16


def _model_attention(q, k, v, mask):
    """The model's attention for these shapes: SDPA over K/V repeated per query head."""
    rep = HQ // HKV
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25).transpose(1, 2)


def _batch(pads: list[int], head: int, width: int, seed: int):
    """K/V of rows right-aligned after ``pads``, each beginning with the same ``head``
    columns; a query per row; the padding mask."""
    gen = torch.Generator().manual_seed(seed)
    rows = len(pads)
    k, v = torch.zeros(rows, HKV, width, D), torch.zeros(rows, HKV, width, D)
    hk, hv = torch.randn(HKV, head, D, generator=gen), torch.randn(HKV, head, D, generator=gen)
    for r, p in enumerate(pads):
        k[r, :, p:p + head], v[r, :, p:p + head] = hk, hv
        k[r, :, p + head:] = torch.randn(HKV, width - p - head, D, generator=gen)
        v[r, :, p + head:] = torch.randn(HKV, width - p - head, D, generator=gen)
    q = torch.randn(rows, HQ, 1, D, generator=gen)
    mask = (torch.arange(width)[None, :] >= torch.tensor(pads)[:, None])[:, None, None, :]
    return q, k, v, mask


@pytest.mark.parametrize("grouped", [(0, 1, 2, 3), (1, 3), (0, 2, 3)],
                         ids=["every row", "rows apart", "some rows"])
def test_grouped_attention_is_the_models_up_to_rounding(grouped):
    pads, head, width = [3, 0, 7, 5], 20, 40
    q, k, v, mask = _batch(pads, head, width, 1)
    group = HeadGroup(grouped, grouped[0], pads[grouped[0]], head,
                      tuple(pads[r] + head for r in grouped))
    got = attend(q, k, v, mask, 0.25, [group], _model_attention)
    want = _model_attention(q, k, v, mask)
    assert got.shape == want.shape == (4, 1, HQ, D)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def _row(head, own: int, seed: int) -> DynamicCache:
    """A one-row cache of ``head`` (K, V per layer) then ``own`` random columns."""
    gen = torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    for i, (hk, hv) in enumerate(head):
        k = torch.cat([hk, torch.randn(1, HKV, own, D, generator=gen)], 2)
        v = torch.cat([hv, torch.randn(1, HKV, own, D, generator=gen)], 2)
        cache.update(k, v, i)
    return cache


def test_rows_are_grouped_only_when_their_first_columns_are_equal():
    gen = torch.Generator().manual_seed(0)
    head = [(torch.randn(1, HKV, 70, D, generator=gen), torch.randn(1, HKV, 70, D, generator=gen))
            for _ in range(2)]
    other = [(k.clone(), v.clone()) for k, v in head]
    other[1][1][0, 0, 3, 0] += 1e-3  # one value in one layer differs
    key = (123, 70)
    batch = batchcache.BatchCache()
    batch.add(_row(head, 5, 1), key)
    batch.add(_row(head, 9, 2), key)
    batch.add(_row(other, 4, 3), key)  # claims the key, but its K/V differ: not grouped
    batch.add(_row(head, 2, 4), None)
    assert batch.heads == [key, key, None, None]
    [group] = heads.groups(batch)
    assert group.rows == (0, 1) and group.tokens == 70
    assert group.starts == (batch.pads[0] + 70, batch.pads[1] + 70)
    batch.keep([1, 3])  # rows leave: the heads follow their rows
    assert batch.heads == [key, None] and heads.groups(batch) == []
    snap = batch.snapshot()
    batch.add(_row(head, 3, 5), key)
    assert len(heads.groups(batch)) == 1
    batch.restore(snap)
    assert batch.heads == [key, None]


INSTRUCTIONS = ("You are the assistant of a small bakery. Answer questions about bread, cakes, "
                "opening hours and orders. Be brief and friendly. ") * 6


def test_members_of_one_tenant_get_the_same_replies_reading_the_head_once(
        adapter, chat_messages, monkeypatch):
    """The demo model through the executor, 4 members of one tenant with long instructions
    at once: greedy replies equal with shared heads and with a copy read per row. (Whether
    their rows overlap in a step depends on scheduling; the grouping itself is tested above
    without threads.)"""
    seen = []
    real_groups = heads.groups
    monkeypatch.setattr(steps.heads, "groups",
                        lambda batch: seen.append(len(out := real_groups(batch))) or out)
    replies = []
    for share in (True, False):
        monkeypatch.setattr(steps, "SHARE_HEADS", share)
        ex = build_executor(adapter, batch_max=4, metrics=Metrics())
        reqs = [ExecutionRequest("t", f"u{i}", chat_messages, f"My name is {n}.",
                                 instructions=INSTRUCTIONS, max_new_tokens=16, reminder=False,
                                 contrast=0.0, constrain=False, loop_guard=False)
                for i, n in enumerate(("Ana", "Bo", "Chen", "Dara"))]
        try:
            for r in reqs:  # the tenant's segment and each member's cached first
                ex.warm(r.tenant, r.user, r.preference_text, instructions=INSTRUCTIONS)
            with ThreadPoolExecutor(4) as pool:
                replies.append([r.text for r in pool.map(ex.execute, reqs)])
        finally:
            ex.close()
    assert replies[0] == replies[1]


def _tenant_batch(adapter, head, key):
    """Three rows of the demo model: the tenant's K/V, then each member's own tokens."""
    batch = batchcache.BatchCache()
    for own in ("I am Ana.", "Bo here, hello there, how are you?", "Chen."):
        cache = adapter.build_cache(head, 1.0, room=8)
        ids = torch.tensor([adapter.tokenizer(own)["input_ids"]])
        with torch.inference_mode():
            adapter.lean(ids, None, None, cache)
        batch.add(cache, key)
    return batch


def test_a_decoding_step_with_a_shared_head_gives_the_models_logits(demo_model_path,
                                                                     monkeypatch):
    """Deterministic, no threads: rows that begin with the tenant's K/V are grouped, and
    a decoding step through ``steps.decode`` gives the logits of a step that reads a copy
    per row, up to rounding, with the same next tokens. Its own adapter: the session's may
    have had its lean step taken away by another test."""
    adapter = load_adapter(str(demo_model_path), device="cpu", dtype="fp32")
    assert adapter.lean is not None
    head = adapter.compute_kv(INSTRUCTIONS)
    assert head.num_tokens >= heads.MIN_TOKENS
    key = (id(head), head.num_tokens)
    rows = [type("Row", (), {"gen": [7]})() for _ in range(3)]
    logits, seen = {}, []
    real_groups = heads.groups
    monkeypatch.setattr(steps.heads, "groups",
                        lambda batch: seen.append(len(out := real_groups(batch))) or out)
    for share in (True, False):
        monkeypatch.setattr(steps, "SHARE_HEADS", share)
        batch = _tenant_batch(adapter, head, key)
        assert batch.heads == [key] * 3 and len(set(batch.pads)) > 1  # padded rows
        logits[share] = steps.decode(adapter, batch, rows)
    assert seen == [1]  # the shared step grouped the three rows; the other did not ask
    assert torch.allclose(logits[True], logits[False], atol=1e-4, rtol=1e-4)
    assert torch.equal(logits[True].argmax(-1), logits[False].argmax(-1))
