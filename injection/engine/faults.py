"""Failure containment for the batch engine (mixed into ``BatchEngine``, ``batch.py``).

* A row whose prefill raises fails alone and at once; its neighbours go on.
* An accelerator OOM in a decoding step undoes the step (a half-done step appended to
  some layers only: every layer goes back to one width), then the newest row goes back in
  line. A row that already streamed text resumes where it stopped (its K/V is rebuilt
  from its tokens; no text is sent twice); a row alone fails with ``ModelOOMError``.
* Any other failing step fails the rows in it and leaves an empty, consistent batch.
* A stuck or dead scheduler thread (``watchdog.py``) aborts the engine: every row and
  waiting request fails at once with the retryable ``EngineUnavailable``.

Runs on the scheduler thread, except :meth:`abort` and :meth:`progress` (any thread).
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from injection.devices import to_host
from injection.engine import steps
from injection.engine.batchcache import BatchCache
from injection.engine.batchrow import RowJob
from injection.engine.guidance import lean
from injection.engine.guidance.contrast import with_guides
from injection.errors import InjectionError, ModelOOMError
from injection.kvcache.packed import PackedKV

__all__ = ["COUNTERS", "EngineFaults", "close_at_exit"]
COUNTERS = ("steps", "rows", "peak_batch", "batched_steps", "oom_shrinks", "row_failures",
            "step_failures", "resumed", "keep_kv_failures", "watchdog_trips", "prefill_chunks",
            "segment_captures", "capture_failures", "group_prefills", "grouped_rows",
            "group_fallbacks", "guided_rows", "guide_pairs")

log = logging.getLogger("injection.engine.batch")
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def close_at_exit(engine: Any) -> None:
    """Close ``engine`` at interpreter exit if it is still alive then."""
    _LIVE.add(engine)


@atexit.register
def _close_live_engines() -> None:  # before the interpreter tears torch down under them
    for engine in list(_LIVE):
        engine.close(timeout=1.0)


class EngineFaults:
    """The fault half of ``BatchEngine``; the attributes below are the engine's."""

    _rows: list[RowJob]
    _waiting: deque[RowJob]
    _batch: BatchCache
    _cond: threading.Condition
    _closed: bool
    _oom_cap: int
    _admitting: RowJob | None
    _grouped: list[RowJob]  # a group being prefilled (``grouping``)
    _thread: threading.Thread | None
    max_batch: int
    max_rows: int
    counters: dict[str, int]
    clock: Callable[[], float]
    beat_at: float
    busy: bool

    # -- progress, read by the watchdog -------------------------------------------------
    def _beat(self) -> None:
        self.beat_at = self.clock()

    def progress(self) -> tuple[bool, float, bool]:
        """``(busy, last heartbeat, scheduler thread alive)``: the scheduler beats before
        each prefill and each decoding step while it has work (busy)."""
        thread = self._thread
        return self.busy, self.beat_at, thread is not None and thread.is_alive()

    def abort(self, exc: BaseException) -> int:
        """Close the engine and fail every row, the one being admitted and every waiting
        request with ``exc`` now, without the scheduler thread (stuck or dead). Returns
        how many requests were failed; later submissions fail with ``exc`` too."""
        with self._cond:
            self._closed, self._stop_error = True, exc
            jobs = [*self._rows, *self._waiting, *self._grouped]
            if self._admitting is not None:
                jobs.append(self._admitting)
            self._waiting.clear()
            self._cond.notify_all()
        return sum(job.finish(error=exc) for job in jobs)

    # -- rows ---------------------------------------------------------------------------
    def _drop(self, leaving: list[RowJob]) -> None:
        # a guide leaves with its row, or once its row leans (``guidance/lean.py``)
        leaving = with_guides(leaving) + lean.leaving(self._rows)
        if not leaving:
            return
        keep = BatchCache.filled(len(self._rows), {i for i, r in enumerate(self._rows)
                                                   if r in leaving})
        self._batch.keep(keep)  # only rows from past the new end move into freed slots
        self._rows = [self._rows[i] for i in keep]
        if not self._rows:
            self._oom_cap = self.max_rows  # a drained batch may grow again

    def _row_failed(self, job: RowJob, exc: BaseException, where: str) -> None:
        log.warning("batch row failed in its %s (%s); its neighbours go on", where,
                    type(exc).__name__)
        self.counters["row_failures"] += 1
        job.finish(error=exc)

    def _capture_segment(self, job: RowJob, past: Any) -> None:
        """The one-pass miss: the row's leading segment, sliced from its finished prefill
        (fresh host tensors), kept on the row until its first token is out
        (``_keep_captured``). Bookkeeping: a failure costs the cache entry, never the row."""
        job.captured = None
        if job.capture is None or job.capture_tokens <= 0:
            return
        start = len(job.input_ids) - len(job.new_ids)
        end = start + job.capture_tokens
        try:
            with torch.no_grad():
                keys = to_host(torch.stack([layer.keys[0, :, start:end] for layer in past.layers]))
                values = to_host(torch.stack([layer.values[0, :, start:end]
                                              for layer in past.layers]))
            job.captured = PackedKV(keys, values, job.input_ids[start:end])
        except Exception as exc:
            self.counters["capture_failures"] += 1
            log.warning("a one-pass segment was not kept (%s)", type(exc).__name__)

    def _keep_captured(self, jobs: list[RowJob]) -> None:
        """After their first tokens: the captured segments handed to ``capture`` (stored
        in L1 and queued for Redis), so that work never delays a first token."""
        for job in jobs:
            kv, job.captured = job.captured, None
            if kv is None:
                continue
            try:
                job.capture(kv)
                self.counters["segment_captures"] += 1
            except Exception as exc:
                self.counters["capture_failures"] += 1
                log.warning("a one-pass segment was not kept (%s)", type(exc).__name__)

    def _sequence_kv(self, job: RowJob, reason: str) -> PackedKV | None:
        """The finished row's K/V for conversation reuse: bookkeeping, so a failure here
        costs the reuse, never the reply."""
        if not job.keep_kv or reason == "cancelled":
            return None
        try:
            return self._batch.row_kv(self._rows.index(job), job.input_ids + job.gen,
                                      start=job.keep_from)
        except Exception as exc:
            self.counters["keep_kv_failures"] += 1
            log.warning("a finished row's K/V was not kept (%s)", type(exc).__name__)
            return None

    def _decode_oom(self) -> None:
        """After the step was undone: the newest row goes back to the queue (see module)."""
        if not self._batch.consistent():  # never decode on a torn cache
            raise InjectionError("the batch cache is inconsistent after a failed step")
        self.counters["oom_shrinks"] += 1
        victim = max((r for r in self._rows if not r.is_guide), key=lambda r: r.started)
        self._oom_cap = max(1, len(self._rows) - 1)
        self._drop([victim])
        steps.free_accelerator()
        self._requeue_or_fail(victim, alone=not self._rows)

    def _prefill_oom(self, job: RowJob) -> None:
        self.counters["oom_shrinks"] += 1
        self._oom_cap = max(1, len(self._rows))
        steps.free_accelerator()
        self._requeue_or_fail(job, alone=not self._rows)

    def _requeue_or_fail(self, job: RowJob, *, alone: bool) -> None:
        if alone:
            job.finish(error=ModelOOMError("accelerator out of memory for this request"))
            return
        if job.emitted():
            self.counters["resumed"] += 1  # its prefill rebuilds the K/V of what it sent
        with self._cond:
            self._waiting.appendleft(job)  # first in line once memory frees up

    def _fail_all(self, exc: BaseException, *, waiting: bool = False) -> None:
        """A step failed (or the engine stops): its rows fail, the batch starts empty."""
        rows, self._rows = self._rows, []
        rows += [job for job in self._grouped if job not in rows]  # popped, not joined
        self._grouped = []
        self._batch = self._batch.fresh()
        self._oom_cap = self.max_rows
        with self._cond:
            if waiting:
                rows += list(self._waiting)
                self._waiting.clear()
                if self._admitting is not None:  # a chunked prefill between its chunks
                    rows.append(self._admitting)
        for job in rows:
            job.finish(error=exc)
