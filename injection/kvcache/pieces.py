"""A request's injected K/V as the cached pieces it is made of, copied once each.

The injected turn is the tenant's segment, the member's (values scaled by alpha) and the
conversation's link; concatenated on the host they were copied two or three times per
request into fresh pageable memory before the copy to the model's device (which, from
pageable memory, is synchronous). :class:`KVPieces` keeps the pieces as they are cached
(views of L1's entries, a link cut to its reused prefix included) and :meth:`KVPieces.fill`
writes each one once into its place in the destination: the row's own preallocated
cache buffer (``ModelAdapter.build_cache``). On an accelerator the copy is one
non-blocking transfer of the piece's contiguous host tensor (pinned pool memory: truly
asynchronous), guarded so the pool hands that buffer out again only after the device has
read it, then assembled on the device. Every copy is counted (``hostmem.KV_COPIES``).

Entries are made host-contiguous once, when they are stored (:func:`own`, :func:`pooled`),
never on a read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch

from injection.hostmem import HOST_POOL, KV_COPIES
from injection.kvcache.packed import PackedKV

__all__ = ["KVPieces", "Piece", "own", "pooled"]


class Piece(NamedTuple):
    """The first ``tokens`` tokens of a cached entry, values scaled by ``scale``."""

    kv: PackedKV
    tokens: int
    scale: float = 1.0

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes * self.tokens // max(1, self.kv.num_tokens)


class KVPieces:
    """Cached pieces read as one prefix (PackedKV's read-only face: token ids, shape,
    dtype, device); :meth:`fill` writes them into a destination, one copy each.
    ``keys``/``values`` concatenate on first use (counted as ``materialize``): for the
    few callers that need one tensor, never on the engine's path."""

    __slots__ = ("pieces", "token_ids", "_packed")

    def __init__(self, pieces: Iterable[Piece | PackedKV | KVPieces]) -> None:
        flat: list[Piece] = []
        for p in pieces:
            if isinstance(p, KVPieces):
                flat.extend(p.pieces)
            elif isinstance(p, PackedKV):
                flat.append(Piece(p, p.num_tokens))
            elif p.tokens > 0:
                flat.append(p)
        if not flat:
            raise ValueError("KVPieces needs at least one token")
        first = flat[0].kv
        for p in flat:
            if (p.kv.num_layers, p.kv.num_heads, p.kv.head_dim, p.kv.dtype, p.kv.device) != (
                    first.num_layers, first.num_heads, first.head_dim, first.dtype, first.device):
                raise ValueError(f"pieces do not match: {p.kv!r} vs {first!r}")
            if not 0 < p.tokens <= p.kv.num_tokens:
                raise ValueError(f"a piece takes {p.tokens} of {p.kv.num_tokens} tokens")
        self.pieces: tuple[Piece, ...] = tuple(flat)
        self.token_ids = tuple(t for p in flat for t in p.kv.token_ids[:p.tokens])
        self._packed: PackedKV | None = None

    @classmethod
    def of(cls, kv: PackedKV | KVPieces) -> KVPieces:
        return kv if isinstance(kv, KVPieces) else cls([kv])

    # -- PackedKV's read-only face ------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_layers(self) -> int:
        return self.pieces[0].kv.num_layers

    @property
    def num_heads(self) -> int:
        return self.pieces[0].kv.num_heads

    @property
    def head_dim(self) -> int:
        return self.pieces[0].kv.head_dim

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.num_layers, self.num_heads, self.num_tokens, self.head_dim)

    @property
    def dtype(self) -> torch.dtype:
        return self.pieces[0].kv.dtype

    @property
    def device(self) -> torch.device:
        return self.pieces[0].kv.device

    @property
    def is_cpu(self) -> bool:
        return all(p.kv.is_cpu for p in self.pieces)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pieces)

    @property
    def keys(self) -> torch.Tensor:
        return self.packed().keys

    @property
    def values(self) -> torch.Tensor:
        return self.packed().values

    def packed(self) -> PackedKV:
        """One PackedKV of the pieces (a copy each, counted; made once)."""
        if self._packed is None:
            keys, values = self.empty(self.device)
            self.fill(keys, values, site="materialize")
            self._packed = PackedKV(keys, values, self.token_ids)
        return self._packed

    def equal(self, other: PackedKV | KVPieces) -> bool:
        return self.packed().equal(other.packed() if isinstance(other, KVPieces) else other)

    # -- the one copy ---------------------------------------------------------------------
    def empty(self, device: torch.device | str, room: int = 0) -> tuple[torch.Tensor, ...]:
        """Keys and values buffers ``[L, H, T + room, D]`` on ``device`` (ordinary storage,
        also inside inference mode: the engine writes them outside one too)."""
        L, H, T, D = self.shape
        with torch.inference_mode(False):
            return tuple(torch.empty((L, H, T + room, D), dtype=self.dtype, device=device)
                         for _ in range(2))

    def fill(self, keys: torch.Tensor, values: torch.Tensor, *, site: str = "assemble") -> None:
        """Write every piece once into ``keys``/``values`` (``[L, H, >= T, D]``, any
        device) from column 0 on; a piece's values scaled on the way."""
        at = 0
        with torch.no_grad():
            for p in self.pieces:
                cols = slice(at, at + p.tokens)
                _put(keys[:, :, cols], p.kv.keys, p.tokens, 1.0)
                _put(values[:, :, cols], p.kv.values, p.tokens, p.scale)
                moved = p.kv.device != keys.device  # the whole entry goes over
                KV_COPIES.add(site, p.kv.nbytes if moved else p.nbytes)
                at += p.tokens

    def fill_layers(self, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], *,
                    site: str = "assemble") -> None:
        """As :meth:`fill`, into one ``[H, >= T, D]`` destination per layer (buffers made
        layer by layer: a process's allocator reuses those, where one buffer of every
        layer is fresh memory, page faults included, each time)."""
        at, dev = 0, keys[0].device
        with torch.no_grad():
            for p in self.pieces:
                cols, n = slice(at, at + p.tokens), p.tokens
                src_k, src_v = p.kv.keys, p.kv.values
                if src_k.device != dev:
                    src_k, src_v = (t.to(dev, non_blocking=True) for t in (src_k, src_v))
                    HOST_POOL.guard(p.kv.keys)
                    HOST_POOL.guard(p.kv.values)
                for i, (k, v) in enumerate(zip(keys, values, strict=True)):
                    _put(k[None, :, cols], src_k[i:i + 1], n, 1.0)  # on ``dev``: no move
                    _put(v[None, :, cols], src_v[i:i + 1], n, p.scale)
                KV_COPIES.add(site, p.kv.nbytes if p.kv.device != dev else p.nbytes)
                at += n

    def __repr__(self) -> str:
        return f"KVPieces({[(p.tokens, p.scale) for p in self.pieces]}, nbytes={self.nbytes})"


def _put(dst: torch.Tensor, src: torch.Tensor, n: int, scale: float) -> None:
    """``src``'s first ``n`` tokens into ``dst``, times ``scale``. Across devices the
    whole contiguous source goes over in one non-blocking copy (asynchronous from pinned
    memory) and is cut and scaled there."""
    if src.device != dst.device:
        moved = src.to(dst.device, non_blocking=True)
        HOST_POOL.guard(src)  # a pooled buffer is not rewritten before the device read it
        dst.copy_(moved[:, :, :n])
        if scale != 1.0:
            dst.mul_(scale)
    elif scale != 1.0:
        torch.mul(src[:, :, :n], scale, out=dst)
    else:
        dst.copy_(src[:, :, :n])


def own(kv: PackedKV, start: int) -> PackedKV:
    """``kv``'s tokens from ``start`` as an entry of its own: contiguous, in pinned pool
    memory where the pool pins and has room (one copy, at store time); ``kv`` itself
    when ``start`` is 0."""
    if start == 0:
        return kv
    keys, values = (_host_copy(t[:, :, start:]) for t in (kv.keys, kv.values))
    link = PackedKV(keys, values, kv.token_ids[start:])
    KV_COPIES.add("link_store", link.nbytes)
    return link


def pooled(kv: PackedKV) -> PackedKV:
    """A decoded Redis entry in pinned pool memory (one copy, counted ``l2_to_pool``) so
    its transfer to the device is asynchronous; as it is without CUDA (no copy: the
    tensors stay views of the received bytes) or when the pool is full."""
    if not HOST_POOL.pin or kv.is_pinned() or not kv.is_cpu:
        return kv
    keys, values = (HOST_POOL.take(t.shape, t.dtype) for t in (kv.keys, kv.values))
    if keys is None or values is None:
        return kv
    keys.copy_(kv.keys)
    values.copy_(kv.values)
    KV_COPIES.add("l2_to_pool", kv.nbytes)
    return PackedKV(keys, values, kv.token_ids)


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    out = HOST_POOL.take(t.shape, t.dtype) if HOST_POOL.pin else None
    if out is None:
        return t.contiguous() if not t.is_contiguous() else t.clone()
    return out.copy_(t)
