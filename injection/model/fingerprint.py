"""Model fingerprint: identifies weights + tokenizer + dtype, cheaply and stably.

Used in every cache key, so a different model, tokenizer or dtype never maps to
an old PackedKV. Hashing all weights of a 7B model would take seconds; instead
every parameter contributes its name, shape, dtype and a strided sample of its
values (a few thousand elements), which changes with any retrained, re-seeded
or re-quantised checkpoint while costing milliseconds.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

__all__ = ["model_fingerprint", "model_key", "weights_digest", "tokenizer_digest"]

SAMPLES_PER_TENSOR = 4096
_VOLATILE_CONFIG_KEYS = {"_name_or_path", "transformers_version", "dtype", "torch_dtype"}


def model_fingerprint(model: Any, tokenizer: Any, dtype: torch.dtype) -> str:
    """sha256 hex over config, weights digest, tokenizer digest and dtype."""
    cfg = {k: v for k, v in model.config.to_dict().items() if k not in _VOLATILE_CONFIG_KEYS}
    h = hashlib.sha256()
    h.update(json.dumps(cfg, sort_keys=True, default=str).encode())
    h.update(weights_digest(model).encode())
    h.update(tokenizer_digest(tokenizer).encode())
    h.update(str(dtype).encode())
    return h.hexdigest()


def model_key(adapter: Any) -> str:
    """The model's identity for its profile of measured defaults (``model/profiles.py``):
    config + tokenizer and chat template, independent of dtype and device (the
    fingerprint is not: it includes the dtype and the weights). Cached on the adapter."""
    cached = getattr(adapter, "_model_key", None)
    if cached is not None:
        return cached
    key = ""
    model, tok = getattr(adapter, "model", None), getattr(adapter, "tokenizer", None)
    if model is not None and tok is not None and hasattr(model, "config"):
        cfg = {k: v for k, v in model.config.to_dict().items()
               if k not in _VOLATILE_CONFIG_KEYS and not k.startswith("_")}
        blob = json.dumps(cfg, sort_keys=True, default=str) + tokenizer_digest(tok)
        key = hashlib.sha256(blob.encode()).hexdigest()[:16]
    try:
        adapter._model_key = key
    except AttributeError:
        pass
    return key


def weights_digest(model: Any) -> str:
    """sha256 over (name, shape, dtype, strided value sample) of every parameter."""
    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
            flat = p.detach().reshape(-1)
            step = max(1, flat.numel() // SAMPLES_PER_TENSOR)
            sample = flat[::step][:SAMPLES_PER_TENSOR].to("cpu", torch.float32)
            h.update(sample.numpy().tobytes())
    return h.hexdigest()


def tokenizer_digest(tokenizer: Any) -> str:
    """sha256 over the full tokenizer definition (vocab, merges, specials) and chat template."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(str(getattr(tokenizer, "chat_template", None)).encode())
    specials = {k: str(v) for k, v in tokenizer.special_tokens_map.items()}
    h.update(json.dumps(specials, sort_keys=True).encode())
    return h.hexdigest()
