"""Chat rendering and the injected segment: the member's context as the template's system turn.

The injected K/V is computed on exactly the text the model would have seen anyway:
the chat template's rendering of ``[{"role": "system", "content": context}]``. The
prompt continues where that turn ends (history, the new user turn, the generation
prompt), so at alpha 1 injected generation equals plain generation of the same
conversation with the context as its system message, token for token, as long as nothing
else changes the turn: no contrastive guide (``engine/guidance``) and no memory
reminder in the messages (``prompting/reminder.py``, on by default deep in a conversation).

The split is found by rendering, never by hard-coded markers, and is verified:
``encode(segment) + encode(rest) == encode(full)`` or it is not used. Fallbacks, in
order, for templates without a system role (they raise or drop it):

* ``user_prefix``: the context opens the first user message (``context + "\\n\\n"``);
  the segment is the rendering up to the end of that context;
* ``inline``: no split reproduces the rendering, so nothing is injected: the context
  stays in the prompt as text (tier ``none``), which is always correct, never cached.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple, TypeVar

from injection.base import SegmentSplit
from injection.kvcache.conversation import common_prefix

__all__ = ["PromptParts", "ChatRenderer", "SEPARATOR", "compose_context"]

SEPARATOR = "\n\n"
_MODES = ("system", "user_prefix")
# A turn renders and encodes its conversation several times while it is planned (the
# history fitted, the split verified, the prompt encoded), and a deep turn counts each
# earlier turn of its conversation again (``prompting.history``: the block cut). Both are
# pure functions of the text: the last results are kept, per renderer.
ENCODED_KEPT = 64  # texts' token ids
COUNTED_KEPT = 1024  # conversations' (context, messages) token counts
T = TypeVar("T")


class _Memo:
    """The last ``size`` results of a pure function, by key (thread-safe)."""

    def __init__(self, size: int) -> None:
        self.size, self._kept, self._lock = size, OrderedDict(), threading.Lock()

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
        value = make()
        with self._lock:
            self._kept[key] = value
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return value


def compose_context(instructions: str, preference: str) -> str:
    """The system turn's text: tenant instructions, then the member's preference."""
    return SEPARATOR.join(p.strip() for p in (instructions, preference) if p and p.strip())


class PromptParts(NamedTuple):
    """``segment`` is injected as K/V ('' = nothing injected); ``prompt`` follows it."""

    segment: str
    prompt: str
    mode: str  # "system" | "user_prefix" | "inline" | "none"


class ChatRenderer:
    """A tokenizer's chat template: render, encode and split a conversation."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.has_template = bool(getattr(tokenizer, "chat_template", None))
        self._encoded, self._counted = _Memo(ENCODED_KEPT), _Memo(COUNTED_KEPT)

    def render(self, messages: list[dict[str, str]], *, generation_prompt: bool = True) -> str:
        """The template's text (``role: content`` lines for tokenizers without one)."""
        if self.has_template:
            return self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=generation_prompt, tokenize=False
            )
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        return "\n".join(lines + (["assistant:"] if generation_prompt else []))

    def encode(self, text: str, *, first: bool) -> list[int]:
        """Token ids; ``first`` text starts the sequence and gets BOS unless it renders one.

        Templates that render BOS themselves (Llama 3, Gemma, Mistral) must not get a
        second one from the tokenizer; continuation text never gets special tokens.
        """
        return list(self._encoded.get((text, first), lambda: tuple(self._encode(text, first))))

    def _encode(self, text: str, first: bool) -> list[int]:
        bos = getattr(self.tokenizer, "bos_token", None)
        add = first and not (bos and text.startswith(bos))
        return self.tokenizer(text, add_special_tokens=add)["input_ids"]

    def count(self, context: str, messages: list[dict[str, str]]) -> int:
        """Tokens of the whole conversation with ``context`` (``plain``, encoded first)."""
        def made() -> int:
            return len(self.encode(self.plain(context, messages), first=True))

        try:
            key = (context, tuple(tuple(sorted(m.items())) for m in messages))
            hash(key)
        except TypeError:  # a message with unhashable fields (tool calls): counted as is
            return made()
        return self._counted.get(key, made)

    def plain(self, context: str, messages: list[dict[str, str]]) -> str:
        """The whole prompt with ``context`` as text (no injection): the reference path.

        The system turn where the template keeps it, else the first user message's start.
        """
        if not context:
            return self.render(messages)
        try:
            full = self.render(_with_context("system", context, messages))
            if context in full:
                return full
        except Exception:  # noqa: BLE001 - jinja TemplateError, ValueError, ...
            pass
        return self.render(_with_context("user_prefix", context, messages))

    def split(self, context: str, messages: list[dict[str, str]]) -> PromptParts:
        """Segment (the context's turn) and the prompt that continues it, verified."""
        if not context.strip():
            return PromptParts("", self.render(messages), "none")
        for mode in _MODES:
            parts = self._try(mode, context, messages)
            if parts is not None:
                return parts
        return PromptParts("", self.plain(context, messages), "inline")

    def tenant_split(self, segment: str, context: str, instructions: str) -> SegmentSplit | None:
        """``segment`` split after the tenant's instructions, token-exactly, or None.

        The tenant part (template header + instructions) is the same text for every
        member; its ids must be a prefix of the whole turn's ids. Where a token merges
        across the boundary (Qwen: "." and the separator's "\n\n" are one token), the tenant
        part stops before that token: the ids both encodings share, whose text is then a
        prefix of the turn (K/V of a prefix depends on nothing after it). None: one segment.
        """
        instructions = instructions.strip()
        start = segment.find(context) if instructions and context.startswith(instructions) else -1
        if start < 0:
            return None
        cut = start + len(instructions)
        whole = self.encode(segment, first=True)
        head = self.encode(segment[:cut], first=True)
        shared = common_prefix(head, whole)
        if shared < len(head):  # a merge across the boundary
            cut, head = self._cut_at(segment, head[:shared]), head[:shared]
        if cut is None or not head or len(head) >= len(whole):
            return None
        return SegmentSplit(segment[:cut], tuple(head), segment[cut:], tuple(whole[len(head):]))

    def _cut_at(self, segment: str, ids: list[int]) -> int | None:
        """Where ``ids``' text ends in ``segment``, if it is a prefix that encodes back to
        exactly ``ids``; else None."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)
        if not ids or not segment.startswith(text) or self.encode(text, first=True) != ids:
            return None
        return len(text)

    # -- internals ----------------------------------------------------------------------
    def _try(self, mode: str, context: str, messages: list[dict[str, str]]) -> PromptParts | None:
        try:
            full = self.render(_with_context(mode, context, messages))
            segment = self._segment(mode, context, full)
        except Exception:  # noqa: BLE001 - a template that rejects the role or the layout
            return None
        if not segment or context not in segment or not full.startswith(segment):
            return None
        rest = full[len(segment):]
        if not rest or not self.reproduces(segment, rest, full):
            return None
        return PromptParts(segment, rest, mode)

    def _segment(self, mode: str, context: str, full: str) -> str:
        if mode == "system":
            return self.render([{"role": "system", "content": context}], generation_prompt=False)
        end = full.find(context + SEPARATOR)
        return "" if end < 0 else full[: end + len(context) + len(SEPARATOR)]

    def reproduces(self, segment: str, rest: str, full: str) -> bool:
        """``full``'s tokens are ``segment``'s (first) then ``rest``'s: a cut at a token edge."""
        whole = self.encode(full, first=True)
        return self.encode(segment, first=True) + self.encode(rest, first=False) == whole


def _with_context(mode: str, context: str, messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The conversation with ``context`` as a leading system turn or user-message prefix."""
    if mode == "system":
        return [{"role": "system", "content": context}, *messages]
    out = [dict(m) for m in messages]
    first_user = next((m for m in out if m["role"] == "user"), None)
    if first_user is None:
        raise ValueError("no user message to carry the context")
    first_user["content"] = context + SEPARATOR + first_user["content"]
    return out
