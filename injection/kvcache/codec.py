"""The L2 value format: fixed header + raw tensor bytes + HMAC. No pickle.

Layout (little-endian)::

    header  64 B  magic "KVI\\0", format version u16, flags u16, dtype code u8,
                  L, H, T, D u32, token count u32, raw payload length u64,
                  stored payload length u64, zero padding
    payload       keys bytes | values bytes | token ids (int32)   (zstd if flag 1)
    mac     32 B  HMAC-SHA256(tenant MAC key,
                              len|redis name | header | SHA-256 of each 1 MiB payload chunk)

The MAC covers header and payload (through the list of chunk digests, so the
hashing runs on all cores: ``hashlib`` releases the GIL) and binds the value
to its Redis name, itself an HMAC of the full :class:`~injection.base.CacheKey`
(tenant, user, content hash, fingerprint, format version). A value copied
under another key or tenant, truncated or altered in any byte fails the MAC,
which is checked before any byte of the header is interpreted. bf16 travels
as its raw 2-byte pattern; decode maps tensors straight onto the received
buffer (``torch.frombuffer``), so an uncompressed hit costs one hashing pass
and no copy.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import zstandard

from injection.base import CacheKey
from injection.kvcache.packed import PackedKV
from injection.kvcache.signing import L2_FORMAT_VERSION, MAC_SIZE

if TYPE_CHECKING:  # pragma: no cover
    from injection.kvcache.signing import CacheKeySigner

__all__ = ["CorruptEntry", "FORMAT_VERSION", "encode", "decode", "decode_named", "check"]

FORMAT_VERSION = L2_FORMAT_VERSION
MAGIC = b"KVI\x00"
HEADER = struct.Struct("<4sHHB3xIIIIIQQ16x")  # 64 bytes
FLAG_ZSTD = 1
_DTYPES = {1: torch.float32, 2: torch.float16, 3: torch.bfloat16}
_CODES = {v: k for k, v in _DTYPES.items()}
_INT32_MAX = 2**31 - 1
CHUNK = 1 << 20  # payload bytes per SHA-256 digest under the MAC

# Decoded tensors alias the (immutable) bytes received from Redis; nothing writes
# to a PackedKV (all mutation happens on fresh tensors). torch warns about such
# buffers once per process: trigger that once here, silenced, at import time.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    torch.frombuffer(b"\0\0\0\0", dtype=torch.uint8)


class CorruptEntry(ValueError):
    """An L2 value that is truncated, tampered, foreign or of another format version."""


def encode(
    kv: PackedKV, key: CacheKey, signer: CacheKeySigner, *, compress: bool = False, level: int = 1
) -> memoryview:
    """Serialise ``kv`` for the Redis name of ``key``.

    Returns one writable bytes-like buffer (a memoryview, ``bytes(...)`` copies it)
    that ``redis.set`` takes as is.
    """
    if not kv.is_cpu:
        raise ValueError(f"encode needs a CPU PackedKV, got {kv.device}")
    if kv.num_tokens == 0:
        raise ValueError("encode needs at least one token")
    if kv.dtype not in _CODES:
        raise ValueError(f"L2 codec does not support dtype {kv.dtype}")
    if kv.token_ids and not all(0 <= t <= _INT32_MAX for t in kv.token_ids):
        raise ValueError("token ids must fit in int32")
    parts, raw_len, flags = _payload(kv, compress, level)
    stored_len = sum(len(p) for p in parts)
    L, H, T, D = kv.shape
    header = HEADER.pack(
        MAGIC, FORMAT_VERSION, flags, _CODES[kv.dtype], L, H, T, D, T, raw_len, stored_len
    )
    name = signer.redis_key(key)
    digests = _digest_futures(parts)  # hashed on the pool while the copy below runs
    # np.empty: no zero-fill of a buffer that is overwritten anyway
    out = memoryview(np.empty(HEADER.size + stored_len + MAC_SIZE, dtype=np.uint8))
    out[: HEADER.size] = header
    off = HEADER.size
    for p in parts:
        out[off : off + len(p)] = p
        off += len(p)
    out[off:] = signer.mac_parts(signer.tag_of(name), (_binding(name), header, _collect(digests)))
    return out


def _payload(kv: PackedKV, compress: bool, level: int) -> tuple[list[Any], int, int]:
    """Zero-copy views of keys | values | token ids, or one zstd frame of them."""
    ids = torch.tensor(kv.token_ids, dtype=torch.int32)
    parts: list[Any] = [_raw(kv.keys), _raw(kv.values), _raw(ids)]
    raw_len = sum(len(p) for p in parts)
    if not compress:
        return parts, raw_len, 0
    cobj = zstandard.ZstdCompressor(level=level).compressobj(size=raw_len)
    return [b"".join([cobj.compress(p) for p in parts] + [cobj.flush()])], raw_len, FLAG_ZSTD


def decode(blob: bytes | bytearray | memoryview, key: CacheKey, signer: CacheKeySigner) -> PackedKV:
    """Verify then decode a value stored for ``key``; raises :class:`CorruptEntry`."""
    return decode_named(blob, signer.redis_key(key), signer)


def decode_named(
    blob: bytes | bytearray | memoryview, name: str, signer: CacheKeySigner
) -> PackedKV:
    """Like :func:`decode` for a known Redis name (the tier already has it)."""
    h = _verified_header(blob, name, signer)
    L, H, T, D = h["shape"]
    if h["flags"] & FLAG_ZSTD:
        try:
            buf: Any = zstandard.ZstdDecompressor().decompress(
                memoryview(blob)[HEADER.size : -MAC_SIZE], max_output_size=h["raw_len"]
            )
        except zstandard.ZstdError as e:
            raise CorruptEntry(f"zstd payload does not decompress: {e}") from e
        if len(buf) != h["raw_len"]:
            raise CorruptEntry("decompressed payload has the wrong length")
        off = 0
    else:
        buf, off = blob, HEADER.size
    dtype, n = h["dtype"], L * H * T * D
    nb = n * dtype.itemsize
    keys = torch.frombuffer(buf, dtype=dtype, count=n, offset=off).view(L, H, T, D)
    values = torch.frombuffer(buf, dtype=dtype, count=n, offset=off + nb).view(L, H, T, D)
    ids = torch.frombuffer(buf, dtype=torch.int32, count=T, offset=off + 2 * nb).tolist()
    return PackedKV(keys, values, ids)


def check(blob: bytes, name: str, signer: CacheKeySigner) -> dict[str, Any]:
    """Verify MAC and header of a stored value without decoding tensors."""
    h = _verified_header(blob, name, signer)
    return {**h, "dtype": str(h["dtype"]).removeprefix("torch."), "bytes": len(blob)}


def _verified_header(blob: bytes, name: str, signer: CacheKeySigner) -> dict[str, Any]:
    """MAC first, then the header fields and every length they imply."""
    mv = memoryview(blob)
    if len(mv) < HEADER.size + MAC_SIZE:
        raise CorruptEntry(f"truncated: {len(mv)} bytes")
    try:
        tag = signer.tag_of(name)
    except ValueError as e:
        raise CorruptEntry(str(e)) from e
    header, payload = mv[: HEADER.size], mv[HEADER.size : -MAC_SIZE]
    digests = _collect(_digest_futures([payload]))
    expected = signer.mac_parts(tag, (_binding(name), header, digests))
    if not hmac.compare_digest(expected, mv[-MAC_SIZE:]):
        raise CorruptEntry("MAC mismatch (tampered, truncated, foreign key or other secret)")
    magic, version, flags, code, L, H, T, D, ntok, raw_len, stored_len = HEADER.unpack_from(mv)
    if magic != MAGIC:
        raise CorruptEntry("bad magic")
    if version != FORMAT_VERSION:
        raise CorruptEntry(f"format version {version}, expected {FORMAT_VERSION}")
    if flags & ~FLAG_ZSTD or code not in _DTYPES:
        raise CorruptEntry(f"unknown flags {flags:#x} or dtype code {code}")
    dtype = _DTYPES[code]
    expect_raw = 2 * L * H * T * D * dtype.itemsize + 4 * ntok
    if min(L, H, T, D) == 0 or ntok != T or raw_len != expect_raw:
        raise CorruptEntry("inconsistent shape/length fields")
    if stored_len != len(mv) - HEADER.size - MAC_SIZE:
        raise CorruptEntry("payload length mismatch")
    if not flags & FLAG_ZSTD and stored_len != raw_len:
        raise CorruptEntry("uncompressed payload length mismatch")
    return {
        "version": version,
        "flags": flags,
        "dtype": dtype,
        "shape": (L, H, T, D),
        "raw_len": raw_len,
        "compressed": bool(flags & FLAG_ZSTD),
    }


def _binding(name: str) -> bytes:
    b = name.encode()
    return len(b).to_bytes(2, "big") + b


def _raw(t: torch.Tensor) -> memoryview:
    """Bytes of a contiguous CPU tensor without a copy (bf16 as its 2-byte pattern)."""
    assert t.is_cpu and t.is_contiguous()
    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy())


# -- payload digests -------------------------------------------------------------------
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    """The process's hashing pool (created lazily; dropped in forked children)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            workers = max(1, min(8, os.cpu_count() or 1))
            _pool = ThreadPoolExecutor(workers, thread_name_prefix="kvi-hash")
        return _pool


def _after_fork_in_child() -> None:
    # A forked child (Celery prefork) has none of the parent's threads: start afresh.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _chunks(parts: list[Any]) -> list[list[memoryview]]:
    """The concatenation of ``parts`` cut into CHUNK-sized lists of slices."""
    chunks: list[list[memoryview]] = []
    cur: list[memoryview] = []
    room = CHUNK
    for part in parts:
        mv, off = memoryview(part).cast("B"), 0
        while off < len(mv):
            n = min(room, len(mv) - off)
            cur.append(mv[off : off + n])
            off, room = off + n, room - n
            if room == 0:
                chunks.append(cur)
                cur, room = [], CHUNK
    if cur or not chunks:
        chunks.append(cur)
    return chunks


def _sha256(segments: list[memoryview]) -> bytes:
    h = hashlib.sha256()
    for seg in segments:
        h.update(seg)  # releases the GIL for large slices
    return h.digest()


def _digest_futures(parts: list[Any]) -> list[Future[bytes] | bytes]:
    chunks = _chunks(parts)
    if len(chunks) == 1:
        return [_sha256(chunks[0])]
    pool = _executor()
    return [pool.submit(_sha256, c) for c in chunks]


def _collect(digests: list[Future[bytes] | bytes]) -> bytes:
    return b"".join(d if isinstance(d, bytes) else d.result() for d in digests)
