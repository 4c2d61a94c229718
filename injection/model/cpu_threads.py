"""One multi-threaded torch thread per process on a CPU: the batch engine's.

torch runs its CPU kernels on OpenMP (libgomp on Linux). libgomp keeps a team of worker
threads for every thread that has run a parallel region, for as long as that thread
lives, and once the process holds more of those threads than it has CPUs, every team's
workers stop spinning between regions and sleep: each of a decoding step's ~600
parallel regions then pays a futex wake. The batch engine decodes on a thread of its
own, and the model used to be loaded (and its CPU matmul measured) on another that
stays alive (a Celery task thread): that was enough. Measured on SmolLM2-135M, 2-core
CPU (docs/BENCHMARKS.md "CPU threads"), one decoding step on a thread other than the
loading one took 57 ms at 2 rows against 31 ms on the loading thread, and 113 ms against
90 ms at 16 rows.

So on a CPU:

* ``run_alone(fn)``: the model is loaded and measured on a short-lived thread with every
  core (``CORES``), whose team ends with it (``model/loading.py``);
* ``reserve()`` when an engine is built, ``claim()`` on its scheduler thread: that thread
  takes every core for itself, and threads that first run torch after that (request
  threads, cache writers) run torch on one, so they never start a team that would put
  the engine's to sleep. What those threads do
  (packing K/V, digests, tensors of a few MB) is small beside a decoding step.

A thread that already ran torch keeps its count (``torch.set_num_threads`` is per
thread under OpenMP; a new thread starts from the last value set anywhere). Nothing here
changes a result: only how many threads compute it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["CORES", "MODES", "claim", "reserve", "run_alone"]

# "engine": as above; "shared": as before it (the model loaded on the caller's thread, every
# thread on every core), the benchmark's baseline
MODES = ("engine", "shared")

T = TypeVar("T")


def _probe() -> int:
    """What torch would use (every core, or OMP_NUM_THREADS), read on a thread of its own:
    reading it fixes the reading thread's count."""
    out: list[int] = []
    thread = threading.Thread(target=lambda: out.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return out[0]


CORES = _probe()
_default = CORES  # what a thread that first runs torch now gets


def reserve(adapter: Any) -> None:
    """An engine over ``adapter`` is built: on a CPU (mode "engine"), threads that first
    run torch after this compute on one thread (its scheduler will ``claim`` the cores)."""
    if _applies(adapter):
        _set_default(1)


def claim(adapter: Any) -> None:
    """On a CPU (mode "engine"): the calling thread (the engine's scheduler) computes on
    ``CORES`` threads, threads that first run torch after this on one (see module doc).
    Elsewhere nothing changes."""
    if _applies(adapter):
        _own(CORES)
        _set_default(1)


def _applies(adapter: Any) -> bool:
    device = torch.device(getattr(adapter, "device", "cpu"))
    return device.type == "cpu" and getattr(adapter, "cpu_threads", "engine") == "engine"


def run_alone(fn: Callable[[], T]) -> T:
    """``fn()`` on a short-lived thread computing on ``CORES`` threads (its OpenMP team
    ends with it); its exception is raised here."""
    out: dict[str, Any] = {}

    def body() -> None:
        _own(CORES)
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the caller
            out["error"] = exc

    thread = threading.Thread(target=body, name="torch-load")
    thread.start()
    thread.join()
    _set_default(_default)  # body's count became the default for new threads: put back
    if "error" in out:
        raise out["error"]
    return out["value"]


def _own(n: int) -> None:
    """The calling thread computes on ``n`` threads. Its count is first read: a thread's
    first read sets it to the default, and would undo a count set before it."""
    torch.get_num_threads()
    torch.set_num_threads(n)


def _set_default(n: int) -> None:
    """Set what threads that first run torch get, from a thread of its own (setting it
    sets the caller's count too)."""
    global _default
    _default = n
    thread = threading.Thread(target=_own, args=(n,), name="torch-threads")
    thread.start()
    thread.join()
