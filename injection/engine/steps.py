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
from injection.engine import emphasis
from injection.engine.batchcache import BatchCache
from injection.engine.batchrow import RowJob
from injection.kvcache.packed import PackedKV


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
                adapter.build_cache(job.prefix, job.alpha) if job.prefix is not None
                else DynamicCache(config=adapter._cache_config))
        tokens = torch.tensor([job.new_ids if ids is None else ids], device=adapter.device)
        bias = emphasis.prefill_bias(job.emphasis, job.emphasis_spans,
                                     cache.get_seq_length() + tokens.shape[1],
                                     adapter.device, adapter.dtype)
        extra = {} if bias is None else {"position_bias": bias}  # none: today's call
        out = adapter.model(input_ids=tokens, past_key_values=cache, use_cache=True,
                            logits_to_keep=1, **extra)
        logits = out.logits[0, -1]
    if past is None:
        job.kv_transfer_ms, job.kv_bytes_gpu = timer.elapsed_ms(), timer.peak_bytes
    return out.past_key_values, logits


def decode(adapter: Any, batch: BatchCache, rows: list[RowJob]) -> torch.Tensor:
    """One decoding step for every row: the rows' next-token logits ``[B, V]``."""
    mask, positions, cache_position = batch.step_inputs(adapter.device)
    last = torch.tensor([[r.gen[-1]] for r in rows], device=adapter.device)
    bias = emphasis.decode_bias(rows, batch.pads, batch.width, adapter.device, adapter.dtype)
    extra = {} if bias is None else {"position_bias": bias}  # none: today's call
    with torch.inference_mode():
        out = adapter.model(input_ids=last, attention_mask=mask, position_ids=positions,
                            cache_position=cache_position, past_key_values=batch.cache,
                            use_cache=True, **extra)
        return out.logits[:, -1]


def row_output(job: RowJob, reason: str, seq: PackedKV | None) -> GenerationOutput:
    """What a finished row hands back to its caller."""
    first = job.watch.first_token_at
    return GenerationOutput(
        job.watch.text, list(job.gen), job.prompt_ids, kv_transfer_ms=job.kv_transfer_ms,
        kv_bytes_gpu=job.kv_bytes_gpu, finish_reason=reason,
        first_token_ms=(first - job.started) * 1000.0 if first is not None else 0.0,
        sequence_kv=seq,
    )


def bytes_per_token(adapter: Any) -> int:
    cfg = adapter.model.config.get_text_config(decoder=True)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    elem = torch.tensor([], dtype=adapter.dtype).element_size()
    return 2 * adapter.num_layers * adapter.num_kv_heads * head_dim * elem


def free_accelerator() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
