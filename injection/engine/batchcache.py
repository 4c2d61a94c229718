"""The running batch's K/V: left-padded rows in preallocated per-layer buffers.

Layout (the contract other modules build on): row ``i`` holds ``lengths[i]`` real tokens
right-aligned in a ``[B, H, width, D]`` layer, after ``pads[i] = width - lengths[i]``
zero columns, so its token at absolute position ``p`` sits at column ``pads[i] + p``.
The attention mask hides the padding and each row's positions count its real tokens
only, so a row attends to exactly what it would attend to alone.

Storage: each layer owns ``[slots, H, capacity, D]`` key and value buffers
(``SlabLayer``); the layer's ``keys``/``values`` are views of the first ``rows`` slots and
``width`` columns. A decoding step writes its column in place (no ``cat`` per step);
capacity doubles when it runs out. A joining row no longer than the batch is copied
into a free slot; a longer one, or a full set of slots, rebuilds the buffers once
(doubling the slots; ``make_room``: once for a group). Leaving rows free their slots,
which rows from past the new end move into (``filled``: only those are copied); unused
columns are dropped once a quarter of the width. ``spare=False`` keeps no spare
capacity: every step reallocates, as ``DynamicCache``'s ``cat`` did (the benchmark's
"before").
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from injection.devices import to_host
from injection.engine import heads
from injection.hostmem import KV_COPIES
from injection.kvcache.packed import PackedKV

__all__ = ["BatchCache", "SlabLayer"]

Snapshot = tuple[list[tuple[torch.Tensor, torch.Tensor, int, int]], list[int], list[Any]]


class SlabLayer(DynamicLayer):
    """One layer's K/V in buffers with spare rows and columns (see module docstring)."""

    def __init__(self, kbuf: torch.Tensor, vbuf: torch.Tensor, rows: int, width: int,
                 spare: bool = True) -> None:
        super().__init__()
        self.device, self.is_initialized, self.spare = kbuf.device, True, spare
        self.set(kbuf, vbuf, rows, width)

    def set(self, kbuf: torch.Tensor, vbuf: torch.Tensor, rows: int, width: int) -> None:
        self.kbuf, self.vbuf, self.rows, self.n = kbuf, vbuf, rows, width
        self.keys = kbuf[:rows, :, :width]
        self.values = vbuf[:rows, :, :width]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new columns in place after the row's last one; returns the views."""
        n, t = self.n, key_states.shape[-2]
        if n + t > self.kbuf.shape[2]:
            self.reserve(n + t)
        self.kbuf[: self.rows, :, n:n + t].copy_(key_states)
        self.vbuf[: self.rows, :, n:n + t].copy_(value_states)
        self.set(self.kbuf, self.vbuf, self.rows, n + t)
        return self.keys, self.values

    def reserve(self, columns: int) -> None:
        """Room for ``columns``: doubling the capacity (exactly ``columns`` without spare)."""
        cap = self.kbuf.shape[2]
        if columns <= cap:
            return
        cap = max(columns, 2 * cap) if self.spare else columns
        kbuf, vbuf = (_empty_like(b, b.shape[0], cap) for b in (self.kbuf, self.vbuf))
        kbuf[: self.rows, :, : self.n] = self.keys
        vbuf[: self.rows, :, : self.n] = self.values
        self.set(kbuf, vbuf, self.rows, self.n)


class BatchCache:
    """Left-padded K/V of the rows being decoded (see module docstring)."""

    def __init__(self, *, spare: bool = True, max_slots: int = 0) -> None:
        self.cache: DynamicCache | None = None
        self.pads: list[int] = []
        # per row: (key, tokens) of a head it shares with other rows (``heads.py``), or None
        self.heads: list[tuple[int, int] | None] = []
        self.spare, self.max_slots = spare, max_slots

    def fresh(self) -> BatchCache:  # an empty cache with the same storage policy
        return BatchCache(spare=self.spare, max_slots=self.max_slots)

    @property
    def rows(self) -> int:
        return len(self.pads)

    @property
    def width(self) -> int:  # columns per row, padding included: the sequence length
        return 0 if self.cache is None else self.cache.layers[0].n

    def add(self, row_cache: DynamicCache, head: tuple[int, int] | None = None) -> None:
        """Append a prefilled batch-1 cache as the last row (padding whichever is shorter).
        An empty batch adopts a row cache of ``SlabLayer`` s as it is (no copy). ``head``:
        the row's first tokens may be shared with rows of the same key (``heads.py``)."""
        head = heads.checked(self, row_cache, head)
        self._add(row_cache)
        self.heads.append(head)

    def _add(self, row_cache: DynamicCache) -> None:
        if self.cache is None and self.spare and _adoptable(row_cache):
            self.cache, self.pads = DynamicCache(), [0]
            self.cache.layers = list(row_cache.layers)
            return
        n, width, rows = row_cache.get_seq_length(), self.width, self.rows
        new = [(x.keys, x.values) for x in row_cache.layers]
        KV_COPIES.add("batch_join", 2 * sum(k.numel() * k.element_size() for k, _ in new))
        with torch.no_grad():
            if self.cache is not None and n <= width and rows < self._slots():
                for layer, (k, v) in zip(self.cache.layers, new, strict=True):
                    _put_row(layer.kbuf, rows, k, width)  # a free slot: this row only
                    _put_row(layer.vbuf, rows, v, width)
                    layer.set(layer.kbuf, layer.vbuf, rows + 1, width)
                self.pads.append(width - n)
                return
            wide, grow = max(width, n), max(0, n - width)
            slots = self._grown_slots(rows + 1)
            # every layer's new buffers first, then assigned: an OOM half-way changes nothing
            built = [self._rebuilt(i, k, v, slots, wide, grow) for i, (k, v) in enumerate(new)]
            layers = [SlabLayer(kb, vb, rows + 1, wide, self.spare) for kb, vb in built]
        if self.cache is None:
            self.cache = DynamicCache()
        self.cache.layers = layers
        self.pads = [p + grow for p in self.pads] + [wide - n]

    def make_room(self, rows: int, width: int, columns: int) -> None:
        """Slots for ``rows`` rows at least ``width`` columns wide (the rows there shifted
        right) and capacity for ``columns``, in one rebuild: rows joining together (a group
        prefill) then each take a free slot, where one by one each power of two of slots
        and each longer row would copy every row into new buffers."""
        grow = max(0, width - self.width)
        cap = max(columns, self.width + grow) if self.spare else self.width + grow
        if self.cache is None or (rows <= self._slots() and not grow
                                  and cap <= self.cache.layers[0].kbuf.shape[2]):
            return
        slots, wide = max(self._grown_slots(rows), self._slots()), self.width + grow
        with torch.no_grad():
            built = [_moved(x, x.kbuf, x.vbuf, slots, max(cap, x.kbuf.shape[2]), grow)
                     for x in self.cache.layers]  # all layers first: an OOM changes nothing
        self.cache.layers = [SlabLayer(kb, vb, self.rows, wide, self.spare) for kb, vb in built]
        self.pads = [p + grow for p in self.pads]

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in this order); drop columns no row uses once they are a
        quarter of the width. Only rows moving into freed slots are copied (``filled``)."""
        if not rows:
            self.cache, self.pads, self.heads = None, [], []
            return
        self.heads = [self.heads[i] for i in rows]
        pads = [self.pads[i] for i in rows]
        trim, width = min(pads), self.width
        moved = [(j, i) for j, i in enumerate(rows) if i != j]
        if 4 * trim < width and all(i >= len(rows) for _, i in moved):
            with torch.no_grad():  # no column dropped: the moved rows only
                for layer in self.cache.layers:
                    for j, i in moved:
                        layer.kbuf[j, :, :width] = layer.kbuf[i, :, :width]
                        layer.vbuf[j, :, :width] = layer.vbuf[i, :, :width]
                    layer.set(layer.kbuf, layer.vbuf, len(rows), width)
            self.pads = pads
            return
        with torch.no_grad():
            index = torch.tensor(rows, device=self.cache.layers[0].kbuf.device)
            kept = [(x.keys.index_select(0, index)[:, :, trim:],
                     x.values.index_select(0, index)[:, :, trim:]) for x in self.cache.layers]
            for layer, (k, v) in zip(self.cache.layers, kept, strict=True):
                layer.kbuf[: len(rows), :, : width - trim] = k  # copies: no allocation
                layer.vbuf[: len(rows), :, : width - trim] = v
                layer.set(layer.kbuf, layer.vbuf, len(rows), width - trim)
        self.pads = [p - trim for p in pads]

    @staticmethod
    def filled(n: int, leaving: set[int]) -> list[int]:
        """``keep``'s order when rows ``leaving`` of ``n`` go: the others stay in their slots,
        those past the new end move into the slots freed before it."""
        m = n - len(leaving)
        order = list(range(m))
        tail = [i for i in range(m, n) if i not in leaving]
        for slot, i in zip([j for j in range(m) if j in leaving], tail, strict=True):
            order[slot] = i
        return order

    def reserve(self, columns: int) -> None:
        """Room for ``columns`` more per row in every layer (none grows inside a forward)."""
        if self.cache is not None:
            with torch.no_grad():
                for layer in self.cache.layers:
                    layer.reserve(layer.n + columns)

    # -- failure containment: a step that fails half-way is undone whole ----------------
    def snapshot(self) -> Snapshot:
        """Each layer's buffers, rows and width, for :meth:`restore` (a step writes past
        the width only, so restoring the width undoes it)."""
        layers = [] if self.cache is None else [
            (x.kbuf, x.vbuf, x.rows, x.n) for x in self.cache.layers]
        return layers, list(self.pads), list(self.heads)

    def restore(self, snap: Snapshot) -> None:
        """Undo whatever a failed step appended to some layers and not to others."""
        layers, pads, row_heads = snap
        if self.cache is not None and layers:
            for layer, state in zip(self.cache.layers, layers, strict=True):
                layer.set(*state)
        self.pads, self.heads = list(pads), list(row_heads)

    def consistent(self) -> bool:
        """Every layer ``[rows, H, width, D]`` with one width, and a pad per row."""
        if self.cache is None:
            return not self.pads
        want = (self.rows, self.width)
        return all((x.keys.shape[0], x.keys.shape[2]) == want == (x.values.shape[0],
                   x.values.shape[2]) for x in self.cache.layers)

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

    def row_kv(self, row: int, token_ids: list[int], start: int = 0) -> PackedKV:
        """Row ``row``'s real K/V from its token ``start`` on as a CPU PackedKV (ordinary
        tensors, not inference ones, contiguous)."""
        at = self.pads[row] + start
        with torch.no_grad():
            keys = torch.stack([layer.keys[row, :, at:] for layer in self.cache.layers])
            values = torch.stack([layer.values[row, :, at:] for layer in self.cache.layers])
            keys, values = to_host(keys), to_host(values)  # stack made new tensors
        return PackedKV(keys, values, token_ids[start: start + keys.shape[2]])

    # -- storage ------------------------------------------------------------------------
    def _slots(self) -> int:  # rows the buffers hold
        return 0 if self.cache is None else self.cache.layers[0].kbuf.shape[0]

    def _grown_slots(self, rows: int) -> int:
        slots = max(self._slots(), 1)
        while slots < rows:
            slots *= 2
        return max(rows, min(slots, self.max_slots)) if self.max_slots else slots

    def _rebuilt(self, i: int, k: torch.Tensor, v: torch.Tensor, slots: int, wide: int,
                 grow: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s buffers: the old rows shifted ``grow`` right, ``(k, v)`` last."""
        old = None if self.cache is None else self.cache.layers[i]
        cap = max(wide, old.kbuf.shape[2] if old is not None else 0)
        cap = max(cap, 2 * wide) if self.spare and old is None else cap
        bufs = _moved(old, k, v, slots, cap, grow)
        for buf, new in zip(bufs, (k, v), strict=True):
            _put_row(buf, 0 if old is None else old.rows, new, wide)
        return bufs


def _moved(old: SlabLayer | None, k: torch.Tensor, v: torch.Tensor, slots: int, cap: int,
           grow: int) -> tuple[torch.Tensor, torch.Tensor]:
    """New ``[slots, H, cap, D]`` buffers (shaped as ``k``/``v``) holding ``old``'s rows
    shifted ``grow`` columns right, zeros before them."""
    out = []
    for like, mine in ((k, None if old is None else old.keys),
                       (v, None if old is None else old.values)):
        buf = _empty_like(like, slots, cap)
        if mine is not None:
            buf[: mine.shape[0], :, :grow] = 0
            buf[: mine.shape[0], :, grow:grow + mine.shape[2]] = mine
        out.append(buf)
    return out[0], out[1]


def _adoptable(row_cache: DynamicCache) -> bool:
    """Whether a row's cache can be the batch's storage as it is: one slot of
    ``SlabLayer`` s (its prefix built by ``steps.row_cache``, ordinary storage), one width
    in every layer."""
    layers = row_cache.layers
    return bool(layers) and all(
        type(x) is SlabLayer and x.spare and x.rows == 1 and x.kbuf.shape[0] == 1
        and x.n == layers[0].n for x in layers)


def _empty_like(t: torch.Tensor, slots: int, cap: int) -> torch.Tensor:
    """Ordinary (not inference) storage, also inside a forward: written outside one too."""
    with torch.inference_mode(False):
        return torch.empty((slots, t.shape[1], cap, t.shape[3]), dtype=t.dtype,
                           device=t.device)


def _put_row(buf: torch.Tensor, slot: int, row: torch.Tensor, width: int) -> None:
    """``row`` (``[1, H, n, D]``) right-aligned in ``buf[slot, :, :width]``, zeros before."""
    n = row.shape[2]
    buf[slot, :, : width - n] = 0
    buf[slot, :, width - n: width] = row[0]
