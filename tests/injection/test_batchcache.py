"""The preallocated batch K/V cache: rows join and leave between steps, a step writes its
column in place, capacity doubles when it runs out, and the layout contract holds
(row i's token at absolute position p sits at column pads[i] + p)."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from injection.engine.batchcache import BatchCache, SlabLayer

LAYERS, HEADS, DIM = 3, 2, 4


def _row(n: int, seed: int) -> DynamicCache:
    gen = torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    for i in range(LAYERS):
        cache.update(torch.randn(1, HEADS, n, DIM, generator=gen),
                     torch.randn(1, HEADS, n, DIM, generator=gen), i)
    return cache


def _step(batch: BatchCache, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One decoding step's column for every layer (as the model's attention writes it)."""
    gen = torch.Generator().manual_seed(seed)
    cols = []
    for i in range(LAYERS):
        k, v = (torch.randn(batch.rows, HEADS, 1, DIM, generator=gen) for _ in range(2))
        batch.cache.update(k, v, i)
        cols.append((k, v))
    return cols


def _assert_layout(batch: BatchCache, want: list[list[tuple[torch.Tensor, torch.Tensor]]]):
    """``want[r][layer]``: row r's own (keys, values) ``[H, n, D]``, position 0 first."""
    assert batch.consistent()
    for r, layers in enumerate(want):
        pad = batch.pads[r]
        for layer, (k, v) in zip(batch.cache.layers, layers, strict=True):
            n = k.shape[1]
            assert pad + n == batch.width
            assert torch.equal(layer.keys[r, :, pad:pad + n], k)
            assert torch.equal(layer.values[r, :, pad:pad + n], v)
            assert not layer.keys[r, :, :pad].any() and not layer.values[r, :, :pad].any()


def _own(cache: DynamicCache):
    return [(x.keys[0], x.values[0]) for x in cache.layers]


def _append(want, cols):
    for r, layers in enumerate(want):
        for i, (k, v) in enumerate(cols):
            old_k, old_v = layers[i]
            layers[i] = (torch.cat([old_k, k[r]], 1), torch.cat([old_v, v[r]], 1))


def test_rows_join_and_leave_between_steps_keeping_the_layout():
    batch = BatchCache(max_slots=8)
    a, b, c = _row(5, 1), _row(3, 2), _row(9, 3)
    want = [_own(a)]
    batch.add(a)
    batch.add(b)  # shorter: copied into a free slot
    want.append(_own(b))
    assert batch.pads == [0, 2]
    _assert_layout(batch, want)
    _append(want, _step(batch, 10))
    _assert_layout(batch, want)
    batch.add(c)  # longer than the batch: every row shifts right
    want.append(_own(c))
    assert batch.pads == [3, 5, 0] and batch.width == 9
    _assert_layout(batch, want)
    _append(want, _step(batch, 11))
    batch.keep([2, 0])  # a row leaves, the rest reorder
    want = [want[2], want[0]]
    assert batch.pads == [0, 3]
    _assert_layout(batch, want)
    batch.keep([1])  # the longest leaves: its columns go
    assert batch.pads == [0] and batch.width == 7
    _assert_layout(batch, [want[1]])


def test_room_made_for_a_group_lets_each_of_its_rows_take_a_free_slot():
    """``make_room``: one rebuild (the rows there shifted right, capacity for the steps to
    come); then rows up to that width each take a free slot, the buffers never rebuilt."""
    batch = BatchCache()
    first, group = _row(4, 1), [_row(n, 10 + n) for n in (7, 5, 9, 6)]
    batch.add(first)
    _append(want := [_own(first)], _step(batch, 2))
    batch.make_room(1 + len(group), 9, 9 + 20)
    assert batch.pads == [4] and batch.width == 9
    _assert_layout(batch, want)
    bufs = [x.kbuf for x in batch.cache.layers]
    assert bufs[0].shape[0] >= 5 and bufs[0].shape[2] >= 29
    for row in group:
        batch.add(row)
        want.append(_own(row))
    _assert_layout(batch, want)
    assert batch.pads == [4, 2, 4, 0, 3]
    for _ in range(20):  # within the capacity made: steps write in place
        _append(want, _step(batch, 3))
    _assert_layout(batch, want)
    assert all(x.kbuf is b for x, b in zip(batch.cache.layers, bufs, strict=True))
    batch.make_room(5, 9, 29)  # room already there: nothing changes
    assert all(x.kbuf is b for x, b in zip(batch.cache.layers, bufs, strict=True))


def test_rows_leaving_free_slots_that_rows_past_the_new_end_move_into():
    """The engine's order (``filled``): rows before the new end stay in their slots, rows past
    it move into the freed ones; unused columns stay until they are a quarter of the width."""
    assert BatchCache.filled(4, {3}) == [0, 1, 2] and BatchCache.filled(4, {0}) == [3, 1, 2]
    assert BatchCache.filled(5, {1, 2}) == [0, 3, 4] and BatchCache.filled(2, {0, 1}) == []
    batch = BatchCache(max_slots=8)
    rows = [_row(n, s) for s, n in enumerate((6, 5, 7, 6, 5), start=1)]
    for row in rows:
        batch.add(row)
    want = [_own(r) for r in rows]
    _append(want, _step(batch, 10))
    assert batch.pads == [1, 2, 0, 1, 2] and batch.width == 8
    stay = batch.cache.layers[0].keys[0].clone()
    batch.keep(BatchCache.filled(5, {1, 2}))  # the longest leaves: 1 column of 8 unused
    assert batch.pads == [1, 1, 2] and batch.width == 8
    want = [want[0], want[3], want[4]]
    _assert_layout(batch, want)
    assert torch.equal(batch.cache.layers[0].keys[0], stay)  # row 0 stayed where it was
    _append(want, _step(batch, 11))
    batch.keep(BatchCache.filled(3, {0, 1}))  # 2 of 9 columns unused: they stay
    assert batch.pads == [2] and batch.width == 9
    _assert_layout(batch, [want[2]])
    rows = [_row(4, 8), _row(8, 9)]
    batch = BatchCache(max_slots=8)
    for row in rows:
        batch.add(row)
    batch.keep(BatchCache.filled(2, {1}))  # 4 of 8 columns unused: they go
    assert batch.pads == [0] and batch.width == 4
    _assert_layout(batch, [_own(rows[0])])


def test_steps_write_in_place_and_capacity_doubles_when_it_runs_out():
    batch = BatchCache()
    batch.add(_row(4, 1))
    layer = batch.cache.layers[0]
    cap, ptr = layer.kbuf.shape[2], layer.kbuf.data_ptr()
    assert cap > 4  # spare columns from the start
    for s in range(cap - 4):
        _step(batch, s)
    assert layer.kbuf.data_ptr() == ptr and batch.width == cap  # no reallocation so far
    _step(batch, 99)
    assert layer.kbuf.shape[2] == 2 * cap and batch.width == cap + 1
    assert batch.consistent()


def _slab_row(n: int, room: int, seed: int) -> DynamicCache:
    """A row's prefill cache as ``steps.row_cache`` builds it: every layer a one-slot
    ``SlabLayer`` over one ``[L, H, n + room, D]`` buffer, ``n`` columns written."""
    gen = torch.Generator().manual_seed(seed)
    keys, values = (torch.randn(LAYERS, HEADS, n + room, DIM, generator=gen) for _ in range(2))
    cache = DynamicCache()
    cache.layers = [SlabLayer(keys[i].unsqueeze(0), values[i].unsqueeze(0), 1, n)
                    for i in range(LAYERS)]
    return cache


def test_an_empty_batch_adopts_a_slab_row_and_decodes_in_its_room():
    """No copy of a lone row (a conversation's long link): its own buffers are the batch's,
    its steps write into their spare columns; a row joining later copies both as before."""
    batch, row = BatchCache(max_slots=8), _slab_row(5, 3, 1)
    want = [_own(row)]
    ptr = row.layers[0].kbuf.data_ptr()
    batch.add(row)
    assert batch.pads == [0] and batch.cache.layers[0].kbuf.data_ptr() == ptr
    _assert_layout(batch, want)
    for s in range(3):
        _append(want, _step(batch, 10 + s))
    assert batch.cache.layers[0].kbuf.data_ptr() == ptr  # written in place
    _assert_layout(batch, want)
    _append(want, _step(batch, 20))  # past its room: doubled, as the batch's own buffers
    assert batch.cache.layers[0].kbuf.shape[2] == 16
    other = _row(4, 2)
    batch.add(other)
    want.append(_own(other))
    assert batch.pads == [0, 5]
    _assert_layout(batch, want)
    # a non-empty batch, or a row cache of plain layers: copied into the batch's buffers
    full = BatchCache(max_slots=8)
    full.add(_row(4, 3))
    slab = _slab_row(4, 2, 4)
    full.add(slab)
    assert full.cache.layers[0].kbuf.data_ptr() != slab.layers[0].kbuf.data_ptr()
    plain = BatchCache(spare=False)
    plain.add(_slab_row(4, 2, 5))
    assert plain.cache.layers[0].kbuf.shape[2] == 4  # no spare: copied, not adopted


def test_a_rows_kv_is_read_back_whole_or_from_a_token_on():
    batch = BatchCache(max_slots=4)
    batch.add(_row(6, 1))
    batch.add(_row(4, 2))  # padded by 2
    ids = [10, 11, 12, 13, 14]
    whole, tail = batch.row_kv(1, ids), batch.row_kv(1, ids, start=1)
    assert whole.token_ids == (10, 11, 12, 13) and tail.token_ids == (11, 12, 13)
    assert torch.equal(tail.keys, whole.keys[:, :, 1:]) and tail.keys.is_contiguous()
    assert torch.equal(tail.values, whole.values[:, :, 1:]) and tail.values.is_contiguous()


def test_without_spare_capacity_every_step_reallocates():
    batch = BatchCache(spare=False)
    batch.add(_row(4, 1))
    ptrs = set()
    for s in range(3):
        _step(batch, s)
        ptrs.add(batch.cache.layers[0].kbuf.data_ptr())
    assert batch.cache.layers[0].kbuf.shape[2] == batch.width == 7 and len(ptrs) == 3


def test_reserve_grows_every_layer_before_a_step():
    batch = BatchCache()
    batch.add(_row(4, 1))
    cap = batch.cache.layers[0].kbuf.shape[2]
    for s in range(cap - 4):
        _step(batch, s)
    batch.reserve(1)
    ptrs = [x.kbuf.data_ptr() for x in batch.cache.layers]
    assert all(x.kbuf.shape[2] == 2 * cap for x in batch.cache.layers)
    _step(batch, 7)
    assert [x.kbuf.data_ptr() for x in batch.cache.layers] == ptrs


def test_restore_after_a_half_done_step_keeps_earlier_columns():
    batch = BatchCache()
    a, b = _row(5, 1), _row(3, 2)
    batch.add(a)
    batch.add(b)
    want = [_own(a), _own(b)]
    snap = batch.snapshot()
    batch.cache.update(torch.ones(2, HEADS, 1, DIM), torch.ones(2, HEADS, 1, DIM), 0)
    assert not batch.consistent()
    batch.restore(snap)
    _assert_layout(batch, want)
    _append(want, _step(batch, 5))  # the next step overwrites the undone column
    _assert_layout(batch, want)
