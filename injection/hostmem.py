"""Host memory of cached K/V: accounted as the allocator holds it, and reused.

* :func:`held_bytes`: what a tensor's storage really holds. torch's caching host
  allocator rounds every pinned request up to a power of two and keeps freed blocks
  cached, so a pinned 33 MiB entry holds 64 MiB: L1 counts that, not ``nbytes``. A
  pageable tensor holds its storage (a view holds all of it).
* :class:`HostPool`: reusable host buffers in power-of-two size classes (the allocator's
  own rounding, so nothing is lost to a second rounding) for device-to-host copies of
  K/V. A buffer is free again when no tensor uses its storage any more (the storage's
  use count, so a view that outlives its tensor still holds it); ``take`` reuses a free
  buffer of the class before allocating, and the pool never holds more than
  ``max_bytes`` (free buffers of other classes are released first; past that the copy
  goes to pageable memory, counted as ``overflow``). Without CUDA the buffers are
  plain (pageable) tensors: the same logic, testable on CPU.

Reuse is safe for device-to-host copies: they are ordered on the CUDA stream after any
earlier asynchronous host-to-device read of the same buffer. A CPU-side write (a decoded
Redis entry, a conversation link cut from its sequence) could race such a read:
:meth:`HostPool.guard` records an event after an asynchronous read of a pooled buffer,
and the buffer is handed out again only once the device has passed it.

* :data:`KV_COPIES`: copies of cached K/V bytes on a request's way from the cache tiers to
  the engine's batch cache (a piece's keys and values count as one copy), by site.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any

import torch

__all__ = ["HOST_POOL", "KV_COPIES", "CopyCounter", "HostPool", "held_bytes",
           "pinned_allocator_options", "size_class"]

MIN_CLASS = 4096
# torch's documented pinned-allocator options (CUDA semantics, "Memory management"):
# register malloc'ed pages with cudaHostRegister (no global lock of cudaHostAlloc),
# with several threads for large blocks. Only takes effect if set before CUDA starts.
PINNED_OPTIONS = "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"


def pinned_allocator_options(env: dict[str, str] | Any = os.environ) -> bool:
    """Add :data:`PINNED_OPTIONS` to ``PYTORCH_CUDA_ALLOC_CONF`` unless the operator set
    pinned options of their own; True if added. Call before CUDA is initialised."""
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "pinned_" in conf:
        return False
    env["PYTORCH_CUDA_ALLOC_CONF"] = f"{conf},{PINNED_OPTIONS}" if conf else PINNED_OPTIONS
    return True


def size_class(nbytes: int) -> int:
    """The power of two a request of ``nbytes`` occupies (at least ``MIN_CLASS``)."""
    return max(MIN_CLASS, 1 << max(0, math.ceil(math.log2(max(1, nbytes)))))


def _storage_bytes(t: torch.Tensor) -> int:
    return int(t.untyped_storage().nbytes())


def held_bytes(t: torch.Tensor) -> int:
    """Bytes the host allocator holds for ``t``'s storage (see the module doc)."""
    n = _storage_bytes(t)
    if t.is_cpu and t.is_pinned():
        return size_class(n) if n > 0 else 0
    return n


def _use_count(storage: torch.UntypedStorage) -> int:
    return int(torch._C._storage_Use_Count(storage._cdata))


class HostPool:
    """Bounded pool of host buffers in power-of-two classes (see the module doc)."""

    def __init__(self, max_bytes: int = 4 * 1024**3, pin: bool | None = None) -> None:
        self.max_bytes = int(max_bytes)
        self.pin = torch.cuda.is_available() if pin is None else bool(pin)
        self._lock = threading.Lock()
        self._buffers: dict[int, list[torch.UntypedStorage]] = {}
        self.held = 0
        self.counts = {"reused": 0, "allocated": 0, "released": 0, "overflow": 0}
        self._events: dict[int, Any] = {}  # buffer -> the last asynchronous read's event

    def empty(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """A contiguous host tensor of ``shape``/``dtype`` in a pooled buffer (pinned when
        the pool pins), or a plain pageable one when the pool is full."""
        t = self.take(shape, dtype)
        return t if t is not None else torch.empty(tuple(shape), dtype=dtype)

    def take(self, shape: tuple[int, ...] | torch.Size,
             dtype: torch.dtype) -> torch.Tensor | None:
        """Like :meth:`empty`, but None when the pool is full (the overflow is counted)."""
        nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        storage = self._take(size_class(nbytes))
        if storage is None:
            return None
        return torch.empty(0, dtype=dtype).set_(storage, 0, tuple(shape))

    def guard(self, t: torch.Tensor) -> None:
        """``t`` was just read asynchronously on the current CUDA stream (a non-blocking
        host-to-device copy): if it lives in a pooled buffer, that buffer is not handed out
        for a CPU-side write before the device has passed this point."""
        if not (self.pin and t.is_cpu and t.is_pinned()):
            return
        ptr = t.untyped_storage().data_ptr()
        with self._lock:
            if any(s.data_ptr() == ptr for bufs in self._buffers.values() for s in bufs):
                event = torch.cuda.Event()
                event.record()
                self._events[ptr] = event

    def stats(self) -> dict[str, int]:
        with self._lock:
            in_use = sum(c for c, bufs in self._buffers.items() for s in bufs
                         if _use_count(s) > 1)
            return {"held_bytes": self.held, "in_use_bytes": in_use,
                    "max_bytes": self.max_bytes, "pinned": int(self.pin), **self.counts}

    # -- internals (the lock guards buffers and counters) ------------------------------
    def _take(self, cls: int) -> torch.UntypedStorage | None:
        with self._lock:
            for s in self._buffers.get(cls, ()):
                if _use_count(s) == 1 and self._passed(s):  # only the pool refers to it
                    self.counts["reused"] += 1
                    return s
            if self.held + cls > self.max_bytes:
                self._release(need=self.held + cls - self.max_bytes)
            if self.held + cls > self.max_bytes:
                self.counts["overflow"] += 1
                return None
            s = torch.empty(cls, dtype=torch.uint8, pin_memory=self.pin).untyped_storage()
            self._buffers.setdefault(cls, []).append(s)
            self.held += cls
            self.counts["allocated"] += 1
            return s

    def _passed(self, s: torch.UntypedStorage) -> bool:
        """Whether the device has finished the last asynchronous read of ``s``."""
        event = self._events.get(s.data_ptr())
        if event is None or event.query():
            self._events.pop(s.data_ptr(), None)
            return True
        return False

    def _release(self, need: int) -> int:
        """Drop free buffers, largest classes first, until ``need`` bytes."""
        freed = 0
        for cls in sorted(self._buffers, reverse=True):
            keep = []
            for s in self._buffers[cls]:
                if _use_count(s) == 1 and freed < need and self._passed(s):
                    freed += cls
                    self.counts["released"] += 1
                else:
                    keep.append(s)
            self._buffers[cls] = keep
        self.held -= freed
        return freed


class CopyCounter:
    """Copies (and bytes) of cached K/V, per site (``assemble``, ``l2_to_pool``, ...); a
    piece's keys and values together are one copy. Process-wide: a benchmark reads the
    difference around one request (``bench/bench_hot_copies.py``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sites: dict[str, list[int]] = {}

    def add(self, site: str, nbytes: int, copies: int = 1) -> None:
        with self._lock:
            row = self._sites.setdefault(site, [0, 0])
            row[0] += int(copies)
            row[1] += int(nbytes)

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """``{site: (copies, bytes)}`` so far."""
        with self._lock:
            return {k: (c, b) for k, (c, b) in self._sites.items()}

    def since(self, before: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        """What was added after ``before`` (a :meth:`snapshot`), sites with copies only."""
        now = self.snapshot()
        out = {k: (c - before.get(k, (0, 0))[0], b - before.get(k, (0, 0))[1])
               for k, (c, b) in now.items()}
        return {k: v for k, v in out.items() if v[0]}


HOST_POOL = HostPool()
KV_COPIES = CopyCounter()
