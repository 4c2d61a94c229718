"""Batched prefill: rows waiting together are prefilled in one forward pass (mixed into
``BatchEngine``, ``batch.py``; the forward itself is ``steps.prefill_group``).

A group is the first waiting row and those right behind it, up to ``group_prefill`` rows,
while the batch has room (``max_batch``, the OOM cap, the K/V budget). A row joins a group
only if it needs nothing the single path gives it: no attention emphasis, no chunking
(its new tokens fit one chunk), not a row resumed after an OOM. Each row's K/V, cut from
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

from injection.engine import steps
from injection.engine.batchrow import RowJob

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
        rows = len(self._rows) + 1 + (job is not None and job.guide is not None)
        if job is None or (self._rows and rows > min(self.max_batch, self._oom_cap)):
            return None
        if self._rows and self.kv_budget_bytes:
            widest = max(job.reserve_tokens(), *(r.reserve_tokens() for r in self._rows))
            if rows * widest * self.bytes_per_token > self.kv_budget_bytes:
                return None
        return self._waiting.popleft()

    def _group(self, first: RowJob) -> list[RowJob]:
        """``first`` and the groupable rows queued right behind it (popped)."""
        group = [first]
        if self.group_prefill <= 1 or not self._groupable(first):
            return group
        with self._cond:
            while (self._waiting and len(group) < self.group_prefill
                   and self._groupable(self._waiting[0]) and self._room(group)):
                group.append(self._waiting.popleft())
            self._grouped = group if len(group) > 1 else []  # abort() fails them too
        return group

    def _groupable(self, job: RowJob) -> bool:
        return (not job.abandoned and not job.solo and not job.emitted() and not job.prefilled
                and not job.emphasis and job.chunk_cache is None
                and self.pacer.chunk(len(job.new_ids), decoding=bool(self._rows))
                == len(job.new_ids))

    def _room(self, group: list[RowJob]) -> bool:
        rows = len(self._rows) + len(group) + 1
        if rows > min(self.max_batch, self._oom_cap):
            return False
        if not self.kv_budget_bytes:
            return True
        widest = max(r.reserve_tokens() for r in [*self._rows, *group, self._waiting[0]])
        return rows * widest * self.bytes_per_token <= self.kv_budget_bytes

    def _admit_group(self, group: list[RowJob]) -> None:
        """Prefill ``group`` in one forward; every row joins the batch with its first token."""
        self._beat()
        for job in group:
            job.reset(self.adapter.tokenizer, self.adapter.device)
        try:
            t0 = self.clock()
            caches, logits = steps.prefill_group(self.adapter, group)
            self.pacer.prefilled(sum(len(j.new_ids) for j in group), self.clock() - t0)
        except Exception as exc:  # OOM or a bad row: each is prefilled alone next
            self.counters["group_fallbacks"] += 1
            log.warning("a group prefill failed (%s); its rows go alone", type(exc).__name__)
            self._requeue_alone(group)
            self._grouped = []
            if isinstance(exc, torch.cuda.OutOfMemoryError):
                steps.free_accelerator()
            return
        joined: list[RowJob] = []
        try:
            for job, past in zip(group, caches, strict=True):
                self._capture_segment(job, past)
                self._batch.add(past)  # all layers or none
                self._rows.append(job)
                joined.append(job)
        except Exception as exc:  # e.g. OOM growing the batch: the rest go alone
            self.counters["group_fallbacks"] += 1
            log.warning("a grouped row could not join (%s)", type(exc).__name__)
            self._requeue_alone(group[len(joined):])
        del caches
        self.counters["rows"] += len(joined)
        self.counters["group_prefills"] += 1
        self.counters["grouped_rows"] += len(joined)
        self.counters["peak_batch"] = max(self.counters["peak_batch"], len(self._rows))
        self._grouped = []
        if joined:
            self._advance(joined, logits[: len(joined)], cached=False)

    def _requeue_alone(self, group: list[RowJob]) -> None:
        with self._cond:
            for job in reversed(group):
                job.solo = True
                self._waiting.appendleft(job)
