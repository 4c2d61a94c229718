"""How a turn is generated and what of it is kept: one ``adapter.generate``, or a row of
the batch engine that continues the conversation's cached link and keeps the next one."""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import torch

from injection.base import CacheKey, ExecutionRequest
from injection.kvcache.conversation import ConversationStore, messages_hash
from injection.kvcache.kvsource import user_or_none
from injection.kvcache.packed import PackedKV
from injection.prompting.emphasis_spans import reply_spans

__all__ = ["TurnGenerator", "TurnPlan", "join"]

log = logging.getLogger(__name__)


class TurnPlan(NamedTuple):
    """What a turn will run on, decided before the injected segments are fetched."""

    key: CacheKey | None  # the conversation's slot (None: no reuse for this request)
    prompt: str
    prompt_ids: list[int] | None  # the tokens after the injected turn, encoded once
    cached: PackedKV | None  # the conversation's link to continue (None: a miss)
    admitted: bool = False  # the turn's link is stored (see ConversationStore)
    emphasis: float = 0.0  # the turn's attention emphasis (its link is keyed by it)
    replies: tuple[str, ...] = ()  # earlier assistant messages (the model's own words)


def join(head: PackedKV | None, tail: PackedKV | None) -> PackedKV | None:
    """The injected chain followed by the conversation's link (one PackedKV)."""
    if head is None or tail is None:
        return head if tail is None else tail
    return PackedKV(torch.cat([head.keys, tail.keys], 2), torch.cat([head.values, tail.values], 2),
                    (*head.token_ids, *tail.token_ids))


class TurnGenerator:
    def __init__(self, adapter: Any, engine: Any, store: ConversationStore) -> None:
        self.adapter, self.engine, self.store = adapter, engine, store

    def plan(self, req: ExecutionRequest, messages: list[dict[str, str]], prompt: str,
             chash: str, alpha: float, *, injected: bool, emphasis: float = 0.0) -> TurnPlan:
        """Encode the turn once and look its conversation up (``cached``: a hit). K/V
        computed under an emphasis is reused only under the same emphasis."""
        if self.engine is None:
            return TurnPlan(None, prompt, None, None)  # emphasis needs the batch engine
        prompt_ids = self.adapter.renderer.encode(prompt, first=not injected)
        replies = tuple(m["content"] for m in messages if m["role"] == "assistant")
        user = user_or_none(req.user)
        if not (self.store.enabled and req.reuse_conversation and user):
            return TurnPlan(None, prompt, prompt_ids, None, emphasis=emphasis, replies=replies)
        # /v1: the hash chain of the messages as sent (not of the window that fits), so
        # a trimmed history still finds, and then replaces, its conversation's link
        key = self._key(req, user, f"id:{req.conversation_id}" if req.conversation_id
                        else messages_hash(list(req.messages)[:-1]), chash, alpha, emphasis)
        cached = self.store.lookup(key, prompt_ids)
        # admission: a turn with history is a conversation going on; one-shots are not kept
        admitted = cached is not None or any(m["role"] != "system" for m in messages[:-1])
        if not admitted:
            self.store.metrics.incr("conv_not_admitted")
        return TurnPlan(key, prompt, prompt_ids, cached, admitted, emphasis, replies)

    def run(self, plan: TurnPlan, req: ExecutionRequest, prefix: PackedKV | None,
            sampling: dict[str, Any], spans: tuple[tuple[int, int], ...] = (),
            lead: tuple[int, ...] = (), capture: Any = None, guide: Any = None) -> Any:
        """Generate after ``prefix`` (the injected chain, with the conversation's link
        joined on a hit; values already scaled) at alpha 1; ``plan.emphasis`` towards the
        absolute key ``spans`` (engine only). ``lead``: a deferred segment's ids,
        prefilled before the prompt, their K/V handed to ``capture`` (engine only);
        ``guide``: contrastive guidance (``contrast.Guide``, engine only)."""
        if self.engine is None:
            assert not lead, "a deferred segment needs the batch engine"
            return self.adapter.generate(plan.prompt, prefix, 1.0, req.max_new_tokens, **sampling)
        done = plan.cached.num_tokens if plan.cached is not None else 0
        assert not (lead and done), "a deferred segment comes before any conversation link"
        return self.engine.run(prefix, 1.0, [*lead, *plan.prompt_ids[done:]],
                               req.max_new_tokens, keep_kv=plan.admitted,
                               prompt_ids=plan.prompt_ids,
                               emphasis=plan.emphasis if spans else 0.0, emphasis_spans=spans,
                               quiet_spans=self._quiet(plan, prefix, done, len(lead), spans),
                               capture=capture if lead else None, capture_tokens=len(lead),
                               guide=guide, **sampling)

    def _quiet(self, plan: TurnPlan, prefix: PackedKV | None, done: int, lead: int,
               spans: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
        """Absolute positions of the earlier replies still to prefill (emphasis only)."""
        if not (spans and plan.emphasis and plan.replies):
            return ()
        base = (prefix.num_tokens if prefix is not None else 0) - done + lead
        found = reply_spans(self.adapter.renderer, plan.prompt, plan.prompt_ids, plan.replies)
        return tuple((base + s, base + e) for s, e in found if e > done)

    def keep(self, plan: TurnPlan, req: ExecutionRequest, messages: list[dict[str, str]],
             reply: str, out: Any, head: int, chash: str, alpha: float) -> None:
        """Store the turn's link (what follows the ``head`` injected tokens) under the key
        the next turn looks up. Bookkeeping after the reply is final: a failure here costs
        the next turn's reuse, never this reply."""
        try:
            self._keep(plan, req, messages, reply, out, head, chash, alpha)
        except Exception as exc:
            self.store.metrics.incr("conv_keep_errors")
            log.warning("conversation link not kept (%s)", type(exc).__name__)

    def _keep(self, plan: TurnPlan, req: ExecutionRequest, messages: list[dict[str, str]],
              reply: str, out: Any, head: int, chash: str, alpha: float) -> None:
        seq = out.sequence_kv
        if plan.key is None or not plan.admitted or seq is None:
            return
        user = user_or_none(req.user)
        nxt = plan.key if req.conversation_id else self._key(
            req, user, messages_hash([*req.messages, {"role": "assistant", "content": reply}]),
            chash, alpha, plan.emphasis)
        link = PackedKV(seq.keys[:, :, head:], seq.values[:, :, head:], seq.token_ids[head:])
        self.store.keep(nxt, link, replaces=plan.key)  # the link this turn continued

    def _key(self, req: ExecutionRequest, user: str, ident: str, chash: str,
             alpha: float, emphasis: float = 0.0) -> CacheKey:
        return self.store.key(req.tenant, user, ident, chash, alpha, self.adapter.fingerprint,
                              emphasis=emphasis)
