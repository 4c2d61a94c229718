"""Attention emphasis: an additive bias on the attention logits towards chosen key positions.

A row with emphasis ``e`` (nats) and spans ``[(s, e), ...]`` (absolute key positions from
the start of its sequence: the member's memory text tokens) has ``e`` added to every
query's attention logit towards those keys, in every layer and head, before the softmax
(PASTA-style steering; issue 22 section 4). Formulation: transformers' SDPA attention
takes an additive float ``position_bias`` ``[B, 1, q, kv]`` and folds it into the causal /
padding mask (``create_position_bias_mask``); the model forwards it to every layer. So
prefill passes ``[1, 1, 1, kv]`` (broadcast over the row's queries) and a decoding step
``[B, 1, 1, kv]``, each row's spans shifted by its left padding (``BatchCache.pads``).

Exact when off: a forward pass where no row is emphasised passes no bias at all, i.e.
runs exactly the code it ran before emphasis existed. In a batch mixing emphasised and
unemphasised rows, an unemphasised row's bias is all zeros (the same logits; only the
kernel choice can differ at rounding level, as padding already makes it differ).

Cached segments (tenant, member) are computed without bias, so they stay independent of
emphasis; the prompt and the generated tokens attend with it. Conversation links hold
K/V computed under a given emphasis and are keyed by it (``turns.py``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["MAX_EMPHASIS", "Spans", "decode_bias", "default_emphasis", "prefill_bias",
           "resolve", "supports_emphasis"]

MAX_EMPHASIS = 8.0  # nats; requests and tenants are validated against it
# Share of a row's emphasis that tokens the model wrote attend with: its decoding steps,
# and earlier replies read back in a prompt (``quiet`` spans), so a conversation continued
# from its cached link and one prefilled whole see the same biases. 0: only what the
# member, the tenant and the template wrote attends with emphasis. Measured
# (bench_memory_depth.py --emphasis-decode; docs/BENCHMARKS.md, memory depth): at 1 the
# model recites the memory instead of answering.
GENERATED_SCALE = 0.0
Spans = tuple[tuple[int, int], ...]


# Defaults measured per model (bench/bench_memory_depth.py, docs/BENCHMARKS.md "memory
# depth"): model_key -> nats. A model not listed (the random demo model included) is off.
# SmolLM2-135M-Instruct ("b7753234439613b9"): with the bias on its own tokens too it
# recited the memory instead of answering; without it (GENERATED_SCALE 0) it recites no
# more but answers "I'm sorry for ..., as an AI ..." instead (14 % of replies at 3 nats),
# and scored with both failed, 2 and 3 nats gain nothing over the reminder alone on the
# tuning cases (docs/BENCHMARKS.md, memory depth, 2026-11-26): off by default; tenants
# and requests can still turn it on.
MEASURED_DEFAULTS: dict[str, float] = {}


def model_key(adapter: Any) -> str:
    """The model's identity for per-model defaults: config + tokenizer and chat template,
    independent of dtype and device (the fingerprint is not: it includes the dtype)."""
    cached = getattr(adapter, "_emphasis_model_key", None)
    if cached is not None:
        return cached
    key = ""
    model, tok = getattr(adapter, "model", None), getattr(adapter, "tokenizer", None)
    if model is not None and tok is not None and hasattr(model, "config"):
        from injection.model.fingerprint import _VOLATILE_CONFIG_KEYS, tokenizer_digest

        cfg = {k: v for k, v in model.config.to_dict().items()
               if k not in _VOLATILE_CONFIG_KEYS and not k.startswith("_")}
        blob = json.dumps(cfg, sort_keys=True, default=str) + tokenizer_digest(tok)
        key = hashlib.sha256(blob.encode()).hexdigest()[:16]
    try:
        adapter._emphasis_model_key = key
    except AttributeError:
        pass
    return key


def default_emphasis(adapter: Any) -> float:
    """The model's default emphasis (nats) when neither request nor tenant sets one:
    the measured value for this model (``MEASURED_DEFAULTS``), else 0.0 (off)."""
    return MEASURED_DEFAULTS.get(model_key(adapter), 0.0)


def supports_emphasis(adapter: Any) -> bool:
    """Whether the model's attention applies ``position_bias`` (SDPA does; eager would
    silently ignore it, so emphasis is off there)."""
    model = getattr(adapter, "model", None)
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == "sdpa"


def resolve(adapter: Any, requested: float | None) -> float:
    """Effective emphasis: the request's (or tenant's) value, else the model default;
    0.0 where the model cannot apply it."""
    value = default_emphasis(adapter) if requested is None else float(requested)
    if value <= 0.0 or not supports_emphasis(adapter):
        return 0.0
    return min(value, MAX_EMPHASIS)


def _fill(row: torch.Tensor, value: float, spans: Sequence[tuple[int, int]], shift: int,
          limit: int) -> bool:
    """Set ``row[shift + s : shift + e]`` to ``value`` for each span (clipped); any set?"""
    hit = False
    for s, e in spans:
        lo, hi = max(0, shift + int(s)), min(limit, shift + int(e))
        if hi > lo:
            row[lo:hi] = value
            hit = True
    return hit


def prefill_bias(emphasis: float, spans: Spans, kv_len: int, device: Any,
                 dtype: torch.dtype, q_len: int = 1, quiet: Spans = ()) -> torch.Tensor | None:
    """``[1, 1, 1, kv_len]`` bias for a batch-1 prefill whose ``q_len`` queries are the
    last of ``kv_len`` positions (None: no emphasis, pass nothing); ``[1, 1, q_len,
    kv_len]`` when some of them are ``quiet`` (absolute positions of tokens the model
    wrote: their row gets ``GENERATED_SCALE`` of the bias)."""
    if not emphasis or not spans:
        return None
    bias = torch.zeros(kv_len, dtype=torch.float32)
    if not _fill(bias, emphasis, spans, 0, kv_len):
        return None
    first = kv_len - q_len
    rows = [(max(s, first) - first, min(e, kv_len) - first) for s, e in quiet
            if min(e, kv_len) > max(s, first)]
    if not rows:
        return bias.to(device=device, dtype=dtype).view(1, 1, 1, kv_len)
    full = bias.expand(q_len, kv_len).clone()
    for lo, hi in rows:
        full[lo:hi] *= GENERATED_SCALE
    return full.to(device=device, dtype=dtype).view(1, 1, q_len, kv_len)


def decode_bias(rows: Sequence[Any], pads: Sequence[int], width: int, device: Any,
                dtype: torch.dtype) -> torch.Tensor | None:
    """``[B, 1, 1, width + 1]`` bias for one decoding step that appends a column (None when
    no row is emphasised). Row ``i``'s absolute position ``p`` is column ``pads[i] + p``."""
    if not GENERATED_SCALE or not any(getattr(r, "emphasis", 0.0) and getattr(
            r, "emphasis_spans", ()) for r in rows):
        return None
    cols = width + 1
    bias = torch.zeros(len(rows), cols, dtype=torch.float32)
    hit = False
    for i, row in enumerate(rows):
        if row.emphasis and row.emphasis_spans:
            hit |= _fill(bias[i], row.emphasis * GENERATED_SCALE, row.emphasis_spans,
                         pads[i], cols)
    if not hit:
        return None
    return bias.to(device=device, dtype=dtype, non_blocking=True).view(len(rows), 1, 1, cols)
