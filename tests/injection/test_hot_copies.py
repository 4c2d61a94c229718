"""Copies on the hot path (issue 32, section 4): the injected turn and the conversation's
link reach the row's cache as their cached pieces, each copied once (``kvcache.pieces``),
with the same K/V, logits and replies as the concatenation they replace."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from injection import build_executor
from injection.base import ExecutionRequest
from injection.engine import steps
from injection.engine.batch import BatchEngine
from injection.engine.batchcache import SlabLayer
from injection.engine.batchrow import RowJob
from injection.hostmem import KV_COPIES, HostPool
from injection.kvcache.packed import PackedKV
from injection.kvcache.pieces import KVPieces, Piece, own, pooled
from injection.metrics import Metrics

SECRET = "hot-copies-secret-0123456789abcdef"
INSTR = "You are Acme's cooking assistant. Be brief."


def kv(tokens: int, seed: int, layers: int = 2, heads: int = 2, dim: int = 4) -> PackedKV:
    g = torch.Generator().manual_seed(seed)
    return PackedKV(torch.randn(layers, heads, tokens, dim, generator=g),
                    torch.randn(layers, heads, tokens, dim, generator=g),
                    range(seed * 100, seed * 100 + tokens))


def old_cache(prefix: PackedKV) -> DynamicCache:
    """The cache as it was built before: one DynamicCache.update per layer (a cat)."""
    cache = DynamicCache()
    for i in range(prefix.num_layers):
        cache.update(prefix.keys[i].unsqueeze(0).clone(), prefix.values[i].unsqueeze(0).clone(), i)
    return cache


def test_pieces_fill_equals_the_concatenation_with_one_copy_per_piece():
    a, b, c = kv(5, 1), kv(7, 2), kv(4, 3)
    pieces = KVPieces([KVPieces([Piece(a, 5), Piece(b, 7, 0.5)]), Piece(c, 2)])
    assert pieces.num_tokens == 14 and pieces.token_ids == (
        *a.token_ids, *b.token_ids, *c.token_ids[:2])
    before = KV_COPIES.snapshot()
    keys, values = pieces.empty("cpu", room=3)
    pieces.fill(keys, values)
    assert KV_COPIES.since(before) == {"assemble": (3, a.nbytes + b.nbytes + c.nbytes // 2)}
    want_k = torch.cat([a.keys, b.keys, c.keys[:, :, :2]], 2)
    want_v = torch.cat([a.values, b.values.mul(0.5), c.values[:, :, :2]], 2)
    assert keys.shape[2] == 17  # the room stays free for the prompt
    assert torch.equal(keys[:, :, :14], want_k) and torch.equal(values[:, :, :14], want_v)
    assert pieces.nbytes == want_k.numel() * 8 and pieces.packed().equal(
        PackedKV(want_k, want_v, pieces.token_ids))
    assert b.values.equal(kv(7, 2).values)  # the cached piece is never scaled in place


def test_pieces_fill_layer_by_layer_writes_what_fill_writes():
    """``fill_layers`` (a group prefill's per-layer buffers): the same K/V, scaled piece
    included, into ``[H, T, D]`` views of a row of each layer, counted once per piece."""
    a, b = kv(5, 1), kv(7, 2)
    pieces = KVPieces([Piece(a, 5), Piece(b, 6, 0.5)])
    keys, values = pieces.empty("cpu")
    pieces.fill(keys, values)
    rows = [torch.zeros(3, 2, 15, 4) for _ in range(2)], [torch.zeros(3, 2, 15, 4)
                                                           for _ in range(2)]
    before = KV_COPIES.snapshot()
    pieces.fill_layers([k[1, :, 4:] for k in rows[0]], [v[1, :, 4:] for v in rows[1]])
    assert KV_COPIES.since(before) == {"assemble": (2, a.nbytes + b.nbytes * 6 // 7)}
    for i in range(2):
        assert torch.equal(rows[0][i][1, :, 4:], keys[i])
        assert torch.equal(rows[1][i][1, :, 4:], values[i])
        assert not rows[0][i][[0, 2]].any() and not rows[0][i][1, :, :4].any()


def test_a_row_cache_from_pieces_gives_the_logits_of_the_old_cache(adapter):
    """The row's slab cache (pieces copied once, the prompt written in place) against the
    concatenated prefix in a cache built as before: the same logits, bit for bit."""
    ids = adapter.renderer.encode("A quiet vegetarian dinner, please. " * 3, first=True)
    whole = adapter.compute_kv_ids(ids)
    cut = len(ids) // 3
    head = PackedKV(whole.keys[:, :, :cut], whole.values[:, :, :cut], ids[:cut])
    tail = PackedKV(whole.keys[:, :, cut:], whole.values[:, :, cut:], ids[cut:])
    pieces = KVPieces([head, Piece(tail, tail.num_tokens - 2)])
    prefix = PackedKV(whole.keys[:, :, :-2], whole.values[:, :, :-2], ids[:-2])
    job = RowJob(pieces, 1.0, [5, 6, 7], [5, 6, 7], 4, {}, {})
    job.reset(adapter.tokenizer, adapter.device)
    before = KV_COPIES.snapshot()
    cache, logits = steps.prefill(adapter, job)
    assert KV_COPIES.since(before) == {"assemble": (2, prefix.nbytes)}
    assert all(isinstance(layer, SlabLayer) for layer in cache.layers)
    assert cache.get_seq_length() == prefix.num_tokens + 3
    assert cache.layers[0].kbuf.shape[2] == prefix.num_tokens + 3  # room, no regrowth
    with torch.inference_mode():
        ref = adapter.model(input_ids=torch.tensor([[5, 6, 7]], device=adapter.device),
                            past_key_values=old_cache(prefix.to(adapter.device)),
                            use_cache=True, logits_to_keep=1)
    assert torch.equal(logits, ref.logits[0, -1])
    for layer, old in zip(cache.layers, ref.past_key_values.layers, strict=True):
        assert torch.equal(layer.keys, old.keys) and torch.equal(layer.values, old.values)


def test_a_scaled_member_piece_generates_what_the_scaled_concatenation_does(adapter):
    a = adapter.compute_kv_ids(adapter.renderer.encode("Be brief.", first=True))
    b = adapter.compute_kv_ids(adapter.renderer.encode(" I like soup.", first=False), parent=a)
    joined = PackedKV(torch.cat([a.keys, b.keys], 2), torch.cat([a.values, b.scaled_values(
        0.7)], 2), (*a.token_ids, *b.token_ids))
    eng = BatchEngine(adapter, max_batch=2)
    try:
        prompt = adapter.renderer.encode(" What for dinner?", first=False)
        got = eng.run(KVPieces([a, Piece(b, b.num_tokens, 0.7)]), 1.0, prompt, 12)
        want = eng.run(joined, 1.0, prompt, 12)
    finally:
        eng.close()
    assert got.token_ids == want.token_ids and got.text == want.text


@pytest.fixture
def executor(adapter, redis_client):
    ex = build_executor(adapter, batch_max=2, redis_client=redis_client, signing_secret=SECRET,
                        metrics=Metrics(), conversation_prefill_opening=False)
    ex.l2.async_writes = False
    yield ex
    ex.close()


def turn(ex, history, q, user="u1"):
    msgs = [*history, {"role": "user", "content": q}]
    res = ex.execute(ExecutionRequest("t1", user, msgs, "I am vegetarian.", instructions=INSTR,
                                      max_new_tokens=8, conversation_id="c1"))
    return res, [*msgs, {"role": "assistant", "content": res.text}]


def two_turns(ex):
    """Two turns of conversation c1: the history, the stored link's L1 key and its K/V."""
    history = []
    for q in ("What should I cook tonight?", "And for dessert?"):
        _, history = turn(ex, history, q)
    ((key, entry),) = ex.conv_l1._tenants["t1"].entries.items()
    return history, key, entry.kv


def test_a_continuing_turn_copies_each_cached_piece_once(executor):
    history, _, link = two_turns(executor)
    # the stored link: contiguous, its own storage (one copy when it was stored)
    assert link.keys.is_contiguous() and link.values.is_contiguous()
    assert link.keys.untyped_storage().nbytes() == link.nbytes // 2
    before = KV_COPIES.snapshot()
    res, _ = turn(executor, history, "Which drink goes with it?")
    copies = KV_COPIES.since(before)
    assert res.extra["segments"] == {"tenant": "l1", "member": "l1"} and res.reused_tokens > 0
    # tenant segment, member segment, link: one copy each, their bytes exactly
    per_token = link.nbytes // link.num_tokens
    assert copies["assemble"] == (3, (res.kv_tokens + res.reused_tokens) * per_token)
    # alone in the engine: the batch adopts the row's cache, whose spare room it decodes in
    assert "materialize" not in copies and "batch_join" not in copies


def test_a_cut_link_reads_back_as_a_view_of_the_stored_one(executor):
    _, key, stored = two_turns(executor)
    before = KV_COPIES.snapshot()
    got = executor.conversations.lookup(key, [*stored.token_ids[:-3], 1, 2, 3])
    assert KV_COPIES.since(before) == {}
    (piece,) = got.pieces
    assert piece.kv is stored and piece.tokens == stored.num_tokens - 3
    assert got.token_ids == stored.token_ids[:-3]


def test_own_makes_a_link_contiguous_once_and_keeps_a_whole_sequence():
    seq = kv(10, 4)
    assert own(seq, 0) is seq
    link = own(seq, 6)
    assert link.keys.is_contiguous() and link.token_ids == seq.token_ids[6:]
    assert torch.equal(link.keys, seq.keys[:, :, 6:])
    assert link.keys.untyped_storage().data_ptr() != seq.keys.untyped_storage().data_ptr()


def test_without_cuda_an_l2_entry_stays_on_its_received_bytes():
    entry = kv(6, 5)
    if torch.cuda.is_available():
        pytest.skip("with CUDA the entry goes to the pinned pool (the gpu test)")
    assert pooled(entry) is entry


def test_take_says_when_the_pool_is_full():
    pool = HostPool(max_bytes=4096, pin=False)
    a = pool.take((1000,), torch.float32)
    assert a is not None and pool.take((1000,), torch.float32) is None
    assert pool.stats()["overflow"] == 1
    pool.guard(a)  # no CUDA, nothing pinned: nothing to wait for
    del a
    assert pool.take((1000,), torch.float32) is not None


@pytest.mark.gpu
def test_cuda_pieces_go_over_from_pinned_pool_memory_and_assemble_on_the_device():
    from injection.hostmem import HOST_POOL

    entry = kv(64, 6, layers=4)
    got = pooled(entry)
    assert got.is_pinned() and got.equal(entry)
    assert got.keys.untyped_storage().data_ptr() in {
        s.data_ptr() for bufs in HOST_POOL._buffers.values() for s in bufs}
    pieces = KVPieces([got, Piece(got, 10, 0.5)])
    keys, values = pieces.empty("cuda")
    pieces.fill(keys, values)
    assert torch.equal(keys.cpu(), torch.cat([entry.keys, entry.keys[:, :, :10]], 2))
    assert torch.equal(values.cpu()[:, :, 64:], entry.values[:, :, :10].cuda().mul(0.5).cpu())
    ptr = got.keys.untyped_storage().data_ptr()
    assert ptr in HOST_POOL._events  # guarded until the device has read it
    torch.cuda.synchronize()
