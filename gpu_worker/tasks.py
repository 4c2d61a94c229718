"""Celery tasks: take ids, load fresh rows from Postgres, hand off to ``injection``.

Both tasks run on the GPU workers (queue ``gpu``, or a worker's own ``gpu.w.<host>``
when routed by K/V affinity), acknowledge late, are redelivered if their worker dies,
and fail as poison after ``WORKER_MAX_DELIVERIES`` deliveries (gpu_worker.serving.runtime).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from celery import shared_task
from django.conf import settings
from django.db import close_old_connections

from gpu_worker.ops import metrics
from gpu_worker.ops.taskauth import SignedTask
from gpu_worker.routing import registry
from gpu_worker.serving import chat_service, handlers, host, playground
from gpu_worker.serving.idlewarms import Held, IdleWarms
from gpu_worker.serving.runtime import serving, worker_id
from tenants import sealing
from tenants.actions import claim_is_live
from tenants.errors import BudgetExceeded, ChatAbandoned, SealedPayloadRejected

log = logging.getLogger(__name__)

# The queue is named per task in CELERY_TASK_ROUTES ("gpu"); the Task.queue attribute is
# deprecated in Celery 5 and would hide the route from the settings.
GPU_TASK = {
    "bind": True,
    # signed messages only (gpu_worker.ops.taskauth); what Celery logs of the args
    # carries no text (gpu_worker.ops.logpolicy)
    "base": SignedTask,
    "acks_late": True,
    "reject_on_worker_lost": True,
    "soft_time_limit": settings.CHAT_SOFT_TIME_LIMIT,
    "time_limit": settings.CHAT_HARD_TIME_LIMIT,
}


# throws: an abandoned chat, one whose real prompt the budgets cannot hold, or one sealed
# under another key, is an expected outcome (logged as one line, no traceback).
@shared_task(name="gpu_worker.tasks.chat",
             throws=(ChatAbandoned, BudgetExceeded, SealedPayloadRejected),
             **GPU_TASK)
def chat(
    self,
    member_id: int,
    conversation_id: int | None,
    turn: str,
    request_id: str,
    enqueued_at: float | None = None,
) -> str:
    """One chat turn for a member; returns the API response body, sealed for the web.

    ``turn``: the message and parameters, sealed by the web for this request
    (``gpu_worker.client.dispatch.chat_args``); one that does not open here (another
    ``KV_SIGNING_SECRET``) fails at once with ``SealedPayloadRejected``, nothing run.
    Runs and stores only under the request's live claim in Postgres (not abandoned by
    the web, before its deadline): checked before starting and again, row-locked, when
    storing. A redelivered or restored task the web gave up on is refused, not stored."""
    with serving(self, enqueued_at):
        try:
            if not claim_is_live(member_id, request_id):
                raise ChatAbandoned("abandoned or past its deadline; not started")
            asked = sealing.open_sealed(sealing.CHAT_TURN, request_id, turn)
            host.sync_key_generation()
            result = chat_service.answer(member_id, conversation_id, asked["message"],
                                         asked["params"], request_id)
        except (ChatAbandoned, BudgetExceeded, SealedPayloadRejected) as exc:
            chat_service.release_reservation(member_id, request_id)
            log.warning("chat request_id=%s refused: %s", request_id, exc.message)
            raise
        except Exception:  # failed (a time limit included): it will bill nothing more
            chat_service.release_reservation(member_id, request_id)
            raise
    worker = worker_id(self)
    tier = result["cache"]["tier"]
    # this worker's L1 now holds the member's K/V: the preference's, or (even without a
    # preference) the conversation's, kept for its next turn
    _remember(member_id, worker, "conversation" if _keeps_conversations() else tier)
    log.info(
        "chat request_id=%s tier=%s tokens=%s+%s latency=%.0fms",
        request_id, tier, result["usage"]["prompt_tokens"],
        result["usage"]["completion_tokens"], result["cache"].get("inference_latency_ms", 0),
    )
    return sealing.seal(sealing.CHAT_RESULT, request_id, {**result, "worker": worker})


# A warm queued after an edit (``background``) is held in this process and runs one at a
# time, only once the batch engine has had nothing else to do for ``BACKGROUND_QUIET_S``
# (``serving.idlewarms``: one held a member, at most ``BACKGROUND_MAX_HELD``, dropped after
# ``KV_WARM_EXPIRES``; lost on a restart: the member's next chat computes what it would
# have). Measured: the 200 warms of a bulk edit run as they came took the chats beside them
# from 0.18 s to 7.2 s to the first token (docs/BENCHMARKS.md, warm on edit).
BACKGROUND_QUIET_S = 0.5  # how long the engine must stay idle before a warm starts
BACKGROUND_MAX_HELD = 4096  # members whose warm a process holds at most


@shared_task(name="gpu_worker.tasks.warm_member", **GPU_TASK)
def warm_member(self, member_id: int, after_outbox: int | None = None,
                background: bool = False) -> dict[str, Any]:
    """Make sure the member's enabled preference K/V is cached (L1 here, and L2).
    ``after_outbox``: the invalidation of the edit that queued it (``KV_WARM_ON_EDIT``),
    applied here first if its broadcast has not arrived yet, so it cannot evict the warm.
    ``background``: acknowledged at once and held until this process is idle."""
    worker = worker_id(self)
    if background:
        IDLE_WARMS.add(member_id, after_outbox, worker)
        log.info("background warm of member %s held until the worker is idle", member_id)
        return {"member": member_id, "tier": "held", "worker": worker}
    with serving(self):
        host.sync_key_generation()
        member = chat_service.load_member(member_id)
        if after_outbox is not None:
            handlers.apply_outbox(int(after_outbox), str(member.tenant_id), str(member.pk))
        tier = _warm(member)
    _remember(member_id, worker, tier)
    metrics.BACKGROUND_WARMS.labels("asked").inc()
    return {"member": member_id, "tenant": member.tenant_id, "tier": tier, "worker": worker}


def _run_held(held: Held) -> None:
    """A held background warm, on the idle-warms thread (its own database connection)."""
    host.sync_key_generation()
    member = chat_service.load_member(held.member_id)
    if held.after_outbox is not None:
        handlers.apply_outbox(int(held.after_outbox), str(member.tenant_id), str(member.pk))
    tier = _warm(member)
    _remember(held.member_id, held.worker, tier)
    metrics.BACKGROUND_WARMS.labels("ran").inc()
    log.info("background warm of member %s ran (%s)", held.member_id, tier)


def _idle() -> bool:
    """The engine holds no row now and still none ``BACKGROUND_QUIET_S`` later: chats sent
    one after another leave gaps of milliseconds, and a warm started in one held the next
    chat back (the bench's 8 live chats beside a bulk edit: 1.25x their first token)."""
    ex = host.current_executor()
    if ex is None:
        return True
    if not ex.idle():
        return False
    time.sleep(BACKGROUND_QUIET_S)
    return ex.idle()


IDLE_WARMS = IdleWarms(_run_held, _idle, max_members=BACKGROUND_MAX_HELD,
                       quiet_s=BACKGROUND_QUIET_S, expires_s=settings.KV_WARM_EXPIRES,
                       count=lambda outcome: metrics.BACKGROUND_WARMS.labels(outcome).inc(),
                       tidy=close_old_connections)


def _warm(member) -> str:
    """The member's segment (and lean) computed or found: the tier it came from."""
    pref = getattr(member, "preference", None)
    memories = chat_service.load_memories(member)  # they render the segment when any
    if not memories and not (pref is not None and pref.enabled and pref.text.strip()):
        return "none"
    return host.get_executor().warm(
        str(member.tenant_id), str(member.pk), pref.text if pref else "",
        member.tenant.instructions, memories=memories,
        contrast=getattr(member.tenant, "memory_contrast", None),
    ).value


@shared_task(name="gpu_worker.tasks.playground", **GPU_TASK)
def playground_reply(self, member_id: int, turn: str, variant: str, alpha: float | None = None,
                     max_new_tokens: int | None = None, stream: bool = False,
                     contrast: float | None = None) -> str:
    """One admin-playground reply (personalised or plain); stores nothing, logs no text.
    ``turn``: the message and an unsaved preference text, sealed (``tenants.sealing``), as
    is the reply returned. ``stream``: publish the pieces on the task id's stream
    (gpu_worker.channels.streams)."""
    with serving(self):
        asked = sealing.open_sealed(sealing.PLAYGROUND_TURN, self.request.id, turn)
        message, preference_text = asked["message"], asked.get("preference_text")
        host.sync_key_generation()
        out = playground.reply(member_id, message, variant, preference_text, alpha,
                               max_new_tokens, stream_id=self.request.id if stream else None,
                               contrast=contrast)
    log.info("playground member=%s variant=%s tier=%s tokens=%s+%s", member_id, variant,
             out["tier"], out["prompt_tokens"], out["completion_tokens"])
    return sealing.seal(sealing.PLAYGROUND_RESULT, self.request.id, out)


def _keeps_conversations() -> bool:
    ex = host.current_executor()
    return ex is not None and ex.conversations.enabled


def _remember(member_id: int, worker: str, tier: str) -> None:
    """Route this member's next request here: our L1 now holds their K/V."""
    if tier == "none":
        return
    try:
        registry.record_affinity(member_id, worker)
    except redis.RedisError as exc:
        log.warning("could not record affinity: %s", exc)
