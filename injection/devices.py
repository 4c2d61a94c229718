"""Host/device helpers for K/V tensors: pinned host copies and cache-build timing."""

from __future__ import annotations

import time

import torch

from injection.hostmem import HOST_POOL

__all__ = ["KVTimer", "to_host"]


def to_host(t: torch.Tensor) -> torch.Tensor:
    """CPU copy of ``t``; into a pooled pinned buffer when CUDA is present (one copy,
    reused once the entry it held is gone: ``injection.hostmem``)."""
    if t.is_cpu:
        return t
    host = HOST_POOL.empty(t.shape, t.dtype)
    host.copy_(t)  # synchronous D2H: the result is complete when returned
    return host


class KVTimer:
    """Times the cache build; on CUDA with events plus the memory peak.

    The events are recorded on the stream without waiting; :meth:`elapsed_ms` waits for
    the end event only (the timed work, not whatever was queued after it) before reading.
    """

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
        """Milliseconds the timed work took on the device (host time without CUDA)."""
        if self.cuda:
            # elapsed_time() of an event the device has not reached yet raises (or reads a
            # time that is not there yet): wait for the end event first
            self._end.synchronize()
            return float(self._start.elapsed_time(self._end))
        return self._ms
