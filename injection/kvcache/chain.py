"""The injected system turn as a chain of cached segments: tenant -> member.

The tenant segment (template header + the tenant's instructions) is computed once per
tenant and shared by all its members; each member's segment (preference + end of the
turn) is computed as the continuation of the tenant's K/V and holds only the tokens it
adds. Keys form a hash chain: a member key hashes its parent's key with its own text,
and the tenant is in every key (``CacheKey.tenant``), so identical instructions of two
tenants never share an entry. The tenant segment is filed under the reserved user
``TENANT_USER``: evicting a member leaves it, evicting the tenant drops it.

Assembled for a request, the chain is its cached pieces ready to inject at alpha 1
(``pieces.KVPieces``: each copied once, into the row's cache): the tenant's values as
computed, the member's values scaled by alpha on the way (keys never).
A model or template without a token-exact split injects the whole turn as one segment
(the member's, keyed as before), scaled as a whole.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, NamedTuple

from injection.base import CacheKey, PreferenceModel, SegmentSplit, Tier
from injection.kvcache.kvsource import PreferenceKVSource, content_hash, user_or_none
from injection.kvcache.packed import PackedKV
from injection.kvcache.pieces import KVPieces, Piece

__all__ = ["KINDS", "LEAN_PREFIX", "TENANT_USER", "ChainKV", "SegmentChain", "kind_of", "kind_stats",
           "segment_split", "tenant_key"]

TENANT_USER = "~tenant"  # member ids are never this: the tenant segment's slot
_ORDER = {Tier.L1: 0, Tier.L2: 1, Tier.COMPUTE: 2}


class ChainKV(NamedTuple):
    """An assembled chain: inject ``kv`` at alpha 1 (the member part is already scaled)."""

    kv: KVPieces | None  # None only for a deferred chain without a cached head
    tier: Tier  # the coldest tier of the chain (compute if any segment was computed)
    cached_tokens: int  # tokens of segments served from L1/L2
    tiers: dict[str, str]  # per segment kind: l1 | l2 | compute
    stored_bytes: int  # bytes of the cached segments this request used
    # deferred (the one-pass miss): the member segment's ids, prefilled by the request
    # right after ``kv`` and before its prompt; ``capture`` stores their K/V
    lead: tuple[int, ...] = ()
    capture: Callable[[PackedKV], None] | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens of the injected turn (a deferred segment's included)."""
        return (self.kv.num_tokens if self.kv is not None else 0) + len(self.lead)


KINDS = ("tenant", "member", "lean", "conversation")
LEAN_PREFIX = "lean-"  # a member's lean (engine/guidance/probe.py): its content hash so marked


def kind_of(key: CacheKey) -> str:
    """A segment entry's kind by its key (conversation links live in their own L1; a
    member's lean lives beside its segments)."""
    if key.user == TENANT_USER:
        return "tenant"
    return "lean" if key.content_hash.startswith(LEAN_PREFIX) else "member"


def kind_stats(counters: dict[str, int], l1: Any, conv_l1: Any) -> dict[str, dict[str, int]]:
    """Per kind: L1 entries and bytes, hits and misses per tier (this process's counters)."""
    out = {k: {"entries": 0, "bytes": 0, "tensor_bytes": 0, "pinned_bytes": 0} for k in KINDS}
    stores = [(l1, kind_of)] + ([(conv_l1, lambda k: "conversation")]
                                if conv_l1 is not None and conv_l1 is not l1 else [])
    for store, classify in stores:
        usage = getattr(store, "usage_by", None)
        for kind, row in (usage(classify) if usage is not None else {}).items():
            for f, n in row.items():
                out[kind][f] += n
    for kind, row in out.items():
        for f in ("l1_hits", "l1_misses", "l2_hits", "l2_misses"):
            row[f] = int(counters.get(f"{kind}_{f}", 0))
    return out


def _sha(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode("utf-8")).hexdigest()


def segment_split(adapter: Any, segment: str, context: str,
                  instructions: str) -> SegmentSplit | None:
    """``segment`` as the tenant's part and the member's (None: one segment)."""
    try:
        return adapter.split_segment(segment, context, instructions)
    except Exception:  # noqa: BLE001 - a tokenizer quirk costs the sharing, not the reply
        return None


def tenant_key(tenant: str, tenant_text: str, fingerprint: str) -> CacheKey:
    return CacheKey(tenant, TENANT_USER, _sha("tenant", content_hash(tenant_text)), fingerprint)


class SegmentChain:
    """Finds or computes the segments of an injected turn through ``source``'s tiers."""

    def __init__(self, adapter: PreferenceModel, source: PreferenceKVSource) -> None:
        self.adapter, self.source = adapter, source

    def split(self, segment: str, context: str, instructions: str) -> SegmentSplit | None:
        return segment_split(self.adapter, segment, context, instructions)

    def get(self, tenant: str, user: str | None, segment: str, split: SegmentSplit | None,
            alpha: float, *, defer: bool = False) -> ChainKV:
        """The chain of ``segment`` for ``user`` of ``tenant`` (``user`` None: the member
        part is computed and never cached; the tenant part is still shared).

        ``defer`` (alpha 1 only): a member segment missing from L1 and L2 is not computed
        here; the chain comes back deferred (``lead``/``capture``) for the request to
        compute it in its own prefill, before its prompt (the one-pass miss)."""
        assert not defer or alpha == 1.0, "a deferred segment is computed unscaled"
        member = user_or_none(user)
        fp = self.adapter.fingerprint
        if split is None:
            if not defer:
                kv, tier, _ = self.source.get(tenant, user, segment)
                return _assemble([("member", kv, tier)], alpha)
            key = CacheKey(tenant, member, content_hash(segment), fp) if member else None
            hit = self.source.lookup(key, kind="member") if key is not None else None
            if hit is None:
                ids = self.adapter.renderer.encode(segment, first=True)
                return self._deferred([], key, ids)
            return _assemble([("member", *hit)], alpha)
        tkey = tenant_key(tenant, split.tenant_text, fp)
        tkv, ttier = self._fetch(
            tkey, lambda: self.adapter.compute_kv_ids(split.tenant_ids), "tenant",
            split.tenant_ids)
        head = [("tenant", tkv, ttier)]
        mkey = (CacheKey(tenant, member, member_hash(tkey, split.member_text), fp)
                if member is not None else None)
        if defer:
            hit = self.source.lookup(mkey, kind="member") if mkey is not None else None
            if hit is None or hit[0].token_ids != split.member_ids:
                return self._deferred(head, mkey, split.member_ids)
            return _assemble([*head, ("member", *hit)], alpha)

        def compute_member() -> PackedKV:
            return self.adapter.compute_kv_ids(split.member_ids, parent=tkv)

        if mkey is None:
            mkv, mtier = self.source.compute(compute_member), Tier.COMPUTE
        else:
            mkv, mtier = self._fetch(mkey, compute_member, "member", split.member_ids)
        return _assemble([*head, ("member", mkv, mtier)], alpha)

    def _deferred(self, head: list[tuple[str, PackedKV, Tier]], key: CacheKey | None,
                  ids: list[int] | tuple[int, ...]) -> ChainKV:
        """The chain's cached ``head`` (alpha 1) with the member segment left to the
        request's prefill; ``capture`` stores what it computes (``key`` None: counted only)."""
        ids = tuple(ids)

        def capture(kv: PackedKV) -> None:
            if kv.token_ids != ids:  # never file K/V under another segment's key
                self.source.metrics.incr("segment_mismatch")
                return
            self.source.store(key, kv)

        base = _assemble(head, 1.0) if head else None
        return ChainKV(base.kv if base else None, Tier.COMPUTE,
                       base.cached_tokens if base else 0,
                       {**(base.tiers if base else {}), "member": Tier.COMPUTE.value},
                       base.stored_bytes if base else 0, lead=ids, capture=capture)


    def shared(self, tenant: str, text: str, ids: list[int]) -> tuple[PackedKV, Tier]:
        """A tenant-wide segment of ``text`` (its ``ids`` from the turn's start) that is no
        member's: the contrast guide's head (``engine/guidance/plan.py``)."""
        key = CacheKey(tenant, TENANT_USER, _sha("shared", content_hash(text)),
                       self.adapter.fingerprint)
        return self._fetch(key, lambda: self.adapter.compute_kv_ids(ids), "tenant", tuple(ids),
                           forward="guide")

    def _fetch(self, key: CacheKey, compute, kind: str, ids: tuple[int, ...],
               forward: str = "") -> tuple[PackedKV, Tier]:
        """``forward``: the compute's kind for the engine (default ``kind``)."""
        kv, tier = self.source.fetch(key, compute, kind=kind, forward=forward)
        if kv.token_ids != tuple(ids):  # content-keyed: only a broken entry gets here
            self.source.metrics.incr("segment_mismatch")
            kv, tier = self.source.compute(compute, forward or kind), Tier.COMPUTE
        return kv, tier


def member_hash(parent: CacheKey, member_text: str) -> str:
    """The member segment's content part: its parent's key hash chained with its text."""
    return _sha("member", parent.content_hash, content_hash(member_text))


def _assemble(parts: list[tuple[str, PackedKV, Tier]], alpha: float) -> ChainKV:
    """The chain as its cached pieces (never concatenated here: ``pieces.KVPieces``, each
    copied once into the row's cache); only the last (member) segment's values are
    scaled, on the way."""
    *_, (_, last, _) = parts
    kv = KVPieces([*(Piece(p, p.num_tokens) for _, p, _ in parts[:-1]),
                   Piece(last, last.num_tokens, alpha)])
    cached = sum(p.num_tokens for _, p, t in parts if t in (Tier.L1, Tier.L2))
    tier = max((t for _, _, t in parts), key=_ORDER.__getitem__)
    return ChainKV(kv, tier, cached, {k: t.value for k, _, t in parts},
                   sum(p.nbytes for _, p, _ in parts))
