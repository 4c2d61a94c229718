"""What the decoding constraints read of a tokenizer and a reply's text: every token's
text (built once per tokenizer) and where a sentence ends."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["ended", "token_texts"]


def token_texts(tokenizer: Any) -> list[str]:
    """Each token id's text, decoded once per tokenizer."""
    texts = getattr(tokenizer, "_kvinject_token_texts", None)
    if texts is None:
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        tokenizer._kvinject_token_texts = texts
    return texts


_END = re.compile(r"[^\W\d_][.!?]+[\"')\]]*\s*$")  # a word's end, then .!? ("1." is a list's)


def ended(text: str) -> bool:
    """Whether ``text`` ends a sentence (a word, then ".", "!" or "?")."""
    return _END.search(text) is not None
