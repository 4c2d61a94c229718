"""Batched prefill: rows waiting together are prefilled in one forward pass (mixed into
``BatchEngine``, ``batch.py``; the forward itself is ``steps.prefill_group``).

A group is the first waiting row and those right behind it, up to ``group_prefill`` rows,
while the batch has room (``max_batch`` requests, a guide not counted; every row, guides
included, within the OOM cap and the K/V budget). A row joins a group
only if it needs nothing the single path gives it: no chunking
(its new tokens fit one chunk), not a row resumed after an OOM. A guided row
(``guidance/contrast.py``) comes with its guide, prefilled in the same forward right after
it (a guide at most twice as long as its row: padding would cost more), so a burst of
guided first turns is prefilled together as unguided ones are. Each row's K/V, cut from
the group's cache, joins the running batch as a row prefilled alone would; the rows'
first tokens are chosen together. A group that fails for any reason is put back at the
head of the queue, each row marked to be prefilled alone: a bad row then fails alone.

Admission itself (``_next_admissible``: the next row, if the batch has room) lives here too.
Runs on the scheduler thread.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from injection.engine import heads, steps
from injection.engine.batchrow import RowJob
from injection.engine.decoding import bans
from injection.engine.guidance import anchor, contrast

__all__ = ["GroupPrefill"]

log = logging.getLogger("injection.engine.batch")


class GroupPrefill:
    """The group half of ``BatchEngine``; the attributes below are the engine's."""

    group_prefill: int
    clock: Any
    pacer: Any
    _waiting: Any
    _rows: list[RowJob]
    max_batch: int
    _oom_cap: int
    kv_budget_bytes: int
    bytes_per_token: int

    def _next_admissible(self) -> RowJob | None:
        """The next waiting row if the batch has room for it (and its guide)."""
        job = self._waiting[0] if self._waiting else None
        if job is None:
            return None
        rows = len(self._rows) + _width(job)
        if self._rows and not self._fits(self._requests() + 1, rows):
            return None
        if self._rows and self.kv_budget_bytes:
            widest = max(job.reserve_tokens(), *(r.reserve_tokens() for r in self._rows))
            if rows * widest * self.bytes_per_token > self.kv_budget_bytes:
                return None
        return self._waiting.popleft()

    def _group(self, first: RowJob) -> list[RowJob]:
        """``first`` and the groupable rows queued right behind it (popped)."""
        group, paced = [first], self._paced()
        if self.group_prefill <= 1 or not self._groupable(first, paced):
            return group
        with self._cond:
            while (self._waiting and len(group) < self.group_prefill
                   and self._groupable(self._waiting[0], paced) and self._room(group)):
                group.append(self._waiting.popleft())
            self._grouped = group if len(group) > 1 else []  # abort() fails them too
        return group

    def _groupable(self, job: RowJob, paced: bool) -> bool:
        return (not job.abandoned and not job.solo and not job.emitted() and not job.prefilled
                and job.chunk_cache is None
                and (job.guide is None or contrast.shares_forward(job, len(job.new_ids)))
                and self.pacer.chunk(len(job.new_ids), decoding=paced) == len(job.new_ids))

    def _paced(self) -> bool:
        """Whether a prefill now is paced (``pacing.Pacer``): while requests decode and no
        more wait than decode (the row being admitted counted as waiting). A long prompt
        arriving among running streams then comes in chunks that stall them little; a burst
        larger than the running batch is prefilled as when idle (grouped, chunks of the cap):
        the few running rows stall once, the many waiting get their first tokens sooner, and
        no small chunk pays a whole forward's fixed cost (on the 2-core CPU about two
        decoding steps). 8 requests with 8 exchanges of history sent at once: 9.8 s when paced,
        5.5 s as now, 6.9 s one after another (docs/BENCHMARKS.md, burst)."""
        running = self._requests()
        return 0 < running and len(self._waiting) + 1 <= running

    def _room(self, group: list[RowJob]) -> bool:
        rows = len(self._rows) + sum(_width(j) for j in [*group, self._waiting[0]])
        if not self._fits(self._requests() + len(group) + 1, rows):
            return False
        if not self.kv_budget_bytes:
            return True
        widest = max(r.reserve_tokens() for r in [*self._rows, *group, self._waiting[0]])
        return rows * widest * self.bytes_per_token <= self.kv_budget_bytes

    def _requests(self) -> int:
        """The batch's rows that choose tokens (guides do not)."""
        return sum(not r.is_guide for r in self._rows)

    def _fits(self, requests: int, rows: int) -> bool:
        """``requests`` within ``max_batch`` (a guide is no request) and ``rows``, guides
        included, within the OOM cap (the K/V budget counts every row: callers)."""
        return requests <= self.max_batch and rows <= self._oom_cap

    def _admit_group(self, group: list[RowJob]) -> None:
        """Prefill ``group`` in one forward; every row joins the batch with its first token."""
        self._beat()
        forward = [r for job in group for r in (job, job.guide) if r is not None]
        for job in group:
            job.reset(self.adapter.tokenizer, self.adapter.device)
            if job.guide is not None:
                job.guide.gen = []
        try:
            t0 = self.clock()
            caches, logits = steps.prefill_group(self.adapter, forward)
            self.pacer.prefilled(sum(len(j.new_ids) for j in forward), self.clock() - t0)
        except Exception as exc:  # OOM or a bad row: each is prefilled alone next
            self.counters["group_fallbacks"] += 1
            log.warning("a group prefill failed (%s); its rows go alone", type(exc).__name__)
            self._requeue_alone(group)
            self._grouped = []
            if isinstance(exc, torch.cuda.OutOfMemoryError):
                steps.free_accelerator()
            return
        joined, firsts = self._join(group, forward, caches, logits)
        del caches
        self.counters["rows"] += len(joined)
        self.counters["group_prefills"] += 1
        self.counters["grouped_rows"] += len(joined)
        self.counters["peak_batch"] = max(self.counters["peak_batch"], len(self._rows))
        self._grouped = []
        if joined:
            self._advance(joined, firsts, cached=False)
            self._keep_captured(joined)

    def _join(self, group: list[RowJob], forward: list[RowJob], caches: list[Any],
              logits: torch.Tensor) -> tuple[list[RowJob], torch.Tensor]:
        """The group's rows (each guide right after its row) into the batch; the joined rows
        and their first tokens' logits (a guided row's combined with its guide's)."""
        at = {id(r): k for k, r in enumerate(forward)}
        joined: list[RowJob] = []
        try:
            width = max(c.get_seq_length() for c in caches)
            self._batch.make_room(len(self._rows) + len(forward), width, max(
                self._batch.width, width) + max(j.max_new_tokens for j in forward))
            for job in group:
                self._capture_segment(job, caches[at[id(job)]])
                self._batch.add(caches[at[id(job)]], heads.head_of(job))  # all layers or none
                self._rows.append(job)
                joined.append(job)
                if job.guide is not None:
                    self._join_guide(job, caches[at[id(job.guide)]])
        except Exception as exc:  # e.g. OOM growing the batch: the rest go alone
            self.counters["group_fallbacks"] += 1
            log.warning("a grouped row could not join (%s)", type(exc).__name__)
            self._requeue_alone(group[len(joined):])
        if not any(job.guide is not None for job in joined):
            return joined, anchor.firsts(joined, logits[[at[id(job)] for job in joined]])
        return joined, anchor.firsts(joined, torch.stack([
            contrast.first_token(j, bans.row(j, logits[at[id(j)]]), logits[at[id(j.guide)]])
            if j.guide is not None else logits[at[id(j)]].float() for j in joined]))

    def _join_guide(self, job: RowJob, past: Any) -> None:
        """``job``'s guide into the batch right after it; a guide that cannot join (an OOM
        growing the batch) leaves its row unguided from here on, never failed."""
        try:
            self._batch.add(past)
        except Exception as exc:  # noqa: BLE001 - the row goes on without its guide
            log.warning("a guide could not join its row (%s)", type(exc).__name__)
            job.guide = None
            return
        self._rows.append(job.guide)
        contrast.count_pair(job, self.counters)

    def _requeue_alone(self, group: list[RowJob]) -> None:
        with self._cond:
            for job in reversed(group):
                job.solo = True
                self._waiting.appendleft(job)


def _width(job: RowJob) -> int:
    """Batch rows ``job`` takes: itself and its guide."""
    return 1 + (job.guide is not None)
