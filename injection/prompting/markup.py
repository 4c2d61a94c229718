"""``retrieve_fact`` markup removed from a reply, whole or streamed, with one result.

One left-to-right scanner serves both paths: :func:`strip_markup` (the final text) and
:class:`MarkupStream` (the pieces handed to a streaming client). The scanner's output
for a prefix of the reply is a prefix of its output for the whole reply, so the pieces
streamed always concatenate to the final text, however the reply was cut into pieces.
While streaming it holds back what is not settled yet: a tail that could still become a
call's head (``"retr"``, ``"<|tool_"``...), a call not closed yet, and trailing
whitespace (it may end up next to a removed call).

Recognised (see ``output_filter``): generic ``retrieve_fact(...)`` (balanced parentheses,
quotes respected), DeepSeek ``<｜tool▁call▁begin｜>...retrieve_fact...<｜tool▁call▁end｜>``
(a ``<｜tool▁calls▁begin｜>`` wrapper left empty goes too), GLM ``<|tool_call|>retrieve_fact``
with a balanced JSON object. A call never closed runs to the end of the reply. Calls of
other tools are kept. Where a call is removed, the whitespace on its two sides becomes
one space (or up to two newlines when it held any), none at the start or end of the reply.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["MarkupStream", "scan", "strip_markup"]

TOOL = "retrieve_fact"
DS_CALL_BEGIN, DS_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
GLM_CALL = "<|tool_call|>"
_HEADS = re.compile(r"\b" + TOOL + r"\s*\(|" + "|".join(
    re.escape(h) for h in (DS_CALLS_BEGIN, DS_CALL_BEGIN, GLM_CALL)))
_MARKERS = (TOOL, DS_CALL_BEGIN, DS_CALLS_BEGIN, GLM_CALL)
_TOOL_AT_END = re.compile(r"\b" + TOOL + r"\s*\Z")


def _closing(text: str, i: int, open_ch: str, close_ch: str) -> int:
    """Index just past the ``close_ch`` closing a group open at ``i``; -1: never closed."""
    depth, quote = 1, ""
    while i < len(text):
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
    return -1


def _unsettled_tail(text: str, pos: int) -> int:
    """Where a tail that could still become a call's head starts (``len(text)``: none)."""
    best = len(text)
    for mk in _MARKERS:
        for n in range(min(len(mk) - 1, len(text) - pos), 0, -1):
            if text.endswith(mk[:n]):
                best = min(best, len(text) - n)
                break
    m = _TOOL_AT_END.search(text, pos)
    return min(best, m.start()) if m else best


def _resolve(raw: str, m: re.Match[str], final: bool) -> tuple[int, int, str] | None:
    """``(end, calls_removed, kept_text)`` for the head at ``m``; None: not decided yet."""
    head, after = m.group(0), m.end()
    if head == DS_CALLS_BEGIN:
        j = raw.find(DS_CALLS_END, after)
        if j < 0 and not final:
            return None
        inner, n = scan(raw[after:] if j < 0 else raw[after:j], final=True)
        end = len(raw) if j < 0 else j + len(DS_CALLS_END)
        if n and not inner.strip():
            return end, n, ""
        return end, n, head + inner + ("" if j < 0 else DS_CALLS_END)
    if head == DS_CALL_BEGIN:
        j = raw.find(DS_CALL_END, after)
        if j < 0 and not final:
            return None
        end = len(raw) if j < 0 else j + len(DS_CALL_END)
        return (end, 1, "") if TOOL in raw[after:end] else (end, 0, raw[m.start():end])
    if head == GLM_CALL:
        return _resolve_glm(raw, after, final)
    end = _closing(raw, after, "(", ")")  # generic: the head consumed "("
    if end < 0:
        return (len(raw), 1, "") if final else None
    return end, 1, ""


def _resolve_glm(raw: str, after: int, final: bool) -> tuple[int, int, str] | None:
    k = after + len(raw[after:]) - len(raw[after:].lstrip())
    rest = raw[k:]
    if not rest.startswith(TOOL):
        if not final and TOOL.startswith(rest):
            return None  # "<|tool_call|>retr" so far
        return after, 0, GLM_CALL
    t = k + len(TOOL)
    if t == len(raw) and not final:
        return None
    if t < len(raw) and (raw[t].isalnum() or raw[t] == "_"):
        return after, 0, GLM_CALL  # another tool whose name starts with ours
    p = t + len(raw[t:]) - len(raw[t:].lstrip())
    if p == len(raw):
        return (len(raw), 1, "") if final else None
    if raw[p] != "{":
        return p, 1, ""  # a head without arguments
    end = _closing(raw, p + 1, "{", "}")
    if end < 0:
        return (len(raw), 1, "") if final else None
    return end, 1, ""


def scan(raw: str, *, final: bool) -> tuple[str, int]:
    """``(clean, calls_removed)`` of ``raw``; not ``final``: only its settled part."""
    out: list[str] = []
    pending: str | None = None  # whitespace gathered around removed calls
    count = pos = 0

    def put(text: str) -> None:
        nonlocal pending
        if pending is not None:
            lead = text[: len(text) - len(text.lstrip())]
            pending += lead
            text = text[len(lead):]
            if not text:
                return
            if "".join(out).strip():
                nl = pending.count("\n")
                out.append("\n" * min(nl, 2) if nl else (" " if pending else ""))
            pending = None
        out.append(text)

    while True:
        m = _HEADS.search(raw, pos)
        if m is None:
            put(raw[pos:] if final else raw[pos:max(pos, _unsettled_tail(raw, pos))])
            break
        put(raw[pos:m.start()])
        res = _resolve(raw, m, final)
        if res is None:
            break
        end, n, kept = res
        count += n
        if kept:
            put(kept)
        elif n:
            text = "".join(out)
            trail = text[len(text.rstrip()):]
            out[:] = [text[: len(text) - len(trail)]]
            pending = (pending or "") + trail
        pos = end
    text = "".join(out)
    return (text if final else text.rstrip()), count


def strip_markup(text: str) -> tuple[str, int]:
    """The whole reply without ``retrieve_fact`` markup; ``(text, calls_removed)``."""
    if TOOL not in text:
        return text, 0
    return scan(text, final=True)


class MarkupStream:
    """Streaming: ``stream(piece)`` for each raw piece, ``stream.finish()`` at the end;
    ``sink`` gets the clean text in pieces that concatenate to ``strip_markup(reply)``."""

    def __init__(self, sink: Callable[[str], None],
                 prepare: Callable[[str], str] = lambda t: t) -> None:
        self.sink, self.prepare = sink, prepare
        self.raw, self.sent = "", ""

    def __call__(self, piece: str) -> None:
        self.raw += self.prepare(piece)
        self._send(scan(self.raw, final=False)[0])

    def finish(self) -> None:
        self._send(strip_markup(self.raw)[0])

    def _send(self, clean: str) -> None:
        if len(clean) > len(self.sent) and clean.startswith(self.sent):
            self.sink(clean[len(self.sent):])
            self.sent = clean
