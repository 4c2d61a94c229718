"""Which rows of the batch begin with the same K/V: a tenant's instructions, injected for
each of its members. A decoding step's attention then reads those columns once for the
group (``model/shared_attention.py``) instead of once per row.

A row's head is its prefix's first cached piece (``KVPieces``; a tenant's segment when
the tenant has instructions) of at least ``MIN_TOKENS`` tokens, keyed by that piece's
identity: a row's cache begins with a copy of that piece, and a row whose K/V are scaled
(a member's alpha) has none. A row joins a group only if its first columns also equal, bit
for bit, those of a row already in it in the first and the last layer (``checked``, a
sixteenth of comparing all 30 of SmolLM2's): a key that lies only costs the row its
sharing.
"""

from __future__ import annotations

from typing import Any

import torch

from injection.model.shared_attention import HeadGroup

__all__ = ["MIN_TOKENS", "checked", "groups", "head_of"]

MIN_TOKENS = 64  # shorter heads: the grouped attention's extra products cost more than they save


def head_of(job: Any) -> tuple[int, int] | None:
    """``(key, tokens)`` of the head ``job``'s row may share, or None."""
    pieces = getattr(job.prefix, "pieces", None)
    if not pieces or job.alpha != 1.0 or pieces[0].tokens < MIN_TOKENS:
        return None
    return id(pieces[0].kv), pieces[0].tokens


def checked(batch: Any, row_cache: Any, head: tuple[int, int] | None) -> tuple[int, int] | None:
    """``head`` if the batch's rows of that key begin with the same K/V as ``row_cache``
    (or none has it yet); else None."""
    if head is None or batch.cache is None:
        return head
    peer = next((i for i, h in enumerate(batch.heads) if h == head), None)
    if peer is None:
        return head
    at, n = batch.pads[peer], head[1]
    ends = [0, len(batch.cache.layers) - 1]
    with torch.no_grad():
        for mine, new in ((batch.cache.layers[i], row_cache.layers[i]) for i in ends):
            if new.keys.shape[2] < n:
                return None
            if not (torch.equal(mine.keys[peer, :, at:at + n], new.keys[0, :, :n])
                    and torch.equal(mine.values[peer, :, at:at + n], new.values[0, :, :n])):
                return None
    return head


def groups(batch: Any) -> list[HeadGroup]:
    """The batch's groups of two rows or more sharing a head."""
    rows_of: dict[tuple[int, int], list[int]] = {}
    for r, head in enumerate(batch.heads):
        if head is not None:
            rows_of.setdefault(head, []).append(r)
    return [HeadGroup(tuple(rows), rows[0], batch.pads[rows[0]], n,
                      tuple(batch.pads[r] + n for r in rows))
            for (_, n), rows in rows_of.items() if len(rows) > 1]
