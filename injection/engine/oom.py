"""GPU memory discipline of the request path: one retry after an accelerator OOM."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from injection.errors import ModelOOMError

__all__ = ["on_cuda", "with_oom_retry"]

T = TypeVar("T")


def with_oom_retry(fn: Callable[[], T], metrics: Any) -> T:
    """Run ``fn``; on CUDA OOM free the allocator cache and retry once."""
    try:
        return fn()
    except torch.cuda.OutOfMemoryError:
        metrics.incr("oom_retries")
    # outside the except block: the failed attempt's frames (and tensors) are gone
    gc.collect()
    torch.cuda.empty_cache()
    try:
        return fn()
    except torch.cuda.OutOfMemoryError as exc:
        metrics.incr("oom_failures")
        raise ModelOOMError("accelerator out of memory after one retry") from exc


def on_cuda(adapter: Any) -> bool:
    return torch.device(adapter.device).type == "cuda" and torch.cuda.is_available()
