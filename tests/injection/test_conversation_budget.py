"""The conversation L1 (build_executor with the batch engine): conversation links never
evict tenant/member segments, and one member's links are capped so a member with many
long conversations cannot flush the other members'."""

from __future__ import annotations

from injection import build_executor
from injection.base import CacheKey
from injection.kvcache.packed import PackedKV
from injection.metrics import Metrics  # its own counters: never the process-wide ones


def link(adapter, tokens: int) -> PackedKV:
    return adapter.compute_kv_ids(tuple(range(5, 5 + tokens)))


def test_conversation_links_never_evict_segments(adapter):
    one = link(adapter, 8)
    ex = build_executor(adapter, metrics=Metrics(), batch_max=2, l1_max_bytes=64 * one.nbytes,
                        conversation_l1_max_bytes=4 * one.nbytes,
                        conversation_max_bytes=one.nbytes)
    try:
        assert ex.warm("t", "m", "I like short answers.", "Be polite.") is not None
        before = {k: v for k, v in ex.stats()["kinds"].items() if k != "conversation"}
        for i in range(20):  # far more links than the conversation budget holds
            ex.conversations.keep(CacheKey("t", f"u{i}", f"c{i}", "fp"), one)
        after = {k: v for k, v in ex.stats()["kinds"].items() if k != "conversation"}
        assert after["tenant"]["entries"] == before["tenant"]["entries"] == 1
        assert after["member"]["entries"] == before["member"]["entries"] == 1
        conv = ex.stats()["kinds"]["conversation"]
        assert conv["entries"] == 4 and conv["bytes"] <= 4 * one.nbytes
    finally:
        ex.close()


def test_one_member_cannot_flush_the_other_members_conversations(adapter):
    one = link(adapter, 8)
    ex = build_executor(adapter, metrics=Metrics(), batch_max=2, conversation_l1_max_bytes=8 * one.nbytes,
                        conversation_max_bytes=one.nbytes)  # member cap: a quarter = 2 links
    try:
        quiet = [CacheKey("t", f"q{i}", "c", "fp") for i in range(4)]
        for k in quiet:
            assert ex.conversations.keep(k, one)
        for i in range(10):
            assert ex.conversations.keep(CacheKey("t", "busy", f"c{i}", "fp"), one)
        assert all(k in ex.conv_l1 for k in quiet)
        busy = [i for i in range(10) if CacheKey("t", "busy", f"c{i}", "fp") in ex.conv_l1]
        assert busy == [8, 9]  # its own most recent two
        ex.conv_l1.check_integrity()
    finally:
        ex.close()
