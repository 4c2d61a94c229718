"""The model-facing half of the batch engine: one prefill, one decoding step, a row's output.

``BatchEngine`` (``batch.py``) schedules; these run the forward passes on the adapter's
model and shape what a finished row hands back. No state of their own.
"""

from __future__ import annotations

import gc
from typing import Any

import torch
from transformers import DynamicCache

from injection.base import GenerationOutput
from injection.devices import KVTimer
from injection.engine import heads
from injection.engine.batchcache import BatchCache, SlabLayer
from injection.engine.batchrow import RowJob
from injection.engine.guidance import lean
from injection.engine.prefill import in_place
from injection.kvcache.packed import PackedKV
from injection.model.lean_step import serving


def prefill(adapter: Any, job: RowJob, ids: list[int] | None = None,
            past: Any = None) -> tuple[Any, torch.Tensor]:
    """The row's new tokens (or ``ids``) on its own (alpha-scaled) prefix K/V, batch 1;
    ``past``: the row's cache so far (a chunked prefill's next chunk continues it).

    Returns the row's cache and the logits of its last position; records the K/V
    transfer time and bytes on the job (when it builds the cache).
    """
    with torch.inference_mode():
        with KVTimer(adapter.device) as timer:
            cache = past if past is not None else (
                row_cache(adapter, job) if job.prefix is not None
                else DynamicCache(config=adapter._cache_config))
        tokens = torch.tensor([job.new_ids if ids is None else ids], device=adapter.device)
        if (lean_step := serving(adapter)) is not None:
            logits = lean_step(tokens, None, None, cache)[0]
        else:
            out = adapter.model(input_ids=tokens, past_key_values=cache, use_cache=True,
                                logits_to_keep=1)
            cache, logits = out.past_key_values, out.logits[0, -1]
    if past is None:
        job.kv_transfer_ms, job.kv_bytes_gpu = timer.elapsed_ms(), timer.peak_bytes
    return cache, logits



def row_cache(adapter: Any, job: RowJob) -> DynamicCache:
    """The row's prefix K/V on the model's device, each cached piece copied once into
    layers with room for everything the row prefills (``SlabLayer``: the forward writes
    its tokens in place, so the prefix is not copied again) and ``job.spare`` columns more
    (an empty batch adopts the layers, and decodes into them)."""
    room = len(job.new_ids) + len(job.gen) + job.spare  # a resumed row prefills its tokens
    return adapter.build_cache(job.prefix, job.alpha, room=room,
                               layer=lambda k, v, n: SlabLayer(k, v, 1, n))


def prefill_group(adapter: Any, jobs: list[RowJob], *, caches: bool = True
                  ) -> tuple[list[DynamicCache], torch.Tensor]:
    """Several rows' new tokens in one forward, each after its own (alpha-scaled) prefix.

    Prefixes are right-aligned in a ``[k, H, P, D]`` cache (``P`` the longest), the new
    tokens right-aligned in the ``N`` columns the forward appends; the attention mask hides
    the padding before a prefix and the gap between a prefix and a shorter row's new
    tokens, and positions count real tokens only, so every row sees what it sees alone.
    Returns each row's cache with its real tokens only (batch 1, ready for
    ``BatchCache.add``; none with ``caches`` False: a forward that wants first tokens only)
    and the logits of every row's last token ``[k, V]``.
    """
    lean_step = serving(adapter)
    if lean_step is not None and adapter._cache_config is None and any(
            j.prefix is not None for j in jobs):  # the prefixes copied once (``in_place.py``)
        with torch.inference_mode():
            return in_place.prefill(adapter, lean_step, jobs, caches)
    dev = adapter.device
    plens = [j.prefix.num_tokens if j.prefix is not None else 0 for j in jobs]
    nlens = [len(j.new_ids) for j in jobs]
    width, n = max(plens), max(nlens)
    with torch.inference_mode():
        cache = DynamicCache()
        if width:
            built = [adapter.build_cache(j.prefix, j.alpha) if j.prefix is not None else None
                     for j in jobs]
            for i in range(adapter.num_layers):
                layers = [b.layers[i] if b is not None else None for b in built]
                keys, values = (_aligned(layers, width, attr) for attr in ("keys", "values"))
                cache.update(keys, values, i)
            del built
        ids = torch.full((len(jobs), n), adapter.tokenizer.pad_token_id or 0, device=dev)
        mask = torch.zeros((len(jobs), width + n), dtype=torch.long, device=dev)
        pos = torch.zeros((len(jobs), n), dtype=torch.long, device=dev)
        for r, (job, p, k) in enumerate(zip(jobs, plens, nlens, strict=True)):
            ids[r, n - k:] = torch.tensor(job.new_ids, device=dev)
            mask[r, width - p: width] = 1
            mask[r, width + n - k:] = 1
            pos[r, n - k:] = torch.arange(p, p + k, device=dev)
        if lean_step is not None:
            logits = lean_step(ids, mask, pos, cache)
        else:
            out = adapter.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                                cache_position=torch.arange(width, width + n, device=dev),
                                past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache, logits = out.past_key_values, out.logits[:, -1]
        rows = [_row_cache(cache, r, width, p, n, k)
                for r, (p, k) in enumerate(zip(plens, nlens, strict=True))] if caches else []
        return rows, logits


def _aligned(layers: list[Any], width: int, attr: str) -> torch.Tensor:
    """One layer's prefixes right-aligned in ``[k, H, width, D]`` (zeros before)."""
    some = next(getattr(x, attr) for x in layers if x is not None)
    out = some.new_zeros((len(layers), some.shape[1], width, some.shape[3]))
    for r, layer in enumerate(layers):
        if layer is not None:
            t = getattr(layer, attr)
            out[r, :, width - t.shape[2]:] = t[0]
    return out


def _row_cache(cache: Any, r: int, width: int, p: int, n: int, k: int) -> DynamicCache:
    """Row ``r``'s real tokens (its prefix, then its new tokens) as a batch-1 cache."""
    def real(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t[r:r + 1, :, width - p:width], t[r:r + 1, :, width + n - k:]], dim=2)

    row = DynamicCache()
    for i, layer in enumerate(cache.layers):
        row.update(real(layer.keys), real(layer.values), i)
    return row


SHARE_HEADS = True  # rows sharing a head attend to it in one read (``heads.py``)


def decode(adapter: Any, batch: BatchCache, rows: list[RowJob]) -> torch.Tensor:
    """One decoding step for every row: the rows' next-token logits ``[B, V]``."""
    mask, positions, cache_position = batch.step_inputs(adapter.device)
    last = torch.tensor([[r.gen[-1]] for r in rows], device=adapter.device)
    with torch.inference_mode():
        if (lean_step := serving(adapter)) is not None:  # rows sharing a head: read once
            batch.cache.head_groups = heads.groups(batch) if SHARE_HEADS else []
            return lean_step(last, mask, positions, batch.cache)
        out = adapter.model(input_ids=last, attention_mask=mask, position_ids=positions,
                            cache_position=cache_position, past_key_values=batch.cache,
                            use_cache=True)
        return out.logits[:, -1]


def row_output(job: RowJob, reason: str, seq: PackedKV | None) -> GenerationOutput:
    """What a finished row hands back to its caller."""
    first = job.watch.first_token_at
    return GenerationOutput(
        job.watch.text, list(job.gen), job.prompt_ids, kv_transfer_ms=job.kv_transfer_ms,
        kv_bytes_gpu=job.kv_bytes_gpu, finish_reason=reason,
        first_token_ms=(first - job.started) * 1000.0 if first is not None else 0.0,
        sequence_kv=seq, guide_prefill_tokens=job.guide_prefilled,
        guide_decode_tokens=_guide_steps(job), leans=lean.measured(job),
    )


def _guide_steps(job: RowJob) -> int:
    """The guide's decoding steps: none without a guide, those before it left (``lean.py``),
    else one per row token but the last (no step follows it)."""
    if not job.guide_prefilled:
        return 0
    return job.guide_fed if job.guide_fed is not None else max(0, len(job.gen) - 1)


def bytes_per_token(adapter: Any) -> int:
    cfg = adapter.model.config.get_text_config(decoder=True)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    elem = torch.tensor([], dtype=adapter.dtype).element_size()
    return 2 * adapter.num_layers * adapter.num_kv_heads * head_dim * elem


def kv_format(adapter: Any) -> dict[str, Any]:
    """What one cached token costs for the loaded model: K and V of every layer and KV head,
    in the model's dtype (L1 and the L2 codec store exactly that, before headers)."""
    try:
        per_token = bytes_per_token(adapter)
    except AttributeError:  # an adapter without a transformers config (test doubles)
        per_token = None
    matmul = getattr(adapter, "matmul", None)  # the CPU's decoding kernel (cpu_matmul)
    return {"bytes_per_token": per_token, "dtype": str(getattr(adapter, "dtype", "")),
            "layers": getattr(adapter, "num_layers", None),
            "kv_heads": getattr(adapter, "num_kv_heads", None),
            "cpu_matmul": matmul.summary() if matmul is not None else None}


def free_accelerator() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
