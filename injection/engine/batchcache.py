"""The running batch's K/V: one left-padded ``DynamicCache`` whose rows join and leave.

Row ``i`` holds ``lengths[i]`` real tokens right-aligned in a ``[B, H, T, D]`` layer,
after ``pads[i] = T - lengths[i]`` zero columns. The attention mask hides the padding
and each row's positions count its real tokens only, so a row attends to exactly what
it would attend to alone: its own tokens, never another row's (the batch dimension of
attention never mixes rows; the mask never lets a row see a pad or a foreign column).

Membership changes copy the cache (``cat`` / ``index_select``); decoding steps append
through ``DynamicCache.update`` as transformers always does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from injection.devices import to_host
from injection.kvcache.packed import PackedKV

__all__ = ["BatchCache"]


class BatchCache:
    """Left-padded K/V of the rows being decoded (see module docstring)."""

    def __init__(self) -> None:
        self.cache: DynamicCache | None = None
        self.pads: list[int] = []

    @property
    def rows(self) -> int:
        return len(self.pads)

    @property
    def width(self) -> int:
        """Columns per row (padding included): the cache's sequence length."""
        return 0 if self.cache is None else self.cache.get_seq_length()

    def add(self, row_cache: DynamicCache) -> None:
        """Append a prefilled batch-1 cache as the last row (padding whichever is shorter)."""
        n = row_cache.get_seq_length()
        if self.cache is None:
            self.cache, self.pads = row_cache, [0]
            return
        width = self.width
        grow = max(0, n - width)
        # every layer's new tensors first, then assigned: an OOM half-way changes nothing
        merged = [(torch.cat([_left_pad(mine.keys, grow), _left_pad(new.keys, width - n)]),
                   torch.cat([_left_pad(mine.values, grow), _left_pad(new.values, width - n)]))
                  for mine, new in zip(self.cache.layers, row_cache.layers, strict=True)]
        self._assign(merged)
        self.pads = [p + grow for p in self.pads] + [max(0, width - n)]

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in this order); drop columns no remaining row uses."""
        if not rows:
            self.cache, self.pads = None, []
            return
        if rows == list(range(self.rows)):
            return
        index = torch.tensor(rows, device=self.cache.layers[0].keys.device)
        pads = [self.pads[i] for i in rows]
        trim = min(pads)
        self._assign([(layer.keys.index_select(0, index)[:, :, trim:],
                        layer.values.index_select(0, index)[:, :, trim:])
                       for layer in self.cache.layers])
        self.pads = [p - trim for p in pads]

    # -- failure containment: a step that fails half-way is undone whole ----------------
    def snapshot(self) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[int]]:
        """The layers' tensors as they are (references: a step's ``update`` replaces them
        with new tensors, never writes into them), for :meth:`restore`."""
        layers = [] if self.cache is None else [(x.keys, x.values) for x in self.cache.layers]
        return layers, list(self.pads)

    def restore(self, snap: tuple[list[tuple[torch.Tensor, torch.Tensor]], list[int]]) -> None:
        """Undo whatever a failed step appended to some layers and not to others."""
        layers, pads = snap
        if self.cache is not None and layers:
            self._assign(layers)
        self.pads = list(pads)

    def consistent(self) -> bool:
        """Every layer ``[rows, H, width, D]`` with one width, and a pad per row."""
        if self.cache is None:
            return not self.pads
        want = (self.rows, self.width)
        return all((x.keys.shape[0], x.keys.shape[2]) == want == (x.values.shape[0],
                   x.values.shape[2]) for x in self.cache.layers)

    def _assign(self, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for layer, (keys, values) in zip(self.cache.layers, tensors, strict=True):
            layer.keys, layer.values = keys, values

    def step_inputs(self, device: torch.device) -> tuple[Any, Any, torch.Tensor]:
        """``attention_mask [B, T+1]``, ``position_ids [B, 1]`` and ``cache_position [1]``
        for one decoding step that appends a column to every row. Without padding (one
        row, or rows of one length) mask and positions are implied: both are None."""
        width = self.width
        if not any(self.pads):
            return None, None, torch.tensor([width], device=device)
        pads = torch.tensor(self.pads, device=device)
        cols = torch.arange(width + 1, device=device)
        mask = (cols.unsqueeze(0) >= pads.unsqueeze(1)).long()
        positions = (width - pads).unsqueeze(1)
        return mask, positions, torch.tensor([width], device=device)

    def row_kv(self, row: int, token_ids: list[int]) -> PackedKV:
        """Row ``row``'s real K/V as a CPU PackedKV (ordinary tensors, not inference ones)."""
        pad = self.pads[row]
        with torch.no_grad():
            keys = torch.stack([layer.keys[row, :, pad:] for layer in self.cache.layers])
            values = torch.stack([layer.values[row, :, pad:] for layer in self.cache.layers])
            keys, values = to_host(keys), to_host(values)  # stack made new tensors
        return PackedKV(keys, values, token_ids[: keys.shape[2]])


def _left_pad(t: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` zero columns before the sequence axis of a ``[B, H, T, D]`` tensor."""
    return F.pad(t, (0, 0, n, 0)) if n > 0 else t
