"""Conversation K/V: the link of the chain after the injected turn, in L1 and Redis.

After a turn the engine hands back the K/V of everything it processed; what is kept is
only the part after the injected system turn (history, the new user turn, the reply):
the tenant and member segments before it are cached on their own. An entry is keyed
(``CacheKey``: tenant, member, content hash, model) by

* the conversation's identity: the caller's id (``/api/chat``: the stored conversation)
  or the hash chain of the messages before the new one (``/v1``: the next turn looks up
  the hash of this turn's messages + the reply), hashed with
* the injected turn's hash and alpha (a changed preference, instructions or alpha
  misses).

The next turn's tokens are compared with the stored ones: the longest common prefix is
reused and only the rest is prefilled, so a trimmed history or a re-tokenised reply
only shortens the reuse. Entries go to L1 (their own budget when the executor has a
conversation L1) and to Redis (same codec, HMAC, tenant-scoped names, the member's
index: evicting the member or the tenant drops them), so a turn on another worker or
after a restart continues from cache. A stored conversation's links carry its id in
their key (``l2.links.link_hash``) and are named in its own index in Redis too, so
deleting the conversation drops exactly them (``ConversationStore.drop``). Admission: a turn without history (a one-shot
request, or a conversation's first turn) is not stored; turns with history (the
conversation goes on) are, except a ``/v1`` turn whose history was seen before (a
doorkeeper mark in Redis per conversation key, ``first_sighting``): one-shot requests
that share a fixed few-shot prefix look up the same key every time and store a link
nobody reads, so only the first of them is kept. Redis holds each tenant's links to a
byte budget of their own (``injection.kvcache.l2.links``).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from injection.base import CacheKey, KVStore
from injection.kvcache.l2.links import link_conversation, link_hash
from injection.kvcache.packed import PackedKV
from injection.kvcache.pieces import KVPieces, Piece, pooled
from injection.metrics import Metrics

__all__ = ["ConversationStore", "common_prefix", "link_digest", "messages_hash"]

log = logging.getLogger(__name__)


def common_prefix(a: tuple[int, ...] | list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def link_digest(token_ids: tuple[int, ...] | list[int]) -> str:
    """A short digest of a link's token ids (which copy of a conversation's link)."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:32]


def messages_hash(messages: list[dict[str, str]]) -> str:
    """Hash chain of the messages (role and content of each, in order)."""
    h = hashlib.sha256(b"msgs").hexdigest()
    for m in messages:
        h = hashlib.sha256("\x1f".join((h, m["role"], m["content"])).encode()).hexdigest()
    return h


class ConversationStore:
    """Finds and keeps the conversation links of members' conversations."""

    def __init__(self, l1: KVStore | None, l2: KVStore | None, metrics: Metrics, *,
                 max_bytes: int) -> None:
        self.l1, self.metrics, self.max_bytes = l1, metrics, int(max_bytes)
        links = getattr(l2, "links_view", None)  # Redis: links within their tenant's budget
        self.l2 = links() if links is not None else l2
        # told (old key, new key, new link) after a turn replaced a link, so the host can
        # have the other workers drop their L1 copies of the superseded one (drop_stale)
        self.on_replaced: Callable[[CacheKey, CacheKey, PackedKV], None] | None = None
        self._l1_lock = threading.Lock()  # a turn's link and a late extension never cross

    @property
    def enabled(self) -> bool:
        return self.l1 is not None and self.max_bytes > 0

    def key(self, tenant: str, user: str, ident: str, segment_hash: str, alpha: float,
            fingerprint: str, conversation: str | None = None) -> CacheKey:
        """A link's key; ``conversation``: the stored conversation it belongs to
        (``/api/chat``), tagged in the key so deleting it drops exactly its links."""
        parts = ["conv", ident, segment_hash, f"{float(alpha):.6f}"]
        digest = hashlib.sha256("|".join(parts).encode()).hexdigest()
        return CacheKey(tenant, user, link_hash(conversation, digest), fingerprint)

    def drop(self, tenant: str, user: str, conversation: str) -> dict[str, int | None]:
        """Drop the links of ``user``'s stored conversation ``conversation`` from L1 and
        Redis; the member's segments, lean and other conversations stay. Per tier: links
        dropped (None: the tier failed, counted)."""
        def mine(key: CacheKey) -> bool:
            return link_conversation(key) == conversation

        return {"l1": self._call("l1", self.l1, "evict", tenant, user, mine),
                "l2": self._call("l2", self.l2, "evict_conversation", tenant, user,
                                 conversation)}

    def lookup(self, key: CacheKey, prompt_ids: list[int]) -> PackedKV | KVPieces | None:
        """The stored link cut to its common prefix with ``prompt_ids`` (the tokens after
        the injected turn), leaving at least one token to prefill; None: a miss. A cut
        link is a piece of the stored one (a view: copied once, into the row's cache)."""
        stored = self._get(key)
        n = common_prefix(stored.token_ids, prompt_ids) if stored is not None else 0
        n = min(n, len(prompt_ids) - 1)
        if stored is None or n < 1:
            self.metrics.incr("conv_misses")
            return None
        self.metrics.incr("conv_hits")
        self.metrics.incr("conv_tokens_reused", n)
        if n == stored.num_tokens:
            return stored
        return KVPieces([Piece(stored, n)])

    # -- storage --------------------------------------------------------------------------
    def keep(self, key: CacheKey, kv: PackedKV, *, replaces: CacheKey | None = None) -> bool:
        """Store a turn's link (L1 and Redis) and drop the one it supersedes."""
        if not self.enabled:
            return False
        assert kv.keys.is_cpu and kv.values.is_cpu, "cached K/V must live on CPU"
        if kv.nbytes > self.max_bytes:
            self.metrics.incr("conv_too_large")
            return False
        if replaces is not None and replaces != key:
            for name, store in (("l1", self.l1), ("l2", self.l2)):
                self._call(name, store, "discard", replaces)
        with self._l1_lock:
            stored = bool(self._call("l1", self.l1, "put", key, kv))
        self._call("l2", self.l2, "put", key, kv)
        self.metrics.incr("conv_stored")
        if replaces is not None and self.on_replaced is not None:
            try:
                self.on_replaced(replaces, key, kv)
            except Exception as exc:  # the broadcast costs other workers' memory, not replies
                self.metrics.incr("conv_replaced_errors")
                log.warning("superseded link not announced (%s)", type(exc).__name__)
        return stored

    def extend(self, key: CacheKey, base_ids: tuple[int, ...] | list[int], kv: PackedKV) -> bool:
        """Put ``kv``, a continuation of the link ``base_ids`` (the next turn's opening
        prefilled ahead, ``turns.py``), in L1 under ``key`` while that link is still the
        one there; Redis keeps the link as the turn stored it."""
        assert kv.keys.is_cpu and kv.values.is_cpu, "cached K/V must live on CPU"
        with self._l1_lock:
            if kv.nbytes > self.max_bytes or not self.holds(key, base_ids):
                return False
            stored = bool(self._call("l1", self.l1, "put", key, kv))
        self.metrics.incr("conv_extended" if stored else "conv_extend_refused")
        return stored

    def first_sighting(self, key: CacheKey) -> bool:
        """Whether no turn looked ``key`` up before (within the mark's TTL; True without
        Redis, or when it does not answer: admission then errs towards keeping)."""
        seen = self._call("l2", self.l2, "first_sighting", key) if self.enabled else None
        return seen is None or bool(seen)

    def holds(self, key: CacheKey, token_ids: tuple[int, ...] | list[int]) -> bool:
        """Whether L1's link under ``key`` is the one of ``token_ids`` (a peek: no hit or
        miss is counted, no recency changed; an L1 without ``peek`` holds nothing)."""
        current = self._call("l1", self.l1, "peek", key) if self.enabled else None
        return current is not None and tuple(current.token_ids) == tuple(token_ids)

    def drop_stale(self, old: CacheKey, new: CacheKey, tokens: int, digest: str) -> int:
        """Another worker replaced ``old`` with a link of ``tokens`` tokens (``digest``):
        drop this L1's copy of ``old`` and, under ``new``, anything that is not that link
        or its continuation (a shorter, older copy). Returns how many entries went."""
        if self.l1 is None:
            return 0
        dropped = 0
        if old != new and self.l1.discard(old):
            dropped += 1
        peek = getattr(self.l1, "peek", None)
        mine = peek(new) if peek is not None else None
        if mine is not None and not (mine.num_tokens >= tokens
                                     and link_digest(mine.token_ids[:tokens]) == digest):
            dropped += int(self.l1.discard(new))
        self.metrics.incr("conv_superseded_dropped", dropped)
        return dropped

    def _get(self, key: CacheKey) -> PackedKV | None:
        if not self.enabled:
            return None
        for name, store in (("l1", self.l1), ("l2", self.l2)):
            kv = self._call(name, store, "get", key)
            if kv is not None and kv.keys.is_cpu and kv.values.is_cpu:
                # not promoted to L1 from L2: the turn replaces the link when it finishes
                self.metrics.incr(f"conversation_{name}_hits")
                return pooled(kv) if name == "l2" else kv
            if store is not None:
                self.metrics.incr(f"conversation_{name}_misses")
        return None

    def _call(self, name: str, store: Any, op: str, *args: Any) -> Any:
        """A tier operation; a faulty tier costs the reuse, never the reply."""
        fn = getattr(store, op, None) if store is not None else None
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            self.metrics.incr(f"{name}_errors")
            log.warning("conversation K/V %s on %s failed (%s)", op, name, type(exc).__name__)
            return None
