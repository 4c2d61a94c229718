"""One request inside the batch engine: its inputs, its state, and how its caller waits."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from injection.base import GenerationOutput
from injection.engine.sampling import RowSampler
from injection.engine.stopping import GenerationWatch, admitted
from injection.kvcache.packed import PackedKV

__all__ = ["RowJob", "hand_over", "report_failure", "wait_for"]

log = logging.getLogger("injection.engine.batch")

_FINISH = threading.Lock()  # finish() is first-wins across threads


@dataclass(eq=False)
class RowJob:
    """A generation: ``prefix`` K/V (values scaled by ``alpha`` when built) then ``new_ids``.

    ``prefix_ids + new_ids`` is the whole input; ``keep_kv`` asks for the finished
    sequence's K/V (``GenerationOutput.sequence_kv``) for conversation reuse.
    """

    prefix: PackedKV | None
    alpha: float
    new_ids: list[int]
    prompt_ids: list[int]  # what the caller counts as the prompt (reported back)
    max_new_tokens: int
    sampling: dict[str, Any]
    watch_opts: dict[str, Any]
    keep_kv: bool = False
    keep_from: int = 0  # that K/V from this token on (a head the caller holds left out)
    # the one-pass miss: the first ``capture_tokens`` of ``new_ids`` are a cache segment
    # missing from every tier; its K/V, sliced from this row's prefill, goes to ``capture``
    capture: Callable[[PackedKV], None] | None = None
    capture_tokens: int = 0
    captured: PackedKV | None = None  # that K/V, handed to ``capture`` after the first token
    solo: bool = False  # prefilled alone, never in a group (``grouping``)
    # columns its prefill cache keeps free for decoding: a row the empty batch adopts as is
    # (``BatchCache.add``), set by the scheduler just before the prefill
    spare: int = 0
    # contrastive guidance (``guidance/contrast.py``): the row's guide, and the guide's own flag
    guide: RowJob | None = None
    guide_strength: float = 0.0
    is_guide: bool = False
    guide_prefilled: int = 0  # tokens the guide row has prefilled (``contrast.prefill*``)
    # a guide that left early (``guidance/lean.py``): its ``[V]`` lean, steps seen, steps fed,
    # and the guide itself, back for a row that starts over (``reset``)
    lean: Any = None
    lean_steps: int = 0
    guide_fed: int | None = None
    guide_left: RowJob | None = None
    # a member's lean measured once (``guidance/probe.py``): ``probe`` rows measure it (their
    # first token's ``[V]`` difference in ``first_lean``), ``preset`` rows choose with it
    # (its ``first``/``rest``, times ``guide_strength``) and run no guide
    probe: bool = False
    first_lean: Any = None
    preset: Any = None
    first_scores: Any = None  # ``[V]`` first-token scores of its anchor (``guidance/anchor.py``)
    # decoding constraints (``engine/decoding/bans.py``, built by ``bans.prepare`` when submitted)
    token_map: Any = None
    phrases: Any = None
    started: float = field(default_factory=time.perf_counter)
    # told the tokens generated if the row fails (``report_failure``; the request's, popped
    # from ``sampling`` like ``admit``): billing
    on_failure: Callable[[int], None] | None = None
    input_ids: list[int] = field(init=False)  # prefix ids + new_ids (__post_init__)
    # -- state (scheduler thread) --
    gen: list[int] = field(default_factory=list)
    watch: GenerationWatch | None = None
    sampler: RowSampler | None = None
    kv_transfer_ms: float = 0.0
    kv_bytes_gpu: int = 0
    chunk_cache: Any = None  # a chunked prefill's K/V so far (``prefilled`` of its ids)
    prefilled: int = 0
    # -- handoff --
    abandoned: bool = False  # the caller stopped waiting (time limit, shutdown)
    output: GenerationOutput | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        # the whole input, once (the admission check and the repetition penalty read it)
        self.input_ids = [*(self.prefix.token_ids if self.prefix is not None else ()),
                          *self.new_ids]
        # the request's ``admit`` (budgets), asked with the prompt it is billed for before
        # the row is queued; it may lower max_new_tokens, or refuse by raising
        self.max_new_tokens = admitted(self.sampling, len(self.input_ids), self.max_new_tokens)
        self.on_failure = self.sampling.pop("on_failure", self.on_failure)

    def reset(self, tokenizer: Any, device: Any) -> None:
        """Fresh generation state (also when a row is put back after an OOM): a guide that
        had left guides the row again from its start."""
        self.gen = []
        if self.guide_left is not None:
            self.guide, self.guide_left = self.guide_left, None
        self.lean, self.lean_steps, self.guide_fed = None, 0, None
        self.first_lean = None
        if self.preset is not None:  # leaning from the first token (``lean.advance``)
            self.lean = self.preset.first.to(device, torch.float32) * self.guide_strength
            self.guide_fed = 0
        self.watch = GenerationWatch(tokenizer, 0, **self.watch_opts)
        self.sampler = RowSampler(self.sampling.get("temperature") or 0.0,
                                  self.sampling.get("top_p") or 1.0,
                                  self.sampling.get("seed"), device=device,
                                  token_map=self.token_map, forced=self.phrases,
                                  no_repeat=self.sampling.get("no_repeat", 0))

    def emitted(self) -> bool:
        """Whether any text reached the caller's stream (then it is resumed, never restarted)."""
        return self.watch is not None and self.watch.sent > 0

    def prefill_ids(self, resume: bool) -> list[int]:
        """The tokens a prefill runs after the prefix: the new ids, and when a row put back
        after an OOM resumes, the tokens it generated except the last (the next step's)."""
        return self.new_ids + self.gen[:-1] if resume else self.new_ids

    def reserve_tokens(self) -> int:
        return len(self.input_ids) + self.max_new_tokens

    def finish(self, output: GenerationOutput | None = None,
               error: BaseException | None = None) -> bool:
        """Hand the result to the caller; the first call wins (False: already finished,
        e.g. a watchdog failed the row before a stuck scheduler thread came back)."""
        return hand_over(self, error, output=output)

    def wait(self, poll: float = 0.05) -> GenerationOutput:
        """Block until finished; the row is abandoned (dropped at the next step) when its
        caller stops waiting (``wait_for``). A row that fails (its caller's time limit, the
        engine's error) tells its ``on_failure`` the tokens it generated."""
        try:
            wait_for(self, poll)
        except BaseException:
            report_failure(self)
            raise
        assert self.output is not None
        return self.output


def hand_over(job: Any, error: BaseException | None, **result: Any) -> bool:
    """Set ``job``'s result attributes (or ``error``) and its ``done`` event, once: the first
    call wins across threads (False: already finished)."""
    with _FINISH:
        if job.done.is_set():
            return False
        for name, value in result.items():
            setattr(job, name, value)
        job.error = error
        job.done.set()
    return True


def wait_for(job: Any, poll: float = 0.05) -> None:
    """Block until ``job.done``, raising its error. Short waits, so an asynchronous exception
    (the soft time limit) reaches this thread; ``job.abandoned`` is then set."""
    try:
        while not job.done.wait(poll):
            pass
    except BaseException:
        job.abandoned = True
        raise
    if job.error is not None:
        raise job.error


def report_failure(job: RowJob) -> None:
    """Tell a failed row's ``on_failure`` how many tokens it generated, once (a row whose
    caller stopped: those it had then; the step in flight may add one). Bookkeeping: a
    failing callback is logged, never raised over the row's own error."""
    callback, job.on_failure = job.on_failure, None
    if callback is None:
        return
    try:
        callback(len(job.gen))
    except Exception as exc:
        log.warning("a failed row's tokens were not reported (%s)", type(exc).__name__)
