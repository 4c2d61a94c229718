"""L2 codec: exact round trips, MAC checked first, every forgery/corruption rejected."""

from __future__ import annotations

import random
import struct

import pytest
import torch

from injection.base import CacheKey
from injection.kvcache import codec
from injection.kvcache.codec import HEADER, CorruptEntry, decode, encode
from injection.kvcache.packed import PackedKV
from injection.kvcache.signing import CacheKeySigner

SIGNER = CacheKeySigner("codec-test-secret-0123456789")
KEY = CacheKey("acme", "u1", "ab" * 32, "fp1")


def packed(dtype=torch.float16, L=3, H=2, T=7, D=16, seed=0) -> PackedKV:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(L, H, T, D, generator=g).to(dtype)
    v = torch.randn(L, H, T, D, generator=g).to(dtype)
    return PackedKV(k, v, [random.Random(seed).randrange(0, 2**31 - 1) for _ in range(T)])


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_round_trip_is_bit_exact(dtype, compress):
    p = packed(dtype)
    blob = encode(p, KEY, SIGNER, compress=compress)
    q = decode(blob, KEY, SIGNER)
    assert q.dtype == dtype and q.shape == p.shape
    assert q.equal(p)  # bitwise: bf16 travels as its own 2-byte pattern
    assert q.keys.view(torch.int16 if dtype != torch.float32 else torch.int32).equal(
        p.keys.view(torch.int16 if dtype != torch.float32 else torch.int32)
    )
    info = codec.check(blob, SIGNER.redis_key(KEY), SIGNER)
    assert info["compressed"] is compress and info["shape"] == p.shape


def test_uncompressed_layout_is_header_raw_bytes_mac():
    p = packed(torch.bfloat16)
    blob = encode(p, KEY, SIGNER)
    assert len(blob) == HEADER.size + p.nbytes + 4 * p.num_tokens + 32
    assert blob[:4] == b"KVI\x00"
    raw_keys = p.keys.reshape(-1).view(torch.uint8).numpy().tobytes()
    assert blob[HEADER.size : HEADER.size + len(raw_keys)] == raw_keys
    assert b"pickle" not in blob and b"\x80\x04" != blob[:2]


def test_decode_survives_the_blob_being_dropped():
    p = packed(torch.float32)
    q = decode(bytes(bytearray(encode(p, KEY, SIGNER))), KEY, SIGNER)
    import gc

    gc.collect()
    assert q.equal(p)


def test_scaled_values_of_decoded_entry_is_writable_and_fresh():
    q = decode(encode(packed(), KEY, SIGNER), KEY, SIGNER)
    before = q.values.clone()
    s = q.scaled_values(1.0)
    s.mul_(3)
    assert torch.equal(q.values, before)


@pytest.mark.parametrize("compress", [False, True])
def test_every_single_byte_tamper_is_rejected(compress):
    p = packed(torch.float16, L=1, H=1, T=3, D=4)
    blob = encode(p, KEY, SIGNER, compress=compress)
    for i in range(len(blob)):
        bad = bytearray(blob)
        bad[i] ^= 0x01
        with pytest.raises(CorruptEntry):
            decode(bytes(bad), KEY, SIGNER)


def test_multi_chunk_payload_round_trip_and_tamper_in_every_chunk():
    p = packed(torch.float32, L=2, H=2, T=300, D=512)  # ~4.9 MB: 5 parallel-hashed chunks
    blob = encode(p, KEY, SIGNER)
    assert len(blob) > 4 * codec.CHUNK
    assert decode(bytes(blob), KEY, SIGNER).equal(p)
    n_chunks = (len(blob) - HEADER.size - 32) // codec.CHUNK + 1
    for c in range(n_chunks):
        for delta in (0, 1, codec.CHUNK // 2):
            i = min(HEADER.size + c * codec.CHUNK + delta, len(blob) - 33)
            bad = bytearray(blob)
            bad[i] ^= 0x80
            with pytest.raises(CorruptEntry, match="MAC"):
                decode(bad, KEY, SIGNER)


def test_chunking_is_independent_of_part_boundaries():
    data = bytes(range(256)) * 9000  # 2.3 MB
    one = codec._collect(codec._digest_futures([data]))
    cut = [data[:5], data[5 : codec.CHUNK + 3], data[codec.CHUNK + 3 :]]
    assert codec._collect(codec._digest_futures(cut)) == one
    assert len(one) == 32 * 3


@pytest.mark.parametrize("cut", [0, 1, 10, HEADER.size, HEADER.size + 31, -1, -32, -33])
def test_truncation_and_extension_are_rejected(cut):
    blob = encode(packed(), KEY, SIGNER)
    with pytest.raises(CorruptEntry):
        decode(blob[:cut], KEY, SIGNER)
    with pytest.raises(CorruptEntry):
        decode(bytes(blob) + b"\x00", KEY, SIGNER)


@pytest.mark.parametrize("field", CacheKey._fields)
def test_value_moved_to_another_key_is_rejected(field):
    blob = encode(packed(), KEY, SIGNER)
    other = KEY._replace(**{field: getattr(KEY, field) + "2"})
    with pytest.raises(CorruptEntry, match="MAC"):
        decode(blob, other, SIGNER)


def test_wrong_secret_or_generation_is_rejected():
    blob = encode(packed(), KEY, SIGNER)
    for s in (
        CacheKeySigner("another-secret-0123456789"),
        CacheKeySigner("codec-test-secret-0123456789", key_generation="1"),
    ):
        with pytest.raises(CorruptEntry, match="MAC"):
            codec.decode_named(blob, SIGNER.redis_key(KEY), s)


def test_foreign_name_is_rejected():
    blob = encode(packed(), KEY, SIGNER)
    with pytest.raises(CorruptEntry):
        codec.decode_named(blob, "kvi:not-a-tag:e:00", SIGNER)


def _resign(header_and_payload: bytes) -> bytes:
    """What an attacker holding the secret could write: used to reach the header checks."""
    name = SIGNER.redis_key(KEY)
    header, payload = header_and_payload[: HEADER.size], header_and_payload[HEADER.size :]
    digests = codec._collect(codec._digest_futures([payload]))
    mac = SIGNER.mac_parts(SIGNER.tag_of(name), (codec._binding(name), header, digests))
    return header_and_payload + mac


def _with_header(blob: bytes, **changes) -> bytes:
    fields = list(HEADER.unpack_from(blob))
    names = ["magic", "version", "flags", "dtype", "L", "H", "T", "D", "ntok", "raw", "stored"]
    for k, v in changes.items():
        fields[names.index(k)] = v
    return _resign(HEADER.pack(*fields) + blob[HEADER.size : -32])


@pytest.mark.parametrize(
    "changes,msg",
    [
        ({"version": codec.FORMAT_VERSION + 1}, "format version"),
        ({"magic": b"PKL\x00"}, "magic"),
        ({"flags": 4}, "flags"),
        ({"dtype": 9}, "dtype"),
        ({"T": 6}, "inconsistent"),
        ({"ntok": 3}, "inconsistent"),
        ({"raw": 10}, "inconsistent"),
        ({"stored": 11}, "length"),
    ],
)
def test_header_checks_after_a_valid_mac(changes, msg):
    blob = encode(packed(), KEY, SIGNER)
    with pytest.raises(CorruptEntry, match=msg):
        decode(_with_header(blob, **changes), KEY, SIGNER)


def test_mac_is_checked_before_the_header_is_parsed():
    # A wrong version with a bad MAC reports the MAC, proving nothing was parsed first.
    blob = bytearray(encode(packed(), KEY, SIGNER))
    struct.pack_into("<H", blob, 4, 99)
    with pytest.raises(CorruptEntry, match="MAC"):
        decode(bytes(blob), KEY, SIGNER)


def test_encode_validation():
    with pytest.raises(ValueError, match="CPU"):
        encode(packed().to("meta"), KEY, SIGNER)
    p64 = PackedKV(
        torch.zeros(1, 1, 2, 2, dtype=torch.float64),
        torch.zeros(1, 1, 2, 2, dtype=torch.float64),
        [1, 2],
    )
    with pytest.raises(ValueError, match="dtype"):
        encode(p64, KEY, SIGNER)
    with pytest.raises(ValueError, match="int32"):
        encode(PackedKV(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2), [2**31]), KEY, SIGNER)


def test_compression_shrinks_redundant_payloads():
    k = torch.zeros(4, 2, 64, 32, dtype=torch.bfloat16)
    p = PackedKV(k, k.clone(), range(64))
    assert len(encode(p, KEY, SIGNER, compress=True)) < len(encode(p, KEY, SIGNER)) // 10


def _digests_in_child(conn, data: bytes) -> None:
    conn.send(codec._collect(codec._digest_futures([data])))
    conn.close()


def test_forked_child_gets_its_own_hashing_pool():
    # Celery prefork children inherit a pool whose threads do not exist there.
    # (No torch ops in the child: torch's own OpenMP pool is not fork-safe.)
    import multiprocessing as mp

    data = bytes(range(256)) * 20000  # 5 MB: 5 chunks on the pool
    expected = codec._collect(codec._digest_futures([data]))  # parent pool is live
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_digests_in_child, args=(child, data))
    proc.start()
    assert parent.poll(30) and parent.recv() == expected
    proc.join(10)
    assert proc.exitcode == 0
