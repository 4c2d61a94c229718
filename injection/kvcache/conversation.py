"""Conversation K/V reuse: a finished turn's whole sequence K/V, kept in L1 for the next turn.

After a turn the engine hands back the K/V of everything it processed (injected system
turn, history, the new user turn, the reply). It is stored in the worker's L1 (the same
tenant partition, byte accounting, quotas and ``check_integrity()`` as preference
entries) under a :class:`CacheKey` whose ``user`` is the member and whose content part
hashes the conversation's opening message, the injected segment, alpha and the model.
The next turn's tokens are compared with the stored ones: the longest common prefix is
reused and only the rest is prefilled. So:

* never shared across members or tenants (the key holds both; L1 is tenant-partitioned);
* a changed preference or tenant instructions (segment hash), alpha or model misses;
* a trimmed history changes the first tokens after the segment: the common prefix ends
  there and the turn falls back to a full prefill of the prompt;
* a re-tokenised reply that differs from the generated ids only shortens the reuse.

Entries live in L1 only (never Redis): they are large and only useful to the worker that
the member's affinity routing sends the conversation to.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, NamedTuple

from injection.base import CacheKey, ExecutionRequest, KVStore
from injection.kvcache.kvsource import user_or_none
from injection.kvcache.packed import PackedKV
from injection.metrics import Metrics

__all__ = ["ConversationReuse", "TurnGenerator", "TurnPlan", "common_prefix"]

log = logging.getLogger(__name__)


def common_prefix(a: tuple[int, ...] | list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ConversationReuse:
    """Finds and keeps whole-sequence K/V of members' conversations in L1."""

    def __init__(self, l1: KVStore | None, metrics: Metrics, *, max_bytes: int) -> None:
        self.l1, self.metrics, self.max_bytes = l1, metrics, int(max_bytes)

    @property
    def enabled(self) -> bool:
        return self.l1 is not None and self.max_bytes > 0

    def key(self, tenant: str, user: str, messages: list[dict[str, str]], segment_hash: str,
            alpha: float, fingerprint: str) -> CacheKey:
        """The slot of this member's conversation (its opening message identifies it)."""
        opening = next((m["content"] for m in messages if m["role"] != "system"), "")
        parts = ["conv", hashlib.sha256(opening.encode()).hexdigest(), segment_hash,
                 f"{float(alpha):.6f}"]
        return CacheKey(tenant, user, hashlib.sha256("|".join(parts).encode()).hexdigest(),
                        fingerprint)

    def lookup(self, key: CacheKey, full_ids: list[int], min_tokens: int) -> PackedKV | None:
        """The stored K/V cut to its common prefix with ``full_ids``, if that covers at
        least ``min_tokens`` (the injected segment) and leaves a token to prefill."""
        stored = self._get(key)
        n = common_prefix(stored.token_ids, full_ids) if stored is not None else 0
        n = min(n, len(full_ids) - 1)
        if stored is None or n < max(1, min_tokens):
            self.metrics.incr("conv_misses")
            return None
        self.metrics.incr("conv_hits")
        self.metrics.incr("conv_tokens_reused", n)
        if n == stored.num_tokens:
            return stored
        return PackedKV(stored.keys[:, :, :n], stored.values[:, :, :n], stored.token_ids[:n])

    def keep(self, key: CacheKey, kv: PackedKV | None) -> bool:
        """Store a finished turn's sequence K/V (replacing the slot's previous one)."""
        if kv is None or not self.enabled:
            return False
        assert kv.keys.is_cpu and kv.values.is_cpu, "cached K/V must live on CPU"
        if kv.nbytes > self.max_bytes:
            self.metrics.incr("conv_too_large")
            return False
        try:
            return bool(self.l1.put(key, kv))
        except Exception as exc:  # a faulty tier costs the reuse, never the reply
            self.metrics.incr("l1_errors")
            log.warning("conversation K/V not kept (%s)", type(exc).__name__)
            return False

    def _get(self, key: CacheKey) -> PackedKV | None:
        if not self.enabled:
            return None
        try:
            kv: Any = self.l1.get(key)
        except Exception as exc:
            self.metrics.incr("l1_errors")
            log.warning("conversation K/V lookup failed (%s)", type(exc).__name__)
            return None
        if kv is not None and not (kv.keys.is_cpu and kv.values.is_cpu):
            return None
        return kv


class TurnPlan(NamedTuple):
    """What a turn will run on, decided before any preference K/V is fetched."""

    key: CacheKey | None  # the conversation's slot (None: no reuse for this request)
    prompt: str
    prompt_ids: list[int] | None  # encoded once, when the engine runs the turn
    cached: PackedKV | None  # the conversation's K/V to continue (None: a miss)
    rest: list[int]  # with ``cached``: the tokens after it, to prefill
    head: int = 0  # tokens of the injected segment (counted when the conversation is looked up)


class TurnGenerator:
    """How a turn is generated: one ``adapter.generate``, or a row of the batch engine that
    keeps the sequence K/V and continues the conversation's when it can."""

    def __init__(self, adapter: Any, engine: Any, reuse: ConversationReuse) -> None:
        self.adapter, self.engine, self.reuse = adapter, engine, reuse

    def plan(self, req: ExecutionRequest, segment: str, prompt: str, chash: str,
             alpha: float) -> TurnPlan:
        """Encode the turn once and look its conversation up (``cached``: a hit)."""
        key = self._key(req, chash, alpha if segment else 0.0)
        if self.engine is None:
            return TurnPlan(key, prompt, None, None, [])
        renderer = self.adapter.renderer
        prompt_ids = renderer.encode(prompt, first=not segment)
        if key is None:
            return TurnPlan(key, prompt, prompt_ids, None, [])
        head = renderer.encode(segment, first=True) if segment else []
        full = head + prompt_ids
        cached = self.reuse.lookup(key, full, min_tokens=len(head))
        rest = full[cached.num_tokens:] if cached is not None else []
        return TurnPlan(key, prompt, prompt_ids, cached, rest, len(head))

    def run(self, plan: TurnPlan, req: ExecutionRequest, kv: PackedKV | None, alpha: float,
            sampling: dict[str, Any]) -> Any:
        """Generate: on the conversation's K/V (a hit), else after ``kv`` (or from scratch);
        with an engine the sequence K/V is kept for the next turn."""
        if self.engine is None:
            return self.adapter.generate(plan.prompt, kv, alpha, req.max_new_tokens, **sampling)
        keep = plan.key is not None
        if plan.cached is not None:
            out = self.engine.run(plan.cached, 1.0, plan.rest, req.max_new_tokens, keep_kv=True,
                                  prompt_ids=plan.prompt_ids, **sampling)
        else:
            out = self.engine.run(kv, alpha, plan.prompt_ids, req.max_new_tokens, keep_kv=keep,
                                  **sampling)
        if keep:
            self.reuse.keep(plan.key, out.sequence_kv)
        return out

    def _key(self, req: ExecutionRequest, chash: str, alpha: float) -> CacheKey | None:
        """This member's conversation slot (its opening message as sent identifies it)."""
        user = user_or_none(req.user)
        if not (self.reuse.enabled and req.reuse_conversation and user):
            return None
        return self.reuse.key(req.tenant, user, list(req.messages), chash, alpha,
                              self.adapter.fingerprint)
