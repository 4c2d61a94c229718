"""A conversation link replaced on one worker is dropped from the other workers' L1
(signed control op ``conv_link`` over real Redis pub/sub), so superseded copies never
wait for their LRU; a copy that is the new link or continues it stays."""

from __future__ import annotations

import time

import pytest
import torch

from gpu_worker.channels import control, kvstore
from gpu_worker.channels.linkcast import LinkBroadcaster
from gpu_worker.serving import host
from gpu_worker.serving.handlers import HANDLERS
from injection.base import CacheKey
from injection.kvcache.conversation import ConversationStore
from injection.kvcache.lru import TenantLRU
from injection.kvcache.packed import PackedKV
from injection.metrics import Metrics

TENANT = "linkcast"


def link(ids: list[int]) -> PackedKV:
    k = torch.randn(1, 1, len(ids), 4)
    return PackedKV(k, torch.randn_like(k), ids)


def wait_for(cond, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def barrier(listener) -> None:
    """One listener thread handles messages in order: once it answered a request sent
    after them, every earlier message was handled."""
    assert len(control.request("stats", timeout=30)) >= 1


@pytest.fixture
def worker_b(settings, demo_model_path):
    """This process as worker B: the real host executor and its control listener."""
    settings.MODEL_PATH, settings.MODEL_DEVICE, settings.MODEL_DTYPE = str(demo_model_path), "", ""
    executor = host.get_executor()
    listener = control.ControlListener(HANDLERS)
    listener.start()
    assert listener.ready.wait(10)
    yield executor, listener
    listener.stop()
    listener.join(5)
    kvstore.l2_tier().evict(TENANT)
    host.close_executor()


def dropped(executor) -> int:
    return executor.metrics.snapshot()["counters"].get("conv_superseded_dropped", 0)


def test_other_workers_drop_their_superseded_copies(worker_b):
    executor, listener = worker_b
    b = executor.conversations
    fp = "fp"
    same = CacheKey(TENANT, "m1", "chat-conv-7", fp)  # /api/chat: one key per conversation
    v1_old = CacheKey(TENANT, "m2", "v1-msgs-1", fp)  # /v1: keyed by the messages so far
    v1_new = CacheKey(TENANT, "m2", "v1-msgs-2", fp)
    ahead = CacheKey(TENANT, "m3", "chat-conv-8", fp)
    other_tenant = CacheKey(TENANT + "-x", "m1", "chat-conv-7", fp)
    for k, ids in ((same, [1, 2, 3]), (v1_old, [4, 5]), (ahead, [7, 8, 9, 10]),
                   (other_tenant, [1, 2, 3])):
        assert b.l1.put(k, link(ids))  # B served these turns before
    seen, before = listener.received, dropped(executor)
    # worker A: its own L1, the same Redis, the broadcaster a serving worker is built with
    a = ConversationStore(TenantLRU(), kvstore.l2_tier(), Metrics(), max_bytes=10**6)
    a.on_replaced = cast = LinkBroadcaster()
    a.keep(same, link([1, 2, 3, 11, 12]), replaces=same)  # the conversation went on, on A
    a.keep(v1_new, link([4, 5, 6]), replaces=v1_old)
    a.keep(ahead, link([7, 8]), replaces=ahead)  # B's copy continues A's: it stays
    assert cast.flush(10) and cast.published == 3
    assert wait_for(lambda: listener.received >= seen + 3)
    barrier(listener)
    assert same not in b.l1 and v1_old not in b.l1
    assert ahead in b.l1 and other_tenant in b.l1  # another tenant is never touched
    assert dropped(executor) - before == 2


def test_the_replacing_worker_keeps_its_own_new_link(worker_b):
    executor, listener = worker_b
    b = executor.conversations
    seen = listener.received
    key = CacheKey(TENANT, "m1", "chat-conv-9", "fp")
    b.on_replaced = cast = LinkBroadcaster()
    b.l1.put(key, link([1, 2]))
    b.keep(key, link([1, 2, 3, 4]), replaces=key)  # B itself continued the conversation
    assert cast.flush(10) and wait_for(lambda: listener.received > seen)
    barrier(listener)
    assert b.l1.peek(key) is not None and b.l1.peek(key).num_tokens == 4


def test_member_and_tenant_invalidation_reach_links_and_the_tenant_segment(worker_b):
    """Deleting a member (or a conversation: the member's scope) drops its links from every
    worker's conversation L1 and from Redis; the tenant's scope also drops the shared
    tenant segment, which a member's scope leaves."""
    from injection.kvcache.chain import TENANT_USER

    executor, listener = worker_b
    b = executor.conversations
    conv = CacheKey(TENANT, "m5", "conv-1", "fp")
    seg = CacheKey(TENANT, TENANT_USER, "instr", "fp")
    assert b.keep(conv, link([1, 2, 3]))
    assert executor.l1.put(seg, link([4, 5]))
    assert executor.l2 is not None  # the test settings keep L2 on
    executor.l2.put(seg, link([4, 5]))
    assert executor.l2.flush(10)  # both writes landed
    assert kvstore.l2_tier().get(conv) is not None
    kvstore.invalidate(TENANT, "m5")
    barrier(listener)
    assert conv not in b.l1 and kvstore.l2_tier().get(conv) is None
    assert seg in executor.l1  # a member's scope never covers the tenant segment
    kvstore.invalidate(TENANT)
    barrier(listener)
    assert seg not in executor.l1 and kvstore.l2_tier().get(seg) is None
