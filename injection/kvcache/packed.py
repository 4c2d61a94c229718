"""PackedKV: every layer's preference K/V as two contiguous tensors.

``keys`` and ``values`` have shape ``[L, H_kv, T, D]`` (layers, key/value
heads, tokens, head dim), share dtype and device. Moving a PackedKV between
devices is therefore exactly two copies, never ``2 x L``. Instances are
immutable in spirit: no method mutates the tensors; everything that changes
data returns a new tensor or a new PackedKV.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

__all__ = ["PackedKV"]


def _check_pair(keys: torch.Tensor, values: torch.Tensor) -> None:
    if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise ValueError("PackedKV keys and values must be torch.Tensor")
    if keys.dim() != 4:
        raise ValueError(
            f"PackedKV tensors must be [L, H, T, D]; got keys shape {tuple(keys.shape)}"
        )
    if keys.shape != values.shape:
        raise ValueError(
            f"PackedKV keys/values shape mismatch: {tuple(keys.shape)} vs {tuple(values.shape)}"
        )
    if keys.dtype != values.dtype:
        raise ValueError(f"PackedKV keys/values dtype mismatch: {keys.dtype} vs {values.dtype}")
    if keys.device != values.device:
        raise ValueError(f"PackedKV keys/values device mismatch: {keys.device} vs {values.device}")
    if not keys.dtype.is_floating_point:
        raise ValueError(f"PackedKV needs a floating dtype, got {keys.dtype}")


class PackedKV:
    """All layers' keys and values of one preference text.

    Args:
        keys: ``[L, H_kv, T, D]`` tensor (made contiguous if it is not).
        values: same shape, dtype and device as ``keys``.
        token_ids: the ``T`` token ids the K/V was computed from.
    """

    __slots__ = ("_keys", "_values", "_token_ids")

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, token_ids: Iterable[int]) -> None:
        _check_pair(keys, values)
        ids = tuple(int(t) for t in token_ids)
        if len(ids) != keys.shape[2]:
            raise ValueError(
                f"PackedKV token_ids has {len(ids)} ids but tensors hold {keys.shape[2]} tokens"
            )
        self._keys = keys.contiguous()
        self._values = values.contiguous()
        self._token_ids = ids

    # -- construction / views -------------------------------------------------
    @classmethod
    def from_entries(
        cls, entries: Sequence[tuple[torch.Tensor, torch.Tensor]], token_ids: Iterable[int]
    ) -> PackedKV:
        """Pack per-layer ``(k, v)`` pairs of shape ``[1, H, T, D]`` or ``[H, T, D]``.

        One ``torch.stack`` for keys and one for values.
        """
        if len(entries) == 0:
            raise ValueError("PackedKV.from_entries needs at least one layer")
        ks, vs = [], []
        for i, pair in enumerate(entries):
            if len(pair) != 2:
                raise ValueError(f"layer {i}: expected a (key, value) pair")
            ks.append(_layer_3d(pair[0], i, "key"))
            vs.append(_layer_3d(pair[1], i, "value"))
        first = ks[0]
        for i, (k, v) in enumerate(zip(ks, vs, strict=True)):
            for t in (k, v):
                if t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
                    raise ValueError(
                        f"layer {i}: shape/dtype/device {tuple(t.shape)}/{t.dtype}/{t.device} "
                        f"differs from layer 0 {tuple(first.shape)}/{first.dtype}/{first.device}"
                    )
        return cls(torch.stack(ks), torch.stack(vs), token_ids)

    def to_entries(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer ``(k, v)`` views of shape ``[1, H, T, D]`` (no copy)."""
        return [
            (self._keys[i].unsqueeze(0), self._values[i].unsqueeze(0))
            for i in range(self.num_layers)
        ]

    # -- properties -----------------------------------------------------------
    @property
    def keys(self) -> torch.Tensor:
        return self._keys

    @property
    def values(self) -> torch.Tensor:
        return self._values

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self._token_ids

    @property
    def num_layers(self) -> int:
        return self._keys.shape[0]

    @property
    def num_heads(self) -> int:
        return self._keys.shape[1]

    @property
    def num_tokens(self) -> int:
        return self._keys.shape[2]

    @property
    def head_dim(self) -> int:
        return self._keys.shape[3]

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return tuple(self._keys.shape)  # type: ignore[return-value]

    @property
    def dtype(self) -> torch.dtype:
        return self._keys.dtype

    @property
    def device(self) -> torch.device:
        return self._keys.device

    @property
    def nbytes(self) -> int:
        """Bytes of keys + values (token ids not counted)."""
        return 2 * self._keys.numel() * self._keys.element_size()

    @property
    def is_cpu(self) -> bool:
        return self._keys.is_cpu

    def is_pinned(self) -> bool:
        return self._keys.is_cpu and self._keys.is_pinned() and self._values.is_pinned()

    # -- movement ---------------------------------------------------------------
    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedKV:
        """Copy to ``device`` with exactly 2 tensor copies; ``self`` if already there.

        ``non_blocking`` only overlaps with compute when the source is pinned.
        """
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if self.device == device:
            return self
        k = self._keys.to(device, non_blocking=non_blocking)
        v = self._values.to(device, non_blocking=non_blocking)
        return PackedKV(k, v, self._token_ids)

    def pin_memory(self) -> PackedKV:
        """Page-locked CPU copy (for async H2D); ``self`` without CUDA or if pinned/on GPU."""
        if not self.is_cpu or not torch.cuda.is_available() or self.is_pinned():
            return self
        return PackedKV(self._keys.pin_memory(), self._values.pin_memory(), self._token_ids)

    # -- data -------------------------------------------------------------------
    def scaled_values(self, alpha: float) -> torch.Tensor:
        """Values multiplied by ``alpha`` in one vectorised op.

        Always returns a NEW tensor (also for ``alpha == 1.0``) with the same
        dtype and device, so callers may mutate or grow it without touching the
        cached entry. Keys are never scaled.
        """
        if alpha == 1.0:
            return self._values.clone()
        return self._values.mul(alpha)

    def equal(self, other: PackedKV) -> bool:
        """Exact equality of tensors (shape, dtype, bits) and token ids."""
        return (
            isinstance(other, PackedKV)
            and self._token_ids == other._token_ids
            and self.dtype == other.dtype
            and self.shape == other.shape
            and torch.equal(self._keys, other._keys.to(self.device))
            and torch.equal(self._values, other._values.to(self.device))
        )

    def __repr__(self) -> str:
        L, H, T, D = self.shape
        return (
            f"PackedKV(L={L}, H={H}, T={T}, D={D}, dtype={self.dtype}, "
            f"device={self.device}, nbytes={self.nbytes})"
        )


def _layer_3d(t: torch.Tensor, i: int, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"layer {i}: {what} is not a tensor")
    if t.dim() == 4:
        if t.shape[0] != 1:
            raise ValueError(f"layer {i}: {what} batch size must be 1, got {t.shape[0]}")
        return t[0]
    if t.dim() != 3:
        raise ValueError(
            f"layer {i}: {what} must be [1, H, T, D] or [H, T, D], got {tuple(t.shape)}"
        )
    return t
