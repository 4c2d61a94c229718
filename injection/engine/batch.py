"""BatchEngine: continuous (iteration-level) batching over the model's forward pass.

Callers on any thread submit rows and wait; one scheduler thread owns the model. Each
iteration admits waiting rows (prefilled on their own injected K/V, merged into the left-padded
batch cache, ``batchcache``), runs one decoding step for every row and lets finished rows
leave; a row's greedy output equals the row run alone. Per row: sampling, seed, stop strings,
streaming, cancellation, max tokens (``RowJob``). Admission: ``max_batch`` requests (a guide
row is none) within a K/V budget. Failures stay contained (``faults``), a watchdog reads the
heartbeat; forwards of no row (segments, embeddings, guide heads, anchors) run here too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from injection.base import GenerationOutput
from injection.engine import heads, steps
from injection.engine.batchcache import BatchCache
from injection.engine.batchrow import RowJob
from injection.engine.decoding import bans, loops
from injection.engine.faults import COUNTERS, EngineFaults, close_at_exit
from injection.engine.guidance import anchor, contrast
from injection.engine.prefill.forwards import FORWARD_COUNTERS, EngineForwards
from injection.engine.prefill.grouping import GroupPrefill
from injection.engine.prefill.pacing import Pacer
from injection.engine.sampling import BatchChooser
from injection.errors import EngineUnavailable, InjectionError, InvalidRequest
from injection.kvcache.packed import PackedKV
from injection.model import cpu_threads

__all__ = ["BatchEngine", "RowJob"]

log = logging.getLogger(__name__)
_WATCH_KEYS = ("stop", "on_text", "cancelled")
_PENDING = object()  # a chunked prefill with chunks to go


class BatchEngine(EngineForwards, EngineFaults, GroupPrefill):
    """Batched generation for one ``ModelAdapter`` (same ``generate`` contract).

    Args:
        adapter: the loaded model (plain full-attention cache layers).
        max_batch: requests decoded together at most (each guided one's guide row besides:
            up to twice as many rows, all within ``kv_budget_bytes``).
        kv_budget_bytes: bound on the batch's padded K/V (0: none; one row always fits).
        join_wait_ms: when idle, wait this long for more rows before the first prefill.
        clock: monotonic seconds for the scheduler's heartbeat (``watchdog.py``).
        prefill_chunk: a longer prefill runs in chunks of this many tokens, one between
            decoding steps, so running rows go on while it arrives (0: whole).
        preallocate: K/V in buffers with spare capacity, written in place (``batchcache``);
            False reallocates every step, as ``DynamicCache`` does (the benchmark's baseline).
        pace: while rows decode, a chunk is sized to cost about this many of their
            decoding steps, measured (``pacing.Pacer``; 0: always ``prefill_chunk``).
        group_prefill: rows waiting together are prefilled in one forward, up to this
            many (``grouping``; 1: each alone).
    """

    def __init__(self, adapter: Any, *, max_batch: int = 8, kv_budget_bytes: int = 0,
                 join_wait_ms: float = 0.0, clock: Callable[[], float] = time.monotonic,
                 preallocate: bool = True, prefill_chunk: int = 512, pace: float = 0.0,
                 group_prefill: int = 1) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.adapter, self.max_batch = adapter, int(max_batch)
        self.max_rows = self._oom_cap = 2 * self.max_batch  # each request and its guide
        self.kv_budget_bytes, self.join_wait = int(kv_budget_bytes), join_wait_ms / 1000.0
        self.bytes_per_token, self._eos = steps.bytes_per_token(adapter), adapter._eos_ids()
        self._choose = BatchChooser(adapter.model.generation_config)  # as generate() does
        self._waiting: deque[RowJob] = deque()
        self._forwards, self._forwarding = deque(), []  # forwards of no row (``forwards``)
        self._rows: list[RowJob] = []
        self._batch = BatchCache(spare=preallocate, max_slots=self.max_rows)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed, self._stop_error = False, EngineUnavailable("the batch engine stopped")
        self._admitting: RowJob | None = None  # popped from the queue, being prefilled
        self._chunking: RowJob | None = None  # its prefill goes on after the next step
        self.prefill_chunk, self.pacer = int(prefill_chunk), Pacer(int(prefill_chunk), pace)
        self.group_prefill, self._grouped = max(1, int(group_prefill)), []
        self.clock, self.busy, self.beat_at = clock, False, clock()
        self.counters = dict.fromkeys(COUNTERS + FORWARD_COUNTERS, 0)
        close_at_exit(self)
        cpu_threads.reserve(adapter)  # on a CPU: the scheduler thread takes the cores

    # -- callers ----------------------------------------------------------------------
    def generate(self, prompt: str, injected: PackedKV | None, alpha: float,
                 max_new_tokens: int, **sampling: Any) -> GenerationOutput:
        prompt_ids = self.adapter.renderer.encode(prompt, first=injected is None)
        return self.run(injected, alpha, prompt_ids, max_new_tokens, **sampling)

    def run(self, *args: Any, **kwargs: Any) -> GenerationOutput:
        return self.start(*args, **kwargs).wait()  # ``start`` a row, wait for its output

    def start(self, prefix: PackedKV | None, alpha: float, new_ids: list[int],
              max_new_tokens: int, *, keep_kv: bool = False, keep_from: int = 0,
              prompt_ids: list[int] | None = None,
              capture: Callable[[PackedKV], None] | None = None, capture_tokens: int = 0,
              guide: contrast.Guide | None = None, first_scores: torch.Tensor | None = None,
              lean: Any = None, probe: bool = False, **sampling: Any) -> RowJob:
        """Queue a row after ``prefix`` K/V (scaled by ``alpha``) and ``new_ids`` (``wait()``:
        its output; ``keep_kv``: with its K/V from token ``keep_from`` on); ``capture``: the
        K/V of its first ``capture_tokens`` once prefilled
        (``faults``); ``guide``/``lean``/``probe``: ``contrast.attach``; ``first_scores``: an anchor's."""
        if not new_ids:
            raise InvalidRequest("prompt is empty")
        if prefix is not None:
            self.adapter._check_compatible(prefix)
        watch_opts = {k: sampling.pop(k) for k in _WATCH_KEYS if k in sampling}
        job = RowJob(prefix, float(alpha), list(new_ids), list(prompt_ids or new_ids),
                     int(max_new_tokens), sampling, watch_opts, keep_kv=keep_kv,
                     keep_from=int(keep_from), capture=capture,
                     capture_tokens=int(capture_tokens), first_scores=first_scores, probe=probe)
        job.token_map, job.phrases = bans.prepare(
            self.adapter.tokenizer, sampling.get("constraints", ()), self._eos)
        contrast.attach(job, guide, self.max_batch, lean)
        self.adapter._check_length(len(job.input_ids) + job.max_new_tokens)
        return self.submit(job)

    def submit(self, job: RowJob) -> RowJob:
        self._enqueue(self._waiting, job)
        return job

    def stats(self) -> dict[str, Any]:
        with self._cond:
            busy = (self._requests() + len(self._waiting)
                    + (self._chunking is not None))  # requests: a guide takes no slot
            return {**self.counters, "max_batch": self.max_batch, "active": len(self._rows),
                    "waiting": len(self._waiting), "free_slots": max(0, self.max_batch - busy)}

    def close(self, timeout: float = 5.0) -> None:
        """Stop the scheduler; rows still waiting or running fail."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- scheduler --------------------------------------------------------------------
    def _ensure_thread(self) -> None:  # one that died busy is left to the watchdog
        if self._thread is None or not (self._thread.is_alive() or self.busy):
            thread = threading.Thread(target=self._loop, name="batch-engine", daemon=True)
            thread.start()  # published once alive: progress() never sees it unstarted
            self._thread = thread

    def _loop(self) -> None:
        cpu_threads.claim(self.adapter)  # on a CPU: every core, here only
        while True:
            with self._cond:
                self.busy = False
                while (not self._closed and not self._waiting and not self._rows
                       and self._chunking is None and not self._forwards):
                    self._cond.wait()
                if self._closed:
                    break
                self.busy = True
                self._beat()
                idle = not self._rows and self._chunking is None
            if idle and self.join_wait:
                time.sleep(self.join_wait)  # let a burst arrive together
            try:
                self._run_forwards()  # planning's forwards first: their rows come next
                self._admit()
                if self._rows:
                    self._decode()
            except Exception as exc:  # a broken step fails its rows, never the engine
                log.exception("batch step failed")
                self.counters["step_failures"] += 1
                self._fail_all(exc)
        self._fail_all(self._stop_error, waiting=True)

    def _admit(self) -> None:
        while True:
            with self._cond:
                job = self._admitting = self._chunking or self._next_admissible()
            if job is None:
                return
            if job.abandoned:
                job.finish(error=InjectionError("abandoned before it started"))
                self._chunking = self._admitting = job.chunk_cache = None
                continue
            group = self._group(job) if self._chunking is None else [job]
            if len(group) > 1:
                self._admit_group(group)
                self._admitting = None
                continue
            oom, first = False, None
            try:
                first = self._prefill(job)
            except torch.cuda.OutOfMemoryError:
                oom = True  # handled below, once the failed attempt's frames are gone
            except Exception as exc:  # this row's input or prefix: it fails alone, at once
                self._row_failed(job, exc, "prefill")
            finally:
                if first is not _PENDING:  # done, failed or put back: no partial K/V kept
                    self._chunking = job.chunk_cache = None
                    job.prefilled = 0
                self._admitting = self._chunking
            if oom:
                self._prefill_oom(job)
                return
            if first is _PENDING:  # its next chunk after the running rows' next step
                return
            if first is not None:  # in the batch now: its first token (a resumed row: none)
                self._advance([job], first.unsqueeze(0), cached=False)
                self._keep_captured([job])

    def _prefill(self, job: RowJob) -> Any:
        """Run the row's new tokens on its own prefix K/V (batch 1), join the batch; returns
        the logits of its first token. A row put back after streaming text resumes: its
        tokens so far are prefilled too, and its next token is already chosen (None)."""
        self._beat()
        resume = job.emitted()
        if not resume and not job.prefilled:
            job.reset(self.adapter.tokenizer, self.adapter.device)
        ids, done = job.prefill_ids(resume), job.prefilled
        if not done:  # a lone unguided row: room to decode in the cache the batch adopts
            alone = not self._rows and job.guide is None and self._batch.spare
            job.spare = min(len(job.input_ids), job.max_new_tokens) if alone else 0
        size = self.pacer.chunk(len(ids) - done, decoding=self._paced())
        t0 = self.clock()
        past, logits, guided = contrast.prefill(  # a guided row: with its guide, if it can
            self.adapter, job, ids[done:done + size], job.chunk_cache,
            whole=not resume and done + size == len(ids), counters=self.counters)
        self.pacer.prefilled(size, self.clock() - t0)
        if done + size < len(ids):
            job.chunk_cache, job.prefilled, self._chunking = past, done + size, job
            self.counters["prefill_chunks"] += 1
            return _PENDING
        guided = guided or contrast.prefill_guide(self.adapter, job, resume, self.counters)
        if not resume:
            self._capture_segment(job, past)  # before the batch takes the row's K/V
        self._batch.add(past, heads.head_of(job))  # all layers or none
        self._rows.append(job)
        if guided is not None:  # the guide right after its row
            self._batch.add(guided[0])
            self._rows.append(job.guide)
            logits = contrast.first_token(job, bans.row(job, logits), guided[1])  # (folded: no-op)
        self.counters["rows"] += 1
        self.counters["peak_batch"] = max(self.counters["peak_batch"], len(self._rows))
        return None if resume else anchor.first(job, logits)

    def _decode(self) -> None:
        self._beat()
        snap = self._batch.snapshot()
        try:
            self._batch.reserve(1)  # any growth before the forward, all layers at once
            t0 = self.clock()
            logits = steps.decode(self.adapter, self._batch, self._rows)
            self.pacer.stepped(self.clock() - t0)
        except torch.cuda.OutOfMemoryError:
            logits = None  # handled below, once the failed attempt's frames are gone
        if logits is None:  # undo: the layers the step reached drop its column
            self._batch.restore(snap)
            self._decode_oom()
            return
        self.counters["steps"] += 1
        self.counters["batched_steps"] += int(len(self._rows) > 1)
        self._advance(list(self._rows), logits)

    def _advance(self, rows: list[RowJob], logits: torch.Tensor, *, cached: bool = True) -> None:
        """Choose each row's token from its logits (``[rows, V]``) and append it; finished
        rows leave, then their callers wake. A row whose draw or callbacks raise fails alone."""
        leaving: list[tuple[RowJob, GenerationOutput | None, BaseException | None]] = []
        logits = bans.apply(rows, logits)  # decoding constraints, before a guide's contrast
        own = contrast.own_scores(rows, logits)  # a guided row's, without its guide
        rows, logits = contrast.split_rows(rows, logits)  # guides choose nothing
        logits = loops.guard(rows, logits, self._eos, own)  # a reply's own repeats
        for job, pick in self._choose(rows, logits, cached=cached):
            if job.done.is_set():  # failed meanwhile (engine aborted): no more text for it
                continue
            try:
                pick = pick if isinstance(pick, int) else job.sampler.draw(pick)
                out = self._append(job, bans.forced(job, pick, self._eos, self.adapter.tokenizer))
                if out is not None:
                    leaving.append((job, out, None))
            except Exception as exc:  # e.g. non-finite logits, a failing stream callback
                leaving.append((job, None, exc))
        self._drop([job for job, _, _ in leaving] + [r for r in self._rows if r.done.is_set()])
        self._keep_captured([job for job, _, _ in leaving])  # before their callers wake
        for job, out, exc in leaving:
            job.finish(out) if exc is None else self._row_failed(job, exc, "step")

    def _append(self, job: RowJob, token: int) -> GenerationOutput | None:
        job.gen.append(token)
        contrast.mirror(job, token)
        stop = job.watch.observe(job.gen) or token in self._eos
        if job.abandoned:
            job.watch.finish_reason = "cancelled"
            stop = True
        if stop or len(job.gen) >= job.max_new_tokens:
            reason = job.watch.finish(job.gen, job.max_new_tokens, self._eos)
            return steps.row_output(job, reason, self._sequence_kv(job, reason))
        return None
