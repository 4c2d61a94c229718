"""Watching a generation as it runs: stop sequences, incremental text, cancellation.

:class:`GenerationWatch` is a transformers ``StoppingCriteria`` called after every
generated token. It decodes the generated ids so far and

* stops at the first occurrence of any ``stop`` string (the reply ends before it);
* hands newly final text to ``on_text`` (streaming), never splitting a multi-byte
  character (a trailing U+FFFD from a partial byte sequence is held back) and never
  sending text that could still turn out to be the start of a stop string;
* stops when ``cancelled()`` says so (checked every ``cancel_every`` tokens).

``first_token_at`` is when the first token was generated (``time.perf_counter()``).
``finish_reason`` afterwards: ``"stop"`` (a stop string or end of sequence),
``"length"`` (``max_new_tokens`` reached) or ``"cancelled"``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import StoppingCriteria

__all__ = ["GenerationWatch", "find_stop"]

_PARTIAL = "\ufffd"  # what decode() yields for an incomplete UTF-8 sequence


def find_stop(text: str, stop: Sequence[str]) -> int:
    """Index of the earliest stop string in ``text``, or -1."""
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return min(hits) if hits else -1


def _held_back(text: str, stop: Sequence[str]) -> int:
    """How many trailing characters could still begin a stop string."""
    longest = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest


class GenerationWatch(StoppingCriteria):
    """Per-token check of one single-sequence generation (see module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        start: int,
        *,
        stop: Sequence[str] = (),
        on_text: Callable[[str], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        cancel_every: int = 1,
    ) -> None:
        self.tokenizer, self.start = tokenizer, start
        self.stop = tuple(s for s in stop if s)
        self.on_text, self.cancelled = on_text, cancelled
        self.cancel_every = max(1, int(cancel_every))
        self.text = ""  # the reply so far (cut at a stop string once one appears)
        self.sent = 0  # characters of ``text`` handed to on_text
        self.finish_reason: str | None = None
        self.steps = 0
        self.first_token_at: float | None = None  # perf_counter() at the first token

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        done = self.observe(input_ids[0, self.start:].tolist())
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)

    def observe(self, generated: list[int]) -> bool:
        """One step of a generation whose generated ids so far are ``generated``; True when
        it must stop (a stop string, or cancelled). The batch engine calls this per row."""
        self.steps += 1
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        done = self._update(generated)
        if not done and self.cancelled is not None and self.steps % self.cancel_every == 0:
            done = bool(self.cancelled())
            if done:
                self.finish_reason = "cancelled"
        return done

    def _update(self, ids: list[int]) -> bool:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = find_stop(text, self.stop)
        if cut >= 0:
            self.text, self.finish_reason = text[:cut], "stop"
            self._emit(len(self.text))
            return True
        self.text = text
        final = len(text.rstrip(_PARTIAL)) if text.endswith(_PARTIAL) else len(text)
        self._emit(final - _held_back(text[:final], self.stop))
        return False

    def _emit(self, upto: int) -> None:
        if self.on_text is not None and upto > self.sent:
            self.on_text(self.text[self.sent:upto])
            self.sent = upto

    def finish(self, ids: list[int], max_new_tokens: int, eos_ids: set[int]) -> str:
        """After generation: flush the rest of the text; returns the finish reason."""
        if self.finish_reason is None:
            self._update(ids)
        if self.finish_reason is None:
            ended = bool(ids) and ids[-1] in eos_ids
            self.finish_reason = "stop" if ended or len(ids) < max_new_tokens else "length"
        self._emit(len(self.text))
        if callable(flush := getattr(self.on_text, "finish", None)):
            flush()  # a filtering stream (``prompting.markup``) sends what it held back
        return self.finish_reason


def admitted(sampling: dict[str, Any], prompt_tokens: int, max_new_tokens: int) -> int:
    """``max_new_tokens`` capped by the request's ``admit`` (popped from ``sampling``),
    asked with the prompt's token count just before generating; it raises to refuse."""
    admit = sampling.pop("admit", None)
    if admit is None:
        return int(max_new_tokens)
    granted = int(admit(int(prompt_tokens)))
    if granted < 1:
        raise ValueError(f"admit granted {granted} tokens: it must refuse by raising")
    return min(int(max_new_tokens), granted)
