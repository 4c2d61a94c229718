"""Checks and options of an :class:`ExecutionRequest` before the executor runs it."""

from __future__ import annotations

import math
from typing import Any

from injection.base import ExecutionRequest
from injection.engine.guidance.contrast import MAX_CONTRAST
from injection.errors import InvalidRequest
from injection.prompting.markup import MarkupStream
from injection.prompting.output_filter import strip_control_chars

__all__ = ["history_len", "sampling_options", "validate"]


# a temperature below this is greedy decoding (its limit): dividing float32 logits by it
# overflows (1e-313 is 0 in float32) and the draw fails; vLLM uses the same floor
GREEDY_BELOW = 1e-5


def sampling_options(req: ExecutionRequest) -> dict[str, Any]:
    """The generation's sampling, stop strings and stream callbacks."""
    temperature = req.temperature if req.temperature >= GREEDY_BELOW else 0.0
    sampling: dict[str, Any] = {"temperature": temperature, "top_p": req.top_p,
                                "seed": req.seed}
    if req.stop:
        sampling["stop"] = tuple(req.stop)
    if req.on_text is not None:  # control characters and markup never reach a stream either
        sampling["on_text"] = MarkupStream(req.on_text, lambda t: strip_control_chars(t)[0])
    if req.cancelled is not None:
        sampling["cancelled"] = req.cancelled
    if req.admit is not None:
        sampling["admit"] = req.admit
    if req.on_failure is not None:
        sampling["on_failure"] = req.on_failure
    return sampling


def history_len(messages: list[dict[str, str]]) -> int:
    return sum(1 for m in messages[:-1] if m["role"] != "system")


def _in_range(name: str, value: float | None, high: float) -> None:
    """An optional strength: unset, or finite within [0, high]."""
    if value is not None and not (math.isfinite(value) and 0 <= value <= high):
        raise InvalidRequest(f"{name} must be between 0 and {high:g}, got {value}")


def validate(req: ExecutionRequest) -> None:
    if not req.tenant:
        raise InvalidRequest("tenant is required")
    msgs = list(req.messages) if isinstance(req.messages, list | tuple) else []
    if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs):
        raise InvalidRequest("messages must be a list of {role, content} objects")
    if any(m.get("role") not in ("system", "user", "assistant") for m in msgs):
        raise InvalidRequest("message roles must be system, user or assistant")
    if not msgs or msgs[-1]["role"] != "user" or not msgs[-1]["content"].strip():
        raise InvalidRequest("the conversation must end with a non-empty user message")
    if not math.isfinite(req.alpha) or req.alpha < 0:
        raise InvalidRequest(f"alpha must be a finite number >= 0, got {req.alpha}")
    _in_range("contrast", req.contrast, MAX_CONTRAST)
    if req.max_new_tokens < 1:
        raise InvalidRequest("max_new_tokens must be >= 1")
    if not math.isfinite(req.temperature) or req.temperature < 0 or not 0 < req.top_p <= 1:
        raise InvalidRequest("temperature must be >= 0 and top_p in (0, 1]")
