"""The dtype a model is loaded in: explicit, else the config's on CUDA and fp32 on CPU."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["resolve_dtype"]

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
}


def resolve_dtype(dtype: str | torch.dtype | None, *, device: torch.device, config: Any) -> torch.dtype:
    """Explicit dtype wins; else the config's dtype on CUDA and fp32 on CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        try:
            return _DTYPES[dtype.lower()]
        except KeyError:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}") from None
    if device.type == "cuda":
        cfg = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if isinstance(cfg, str):
            cfg = _DTYPES.get(cfg.lower())
        if isinstance(cfg, torch.dtype):
            return cfg
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32
