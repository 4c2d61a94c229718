"""Host memory of cached K/V: a bounded pool of reusable buffers (its logic on plain
tensors here; pinned on CUDA), and L1 accounting as the allocator holds memory."""

from __future__ import annotations

import pytest
import torch

from injection.base import CacheKey
from injection.hostmem import HostPool, held_bytes, pinned_allocator_options, size_class
from injection.kvcache.lru import TenantLRU, accounted_bytes
from injection.kvcache.packed import PackedKV


def test_size_classes_are_the_allocators_powers_of_two():
    assert [size_class(n) for n in (1, 4096, 4097, 5 * 2**20)] == [4096, 4096, 8192, 2**23]


def test_a_freed_buffer_is_reused_for_the_next_copy_of_its_class():
    pool = HostPool(max_bytes=2**20, pin=False)
    a = pool.empty((2, 3, 100), torch.float32)  # 2400 bytes -> the 4096 class
    assert a.is_contiguous() and a.shape == (2, 3, 100) and held_bytes(a) == 4096
    ptr = a.data_ptr()
    del a
    b = pool.empty((1, 1000), torch.float32)  # same class: the same buffer again
    assert b.data_ptr() == ptr
    s = pool.stats()
    assert (s["allocated"], s["reused"], s["held_bytes"], s["in_use_bytes"]) == (1, 1, 4096, 4096)


def test_a_buffer_in_use_through_a_view_is_never_handed_out_twice():
    pool = HostPool(max_bytes=2**20, pin=False)
    a = pool.empty((4, 100), torch.float32)
    a.fill_(7.0)
    view = a[1:3]  # outlives its tensor: the storage is still in use
    del a
    b = pool.empty((4, 100), torch.float32)
    b.fill_(0.0)
    assert torch.all(view == 7.0) and pool.stats()["allocated"] == 2


def test_the_pool_is_bounded_releases_free_buffers_then_overflows_to_pageable():
    pool = HostPool(max_bytes=3 * 4096, pin=False)
    small = [pool.empty((1000,), torch.float32) for _ in range(3)]  # 3 x 4096: full
    assert pool.stats()["held_bytes"] == 3 * 4096
    over = pool.empty((1000,), torch.float32)  # nothing free: plain memory, counted
    assert pool.stats()["overflow"] == 1 and held_bytes(over) == 4000
    del small[:2]
    big = pool.empty((2000,), torch.float32)  # 8192: two free 4096 buffers released
    s = pool.stats()
    assert s["released"] == 2 and s["held_bytes"] == 4096 + 8192 <= pool.max_bytes
    assert held_bytes(big) == 8192


def test_l1_counts_what_the_storage_holds_not_the_view():
    base = torch.randn(1, 1, 16, 8)
    kv = PackedKV(base[:, :, :4], base[:, :, 4:8].clone(), range(4))  # keys: a view
    assert kv.nbytes == 2 * 4 * 8 * 4
    assert accounted_bytes(kv) == base.untyped_storage().nbytes() + 4 * 8 * 4
    lru = TenantLRU(max_bytes=10**6)
    lru.put(CacheKey("t", "u", "h", "fp"), kv)
    s = lru.stats()
    assert s["bytes"] == accounted_bytes(kv) and s["tensor_bytes"] == kv.nbytes
    assert s["pinned_bytes"] == 0
    lru.check_integrity()


def test_pinned_options_are_added_only_where_the_operator_set_none():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert pinned_allocator_options(env)
    assert env["PYTORCH_CUDA_ALLOC_CONF"].startswith("expandable_segments:True,pinned_use")
    own = {"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:False"}
    assert not pinned_allocator_options(own) and own["PYTORCH_CUDA_ALLOC_CONF"].endswith("False")


@pytest.mark.gpu
def test_cuda_copies_land_in_reused_pinned_buffers_accounted_rounded():
    from injection.devices import to_host
    from injection.hostmem import HOST_POOL

    dev = torch.device("cuda")
    x = torch.randn(3, 5, 333, 64, device=dev)
    host = to_host(x)
    assert host.is_pinned() and torch.equal(host, x.cpu())
    assert held_bytes(host) == size_class(x.numel() * 4) > x.numel() * 4
    ptr = host.data_ptr()
    kv = PackedKV(host, to_host(x), range(333))
    assert kv.is_pinned()
    lru = TenantLRU(max_bytes=2**30)
    lru.put(CacheKey("t", "u", "h", "fp"), kv)
    assert lru.stats()["pinned_bytes"] == lru.stats()["bytes"] == 2 * size_class(x.numel() * 4)
    lru.clear()
    del kv, host
    again = to_host(x)
    assert again.data_ptr() == ptr and HOST_POOL.stats()["reused"] >= 1
