"""Strip residual ``retrieve_fact`` tool calls from model output (design F1-4).

Three formats are recognised:

* generic  ``retrieve_fact(trace_id="...", ...)`` (balanced parentheses, quotes respected);
* DeepSeek ``<｜tool▁call▁begin｜>...retrieve_fact...<｜tool▁call▁end｜>`` (and the
  ``<｜tool▁calls▁begin｜>``/``<｜tool▁calls▁end｜>`` wrapper once it is empty);
* GLM      ``<|tool_call|>retrieve_fact\\n{...}`` (balanced JSON object).

A call cut off by the token limit (no closing marker) is stripped to the end of
the text. Calls of other tools are left alone. The scanner lives in ``markup.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from injection.prompting.markup import strip_markup

__all__ = ["clean_reply", "strip_control_chars", "strip_retrieve_fact_calls"]

# C0 controls but tab, newline and carriage return; DEL; C1 controls; lone surrogates.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def strip_control_chars(text: str) -> tuple[str, int]:
    """Drop characters no client can display (NUL, escapes, C1, lone surrogates); keep
    text, whitespace, emoji and format characters (ZWJ, bidi marks). ``(text, removed)``."""
    return _CONTROL.subn("", text)


def strip_retrieve_fact_calls(text: str) -> tuple[str, int]:
    """Return ``(clean_text, stripped_count)``; text without calls is returned unchanged.

    The same scanner strips streamed text (``markup.MarkupStream``), so a streamed reply
    concatenates to exactly this."""
    return strip_markup(text)


def clean_reply(text: str, incr: Callable[[str, int], None]) -> tuple[str, int]:
    """A final reply as clients get it: control characters first (as the stream does),
    then ``retrieve_fact`` calls; counts both through ``incr``. ``(text, calls)``."""
    text, controls = strip_control_chars(text)
    if controls:
        incr("stripped_control_chars", controls)
    text, n = strip_retrieve_fact_calls(text)
    if n:
        incr("stripped_calls", n)
    return text, n
