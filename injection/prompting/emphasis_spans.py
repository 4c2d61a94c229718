"""Which key positions attention emphasis applies to: the member's memory text tokens.

The injected system turn is ``segment`` (the chain: tenant ids, then member ids = the
separator, the member's text, the end of the turn). Emphasis goes to the tokens of the
member's own text only: never the template's header or footer, the separator, or the
tenant's instructions. Found token-exactly: the segment is tokenised exactly as the chain
tokenises it (the ids are checked against the chain's), and a token belongs to a text
when its characters overlap the text's characters. Positions are absolute (from the
start of the sequence): the segment starts the sequence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from injection.base import ExecutionRequest, SegmentSplit
from injection.engine import emphasis as _emphasis

__all__ = ["emphasis_for", "find_spans", "member_texts", "normalised", "reply_spans",
           "text_spans"]

Spans = tuple[tuple[int, int], ...]
REF_TOKENS = 16  # emphasised tokens that get the full strength (about one memory)


def member_texts(req: ExecutionRequest) -> list[str]:
    """The member's texts in the system turn: its memories, else its preference."""
    if req.memories:
        return [m.text.strip() for m in req.memories if m.text.strip()]
    return [req.preference_text.strip()] if req.preference_text.strip() else []


def emphasis_for(adapter: Any, req: ExecutionRequest, segment: str,
                 split: SegmentSplit | None, *, on: bool,
                 texts: Sequence[str] | None = None) -> tuple[float, Spans]:
    """The effective emphasis of ``req`` and the absolute key spans it applies to; (0, ())
    when off, when ``on`` is False (nothing personal injected, no batch engine) or when no
    member token is found. ``texts``: the member texts in ``segment`` in rendered order
    (``MemoryPlan.emphasis_texts``; None: ``member_texts(req)``)."""
    value = _emphasis.resolve(adapter, req.emphasis) if on else 0.0
    if not value:
        return 0.0, ()
    try:
        spans = text_spans(adapter.renderer, segment, split, req.instructions,
                           member_texts(req) if texts is None else texts)
    except Exception:  # noqa: BLE001 - a tokenizer quirk costs the emphasis, never the reply
        spans = ()
    value = normalised(value, spans)
    return (value, spans) if spans and value > 0 else (0.0, ())


def normalised(value: float, spans: Spans) -> float:
    """``value`` less ln(tokens / REF_TOKENS) when the spans hold more than REF_TOKENS
    tokens: the emphasised keys' total extra weight (tokens x e^value) stays that of one
    memory, so 20 memories are not each pushed as hard as one (measured: at full strength
    they crowd out the tenant's instructions and the question)."""
    n = sum(e - s for s, e in spans)
    if n <= REF_TOKENS:
        return value
    return max(0.0, value - math.log(n / REF_TOKENS))


def _encode_with_offsets(renderer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    tok = renderer.tokenizer
    bos = getattr(tok, "bos_token", None)
    add = not (bos and text.startswith(bos))  # as ChatRenderer.encode(first=True)
    enc = tok(text, add_special_tokens=add, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def text_spans(renderer: Any, segment: str, split: SegmentSplit | None, instructions: str,
               texts: Sequence[str]) -> Spans:
    """Token spans ``[(start, end), ...]`` of ``texts`` (found in order) in ``segment``,
    after the tenant's part: its split when there is one, else its instructions' text."""
    ids, offsets = _encode_with_offsets(renderer, segment)
    if ids != renderer.encode(segment, first=True):
        return ()
    first_tok, cursor = 0, 0
    if split is not None:
        if tuple(ids) != split.tenant_ids + split.member_ids:
            return ()
        first_tok, cursor = len(split.tenant_ids), len(split.tenant_text)
    elif instructions.strip() and (at := segment.find(instructions.strip())) >= 0:
        cursor = at + len(instructions.strip())
    return _merge(find_spans(segment, offsets, texts, cursor, first_tok))


def reply_spans(renderer: Any, prompt: str, prompt_ids: Sequence[int],
                replies: Sequence[str]) -> Spans:
    """Token spans of ``replies`` (earlier assistant messages, found in order) in the
    continuation ``prompt`` encoded as ``prompt_ids``; () when the tokenisation differs."""
    enc = renderer.tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
    if list(enc["input_ids"]) != list(prompt_ids):
        return ()
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    return _merge(find_spans(prompt, offsets, [r.strip() for r in replies]))


def find_spans(text: str, offsets: Sequence[Sequence[int]], parts: Sequence[str],
               cursor: int = 0, first_tok: int = 0) -> list[tuple[int, int]]:
    """Token spans ``(start, end)`` of ``parts``, found in order in ``text`` from character
    ``cursor`` on (a part not found is skipped): the tokens (from ``first_tok``) whose
    ``offsets`` overlap the part's characters; a part's tokens are contiguous."""
    spans: list[tuple[int, int]] = []
    for part in parts:
        at = text.find(part, cursor) if part else -1
        if at < 0:
            continue
        lo, hi = at, at + len(part)
        cursor = hi
        toks = [i for i, (a, b) in enumerate(offsets)
                if i >= first_tok and b > a and a < hi and b > lo]
        if toks:
            spans.append((toks[0], toks[-1] + 1))
    return spans


def _merge(spans: list[tuple[int, int]]) -> Spans:
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return tuple(out)
