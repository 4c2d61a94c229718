"""Host/device helpers for K/V tensors: pinned host copies and cache-build timing."""

from __future__ import annotations

import time

import torch

__all__ = ["KVTimer", "to_host"]


def to_host(t: torch.Tensor) -> torch.Tensor:
    """CPU copy of ``t``; into pinned memory when CUDA is present (one copy)."""
    if t.is_cpu:
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t)  # synchronous D2H: the result is complete when returned
    return host


class KVTimer:
    """Times the cache build; on CUDA with events (no extra sync) plus the memory peak."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.cuda = device, device.type == "cuda"
        self.peak_bytes = 0

    def __enter__(self) -> KVTimer:
        if self.cuda:
            self._base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start, self._end = torch.cuda.Event(True), torch.cuda.Event(True)
            self._start.record()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ms = (time.perf_counter() - self._t0) * 1000.0
        if self.cuda:
            self._end.record()
            self.peak_bytes = max(0, torch.cuda.max_memory_allocated(self.device) - self._base)

    def elapsed_ms(self) -> float:
        """Call after the work that follows has synchronised (e.g. generation)."""
        if self.cuda:
            return float(self._start.elapsed_time(self._end))
        return self._ms
