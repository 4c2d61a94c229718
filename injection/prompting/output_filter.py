"""Strip residual ``retrieve_fact`` tool calls from model output (design F1-4).

Three formats are recognised:

* generic  ``retrieve_fact(trace_id="...", ...)`` (balanced parentheses, quotes respected);
* DeepSeek ``<｜tool▁call▁begin｜>...retrieve_fact...<｜tool▁call▁end｜>`` (and the
  ``<｜tool▁calls▁begin｜>``/``<｜tool▁calls▁end｜>`` wrapper once it is empty);
* GLM      ``<|tool_call|>retrieve_fact\\n{...}`` (balanced JSON object).

A call cut off by the token limit (no closing marker) is stripped to the end of
the text. Calls of other tools are left alone.
"""

from __future__ import annotations

import re

__all__ = ["strip_control_chars", "strip_retrieve_fact_calls"]

TOOL = "retrieve_fact"
DS_CALL_BEGIN, DS_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
GLM_CALL = "<|tool_call|>"

_DS_CALL = re.compile(re.escape(DS_CALL_BEGIN) + r"(.*?)(?:" + re.escape(DS_CALL_END) + r"|\Z)", re.S)
_DS_EMPTY_WRAPPER = re.compile(
    re.escape(DS_CALLS_BEGIN) + r"\s*(?:" + re.escape(DS_CALLS_END) + r"|\Z)"
)
_GLM_HEAD = re.compile(re.escape(GLM_CALL) + r"\s*" + TOOL + r"\b\s*")
_GENERIC_HEAD = re.compile(r"\b" + TOOL + r"\s*\(")
_BLANK_RUNS = re.compile(r"\n{3,}")
_SPACE_RUNS = re.compile(r"(?<=\S)[ \t]{2,}(?=\S)")


# C0 controls but tab, newline and carriage return; DEL; C1 controls; lone surrogates.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def strip_control_chars(text: str) -> tuple[str, int]:
    """Drop characters no client can display (NUL, escapes, C1, lone surrogates); keep
    text, whitespace, emoji and format characters (ZWJ, bidi marks). ``(text, removed)``."""
    return _CONTROL.subn("", text)


def strip_retrieve_fact_calls(text: str) -> tuple[str, int]:
    """Return ``(clean_text, stripped_count)``; text without calls is returned unchanged."""
    if TOOL not in text:
        return text, 0
    text, n_ds = _strip_deepseek(text)
    text, n_glm = _strip_spans(text, _GLM_HEAD, "{", "}")
    text, n_gen = _strip_spans(text, _GENERIC_HEAD, "(", ")", opened=True)
    count = n_ds + n_glm + n_gen
    if count:
        text = _BLANK_RUNS.sub("\n\n", _SPACE_RUNS.sub(" ", text)).strip()
    return text, count


def _strip_deepseek(text: str) -> tuple[str, int]:
    count = 0

    def drop(m: re.Match[str]) -> str:
        nonlocal count
        if TOOL not in m.group(1):
            return m.group(0)
        count += 1
        return ""

    text = _DS_CALL.sub(drop, text)
    if count:
        text = _DS_EMPTY_WRAPPER.sub("", text)
    return text, count


def _strip_spans(
    text: str, head: re.Pattern[str], open_ch: str, close_ch: str, *, opened: bool = False
) -> tuple[str, int]:
    """Remove ``head`` + a balanced ``open_ch ... close_ch`` group after it.

    ``opened``: the head already consumed the opening character.
    """
    out: list[str] = []
    pos = count = 0
    while (m := head.search(text, pos)) is not None:
        start = m.end()
        if not opened:
            if start >= len(text) or text[start] != open_ch:
                end = start  # head without arguments (e.g. cut off): drop the head
            else:
                end = _balanced_end(text, start + 1, open_ch, close_ch)
        else:
            end = _balanced_end(text, start, open_ch, close_ch)
        out.append(text[pos : m.start()])
        pos = end
        count += 1
    out.append(text[pos:])
    return "".join(out), count


def _balanced_end(text: str, i: int, open_ch: str, close_ch: str) -> int:
    """Index just past the ``close_ch`` matching an already-open group at ``i``.

    Quoted strings (single or double, with backslash escapes) are skipped; an
    unterminated group runs to the end of the text.
    """
    depth, quote, n = 1, "", len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n
