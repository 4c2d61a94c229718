"""Forwards that are no row: run by the batch engine, one at a time (mixed into
``BatchEngine``, ``batch.py``).

A request's planning needs forwards of its own before its row exists: a tenant or member
segment missing from every tier (``kvcache/chain.py``, ``kvsource.py``), a memory's or a
message's embedding (``memory/embed.py``), the guide's shared head (``guidance/plan.py``),
a deep turn's anchor (``guidance/anchor.py``).
Run on the request threads they would share the device with the scheduler's steps,
outside its OOM handling. :meth:`EngineForwards.forward` queues such a forward (``fn``,
which returns host values) and blocks; the scheduler runs the forwards queued at the
start of an iteration, before it admits rows and decodes (so between two decoding steps),
each under the watchdog's heartbeat. Per forward:

* any exception but an OOM is its caller's alone, raised to it; the engine goes on;
* an accelerator OOM frees the allocator's cache, holds admission at the rows running now
  (as a prefill OOM does) and runs the forward once more; a second OOM fails that forward
  alone with ``ModelOOMError``;
* counted by kind (``forwards_<kind>``, ``FORWARD_KINDS``) in the engine's counters.

A forward that is a prefill of rows whose last logits make its result
(:meth:`EngineForwards.forward_rows`: a deep turn's anchor) runs together with the like
forwards queued beside it, up to ``GROUP_ROWS`` rows, as one ``steps.prefill_group`` (a
burst of deep turns: one forward's fixed cost instead of one per turn; each row sees what
it sees alone), counted in ``forward_groups``. Should that forward fail, each runs alone as above (its own
failure, its own OOM retry).

Asked from the scheduler thread itself (a callback inside a step), a forward runs at
once: the thread is the device's already. A caller that stops waiting (its time limit)
abandons a forward not yet started. Engines that stop or abort fail the waiting forwards
with their error, as they fail waiting rows. Without an engine, ``base.run_here`` runs
``fn`` on the caller's thread (as before).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from injection.engine import steps
from injection.engine.batchrow import hand_over, wait_for
from injection.errors import InjectionError, ModelOOMError

__all__ = ["FORWARD_COUNTERS", "FORWARD_KINDS", "EngineForwards", "ForwardJob"]

T = TypeVar("T")
log = logging.getLogger("injection.engine.batch")
FORWARD_KINDS = ("tenant", "member", "guide", "embed", "anchor")
FORWARD_COUNTERS = (*(f"forwards_{k}" for k in FORWARD_KINDS), "forward_failures",
                    "forward_ooms", "forward_oom_failures", "anchor_failures", "forward_groups")
GROUP_ROWS = 16  # rows of queued row forwards run as one (a burst of 8 anchors' pairs)


class ForwardJob:
    """One queued forward and how its caller waits for it."""

    def __init__(self, kind: str, fn: Callable[[], Any], rows: list[Any] | None = None,
                 then: Callable[[torch.Tensor], Any] | None = None) -> None:
        self.kind, self.fn = kind, fn
        # a prefill of ``rows`` (``RowJob``) and its result from their last logits ``[k, V]``:
        # ``fn`` runs it alone, a group runs it with others (``EngineForwards.forward_rows``)
        self.rows, self.then = (rows, then) if rows and then is not None else (None, None)
        self.result: Any = None
        self.error: BaseException | None = None
        self.abandoned = False
        self.done = threading.Event()

    def finish(self, result: Any = None, error: BaseException | None = None) -> bool:
        return hand_over(self, error, result=result)  # the first call wins

    def wait(self, poll: float = 0.05) -> Any:
        wait_for(self, poll)  # its caller stopping marks it abandoned (skipped unstarted)
        return self.result


class EngineForwards:
    """The forward half of ``BatchEngine``; the attributes below are the engine's."""

    _cond: threading.Condition
    _closed: bool
    _stop_error: BaseException
    _thread: threading.Thread | None
    _rows: list
    _waiting: deque
    _forwards: deque[ForwardJob]  # queued (``forward``)
    _forwarding: list[ForwardJob]  # taken by the scheduler, running or next
    _oom_cap: int
    busy: bool
    counters: dict[str, int]
    adapter: Any
    _beat: Callable[[], None]
    _ensure_thread: Callable[[], None]

    def forward(self, kind: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` (a forward of ``kind``, ``FORWARD_KINDS``) on the scheduler thread
        between decoding steps and return what it returns (see module)."""
        return self._submit(ForwardJob(kind, fn))

    def forward_rows(self, kind: str, rows: list[Any], then: Callable[[torch.Tensor], T]) -> T:
        """``then`` of the last logits ``[k, V]`` of ``rows`` (``RowJob``s) prefilled, as
        ``forward`` runs a forward; with the like forwards queued beside it, in one group."""
        return self._submit(ForwardJob(kind, lambda: then(self._prefill_rows(rows)), rows, then))

    def _prefill_rows(self, rows: list[Any]) -> torch.Tensor:
        """The last logits of ``rows`` prefilled in one forward (no caches kept)."""
        return steps.prefill_group(self.adapter, rows, caches=False)[1]

    def _submit(self, job: ForwardJob) -> Any:
        if threading.current_thread() is self._thread:
            self._run_forward(job)
            return job.wait()
        self._enqueue(self._forwards, job)
        return job.wait()

    def _enqueue(self, queue: deque, job: Any) -> None:
        """Queue a row (``_waiting``) or a forward (``_forwards``) for the scheduler."""
        with self._cond:
            if self._closed:
                raise type(self._stop_error)(str(self._stop_error))
            if not self._rows and not self._waiting and not self.busy:
                self._beat()  # an idle engine's last beat is old: work starts the clock now
            queue.append(job)
            self._ensure_thread()
            self._cond.notify_all()

    def _run_forwards(self) -> None:
        """The forwards queued now, in order (the scheduler, before admitting rows)."""
        with self._cond:
            jobs = list(self._forwards)
            self._forwards.clear()
            self._forwarding = jobs
        try:
            for run in _runs(jobs):
                if len(run) > 1:
                    self._run_group(run)
                else:
                    self._run_forward(run[0])
        finally:
            self._forwarding = []

    def _run_group(self, run: list[ForwardJob]) -> None:
        """Row forwards in one prefill group, each finished with ``then`` of its rows'
        logits; alone should the group fail (or fewer than two still wanted)."""
        live = [job for job in run if not (job.abandoned or job.done.is_set())]
        for job in (j for j in run if j not in live):
            job.finish(error=InjectionError("abandoned before it started"))
        logits = None
        if len(live) > 1:
            self._beat()
            try:
                logits = self._prefill_rows([r for j in live for r in j.rows])
            except Exception:  # an OOM too: each alone, with its own retry and failure
                log.warning("a group of %d %s forwards failed; each runs alone", len(live),
                            live[0].kind, exc_info=True)
        if logits is None:
            for job in live:
                self._run_forward(job)
            return
        self.counters["forward_groups"] += 1
        at = 0
        for job in live:
            self._count(job)
            part, at = logits[at:at + len(job.rows)], at + len(job.rows)
            try:
                job.finish(job.then(part))
            except Exception as exc:  # its own result's failure
                self.counters["forward_failures"] += 1
                job.finish(error=exc)

    def _run_forward(self, job: ForwardJob) -> None:
        if job.abandoned or job.done.is_set():  # its caller stopped waiting, or aborted
            job.finish(error=InjectionError("abandoned before it started"))
            return
        self._count(job)
        for _attempt in (1, 2):
            self._beat()
            oom = False
            try:
                result = job.fn()
            except torch.cuda.OutOfMemoryError:
                oom = True  # handled below, once the failed attempt's frames are gone
            except Exception as exc:  # the caller's input or model: its own failure
                self.counters["forward_failures"] += 1
                job.finish(error=exc)
                return
            if not oom:
                job.finish(result)
                return
            self.counters["forward_ooms"] += 1
            self._oom_cap = max(1, len(self._rows))  # no more rows while memory is short
            steps.free_accelerator()
        self.counters["forward_oom_failures"] += 1
        log.warning("a %s forward ran out of accelerator memory twice; it fails alone", job.kind)
        job.finish(error=ModelOOMError("accelerator out of memory for this request"))

    def _count(self, job: ForwardJob) -> None:
        self.counters[f"forwards_{job.kind}"] = self.counters.get(f"forwards_{job.kind}", 0) + 1

    def abort(self, exc: BaseException) -> int:
        failed = super().abort(exc)  # type: ignore[misc]
        return failed + self._fail_forwards(exc, running=True)

    def _fail_all(self, exc: BaseException, *, waiting: bool = False) -> None:
        super()._fail_all(exc, waiting=waiting)  # type: ignore[misc]
        if waiting:
            self._fail_forwards(exc, running=False)

    def _fail_forwards(self, exc: BaseException, *, running: bool) -> int:
        with self._cond:
            jobs = list(self._forwards)
            self._forwards.clear()
            if running:  # a stuck forward's caller gets the error now
                jobs += self._forwarding
        return sum(job.finish(error=exc) for job in jobs)


def _runs(jobs: list[ForwardJob]) -> list[list[ForwardJob]]:
    """``jobs`` in order, consecutive row forwards of one kind together (``GROUP_ROWS``)."""
    runs: list[list[ForwardJob]] = []
    for job in jobs:
        last = runs[-1] if runs else None
        if (job.rows is not None and last is not None and last[0].rows is not None
                and last[0].kind == job.kind
                and sum(len(j.rows) for j in last) + len(job.rows) <= GROUP_ROWS):
            last.append(job)
        else:
            runs.append([job])
    return runs
