"""A group prefill's K/V written once, where the rows will read it (``steps.prefill_group``
on a model the lean step serves, with plain cache layers).

The general path copies a tenant's K/V four times per row before the rows decode: each
row's prefix into a buffer of its own (``build_cache``), the buffers into one padded
batch, the batch and the forward's new columns into a longer one (``cat`` in every
layer), and each row's real columns out again (another ``cat``). For 15 members of one
tenant (790 columns each) those copies took as long as the forward's linear layers.

Here every layer's ``[rows, H, P + N, D]`` buffers are made once: each row's prefix is
written from its cached pieces right-aligned in the first ``P`` columns (values scaled
by the row's alpha), and the forward writes its ``N`` new columns in place
(``SlabLayer``). A row's new tokens are left-aligned in those columns, padding after
them, so its real columns are one run (prefix, then new tokens) that the row's cache is
a view of: ``BatchCache.add`` copies it into the batch, the only copy. The mask hides
each row's padding, positions count real tokens only, and the lean step reads each row's
logits at its last real token (``last``). A padding position comes after every real
one, so no real token attends to it.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from injection.engine.batchcache import SlabLayer
from injection.kvcache.pieces import KVPieces

__all__ = ["prefill"]


def prefill(adapter: Any, lean: Any, jobs: list[Any], caches: bool
            ) -> tuple[list[DynamicCache], torch.Tensor]:
    """``steps.prefill_group``'s result for ``jobs`` (see module docstring)."""
    dev = adapter.device
    plens = [j.prefix.num_tokens if j.prefix is not None else 0 for j in jobs]
    nlens = [len(j.new_ids) for j in jobs]
    width, n = max(plens), max(nlens)
    keys, values = _buffers(adapter, jobs, plens, width + n)
    cache = DynamicCache()
    cache.layers = [SlabLayer(keys[i], values[i], len(jobs), width, spare=False)
                    for i in range(adapter.num_layers)]
    ids = torch.full((len(jobs), n), adapter.tokenizer.pad_token_id or 0, device=dev)
    mask = torch.zeros((len(jobs), width + n), dtype=torch.long, device=dev)
    pos = torch.zeros((len(jobs), n), dtype=torch.long, device=dev)
    for r, (job, p, k) in enumerate(zip(jobs, plens, nlens, strict=True)):
        ids[r, :k] = torch.tensor(job.new_ids, device=dev)
        mask[r, width - p: width + k] = 1
        pos[r] = torch.arange(p, p + n, device=dev)
    last = torch.tensor([k - 1 for k in nlens], device=dev)
    logits = lean(ids, mask, pos, cache, last=last)
    if not caches:
        return [], logits
    return [_row(keys, values, r, width - p, p + k)
            for r, (p, k) in enumerate(zip(plens, nlens, strict=True))], logits


def _buffers(adapter: Any, jobs: list[Any], plens: list[int], columns: int
             ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer, ``[rows, H, columns, D]`` keys and values: each row's prefix right-aligned
    before column ``max(plens)``, zeros before it; the forward writes the rest. A buffer
    per layer (about 10 MB), not one for all: the allocator reuses buffers of that size
    from one burst to the next, where one of 300 MB is fresh memory every time."""
    width = max(plens)  # some row has a prefix (``steps.prefill_group``)
    like = next(j.prefix for j in jobs if j.prefix is not None)
    layers, heads, _, dim = like.shape
    with torch.inference_mode(False):
        keys, values = ([torch.empty((len(jobs), heads, columns, dim), dtype=like.dtype,
                                     device=adapter.device) for _ in range(layers)]
                        for _ in range(2))
    with torch.no_grad():
        for r, (job, p) in enumerate(zip(jobs, plens, strict=True)):
            for k, v in zip(keys, values, strict=True):
                k[r, :, : width - p] = 0
                v[r, :, : width - p] = 0
            if job.prefix is None:
                continue
            adapter._check_compatible(job.prefix)
            KVPieces.of(job.prefix).fill_layers([k[r, :, width - p:] for k in keys],
                                                [v[r, :, width - p:] for v in values])
            if job.alpha != 1.0:
                for v in values:
                    v[r, :, width - p: width].mul_(job.alpha)
    return keys, values


def _row(keys: list[torch.Tensor], values: list[torch.Tensor], r: int, start: int, n: int
         ) -> DynamicCache:
    """Row ``r``'s ``n`` real columns from ``start`` as a batch-1 cache of views."""
    row = DynamicCache()
    row.layers = [SlabLayer(k[r:r + 1, :, start:], v[r:r + 1, :, start:], 1, n, spare=False)
                  for k, v in zip(keys, values, strict=True)]
    return row
