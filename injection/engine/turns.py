"""How a turn is generated and what of it is kept: one ``adapter.generate``, or a row of
the batch engine that continues the conversation's cached link and keeps the next one."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from typing import Any

import torch

from injection.base import CacheKey, ExecutionRequest
from injection.engine.planning.plan import LinkPlan, TurnPlan
from injection.kvcache.conversation import ConversationStore, common_prefix, messages_hash
from injection.kvcache.kvsource import user_or_none
from injection.kvcache.packed import PackedKV
from injection.kvcache.pieces import KVPieces, own
from injection.prompting.opening import next_opening

__all__ = ["TurnGenerator", "engine_idle", "join", "opening_pays"]

log = logging.getLogger(__name__)

# After a reply, prefill the next turn's opening (the reply, the next user header and a
# fixed reminder: ``prompting/opening.py``) onto the conversation's link in the background,
# so the next turn prefills only its message; at most this many turns wait for it. Only
# while the engine has nothing else to do: measured back to back (bench/bench_opening_load.py,
# 4 chats, CPU), openings run beside other rows cost 0.90x tokens/s and 1.48x TTFT (the next
# turn mostly arriving before its opening was ready); idle-only, 1.01x and 0.93-1.06x.
# By default only where the model runs on a CPU (``opening_pays``).
MAX_PENDING_OPENINGS = 8
# A conversation's next turn that arrives while its opening is being prefilled waits for it
# (it would queue behind that row on the engine anyway) and reuses it, at most this long;
# one still queued is cancelled and the turn prefills those tokens itself. Measured
# (bench/profile_first_token.py, a /v1 chat sent back to back): the turn used to look its link
# up before the running opening was stored, then wait for that row and prefill the opening's
# tokens again.
OPENING_WAIT_S = 2.0
# An opening starts this long after its reply at the earliest, and not at all once its
# conversation's next turn has come: a client that answers at once (an agent, a script) has
# that turn prefill the opening's few tokens with its message, one forward instead of two
# (waiting for the opening's own forward cost it 129 ms of a 529 ms first token at turn 20,
# bench/profile_first_token.py); a person reading the reply loses nothing.
OPENING_DELAY_S = 0.5
OPENING_PROBES = ("Hello", "what", "1", " (")  # unlike starts of a next message


def engine_idle(engine: Any) -> bool:
    """Whether the batch engine runs and holds no row (an opening, a background warm start
    only then)."""
    stats = engine.stats()
    return not stats.get("active") and not stats.get("waiting")


def opening_pays(engine: Any) -> bool:
    """Whether to prefill openings when not told: where the engine's model runs on a CPU. A
    CPU prefill costs per token, so the next turn's first token came about 10 % sooner in a
    live chat. A GPU prefill of a few dozen tokens is bound by kernel launches and costs what
    the message's alone does: on an H100 (SmolLM2-135M's shapes) a live turn came no sooner
    within noise, while back-to-back chats lost 1.29x and 1.45x TTFT p50 to openings
    started in the engine's short idle gaps (BENCHMARKS.md, memory depth: "The opening and the
    reminder on an H100")."""
    device = getattr(getattr(engine, "adapter", None), "device", None)
    return engine is not None and torch.device(device or "cpu").type == "cpu"


def join(head: PackedKV | KVPieces | None,
         tail: PackedKV | KVPieces | None) -> KVPieces | PackedKV | None:
    """The injected chain followed by the conversation's link: their pieces, not a copy
    (``kvcache.pieces``: each piece is copied once, into the row's cache)."""
    if head is None or tail is None:
        return head if tail is None else tail
    return KVPieces([head, tail])


class TurnGenerator:
    def __init__(self, adapter: Any, engine: Any, store: ConversationStore) -> None:
        self.adapter, self.engine, self.store = adapter, engine, store
        self._lock = threading.Lock()  # the openings waiting, and closing
        self._pending: set[Future] = set()
        # the link key each opening extends: its future, and the event its next turn sets
        self._opening_of: dict[CacheKey, tuple[Future, threading.Event]] = {}
        self._openings: ThreadPoolExecutor | None = None
        self._closed = False
        self.prefill_opening = opening_pays(engine)  # build_executor may say otherwise

    def plan(self, req: ExecutionRequest, messages: list[dict[str, str]], prompt: str,
             chash: str, alpha: float, *, injected: bool) -> LinkPlan:
        """Encode the turn once and look its conversation up (``cached``: a hit)."""
        if self.engine is None:
            return LinkPlan(None, prompt, None, None)  # one adapter.generate: no link
        prompt_ids = self.adapter.renderer.encode(prompt, first=not injected)
        user = user_or_none(req.user)
        if not (self.store.enabled and req.reuse_conversation and user):
            return LinkPlan(None, prompt, prompt_ids, None)
        # /v1: the hash chain of the messages as sent (not of the window that fits), so
        # a trimmed history still finds, and then replaces, its conversation's link
        key = self._key(req, user, f"id:{req.conversation_id}" if req.conversation_id
                        else messages_hash(list(req.messages)[:-1]), chash, alpha)
        if req.conversation_id or any(m["role"] != "system" for m in req.messages[:-1]):
            self._await_opening(key)
            cached = self.store.lookup(key, prompt_ids)
        else:  # a /v1 first turn: no link is ever kept under its key (admission, below)
            cached = None
        # admission: a turn with history is a conversation going on; one-shots are not kept,
        # nor a /v1 history seen before (a fixed few-shot prefix: its links are never read)
        admitted = cached is not None or (
            any(m["role"] != "system" for m in messages[:-1])
            and (bool(req.conversation_id) or self.store.first_sighting(key)))
        if not admitted:
            self.store.metrics.incr("conv_not_admitted")
        return LinkPlan(key, prompt, prompt_ids, cached, admitted)

    def run(self, plan: TurnPlan, prefix: PackedKV | None, lead: tuple[int, ...] = (),
            capture: Any = None, guide: Any = None, first: Any = None, lean: Any = None) -> Any:
        """Generate after ``prefix`` (the injected chain, with the conversation's link
        joined on a hit; values already scaled) at alpha 1. ``lead``: a deferred segment's
        ids, prefilled before the prompt, their K/V handed to ``capture`` (engine only);
        ``guide``: contrastive guidance (``contrast.Guide``, engine only); ``first``: the
        first token's scores (``anchor.py``, engine only); ``lean``: the member's lean and
        its strength (``probe.py``, engine only)."""
        link = plan.link
        if self.engine is None:
            assert not lead, "a deferred segment needs the batch engine"
            return self.adapter.generate(link.prompt, prefix, 1.0, plan.max_new_tokens,
                                         **plan.sampling)
        done = link.done
        assert not (lead and done), "a deferred segment comes before any conversation link"
        return self.engine.run(prefix, 1.0, [*lead, *link.prompt_ids[done:]],
                               plan.max_new_tokens, keep_kv=link.admitted,
                               prompt_ids=link.prompt_ids,
                               capture=capture if lead else None, capture_tokens=len(lead),
                               guide=guide, first_scores=first, lean=lean, **plan.sampling)

    def keep(self, plan: TurnPlan, req: ExecutionRequest, reply: str, out: Any,
             head: int) -> None:
        """Store the turn's link (what follows the ``head`` injected tokens) under the key
        the next turn looks up; after an injected turn, the next turn's text before its
        message (``prompting/opening.py``) is prefilled onto the link in the background.
        Bookkeeping after the reply is final: a failure here costs the next turn's reuse,
        never this reply."""
        messages = list(plan.messages)
        opening = partial(next_opening, self.adapter.plain_prompt, plan.context, messages,
                          reply, plan.reminder) if plan.injected else None
        try:
            self._keep(plan.link, req, messages, reply, out, head, plan.chash,
                       plan.member_alpha, opening)
        except Exception as exc:
            self.store.metrics.incr("conv_keep_errors")
            log.warning("conversation link not kept (%s)", type(exc).__name__)

    def _keep(self, plan: LinkPlan, req: ExecutionRequest, messages: list[dict[str, str]],
              reply: str, out: Any, head: int, chash: str, alpha: float,
              opening: Callable[[], str | None] | None) -> None:
        seq = out.sequence_kv
        if plan.key is None or not plan.admitted or seq is None:
            return
        user = user_or_none(req.user)
        nxt = plan.key if req.conversation_id else self._key(
            req, user, messages_hash([*req.messages, {"role": "assistant", "content": reply}]),
            chash, alpha)
        link = own(seq, head)  # contiguous (pool memory with CUDA) once: reads are views
        self.store.keep(nxt, link, replaces=plan.key)  # the link this turn continued
        if (opening is not None and self.prefill_opening and self.engine is not None
                and plan.prompt_ids is not None):
            self._submit(nxt, plan.prompt, seq, head, opening)

    # -- the next turn's opening, prefilled ahead ---------------------------------------
    def _submit(self, key: CacheKey, prompt: str, seq: PackedKV, head: int,
                opening: Callable[[], str | None]) -> None:
        with self._lock:
            self._pending = {f for f in self._pending if not f.done()}
            if self._closed or len(self._pending) >= MAX_PENDING_OPENINGS:
                self.store.metrics.incr("conv_opening_skipped")
                return
            if self._openings is None:
                self._openings = ThreadPoolExecutor(1, thread_name_prefix="kv-opening")
            superseded = threading.Event()
            future = self._openings.submit(self._open, key, prompt, seq, head, opening,
                                           superseded, time.monotonic() + OPENING_DELAY_S)
            self._pending.add(future)
            self._opening_of[key] = (future, superseded)
        # outside the lock: a future already done runs its callback here
        future.add_done_callback(partial(self._opened, key))

    def _opened(self, key: CacheKey, future: Future) -> None:
        with self._lock:
            if self._opening_of.get(key, (None,))[0] is future:
                del self._opening_of[key]

    def _await_opening(self, key: CacheKey) -> None:
        """Before a turn looks its link up: the opening being prefilled onto it is waited
        for (``OPENING_WAIT_S`` at most), so the turn reuses it instead of prefilling the
        same tokens again behind it; one not started yet is cancelled."""
        with self._lock:
            future, superseded = self._opening_of.get(key, (None, None))
            if superseded is not None:
                superseded.set()  # one still in its delay gives way (``_open``)
        if future is None or future.done():
            return
        if future.cancel():
            self.store.metrics.incr("conv_opening_cancelled")
            return
        try:
            if future.result(timeout=OPENING_WAIT_S):
                self.store.metrics.incr("conv_opening_awaited")
        except Exception:  # noqa: BLE001 - too slow, or failed (counted by _open): go on
            self.store.metrics.incr("conv_opening_not_awaited")

    def _open(self, key: CacheKey, prompt: str, seq: PackedKV, head: int,
              opening: Callable[[], str | None], superseded: threading.Event,
              not_before: float) -> bool:
        """After ``OPENING_DELAY_S``, unless the next turn came meanwhile: the opening.
        Whether it went on to prefill it."""
        if superseded.wait(max(0.0, not_before - time.monotonic())):
            self.store.metrics.incr("conv_opening_cancelled")
            return False
        self._prefill_opening(key, prompt, seq, head, opening)
        return True

    def _prefill_opening(self, key: CacheKey, prompt: str, seq: PackedKV, head: int,
                         opening: Callable[[], str | None]) -> None:
        """Prefill the opening after ``seq``; the longer link replaces the turn's in L1
        while that is still the one stored. Best effort: a failure costs the reuse."""
        try:
            if not (self._idle() and self.store.holds(key, seq.token_ids[head:])):
                self.store.metrics.incr("conv_opening_skipped")  # busy, or the chat moved on
                return
            text = opening()
            ids = self._opening_ids(prompt, text, seq.token_ids[head:]) if text else []
            if not ids:
                return
            # the longer link only (from ``head`` on): its own contiguous copy already
            kv = self.engine.run(seq, 1.0, ids, 1, keep_kv=True, keep_from=head).sequence_kv
            if kv is None or kv.num_tokens != seq.num_tokens - head + len(ids):
                return
            self.store.extend(key, seq.token_ids[head:], kv)
        except Exception as exc:
            self.store.metrics.incr("conv_opening_errors")
            log.warning("next turn's opening not prefilled (%s)", type(exc).__name__)

    def _idle(self) -> bool:
        return engine_idle(self.engine)

    def _opening_ids(self, prompt: str, text: str, link_ids: tuple[int, ...]) -> list[int]:
        """The opening's token ids after the link's: those the next turn tokenises the same
        whatever its message (the common prefix over a few unlike ones: "\n\n" alone is
        one token, before a word two); [] where the link is not their prefix."""
        encode, n = self.adapter.renderer.encode, len(link_ids)
        first, *rest = [encode(prompt + text + m, first=False) for m in OPENING_PROBES]
        ids = first[:min(common_prefix(first, other) for other in rest)]
        if len(ids) <= n or tuple(ids[:n]) != tuple(link_ids):
            return []
        return ids[n:]

    def drain(self) -> None:
        """Wait for the openings being prefilled (a member reading the reply, in tests)."""
        with self._lock:
            pending = list(self._pending)
        wait(pending)  # one its next turn cancelled included

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for _, superseded in self._opening_of.values():
                superseded.set()  # openings still in their delay end now
        if self._openings is not None:
            self._openings.shutdown(wait=True, cancel_futures=True)

    def _key(self, req: ExecutionRequest, user: str, ident: str, chash: str,
                alpha: float) -> CacheKey:
        return self.store.key(req.tenant, user, ident, chash, alpha, self.adapter.fingerprint,
                              str(req.conversation_id) if req.conversation_id else None)
