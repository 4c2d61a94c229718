"""BatchEngine: continuous (iteration-level) batching over the model's forward pass.

Callers on any thread submit rows and block; one scheduler thread owns the model's
generation. Each iteration it admits waiting rows (each prefilled alone on its own
injected K/V, then merged into the left-padded batch cache, ``batchcache``), runs one
decoding step for every row, and lets each finished row leave at once. A row's greedy
output equals the same row run alone: its mask and positions see only its own tokens.

Per row: sampling, seed, stop strings, streaming, cancellation and max tokens
(``RowJob``). Admission is bounded by ``max_batch`` and a K/V byte budget; an
accelerator OOM puts the newest row back (or fails it if it already streamed text)
and retries with a smaller batch instead of failing every row.

transformers' own continuous batching (``generate_batch`` / paged attention) takes no
per-request ``past_key_values``, so the injected prefix cannot ride on it.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import deque
from typing import Any

import torch

from injection.base import GenerationOutput
from injection.engine import steps
from injection.engine.batchcache import BatchCache
from injection.engine.batchrow import RowJob
from injection.errors import InjectionError, InvalidRequest, ModelOOMError
from injection.kvcache.packed import PackedKV

__all__ = ["BatchEngine", "RowJob"]

log = logging.getLogger(__name__)
_WATCH_KEYS = ("stop", "on_text", "cancelled")
_LIVE: weakref.WeakSet[BatchEngine] = weakref.WeakSet()


@atexit.register
def _close_live_engines() -> None:
    """Stop scheduler threads before the interpreter tears torch down under them."""
    for engine in list(_LIVE):
        engine.close(timeout=1.0)


class BatchEngine:
    """Batched generation for one ``ModelAdapter`` (same ``generate`` contract).

    Args:
        adapter: the loaded model (plain full-attention cache layers).
        max_batch: rows decoded together at most.
        kv_budget_bytes: bound on the batch's padded K/V (0: none); one row alone is
            always admitted.
        join_wait_ms: when idle, wait this long for more rows before the first prefill.
    """

    def __init__(self, adapter: Any, *, max_batch: int = 8, kv_budget_bytes: int = 0,
                 join_wait_ms: float = 0.0) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.adapter, self.max_batch = adapter, int(max_batch)
        self.kv_budget_bytes, self.join_wait = int(kv_budget_bytes), join_wait_ms / 1000.0
        self.bytes_per_token = steps.bytes_per_token(adapter)
        self._eos = adapter._eos_ids()
        # honoured like generate() does (greedy too); other processors are not used
        self._penalty = float(getattr(adapter.model.generation_config, "repetition_penalty",
                                      None) or 1.0)
        self._waiting: deque[RowJob] = deque()
        self._rows: list[RowJob] = []
        self._batch = BatchCache()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._oom_cap = self.max_batch
        self.counters = {"steps": 0, "rows": 0, "peak_batch": 0, "oom_shrinks": 0,
                         "batched_steps": 0}
        _LIVE.add(self)

    # -- callers ----------------------------------------------------------------------
    def generate(self, prompt: str, injected: PackedKV | None, alpha: float,
                 max_new_tokens: int, **sampling: Any) -> GenerationOutput:
        """``ModelAdapter.generate`` through the batch: blocks until this row finishes."""
        prompt_ids = self.adapter.renderer.encode(prompt, first=injected is None)
        return self.run(injected, alpha, prompt_ids, max_new_tokens, **sampling)

    def run(self, prefix: PackedKV | None, alpha: float, new_ids: list[int],
            max_new_tokens: int, *, keep_kv: bool = False, prompt_ids: list[int] | None = None,
            **sampling: Any) -> GenerationOutput:
        """Generate after ``prefix`` K/V (values scaled by ``alpha``) and ``new_ids``."""
        if not new_ids:
            raise InvalidRequest("prompt is empty")
        if prefix is not None:
            self.adapter._check_compatible(prefix)
        watch_opts = {k: sampling.pop(k) for k in _WATCH_KEYS if k in sampling}
        job = RowJob(prefix, float(alpha), list(new_ids), list(prompt_ids or new_ids),
                     int(max_new_tokens), sampling, watch_opts, keep_kv=keep_kv)
        self.adapter._check_length(len(job.input_ids) + job.max_new_tokens)
        return self.submit(job).wait()

    def submit(self, job: RowJob) -> RowJob:
        with self._cond:
            if self._closed:
                raise InjectionError("the batch engine is closed")
            self._waiting.append(job)
            self._ensure_thread()
            self._cond.notify_all()
        return job

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {**self.counters, "max_batch": self.max_batch, "active": len(self._rows),
                    "waiting": len(self._waiting), "free_slots": self.free_slots()}

    def free_slots(self) -> int:
        return max(0, self.max_batch - len(self._rows) - len(self._waiting))

    def close(self, timeout: float = 5.0) -> None:
        """Stop the scheduler; rows still waiting or running fail."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- scheduler --------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="batch-engine", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not self._rows:
                    self._cond.wait()
                if self._closed:
                    break
                idle = not self._rows
            if idle and self.join_wait:
                time.sleep(self.join_wait)  # let a burst arrive together
            try:
                self._admit()
                if self._rows:
                    self._decode()
            except Exception as exc:  # a broken step fails its rows, never the engine
                log.exception("batch step failed")
                self._fail_all(exc)
        self._fail_all(InjectionError("the batch engine stopped"), waiting=True)

    def _admit(self) -> None:
        while True:
            with self._cond:
                job = self._next_admissible()
            if job is None:
                return
            if job.abandoned:
                job.finish(error=InjectionError("abandoned before it started"))
                continue
            try:
                self._prefill(job)
            except torch.cuda.OutOfMemoryError:
                self._prefill_oom(job)
                return

    def _next_admissible(self) -> RowJob | None:
        if not self._waiting or len(self._rows) >= min(self.max_batch, self._oom_cap):
            return None
        job = self._waiting[0]
        if self._rows and self.kv_budget_bytes:
            widest = max(job.reserve_tokens(), *(r.reserve_tokens() for r in self._rows))
            if (len(self._rows) + 1) * widest * self.bytes_per_token > self.kv_budget_bytes:
                return None
        return self._waiting.popleft()

    def _prefill(self, job: RowJob) -> None:
        """Run the row's new tokens on its own prefix K/V (batch 1), take its first token."""
        job.reset(self.adapter.tokenizer, self.adapter.device, self._penalty)
        past, logits = steps.prefill(self.adapter, job)
        self._batch.add(past)
        self._rows.append(job)
        self.counters["rows"] += 1
        self.counters["peak_batch"] = max(self.counters["peak_batch"], len(self._rows))
        self._advance([(job, logits)])

    def _decode(self) -> None:
        try:
            picks = steps.decode(self.adapter, self._batch, self._rows)
        except torch.cuda.OutOfMemoryError:
            self._decode_oom()
            return
        self.counters["steps"] += 1
        self.counters["batched_steps"] += int(len(self._rows) > 1)
        self._advance(picks)

    def _advance(self, picks: list[tuple[RowJob, Any]]) -> None:
        """Append each row's token (or sample it from its logits); finished rows leave the
        batch (their caller wakes). A row whose sampling or callbacks raise fails alone."""
        for job, pick in picks:
            try:
                if not isinstance(pick, int):
                    seen = job.input_ids + job.gen if job.sampler.penalty != 1.0 else None
                    pick = job.sampler(pick, seen)
                self._append(job, pick)
            except Exception as exc:  # e.g. non-finite logits, a failing stream callback
                log.warning("batch row failed (%s); its neighbours go on", type(exc).__name__)
                job.finish(error=exc)
        self._drop([r for r in self._rows if r.done.is_set()])

    def _append(self, job: RowJob, token: int) -> None:
        job.gen.append(token)
        stop = job.watch.observe(job.gen) or token in self._eos
        if job.abandoned:
            job.watch.finish_reason = "cancelled"
            stop = True
        if stop or len(job.gen) >= job.max_new_tokens:
            self._complete(job)

    def _complete(self, job: RowJob) -> None:
        reason = job.watch.finish(job.gen, job.max_new_tokens, self._eos)
        seq = None
        if job.keep_kv and reason != "cancelled":
            seq = self._batch.row_kv(self._rows.index(job), job.input_ids + job.gen)
        job.finish(steps.row_output(job, reason, seq))

    def _drop(self, leaving: list[RowJob]) -> None:
        if not leaving:
            return
        keep = [i for i, r in enumerate(self._rows) if r not in leaving]
        self._batch.keep(keep)
        self._rows = [self._rows[i] for i in keep]
        if not self._rows:
            self._oom_cap = self.max_batch  # a drained batch may grow again

    # -- faults -----------------------------------------------------------------------
    def _decode_oom(self) -> None:
        """Shrink: the newest row goes back to the queue (or fails if it streamed text)."""
        self.counters["oom_shrinks"] += 1
        victim = self._rows[-1]
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
        if alone or job.emitted():
            job.finish(error=ModelOOMError("accelerator out of memory for this request"))
            return
        with self._cond:
            self._waiting.appendleft(job)  # first in line once memory frees up

    def _fail_all(self, exc: BaseException, *, waiting: bool = False) -> None:
        rows, self._rows = self._rows, []
        self._batch = BatchCache()
        with self._cond:
            if waiting:
                rows += list(self._waiting)
                self._waiting.clear()
        for job in rows:
            if not job.done.is_set():
                job.finish(error=exc)
